/**
 * The chat panel a book mounts once per site: a floating button that opens a non-modal dialog with the
 * conversation, the module menu, selection mode ("Ask about this") and the composer with Send / Stop.
 */
import { useCallback, useEffect, useMemo, useReducer, useRef, useState, type MouseEvent, type ReactNode } from "react";
import { Answer, untilText } from "./Answer";
import { ChatIcon } from "./icons";
import { ApiError, ChatClient, uuid, type Fetch } from "./client";
import { PastConversations } from "./PastConversations";
import type { ChatRequest, FaqEntry, ModuleInfo } from "./protocol";
import { initialState, reducer, type AnswerMessage, type Session } from "./reducer";
import { visibleNotices } from "./notices";
import { inAppPath } from "./navigation";
import { atBottom } from "./scroll";
import { loadSession, saveSession } from "./sessionStore";
import { isOpenShortcut, onMac, SHORTCUT_KEYS, SHORTCUT_LABEL } from "./shortcut";
import { useSelection } from "./useSelection";

export interface ChatPanelProps {
  /** Where the chat server is, e.g. "https://chat.example.org" ("" when it serves this page). */
  apiBase?: string;
  title?: string;
  /** A signed-in reader's bearer token, if the site has one. */
  authToken?: () => string | null;
  /** Open the panel on first render (the demo page does not). */
  defaultOpen?: boolean;
  fetch?: Fetch;
  /**
   * The site's router (Docusaurus: `useHistory().push`): same-site links in answers then navigate inside the
   * single-page app instead of reloading it. Without it they are ordinary links.
   */
  navigate?: (path: string) => void;
}

type PanelNotice = { code: string; message: string } | null;

