/** The panel's title bar: the signed-in reader's Conversations, New chat, Delete this chat (asked twice: it is for
 * good), and Close. While an answer is being written, only Close acts. */
import { useState, type ReactNode } from "react";

interface PanelHeaderProps {
  title: string;
  /** Shown for a signed-in reader: their past conversations, listed in place of this one. */
  listing: boolean | null;
  onListing: (listing: boolean) => void;
  busy: boolean;
  canDelete: boolean;
  onNewChat: () => void;
  onDelete: () => void;
  onClose: () => void;
}

export function PanelHeader(props: PanelHeaderProps): ReactNode {
  const { title, listing, onListing, busy, canDelete, onNewChat, onDelete, onClose } = props;
  const [confirmingDelete, setConfirmingDelete] = useState(false);
  return (
    <header className="tc-header">
      <h2>{title}</h2>
      <div className="tc-actions">
        {listing !== null && (
          <button
            type="button"
            className="tc-button tc-small"
            aria-pressed={listing}
            onClick={() => onListing(!listing)}
            disabled={busy}
          >
            Conversations
          </button>
        )}
        <button type="button" className="tc-button tc-small" onClick={onNewChat} disabled={busy}>
          New chat
        </button>
        {confirmingDelete ? (
          <span className="tc-confirm" role="group" aria-label="Delete this conversation for good?">
            <button
              type="button"
              className="tc-button tc-small tc-danger"
              onClick={() => {
                setConfirmingDelete(false);
                onDelete();
              }}
            >
              Delete for good
            </button>
            <button type="button" className="tc-button tc-small" onClick={() => setConfirmingDelete(false)}>
              Keep
            </button>
          </span>
        ) : (
          <button
            type="button"
            className="tc-button tc-small"
            onClick={() => setConfirmingDelete(true)}
            disabled={busy || !canDelete}
          >
            Delete this chat
          </button>
        )}
        <button type="button" className="tc-icon" aria-label="Close" onClick={onClose}>
          ✕
        </button>
      </div>
    </header>
  );
}
