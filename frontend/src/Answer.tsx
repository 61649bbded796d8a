/** One assistant answer: its notices, the streamed Markdown with citation links, its sources (src/Sources.tsx),
 * how well the book supports it, Copy, retry, and the reader's rating (src/AnswerFeedback.tsx). */
import type { ReactNode } from "react";
import { AnswerFeedback, canRate } from "./AnswerFeedback";
import { splitSources } from "./citations";
import { confidenceCue } from "./confidence";
import { CopyButton } from "./CopyButton";
import { answerAsText } from "./copyText";
import { Markdown } from "./markdown";
import type { Notice } from "./protocol";
import { untilText } from "./rateLimit";
import type { AnswerMessage } from "./reducer";
import { sourceLabel, Sources } from "./Sources";

interface AnswerProps {
  message: AnswerMessage;
  onRetry: () => void;
  onFeedback: (rating: "up" | "down", comment?: string) => void;
  canRetry: boolean;
  /** Module id → title, from /api/modules (sources name their module by id). */
  moduleTitles: Map<string, string>;
  /** The notices to show (some are said once per conversation: src/notices.ts); all of them when absent. */
  notices?: Notice[];
}

const NOTICE_TITLES: Record<string, string> = {
  low_confidence: "Low confidence",
  scope_widened: "Searched the whole book",
  scope_partial: "Partly outside this module",
  scope_limited: "Limited to this module",
  history_unavailable: "History unavailable",
  fallback_faq: "From the FAQ",
  offline_generator: "Offline answer",
  llm_retry: "Retrying",
};

export function Answer({ message, onRetry, onFeedback, canRetry, moduleTitles, notices }: AnswerProps): ReactNode {
  const declined = message.finishReason === "declined";
  const open = message.status === "pending" || message.status === "streaming" || message.status === "reconnecting";
  const citations = message.sources.map((s) => ({ n: s.n, url: s.url, title: sourceLabel(s, moduleTitles) }));
  const { cited, related } = splitSources(message.text, message.sources);
  return (
    <article
      className={`tc-answer tc-answer--${message.status}`}
      aria-busy={open}
      data-finish={message.finishReason ?? undefined}
      data-message-id={message.messageId ?? undefined}
    >
      {(notices ?? message.notices).map((notice, i) => (
        <NoticeBanner key={i} notice={notice} />
      ))}
      {message.status === "pending" && <p className="tc-typing">Searching the textbook…</p>}
      {message.status === "reconnecting" && (
        <p className="tc-typing" role="status">
          Connection lost, reconnecting…
        </p>
      )}
      {message.text && (
        <div className="tc-markdown">
          <Markdown text={message.text} citations={citations} />
          {open && <span className="tc-caret" aria-hidden="true" />}
        </div>
      )}
      {message.finishReason === "cancelled" && <p className="tc-muted">Stopped.</p>}
      {message.sources.length > 0 &&
        (declined ? (
          <Sources sources={message.sources} heading="Sections that may help" titles={moduleTitles} />
        ) : (
          <>
            <Sources sources={cited} heading="Sources" titles={moduleTitles} />
            {related.length > 0 && (
              <Sources sources={related} heading="Related sections" titles={moduleTitles} muted />
            )}
          </>
        ))}
      {message.failure && (
        <div className="tc-error" role="alert">
          <p>{failureText(message)}</p>
          {message.failure.retryable && message.request && (
            <button type="button" className="tc-button" onClick={onRetry} disabled={!canRetry}>
              Retry
            </button>
          )}
        </div>
      )}
      {message.status === "done" && (
        <div className="tc-answer-footer">
          <ConfidenceMeter message={message} />
          {message.text.trim() && (
            <CopyButton
              what="answer"
              text={() => answerAsText(message.text, declined ? [] : cited, (s) => sourceLabel(s, moduleTitles))}
            />
          )}
        </div>
      )}
      {canRate(message) && <AnswerFeedback rating={message.feedback} onFeedback={onFeedback} />}
    </article>
  );
}

/** How well the book supports the answer, in words and a three-step meter (src/confidence.ts). */
function ConfidenceMeter({ message }: { message: AnswerMessage }): ReactNode {
  const cue = confidenceCue(message.confidenceLevel, message.finishReason);
  if (!cue) return null;
  return (
    <p className={`tc-confidence tc-confidence--${cue.level}`} title={cue.detail} data-level={cue.level}>
      <span className="tc-meter" aria-hidden="true">
        {[1, 2, 3].map((step) => (
          <span key={step} className={step <= cue.steps ? "tc-meter-on" : undefined} />
        ))}
      </span>
      <span>{cue.label}</span>
      <span className="tc-visually-hidden">. {cue.detail}</span>
    </p>
  );
}

function NoticeBanner({ notice }: { notice: Notice }): ReactNode {
  const title = NOTICE_TITLES[notice.code] ?? "Note";
  return (
    <div className={`tc-notice tc-notice--${notice.code}`} role="note" data-code={notice.code}>
      <strong>{title}:</strong> {notice.message}
    </div>
  );
}

function failureText(message: AnswerMessage): string {
  const failure = message.failure!;
  if (failure.retryAt) {
    return `${failure.message} You can ask again ${untilText(failure.retryAt)}.`;
  }
  return failure.message || "Something went wrong.";
}
