/** A signed-in reader's past conversations, newest first: pick one to read and continue it. */
import { useEffect, useState, type ReactNode } from "react";
import type { ChatClient } from "./client";
import type { SessionSummary } from "./protocol";

interface PastConversationsProps {
  client: ChatClient;
  current: string | null;
  onOpen: (sessionId: string) => void;
  onClose: () => void;
}

export function PastConversations({ client, current, onOpen, onClose }: PastConversationsProps): ReactNode {
  const [sessions, setSessions] = useState<SessionSummary[] | null>(null);
  const [failed, setFailed] = useState(false);
  useEffect(() => {
    let live = true;
    client.sessions().then(
      (found) => live && setSessions(found),
      () => live && setFailed(true),
    );
    return () => {
      live = false;
    };
  }, [client]);
  return (
    <nav className="tc-past" aria-label="Your conversations">
      <h3>Your conversations</h3>
      {failed ? (
        <p role="alert">Your conversations could not be loaded.</p>
      ) : sessions === null ? (
        <p className="tc-muted">Loading…</p>
      ) : sessions.length === 0 ? (
        <p className="tc-muted">No earlier conversations yet.</p>
      ) : (
        <ul>
          {sessions.map((s) => (
            <li key={s.id}>
              <button
                type="button"
                className="tc-link"
                aria-current={s.id === current ? "true" : undefined}
                onClick={() => onOpen(s.id)}
              >
                {s.title?.trim() || "Untitled conversation"}
              </button>
              <span className="tc-muted">
                {" "}
                {new Date(s.last_activity_at).toLocaleDateString()} · {s.message_count} messages
              </span>
            </li>
          ))}
        </ul>
      )}
      <button type="button" className="tc-link" onClick={onClose}>
        Back to the conversation
      </button>
    </nav>
  );
}
