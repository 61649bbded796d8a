/**
 * The panel's state and every way it changes: questions, streamed events (deduplicated by event id,
 * so a replay after a reconnect never doubles text), failures, history, feedback. Pure: no I/O here.
 */
import type {
  ChatEvent,
  ChatRequest,
  ConfidenceLevel,
  FinishReason,
  HistoryMessage,
  Notice,
  Scope,
  Source,
} from "./protocol";

export interface Session {
  id: string;
  token: string;
}

export interface UserMessage {
  key: string;
  role: "user";
  text: string;
  selectedText: string | null;
  module: string | null;
}

export type AnswerStatus = "pending" | "streaming" | "reconnecting" | "done" | "error";

export interface Failure {
  code: string;
  message: string;
  retryable: boolean;
  /** For 429: when the next question is allowed (epoch ms). */
  retryAt?: number;
}

export interface AnswerMessage {
  key: string;
  role: "assistant";
  request: ChatRequest | null;
  messageId: string | null;
  streamUrl: string | null;
  status: AnswerStatus;
  text: string;
  sources: Source[];
  notices: Notice[];
  mode: "textbook" | "selection";
  confidence: number | null;
  confidenceLevel: ConfidenceLevel | null;
  scope: Scope | null;
  finishReason: FinishReason | null;
  cited: number[];
  failure: Failure | null;
  lastEventId: number;
  feedback: "up" | "down" | null;
}

export type Message = UserMessage | AnswerMessage;

export interface ChatState {
  messages: Message[];
  session: Session | null;
  /** Epoch ms until which asking is refused (the last 429). */
  rateLimitedUntil: number | null;
}

export type Action =
  | { type: "ask"; key: string; answerKey: string; request: ChatRequest }
  | { type: "event"; key: string; event: ChatEvent }
  | { type: "reconnecting"; key: string }
  | { type: "failed"; key: string; failure: Failure }
  | { type: "cancelled"; key: string }
  | { type: "retry"; key: string }
  | { type: "history"; session: Session; messages: HistoryMessage[] }
  | { type: "new_chat" }
  | { type: "feedback"; key: string; rating: "up" | "down" | null }; // null: a rating that could not be saved

export const initialState: ChatState = { messages: [], session: null, rateLimitedUntil: null };

export function newAnswer(key: string, request: ChatRequest | null): AnswerMessage {
  return {
    key,
    role: "assistant",
    request,
    messageId: null,
    streamUrl: null,
    status: "pending",
    text: "",
    sources: [],
    notices: [],
    mode: request?.selected_text ? "selection" : "textbook",
    confidence: null,
    confidenceLevel: null,
    scope: null,
    finishReason: null,
    cited: [],
    failure: null,
    lastEventId: 0,
    feedback: null,
  };
}

export function reducer(state: ChatState, action: Action): ChatState {
  switch (action.type) {
    case "ask": {
      const { request } = action;
      const user: UserMessage = {
        key: action.key,
        role: "user",
        text: request.question,
        selectedText: request.selected_text ?? null,
        module: request.module ?? null,
      };
      return { ...state, messages: [...state.messages, user, newAnswer(action.answerKey, request)] };
    }
    case "event":
      return applyEvent(state, action.key, action.event);
    case "reconnecting":
      return updateAnswer(state, action.key, (m) => (isOpen(m) ? { ...m, status: "reconnecting" } : m));
    case "failed": {
      const next = updateAnswer(state, action.key, (m) =>
        m.status === "done" ? m : { ...m, status: "error", failure: action.failure },
      );
      const until = action.failure.retryAt ?? null;
      return until ? { ...next, rateLimitedUntil: until } : next;
    }
    case "cancelled":
      return updateAnswer(state, action.key, (m) =>
        isOpen(m) ? { ...m, status: "done", finishReason: "cancelled" } : m,
      );
    case "retry":
      return updateAnswer(state, action.key, (m) => ({ ...newAnswer(m.key, m.request), feedback: null }));
    case "history":
      return { ...state, session: action.session, messages: action.messages.map(fromHistory) };
    case "new_chat":
      return { ...initialState, rateLimitedUntil: state.rateLimitedUntil };
    case "feedback":
      return updateAnswer(state, action.key, (m) => ({ ...m, feedback: action.rating }));
  }
}

function isOpen(m: AnswerMessage): boolean {
  return m.status === "pending" || m.status === "streaming" || m.status === "reconnecting";
}

function applyEvent(state: ChatState, key: string, event: ChatEvent): ChatState {
  let session = state.session;
  const next = updateAnswer(state, key, (m) => {
    // Ids count from 1 within a message: anything at or below the last one applied is a replay.
    if (event.id <= m.lastEventId || m.status === "done") return m;
    const base = { ...m, lastEventId: event.id, status: "streaming" as AnswerStatus };
    switch (event.type) {
      case "meta": {
        const meta = event.data;
        if (meta.session_token) session = { id: meta.session_id, token: meta.session_token };
        return {
          ...base,
          messageId: meta.message_id,
          streamUrl: meta.stream_url ?? null,
          mode: meta.mode ?? base.mode,
          confidence: meta.confidence ?? null,
          confidenceLevel: meta.confidence_level ?? null,
          scope: meta.scope ?? null,
        };
      }
      case "sources":
        return { ...base, sources: event.data.sources };
      case "notice":
        return { ...base, notices: [...base.notices, event.data] };
      case "token":
        return { ...base, text: base.text + event.data.text };
      case "done":
        return { ...base, status: "done", finishReason: event.data.finish_reason, cited: event.data.cited ?? [] };
      case "error":
        return { ...base, status: "error", failure: event.data };
    }
  });
  return session === state.session ? next : { ...next, session };
}

function updateAnswer(state: ChatState, key: string, change: (m: AnswerMessage) => AnswerMessage): ChatState {
  let changed = false;
  const messages = state.messages.map((m) => {
    if (m.key !== key || m.role !== "assistant") return m;
    const updated = change(m);
    changed = changed || updated !== m;
    return updated;
  });
  return changed ? { ...state, messages } : state;
}

function fromHistory(h: HistoryMessage): Message {
  if (h.role === "user") {
    return { key: h.id, role: "user", text: h.content, selectedText: h.selected_text, module: h.module_filter };
  }
  const answer = newAnswer(h.id, null);
  if (h.status === "streaming" && h.stream_url) {
    // Still being written (the reader reloaded mid-answer): the panel follows its stream, whose replay
    // from the first event rebuilds text, sources and notices; until then it shows as reconnecting.
    return { ...answer, messageId: h.id, status: "reconnecting", streamUrl: h.stream_url, feedback: h.feedback };
  }
  const finished = h.status === "complete";
  return {
    ...answer,
    messageId: h.id,
    status: "done",
    text: h.content,
    mode: h.mode === "selection" ? "selection" : "textbook",
    confidence: h.confidence,
    finishReason: finished ? "stop" : "cancelled",
    sources: h.citations.map((c) => ({ ...c, heading_path: [] })),
    cited: h.citations.map((c) => c.n),
    feedback: h.feedback,
  };
}
