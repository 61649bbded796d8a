/**
 * Following a streaming answer without fighting the reader: the log sticks to the bottom only while the
 * reader is there. Scrolling up (to reread, or to look at a source) stops the following; "Jump to latest"
 * or scrolling back down resumes it.
 */
import { useEffect, useRef, useState, type RefObject } from "react";

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

/**
 * Follow `log` to the bottom as `content` changes, only while the reader is there. Whether they were at the
 * bottom is judged against the content's height before this update, so a token arriving mid-scroll cannot pull
 * them back down. `behind` says the reader is scrolled up while more came in ("Jump to latest" is shown).
 */
export function useFollowLatest(
  log: RefObject<HTMLElement | null>,
  content: unknown,
): { behind: boolean; onScroll: () => void; jumpToLatest: () => void } {
  const lastHeight = useRef(0);
  const [behind, setBehind] = useState(false);
  useEffect(() => {
    const box = log.current;
    if (!box) return;
    const before = { scrollTop: box.scrollTop, clientHeight: box.clientHeight, scrollHeight: lastHeight.current };
    if (!lastHeight.current || atBottom(before)) {
      box.scrollTop = box.scrollHeight;
      setBehind(false);
    } else {
      setBehind(true);
    }
    lastHeight.current = box.scrollHeight;
  }, [log, content]);
  const onScroll = (): void => {
    if (log.current && atBottom(log.current)) setBehind(false);
  };
  const jumpToLatest = (): void => {
    setBehind(false);
    if (log.current) log.current.scrollTop = log.current.scrollHeight;
  };
  return { behind, onScroll, jumpToLatest };
}
