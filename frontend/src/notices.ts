/**
 * Notices that describe the server, not the answer ("history is off", "no AI model: quoting the book") are
 * said once per conversation, on the first answer that carries them; notices about one answer (low
 * confidence, scope, uncited) are always shown with it. The answers keep every notice in their state.
 */
import type { Notice } from "./protocol";
import type { Message } from "./reducer";

export const ONCE_PER_CONVERSATION = new Set(["history_unavailable", "offline_generator"]);

export function visibleNotices(messages: Message[]): Map<string, Notice[]> {
  const said = new Set<string>();
  const visible = new Map<string, Notice[]>();
  for (const message of messages) {
    if (message.role !== "assistant") continue;
    visible.set(
      message.key,
      message.notices.filter((notice) => {
        if (!ONCE_PER_CONVERSATION.has(notice.code)) return true;
        if (said.has(notice.code)) return false;
        said.add(notice.code);
        return true;
      }),
    );
  }
  return visible;
}
