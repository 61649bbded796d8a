/** The reader's rating of a finished answer: thumbs up or down and, after a thumbs-down, what was wrong or missing. */
import { useState, type ReactNode } from "react";
import { ThumbIcon } from "./icons";
import type { AnswerMessage } from "./reducer";

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

/** Thumbs up and down (pressed as rated); after a thumbs-down, a comment box. */
export function AnswerFeedback({
  rating,
  onFeedback,
}: {
  rating: AnswerMessage["feedback"];
  onFeedback: (rating: "up" | "down", comment?: string) => void;
}): ReactNode {
  return (
    <>
      <div className="tc-feedback" role="group" aria-label="Was this answer helpful?">
        <button
          type="button"
          className="tc-icon"
          aria-pressed={rating === "up"}
          aria-label="Helpful"
          title="Helpful"
          onClick={() => onFeedback("up")}
        >
          <ThumbIcon />
        </button>
        <button
          type="button"
          className="tc-icon"
          aria-pressed={rating === "down"}
          aria-label="Not helpful"
          title="Not helpful"
          onClick={() => onFeedback("down")}
        >
          <ThumbIcon down />
        </button>
      </div>
      {rating === "down" && <DownComment onSend={(text) => onFeedback("down", text)} />}
    </>
  );
}
