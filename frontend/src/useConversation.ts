/**
 * The conversation and its session: the messages (src/reducer.ts), the session id and token kept in localStorage,
 * the history loaded after a reload or picked from a signed-in reader's list (an answer still being written is
 * followed, not shown stopped), a new chat, deleting one for good, the answers' ratings, and the panel's notice
 * about them.
 */
import { useCallback, useEffect, useReducer, useRef, useState, type Dispatch } from "react";
import { ApiError } from "./apiErrors";
import type { ChatClient } from "./client";
import { initialState, reducer, type Action, type AnswerMessage, type ChatState, type Session } from "./reducer";
import { loadSession, saveSession } from "./sessionStore";
import { useChatStream, type ChatStream } from "./useChatStream";

export type PanelNotice = { code: string; message: string } | null;

export interface Conversation {
  state: ChatState;
  dispatch: Dispatch<Action>;
  stream: ChatStream;
  notice: PanelNotice;
  setNotice: (notice: PanelNotice) => void;
  /** Open a past conversation; whether it loaded (if not, the notice says so). */
  openPast: (session: Session) => Promise<boolean>;
  newChat: () => void;
  deleteChat: () => Promise<void>;
  /** Rate an answer (a thumbs-down may say why); a rating the server did not keep is taken back. */
  feedback: (message: AnswerMessage, rating: "up" | "down", comment?: string) => void;
}

export function useConversation(client: ChatClient): Conversation {
  const [state, dispatch] = useReducer(reducer, initialState);
  const [notice, setNotice] = useState<PanelNotice>(null);
  const stream = useChatStream(client, dispatch);
  const { run } = stream;

  const load = useCallback(
    async (session: Session): Promise<void> => {
      const messages = await client.history(session);
      dispatch({ type: "history", session, messages });
      for (const m of messages) {
        // Following an answer found in history: there is no question to post, only the stream to read.
        if (m.role === "assistant" && m.status === "streaming" && m.stream_url) void run(m.id, { question: "" }, m.stream_url);
      }
    },
    [client, run],
  );

  // After a reload: the conversation whose id and token this browser kept.
  const restored = useRef(false);
  useEffect(() => {
    if (restored.current) return;
    restored.current = true;
    const session = loadSession();
    if (!session) return;
    load(session).catch((error: unknown) => {
      if (error instanceof ApiError && error.status === 404) saveSession(null); // purged or deleted
      else setNotice({ code: "history_unavailable", message: "Your earlier conversation could not be loaded." });
    });
  }, [load]);

  useEffect(() => saveSession(state.session), [state.session]);

  const openPast = (session: Session): Promise<boolean> =>
    load(session).then(
      () => {
        setNotice(null);
        return true;
      },
      () => {
        setNotice({ code: "history_unavailable", message: "That conversation could not be loaded." });
        return false;
      },
    );

  const newChat = (): void => {
    dispatch({ type: "new_chat" });
    setNotice(null);
  };

  // For good: the server cascades to every message.
  const deleteChat = async (): Promise<void> => {
    if (state.session) {
      try {
        await client.deleteSession(state.session);
      } catch (error) {
        setNotice({ code: "delete_failed", message: error instanceof Error ? error.message : "Could not delete." });
        return;
      }
    }
    dispatch({ type: "new_chat" });
    setNotice({ code: "deleted", message: "This conversation was deleted." });
  };

  const feedback = (message: AnswerMessage, rating: "up" | "down", comment?: string): void => {
    if (!message.messageId) return;
    const before = comment ? rating : message.feedback;
    dispatch({ type: "feedback", key: message.key, rating });
    client.feedback(message.messageId, rating, state.session, comment).then(
      () => comment && setNotice({ code: "feedback_saved", message: "Thank you: the book's authors will see this." }),
      () => {
        dispatch({ type: "feedback", key: message.key, rating: before }); // not saved: the button is not left pressed
        setNotice({ code: "feedback_failed", message: "Your rating could not be saved." });
      },
    );
  };

  return { state, dispatch, stream, notice, setNotice, openPast, newChat, deleteChat, feedback };
}
