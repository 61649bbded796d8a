/**
 * The server's contract as types (docs/http-api.md and docs/sse-protocol.md), and the one place that
 * turns an SSE frame into a typed event; anything malformed becomes `null` and is ignored.
 */

export type ConfidenceLevel = "none" | "low" | "medium" | "high";
export type FinishReason = "stop" | "length" | "declined" | "fallback" | "cancelled";
export type NoticeCode =
  | "low_confidence"
  | "scope_widened"
  | "scope_partial"
  | "scope_limited"
  | "history_unavailable"
  | "fallback_faq"
  | "offline_generator"
  | "llm_retry";

export interface Scope {
  requested_module: string | null;
  searched: string | string[] | null;
  note: string | null;
}

export interface Meta {
  message_id: string;
  session_id: string;
  session_token?: string | null;
  stream_url: string;
  mode: "textbook" | "selection";
  confidence: number;
  confidence_level: ConfidenceLevel;
  scope?: Scope | null;
}

export interface Source {
  n: number;
  chunk_id?: string;
  file_path?: string;
  module: string;
  chapter: string;
  title: string;
  heading_path?: string[];
  url: string;
  score?: number;
  excerpt: string;
}

export interface Notice {
  code: NoticeCode | string;
  message: string;
}

export interface Done {
  message_id: string;
  finish_reason: FinishReason;
  cited: number[];
}

export interface StreamError {
  code: string;
  message: string;
  retryable: boolean;
}

export type ChatEvent =
  | { type: "meta"; id: number; data: Meta }
  | { type: "sources"; id: number; data: { sources: Source[] } }
  | { type: "notice"; id: number; data: Notice }
  | { type: "token"; id: number; data: { text: string } }
  | { type: "done"; id: number; data: Done }
  | { type: "error"; id: number; data: StreamError };

export interface ChatRequest {
  question: string;
  session_id?: string;
  session_token?: string;
  module?: string;
  selected_text?: string;
  page_url?: string;
  client_request_id?: string;
}

export interface Chapter {
  id: string;
  title: string;
  url: string;
}

export interface ModuleInfo {
  id: string;
  title: string;
  url: string;
  chapters: Chapter[];
}

export interface HistoryCitation {
  n: number;
  module: string;
  chapter: string;
  title: string;
  url: string;
  excerpt: string;
}

/** One of a signed-in reader's conversations (GET /api/sessions), newest activity first. */
export interface SessionSummary {
  id: string;
  title: string | null;
  message_count: number;
  created_at: string;
  last_activity_at: string;
}

export interface HistoryMessage {
  id: string;
  role: "user" | "assistant";
  content: string;
  status: string;
  mode: string | null;
  module_filter: string | null;
  selected_text: string | null;
  confidence: number | null;
  feedback: "up" | "down" | null;
  citations: HistoryCitation[];
  /** Set while the answer is still being written: follow it to see the rest. */
  stream_url?: string | null;
}

export interface FaqEntry {
  question: string;
  answer: string;
  url?: string | null;
}

const TYPES = new Set(["meta", "sources", "notice", "token", "done", "error"]);

/** A typed event from one SSE frame, or null for unknown types, bad JSON or a missing id. */
export function toChatEvent(frame: { event: string; data: string; id: string }): ChatEvent | null {
  if (!TYPES.has(frame.event) || !/^\d+$/.test(frame.id)) return null;
  let data: unknown;
  try {
    data = JSON.parse(frame.data);
  } catch {
    return null;
  }
  if (typeof data !== "object" || data === null) return null;
  const id = Number(frame.id);
  const record = data as Record<string, unknown>;
  switch (frame.event) {
    case "token":
      return typeof record.text === "string" ? { type: "token", id, data: { text: record.text } } : null;
    case "sources":
      return Array.isArray(record.sources) ? { type: "sources", id, data: { sources: record.sources as Source[] } } : null;
    case "meta":
      return typeof record.message_id === "string" ? { type: "meta", id, data: data as Meta } : null;
    case "notice":
      return typeof record.code === "string" ? { type: "notice", id, data: data as Notice } : null;
    case "done":
      return { type: "done", id, data: { cited: [], ...(data as Partial<Done>) } as Done };
    default:
      return { type: "error", id, data: { retryable: false, ...(data as Partial<StreamError>) } as StreamError };
  }
}
