/**
 * The conversation's log: the questions and answers (or, in their place, a signed-in reader's past conversations),
 * the common questions while it is empty, following a streaming answer while the reader is at the bottom ("Jump to
 * latest" otherwise), and links in answers handed to the site's router (src/navigation.ts).
 */
import { useMemo, useRef, type MouseEvent, type ReactNode } from "react";
import { Answer } from "./Answer";
import { inAppPath } from "./navigation";
import { visibleNotices } from "./notices";
import type { FaqEntry } from "./protocol";
import type { AnswerMessage, Message } from "./reducer";
import { useFollowLatest } from "./scroll";

interface MessageListProps {
  messages: Message[];
  /** Shown in place of the messages (the past conversations), when set. */
  instead: ReactNode;
  faq: FaqEntry[];
  moduleTitles: Map<string, string>;
  canRetry: boolean;
  onAsk: (question: string) => void;
  onRetry: (message: AnswerMessage) => void;
  onFeedback: (message: AnswerMessage, rating: "up" | "down", comment?: string) => void;
  navigate?: (path: string) => void;
}

export function MessageList(props: MessageListProps): ReactNode {
  const { messages, instead, faq, moduleTitles, canRetry, onAsk, onRetry, onFeedback, navigate } = props;
  const logRef = useRef<HTMLDivElement>(null);
  const { behind, onScroll, jumpToLatest } = useFollowLatest(logRef, messages);
  const shownNotices = useMemo(() => visibleNotices(messages), [messages]);

  // One listener for every link in the answers (citations, sources, links in the text).
  const followInApp = (event: MouseEvent<HTMLDivElement>): void => {
    const anchor = (event.target as Element).closest?.("a[href]");
    if (!navigate || !(anchor instanceof HTMLAnchorElement)) return;
    const path = inAppPath(anchor, event, window.location);
    if (path === null) return;
    event.preventDefault();
    navigate(path);
  };

  return (
    <>
      <div
        className="tc-log"
        ref={logRef}
        role="log"
        aria-live="polite"
        aria-relevant="additions text"
        onScroll={onScroll}
        onClick={followInApp}
      >
        {instead}
        {!instead && messages.length === 0 && <Welcome faq={faq} onAsk={onAsk} />}
        {!instead &&
          messages.map((m) =>
            m.role === "user" ? (
              <div key={m.key} className="tc-question">
                {m.selectedText && <blockquote className="tc-quote">{m.selectedText}</blockquote>}
                <p>{m.text}</p>
              </div>
            ) : (
              <Answer
                key={m.key}
                message={m}
                moduleTitles={moduleTitles}
                notices={shownNotices.get(m.key)}
                canRetry={canRetry}
                onRetry={() => onRetry(m)}
                onFeedback={(rating, comment) => onFeedback(m, rating, comment)}
              />
            ),
          )}
      </div>
      {behind && (
        <button type="button" className="tc-jump" onClick={jumpToLatest}>
          Jump to latest ↓
        </button>
      )}
    </>
  );
}

/** An empty conversation: what the panel is for, and up to four of the book's common questions to ask. */
function Welcome({ faq, onAsk }: { faq: FaqEntry[]; onAsk: (question: string) => void }): ReactNode {
  return (
    <div className="tc-empty">
      <p>Ask a question about the book. Answers cite the sections they come from.</p>
      {faq.length > 0 && (
        <>
          <p className="tc-muted">Common questions:</p>
          <ul className="tc-suggestions">
            {faq.slice(0, 4).map((entry) => (
              <li key={entry.question}>
                <button type="button" className="tc-link" onClick={() => onAsk(entry.question)}>
                  {entry.question}
                </button>
              </li>
            ))}
          </ul>
        </>
      )}
    </div>
  );
}
