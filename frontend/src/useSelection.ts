/** The "Ask about this" affordance: the reader's current text selection on the page (outside the panel). */
import { useEffect, useState } from "react";

export interface PageSelection {
  text: string;
  /** Viewport position for the floating button, just below the selection's end. */
  top: number;
  left: number;
}

export const MAX_SELECTION_CHARS = 4000;

export function useSelection(isInsidePanel: (node: Node) => boolean): [PageSelection | null, () => void] {
  const [selection, setSelection] = useState<PageSelection | null>(null);
  useEffect(() => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const read = (): void => {
      clearTimeout(timer);
      // Wait for the selection to settle (a drag fires many events), then read it once.
      timer = setTimeout(() => setSelection(currentSelection(isInsidePanel)), 120);
    };
    document.addEventListener("selectionchange", read);
    return () => {
      clearTimeout(timer);
      document.removeEventListener("selectionchange", read);
    };
  }, [isInsidePanel]);
  return [selection, () => setSelection(null)];
}

function currentSelection(isInsidePanel: (node: Node) => boolean): PageSelection | null {
  const sel = window.getSelection();
  if (!sel || sel.isCollapsed || sel.rangeCount === 0) return null;
  const text = sel.toString().replace(/\s+/g, " ").trim();
  if (text.length < 3) return null;
  const range = sel.getRangeAt(0);
  if (isInsidePanel(range.commonAncestorContainer)) return null;
  const rects = range.getClientRects();
  const rect = rects.length ? rects[rects.length - 1] : range.getBoundingClientRect();
  return {
    text: text.slice(0, MAX_SELECTION_CHARS),
    top: Math.min(rect.bottom + 8, window.innerHeight - 48),
    left: Math.max(8, Math.min(rect.right - 60, window.innerWidth - 160)),
  };
}
