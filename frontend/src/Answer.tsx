/** One assistant answer: its notices, the streamed Markdown with citation links, the sources, feedback, retry. */
import { useState, type ReactNode } from "react";
import { splitSources } from "./citations";
import { confidenceCue } from "./confidence";
import { CopyButton } from "./CopyButton";
import { answerAsText } from "./copyText";
import { ThumbIcon } from "./icons";
import { Markdown } from "./markdown";
import type { Notice, Source } from "./protocol";
import type { AnswerMessage } from "./reducer";

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
      {canRate(message) && (
        <div className="tc-feedback" role="group" aria-label="Was this answer helpful?">
          <button
            type="button"
            className="tc-icon"
            aria-pressed={message.feedback === "up"}
            aria-label="Helpful"
            title="Helpful"
            onClick={() => onFeedback("up")}
          >
            <ThumbIcon />
          </button>
          <button
            type="button"
            className="tc-icon"
            aria-pressed={message.feedback === "down"}
            aria-label="Not helpful"
            title="Not helpful"
            onClick={() => onFeedback("down")}
          >
            <ThumbIcon down />
          </button>
        </div>
      )}
      {canRate(message) && message.feedback === "down" && <DownComment onSend={(text) => onFeedback("down", text)} />}
    </article>
  );
}

/** Thumbs only where a rating can be kept: a finished, stored answer (not on a server without history). */
export function canRate(message: AnswerMessage): boolean {
  const stored = !message.notices.some((n) => n.code === "history_unavailable");
  return (
    message.status === "done" &&
    Boolean(message.messageId) &&
    message.finishReason !== "declined" &&
    message.finishReason !== "cancelled" &&
    stored
  );
}

/** After a thumbs-down: what was wrong or missing, in the reader's words (the API keeps up to 2,000 characters). */
function DownComment({ onSend }: { onSend: (text: string) => void }): ReactNode {
  const [text, setText] = useState("");
  const [sent, setSent] = useState(false);
  if (sent) return null;
  return (
    <form
      className="tc-comment"
      onSubmit={(e) => {
        e.preventDefault();
        if (!text.trim()) return;
        onSend(text.trim());
        setSent(true);
      }}
    >
      <label>
        What was wrong or missing? (optional)
        <textarea value={text} maxLength={2000} rows={2} onChange={(e) => setText(e.target.value)} />
      </label>
      <button type="submit" className="tc-button tc-small" disabled={!text.trim()}>
        Send
      </button>
    </form>
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

function Sources({
  sources,
  heading,
  titles,
  muted = false,
}: {
  sources: Source[];
  heading: string;
  titles: Map<string, string>;
  muted?: boolean;
}): ReactNode {
  // The excerpt shows on hover where there is a mouse; on a touch screen the "Preview" toggle opens it in place.
  const [previewing, setPreviewing] = useState<number | null>(null);
  return (
    <section className={muted ? "tc-sources tc-sources--related" : "tc-sources"} aria-label={heading}>
      <h4>{heading}</h4>
      <ol>
        {sources.map((s) => (
          <li key={s.n} value={s.n} className={previewing === s.n ? "tc-previewing" : undefined}>
            <a href={s.url} className="tc-source" data-n={s.n} target="_top">
              {sourceLabel(s, titles)}
            </a>
            {s.excerpt && (
              <>
                <button
                  type="button"
                  className="tc-link tc-preview-toggle"
                  aria-expanded={previewing === s.n}
                  aria-controls={`tc-excerpt-${s.n}`}
                  onClick={() => setPreviewing(previewing === s.n ? null : s.n)}
                >
                  {previewing === s.n ? "Hide preview" : "Preview"}
                </button>
                <span className="tc-excerpt" id={`tc-excerpt-${s.n}`} role="tooltip">
                  {s.excerpt}
                </span>
              </>
            )}
          </li>
        ))}
      </ol>
    </section>
  );
}

/** "Module › Chapter › Heading", skipping parts that repeat the previous one. */
export function sourceLabel(source: Source, moduleTitles: Map<string, string> = new Map()): string {
  const module = moduleTitles.get(source.module) ?? source.module;
  const parts = [module, source.chapter || source.title, ...(source.heading_path ?? [])];
  const out: string[] = [];
  for (const part of parts) {
    const clean = (part ?? "").trim();
    if (clean && !out.includes(clean)) out.push(clean);
  }
  return out.join(" › ");
}

function failureText(message: AnswerMessage): string {
  const failure = message.failure!;
  if (failure.retryAt) {
    return `${failure.message} You can ask again ${untilText(failure.retryAt)}.`;
  }
  return failure.message || "Something went wrong.";
}

export function untilText(at: number, now: number = Date.now()): string {
  const seconds = Math.max(0, Math.ceil((at - now) / 1000));
  if (seconds < 60) return `in ${seconds} s`;
  const minutes = Math.ceil(seconds / 60);
  if (minutes < 60) return `in ${minutes} min`;
  return `at ${new Date(at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}`;
}
