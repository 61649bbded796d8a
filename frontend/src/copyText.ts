/**
 * Copying to the clipboard: an answer as plain text a reader can paste into notes (its text with the [n]
 * markers, then the cited sources with their links), and any text through the Clipboard API, with the old
 * execCommand route for pages where that API is missing (plain http).
 */
import type { Source } from "./protocol";

/** The answer's text, then "Sources:" and one "[n] label: url" line per cited source. */
export function answerAsText(text: string, cited: Source[], label: (source: Source) => string): string {
  const body = text.trim();
  if (cited.length === 0) return body;
  const lines = cited.map((s) => `[${s.n}] ${label(s)}: ${s.url}`);
  return `${body}\n\nSources:\n${lines.join("\n")}`;
}

/** Put ``text`` on the clipboard; false when the browser would not. */
export async function copyToClipboard(text: string): Promise<boolean> {
  try {
    if (navigator.clipboard?.writeText) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch {
    // denied (no user gesture, or a frame without the permission): try the old way
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.append(area);
  area.select();
  try {
    return document.execCommand("copy");
  } catch {
    return false;
  } finally {
    area.remove();
  }
}
