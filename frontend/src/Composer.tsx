/**
 * Where the reader writes: the question (Enter sends, Shift+Enter is a new line), the passage asked about in
 * selection mode, the notice while asking is refused (429), and Send, or Stop while an answer is being written.
 */
import type { ReactNode, RefObject } from "react";

interface ComposerProps {
  draft: string;
  onDraft: (text: string) => void;
  /** The passage selected on the page the question is about (selection mode), if any. */
  quote: string | null;
  onDropQuote: () => void;
  /** While asking is refused: when it is allowed again, in words ("in 42 s"); null otherwise. */
  rateLimitedAgain: string | null;
  streaming: boolean;
  onAsk: (question: string) => void;
  onStop: () => void;
  inputRef: RefObject<HTMLTextAreaElement | null>;
}

export function Composer(props: ComposerProps): ReactNode {
  const { draft, onDraft, quote, onDropQuote, rateLimitedAgain, streaming, onAsk, onStop, inputRef } = props;
  return (
    <form
      className="tc-composer"
      onSubmit={(e) => {
        e.preventDefault();
        onAsk(draft);
      }}
    >
      {quote && (
        <div className="tc-selection" aria-label="Selected text">
          <span className="tc-muted">Asking about the selection:</span>
          <blockquote className="tc-quote">{quote}</blockquote>
          <button type="button" className="tc-link" onClick={onDropQuote}>
            Ask about the whole book instead
          </button>
        </div>
      )}
      {rateLimitedAgain !== null && (
        <p className="tc-notice" role="status" data-code="rate_limited">
          Question limit reached. You can ask again {rateLimitedAgain}.
        </p>
      )}
      <div className="tc-row">
        <textarea
          ref={inputRef}
          value={draft}
          rows={2}
          maxLength={2000}
          aria-label="Your question"
          placeholder={quote ? "What would you like to know about this passage?" : "Ask about the textbook…"}
          onChange={(e) => onDraft(e.target.value)}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) {
              e.preventDefault();
              onAsk(draft);
            }
          }}
        />
        {streaming ? (
          <button type="button" className="tc-button tc-stop" onClick={onStop}>
            Stop
          </button>
        ) : (
          <button type="submit" className="tc-button tc-primary" disabled={!draft.trim() || rateLimitedAgain !== null}>
            Send
          </button>
        )}
      </div>
    </form>
  );
}
