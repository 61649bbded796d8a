/**
 * Citations on a single-page site (Docusaurus): a plain click on a link to this same site is handed to the
 * site's router, so the page does not reload (the panel stays open, a live answer keeps streaming, the
 * conversation is not lost without history). Anything else, a new tab (ctrl/cmd/shift/middle click), another
 * site, a download, is left to the browser.
 */

export interface ClickLike {
  button: number;
  metaKey: boolean;
  ctrlKey: boolean;
  shiftKey: boolean;
  altKey: boolean;
  defaultPrevented: boolean;
}

/** The in-app path (path, query and fragment) a click on `anchor` should go to, or null to let the browser act. */
export function inAppPath(
  anchor: { href: string; target?: string; hasAttribute(name: string): boolean },
  click: ClickLike,
  here: { origin: string },
): string | null {
  if (click.defaultPrevented || click.button !== 0) return null;
  if (click.metaKey || click.ctrlKey || click.shiftKey || click.altKey) return null;
  if (anchor.hasAttribute("download") || (anchor.target && !["_self", "_top", ""].includes(anchor.target))) return null;
  let url: URL;
  try {
    url = new URL(anchor.href, here.origin);
  } catch {
    return null;
  }
  if (url.origin !== here.origin || !/^https?:$/.test(url.protocol)) return null;
  return url.pathname + url.search + url.hash;
}