export function ChatPanel({
  apiBase = "",
  title = "Ask the textbook",
  authToken,
  defaultOpen = false,
  fetch: fetchImpl,
  navigate,
}: ChatPanelProps): ReactNode {
  const client = useMemo(
    () => new ChatClient({ apiBase, fetch: fetchImpl, authToken }),
    [apiBase, fetchImpl, authToken],
  );
  const [state, dispatch] = useReducer(reducer, initialState);
  const [open, setOpen] = useState(defaultOpen);
  const [draft, setDraft] = useState("");
  const [module, setModule] = useState("");
  const [quote, setQuote] = useState<string | null>(null);
  const [modules, setModules] = useState<ModuleInfo[]>([]);
  const [faq, setFaq] = useState<FaqEntry[]>([]);
  const [panelNotice, setPanelNotice] = useState<PanelNotice>(null);
  const [now, setNow] = useState(() => Date.now());
  const controllers = useRef(new Map<string, AbortController>());
  const panelRef = useRef<HTMLDivElement>(null);
  const launcherRef = useRef<HTMLButtonElement>(null);
  const inputRef = useRef<HTMLTextAreaElement>(null);
  const logRef = useRef<HTMLDivElement>(null);
  const loaded = useRef(false);
  const resume = useRef<(answerKey: string, streamUrl: string) => Promise<void>>(async () => {});

  const isInsidePanel = useCallback((node: Node) => Boolean(panelRef.current?.contains(node)), []);
  const [selection, clearSelection] = useSelection(isInsidePanel);

  // A conversation from the server: after a reload (its id and token live in localStorage), or picked from
  // a signed-in reader's list. An answer still being written is followed rather than shown stopped.
  const loadConversation = useCallback(
    async (session: Session): Promise<void> => {
      const messages = await client.history(session);
      dispatch({ type: "history", session, messages });
      for (const m of messages) {
        if (m.role === "assistant" && m.status === "streaming" && m.stream_url) {
          void resume.current(m.id, m.stream_url);
        }
      }
    },
    [client],
  );

  useEffect(() => {
    if (loaded.current) return;
    loaded.current = true;
    const session = loadSession();
    if (!session) return;
    loadConversation(session).catch((error: unknown) => {
      if (error instanceof ApiError && error.status === 404) saveSession(null); // purged or deleted
      else setPanelNotice({ code: "history_unavailable", message: "Your earlier conversation could not be loaded." });
    });
  }, [loadConversation]);

  // Ctrl+I (⌘I on a Mac) opens the panel from anywhere on the page, or brings focus back to its question field.
  const mac = useMemo(onMac, []);
  useEffect(() => {
    const onKey = (event: KeyboardEvent): void => {
      if (!isOpenShortcut(event, mac)) return;
      event.preventDefault();
      setOpen(true);
      inputRef.current?.focus();
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [mac]);

  // A signed-in reader's past conversations (GET /api/sessions), listed in place of the current one.
  const signedIn = Boolean(authToken?.());
  const [listing, setListing] = useState(false);
  const openPast = (session: Session): void => {
    loadConversation(session).then(
      () => {
        setListing(false);
        setPanelNotice(null);
      },
      () => setPanelNotice({ code: "history_unavailable", message: "That conversation could not be loaded." }),
    );
  };

  useEffect(() => saveSession(state.session), [state.session]);

  // The module menu and the FAQ suggestions load when the panel first opens; absence is not an error.
  useEffect(() => {
    if (!open || modules.length || faq.length) return;
    client.modules().then(setModules, () => setModules([]));
    client.faq().then(setFaq, () => setFaq([]));
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [open, client]);

  useEffect(() => {
    if (open) inputRef.current?.focus();
  }, [open, quote]);

  // Follow the stream only while the reader is at the bottom; scrolled up, they keep their place and get
  // a "Jump to latest" control instead (src/scroll.ts). Whether they were at the bottom is judged against
  // the content's height before this update, so a token arriving mid-scroll cannot pull them back down.
  const lastHeight = useRef(0);
  const [behind, setBehind] = useState(false);
  useEffect(() => {
    const log = logRef.current;
    if (!log) return;
    const before = { scrollTop: log.scrollTop, clientHeight: log.clientHeight, scrollHeight: lastHeight.current };
    if (!lastHeight.current || atBottom(before)) {
      log.scrollTop = log.scrollHeight;
      setBehind(false);
    } else {
      setBehind(true);
    }
    lastHeight.current = log.scrollHeight;
  }, [state.messages]);
  const onLogScroll = () => {
    const log = logRef.current;
    if (log && atBottom(log)) setBehind(false);
  };
  const jumpToLatest = () => {
    const log = logRef.current;
    setBehind(false);
    if (log) log.scrollTop = log.scrollHeight;
  };

  useEffect(() => {
    if (!state.rateLimitedUntil || state.rateLimitedUntil <= now) return;
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, [state.rateLimitedUntil, now]);

  useEffect(() => () => controllers.current.forEach((c) => c.abort()), []);

  const shownNotices = useMemo(() => visibleNotices(state.messages), [state.messages]);
  const streaming = state.messages.find(
    (m): m is AnswerMessage => m.role === "assistant" && ["pending", "streaming", "reconnecting"].includes(m.status),
  );
  const rateLimited = state.rateLimitedUntil !== null && state.rateLimitedUntil > now;
  const moduleTitles = useMemo(() => new Map(modules.map((m) => [m.id, m.title])), [modules]);

  const run = useCallback(
    async (answerKey: string, request: ChatRequest, from: string | null = null) => {
      const controller = new AbortController();
      controllers.current.set(answerKey, controller);
      try {
        const outcome = await client.stream(
          request,
          {
            onEvent: (event) => dispatch({ type: "event", key: answerKey, event }),
            onReconnecting: () => dispatch({ type: "reconnecting", key: answerKey }),
          },
          controller.signal,
          from,
        );
        if (outcome.kind === "failed" && outcome.failure) {
          dispatch({ type: "failed", key: answerKey, failure: outcome.failure });
        } else if (outcome.kind === "aborted") {
          dispatch({ type: "cancelled", key: answerKey });
        } else {
          dispatch({ type: "cancelled", key: answerKey }); // a 204 resume: ended while away; no-op if done arrived
        }
      } catch {
        dispatch({ type: "failed", key: answerKey, failure: { code: "client", message: "Something went wrong.", retryable: true } });
      } finally {
        controllers.current.delete(answerKey);
      }
    },
    [client],
  );

  // One listener for every link in the answers (citations, sources, links in the text): see navigation.ts.
  const followInApp = (event: MouseEvent<HTMLDivElement>): void => {
    const anchor = (event.target as Element).closest?.("a[href]");
    if (!navigate || !(anchor instanceof HTMLAnchorElement)) return;
    const path = inAppPath(anchor, event, window.location);
    if (path === null) return;
    event.preventDefault();
    navigate(path);
  };

  // Following an answer found in history: there is no question to post, only the stream to read.
  resume.current = (answerKey, streamUrl) => run(answerKey, { question: "" }, streamUrl);

  const ask = (question: string): void => {
    const text = question.trim();
    if (!text || streaming || rateLimited) return;
    const request: ChatRequest = { question: text, page_url: window.location.href, client_request_id: uuid() };
    attachSession(request, state.session);
    if (module) request.module = module;
    if (quote) request.selected_text = quote;
    const answerKey = uuid();
    dispatch({ type: "ask", key: uuid(), answerKey, request });
    setDraft("");
    setQuote(null);
    void run(answerKey, request);
  };

  const retry = (message: AnswerMessage): void => {
    if (!message.request || streaming) return;
    // A fresh client_request_id: the failed attempt may have been stored as failed under the old one.
    const request = { ...message.request, client_request_id: uuid() };
    if (!request.session_id) attachSession(request, state.session);
    dispatch({ type: "retry", key: message.key });
    void run(message.key, request);
  };

  const stop = async (): Promise<void> => {
    if (!streaming) return;
    const controller = controllers.current.get(streaming.key);
    const stopped = streaming.streamUrl ? await client.stop(streaming.streamUrl) : false;
    // The stream ends by itself with done/cancelled after a successful DELETE; otherwise cut it here.
    if (!stopped) controller?.abort();
    else setTimeout(() => controller?.abort(), 3000);
  };

  const newChat = (): void => {
    if (streaming) return;
    setListing(false);
    dispatch({ type: "new_chat" });
    setPanelNotice(null);
    inputRef.current?.focus();
  };

  // Deleting is for good (the server cascades to every message): the first click asks, the second deletes.
  const [confirmingDelete, setConfirmingDelete] = useState(false);
  const deleteChat = async (): Promise<void> => {
    setConfirmingDelete(false);
    if (streaming) return;
    const session = state.session;
    if (session) {
      try {
        await client.deleteSession(session);
      } catch (error) {
        setPanelNotice({ code: "delete_failed", message: error instanceof Error ? error.message : "Could not delete." });
        return;
      }
    }
    dispatch({ type: "new_chat" });
    setPanelNotice({ code: "deleted", message: "This conversation was deleted." });
  };

  const feedback = (message: AnswerMessage, rating: "up" | "down", comment?: string): void => {
    if (!message.messageId) return;
    const before = comment ? rating : message.feedback;
    dispatch({ type: "feedback", key: message.key, rating });
    client.feedback(message.messageId, rating, state.session, comment).then(
      () => comment && setPanelNotice({ code: "feedback_saved", message: "Thank you: the book's authors will see this." }),
      () => {
        dispatch({ type: "feedback", key: message.key, rating: before }); // not saved: the button is not left pressed
        setPanelNotice({ code: "feedback_failed", message: "Your rating could not be saved." });
      },
    );
  };

  const askAboutSelection = (): void => {
    if (!selection) return;
    setQuote(selection.text);
    clearSelection();
    window.getSelection()?.removeAllRanges();
    setOpen(true);
  };

  const close = (): void => {
    setOpen(false);
    // After the render: on a phone the launcher is hidden while the panel is open (panel.css).
    requestAnimationFrame(() => launcherRef.current?.focus());
  };

  return (
    <div className="tc-root">
      {selection && !streaming && (
        <button
          type="button"
          className="tc-ask-selection"
          style={{ top: selection.top, left: selection.left }}
          onMouseDown={(e) => e.preventDefault()} // keep the selection alive until the click lands
          onClick={askAboutSelection}
        >
          Ask about this
        </button>
      )}
      <button
        ref={launcherRef}
        type="button"
        className="tc-launcher"
        aria-expanded={open}
        aria-controls="tc-panel"
        aria-keyshortcuts={SHORTCUT_KEYS(mac)}
        title={open ? undefined : `${title} (${SHORTCUT_LABEL(mac)})`}
        onClick={() => (open ? close() : setOpen(true))}
      >
        <ChatIcon /> {open ? "Close chat" : title}
      </button>
      <div
        id="tc-panel"
        ref={panelRef}
        className="tc-panel"
        role="dialog"
        aria-label={title}
        hidden={!open}
        onKeyDown={(e) => {
          if (e.key === "Escape") close();
        }}
      >
        <header className="tc-header">
          <h2>{title}</h2>
          <div className="tc-actions">
            {signedIn && (
              <button
                type="button"
                className="tc-button tc-small"
                aria-pressed={listing}
                onClick={() => setListing(!listing)}
                disabled={Boolean(streaming)}
              >
                Conversations
              </button>
            )}
            <button type="button" className="tc-button tc-small" onClick={newChat} disabled={Boolean(streaming)}>
              New chat
            </button>
            {confirmingDelete ? (
              <span className="tc-confirm" role="group" aria-label="Delete this conversation for good?">
                <button type="button" className="tc-button tc-small tc-danger" onClick={() => void deleteChat()}>
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
                disabled={Boolean(streaming) || (!state.session && state.messages.length === 0)}
              >
                Delete this chat
              </button>
            )}
            <button type="button" className="tc-icon" aria-label="Close" onClick={close}>
              ✕
            </button>
          </div>
        </header>
        <label className="tc-scope">
          <span>Search in</span>
          <select value={module} onChange={(e) => setModule(e.target.value)} aria-label="Module to search">
            <option value="">The whole book</option>
            {modules.map((m) => (
              <option key={m.id} value={m.id}>
                {m.title}
              </option>
            ))}
          </select>
        </label>
        {panelNotice && (
          <div className="tc-notice" role="status" data-code={panelNotice.code}>
            {panelNotice.message}
          </div>
        )}
        <div
          className="tc-log"
          ref={logRef}
          role="log"
          aria-live="polite"
          aria-relevant="additions text"
          onScroll={onLogScroll}
          onClick={followInApp}
        >
          {listing && (
            <PastConversations
              client={client}
              current={state.session?.id ?? null}
              onOpen={(id) => openPast({ id, token: state.session?.id === id ? state.session.token : "" })}
              onClose={() => setListing(false)}
            />
          )}
          {!listing && state.messages.length === 0 && (
            <div className="tc-empty">
              <p>Ask a question about the book. Answers cite the sections they come from.</p>
              {faq.length > 0 && (
                <>
                  <p className="tc-muted">Common questions:</p>
                  <ul className="tc-suggestions">
                    {faq.slice(0, 4).map((entry) => (
                      <li key={entry.question}>
                        <button type="button" className="tc-link" onClick={() => ask(entry.question)}>
                          {entry.question}
                        </button>
                      </li>
                    ))}
                  </ul>
                </>
              )}
            </div>
          )}
          {!listing &&
            state.messages.map((m) =>
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
                canRetry={!streaming && !rateLimited}
                onRetry={() => retry(m)}
                onFeedback={(rating, comment) => feedback(m, rating, comment)}
              />
            ),
          )}
        </div>
        {behind && (
          <button type="button" className="tc-jump" onClick={jumpToLatest}>
            Jump to latest ↓
          </button>
        )}
        <form
          className="tc-composer"
          onSubmit={(e) => {
            e.preventDefault();
            ask(draft);
          }}
        >
          {quote && (
            <div className="tc-selection" aria-label="Selected text">
              <span className="tc-muted">Asking about the selection:</span>
              <blockquote className="tc-quote">{quote}</blockquote>
              <button type="button" className="tc-link" onClick={() => setQuote(null)}>
                Ask about the whole book instead
              </button>
            </div>
          )}
          {rateLimited && (
            <p className="tc-notice" role="status" data-code="rate_limited">
              Question limit reached. You can ask again {untilText(state.rateLimitedUntil!, now)}.
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
              onChange={(e) => setDraft(e.target.value)}
              onKeyDown={(e) => {
                if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) {
                  e.preventDefault();
                  ask(draft);
                }
              }}
            />
            {streaming ? (
              <button type="button" className="tc-button tc-stop" onClick={() => void stop()}>
                Stop
              </button>
            ) : (
              <button type="submit" className="tc-button tc-primary" disabled={!draft.trim() || rateLimited}>
                Send
              </button>
            )}
          </div>
        </form>
      </div>
    </div>
  );
}

/** The conversation a question belongs to: its id, and its token when this browser holds one (a signed-in
 * reader's conversation opened from their list has none; their bearer token proves it is theirs). */
function attachSession(request: ChatRequest, session: Session | null): void {
  if (!session) return;
  request.session_id = session.id;
  if (session.token) request.session_token = session.token;
}
