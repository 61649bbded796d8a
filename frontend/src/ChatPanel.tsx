/**
 * The chat panel a book mounts once per site: a floating button that opens a non-modal dialog with the
 * conversation, the module menu, selection mode ("Ask about this") and the composer with Send / Stop.
 * Its parts: the conversation and its session (useConversation, with the streams of useChatStream), the
 * title bar (PanelHeader), the log (MessageList) and the composer (Composer).
 */
import { useCallback, useEffect, useMemo, useRef, useState, type ReactNode } from "react";
import { ChatClient, type Fetch } from "./client";
import { uuid } from "./uuid";
import { Composer } from "./Composer";
import { ChatIcon } from "./icons";
import { MessageList } from "./MessageList";
import { PanelHeader } from "./PanelHeader";
import { PastConversations } from "./PastConversations";
import type { ChatRequest } from "./protocol";
import { useRateLimit } from "./rateLimit";
import type { AnswerMessage, Session } from "./reducer";
import { onMac, SHORTCUT_KEYS, SHORTCUT_LABEL, useOpenShortcut } from "./shortcut";
import { useBookInfo } from "./useBookInfo";
import { useConversation } from "./useConversation";
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
  const { state, dispatch, stream, notice, openPast, newChat, deleteChat, feedback } = useConversation(client);
  const [open, setOpen] = useState(defaultOpen);
  const [draft, setDraft] = useState("");
  const [module, setModule] = useState("");
  const [quote, setQuote] = useState<string | null>(null);
  const [listing, setListing] = useState(false);
  const { modules, faq } = useBookInfo(client, open);
  const rateLimit = useRateLimit(state.rateLimitedUntil);
  const panelRef = useRef<HTMLDivElement>(null);
  const launcherRef = useRef<HTMLButtonElement>(null);
  const inputRef = useRef<HTMLTextAreaElement>(null);

  const isInsidePanel = useCallback((node: Node) => Boolean(panelRef.current?.contains(node)), []);
  const [selection, clearSelection] = useSelection(isInsidePanel);

  // Ctrl+I (⌘I on a Mac) opens the panel from anywhere on the page, or brings focus back to its question field.
  const mac = useMemo(onMac, []);
  useOpenShortcut(
    mac,
    useCallback(() => {
      setOpen(true);
      inputRef.current?.focus();
    }, []),
  );
  useEffect(() => {
    if (open) inputRef.current?.focus();
  }, [open, quote]);

  const streaming = state.messages.find(
    (m): m is AnswerMessage => m.role === "assistant" && ["pending", "streaming", "reconnecting"].includes(m.status),
  );
  const moduleTitles = useMemo(() => new Map(modules.map((m) => [m.id, m.title])), [modules]);
  const signedIn = Boolean(authToken?.());

  const ask = (question: string): void => {
    const text = question.trim();
    if (!text || streaming || rateLimit.limited) return;
    const request: ChatRequest = { question: text, page_url: window.location.href, client_request_id: uuid() };
    attachSession(request, state.session);
    if (module) request.module = module;
    if (quote) request.selected_text = quote;
    const answerKey = uuid();
    dispatch({ type: "ask", key: uuid(), answerKey, request });
    setDraft("");
    setQuote(null);
    void stream.run(answerKey, request);
  };

  const retry = (message: AnswerMessage): void => {
    if (!message.request || streaming) return;
    // A fresh client_request_id: the failed attempt may have been stored as failed under the old one.
    const request = { ...message.request, client_request_id: uuid() };
    if (!request.session_id) attachSession(request, state.session);
    dispatch({ type: "retry", key: message.key });
    void stream.run(message.key, request);
  };

  const startNewChat = (): void => {
    if (streaming) return;
    setListing(false);
    newChat();
    inputRef.current?.focus();
  };

  const pickPast = (session: Session): void => {
    void openPast(session).then((loaded) => loaded && setListing(false));
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
        <PanelHeader
          title={title}
          listing={signedIn ? listing : null}
          onListing={setListing}
          busy={Boolean(streaming)}
          canDelete={Boolean(state.session) || state.messages.length > 0}
          onNewChat={startNewChat}
          onDelete={() => {
            if (!streaming) void deleteChat();
          }}
          onClose={close}
        />
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
        {notice && (
          <div className="tc-notice" role="status" data-code={notice.code}>
            {notice.message}
          </div>
        )}
        <MessageList
          messages={state.messages}
          instead={
            listing && (
              <PastConversations
                client={client}
                current={state.session?.id ?? null}
                onOpen={(id) => pickPast({ id, token: state.session?.id === id ? state.session.token : "" })}
                onClose={() => setListing(false)}
              />
            )
          }
          faq={faq}
          moduleTitles={moduleTitles}
          canRetry={!streaming && !rateLimit.limited}
          onAsk={ask}
          onRetry={retry}
          onFeedback={feedback}
          navigate={navigate}
        />
        <Composer
          draft={draft}
          onDraft={setDraft}
          quote={quote}
          onDropQuote={() => setQuote(null)}
          rateLimitedAgain={rateLimit.limited ? rateLimit.again : null}
          streaming={Boolean(streaming)}
          onAsk={ask}
          onStop={() => {
            if (streaming) void stream.stop(streaming);
          }}
          inputRef={inputRef}
        />
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
