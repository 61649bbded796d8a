/**
 * Following a streaming answer without fighting the reader: the log sticks to the bottom only while the
 * reader is there. Scrolling up (to reread, or to look at a source) stops the following; "Jump to latest"
 * or scrolling back down resumes it.
 */

export interface ScrollBox {
  scrollTop: number;
  scrollHeight: number;
  clientHeight: number;
}

/** Within this many pixels of the bottom counts as "at the bottom" (sub-pixel rounding, a line being added). */
export const BOTTOM_SLACK_PX = 24;

export function atBottom(box: ScrollBox, slack = BOTTOM_SLACK_PX): boolean {
  return box.scrollHeight - box.clientHeight - box.scrollTop <= slack;
}
