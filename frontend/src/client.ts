/**
 * The HTTP side of the panel: POST /api/chat read as a stream, resumed from `stream_url` with
 * Last-Event-ID after a drop, stopped with DELETE; history, feedback, modules and FAQ. No React here.
 */
import { readEventStream, SseParser } from "./sse";
import {
  toChatEvent,
  type ChatEvent,
  type ChatRequest,
  type FaqEntry,
  type HistoryMessage,
  type ModuleInfo,
  type SessionSummary,
} from "./protocol";
import type { Failure, Session } from "./reducer";
import { ApiError, failureOf, isNetworkError, retryAfterOf } from "./apiErrors";
import { uuid } from "./uuid";

export type Fetch = typeof fetch;

export interface StreamHandlers {
  onEvent: (event: ChatEvent) => void;
  onReconnecting: () => void;
}

export interface StreamOutcome {
  /** `ended`: done or error arrived; `failed`: see `failure`; `aborted`: the caller's signal fired. */
  kind: "ended" | "failed" | "aborted";
  failure?: Failure;
}

export interface ClientOptions {
  apiBase: string;
  fetch?: Fetch;
  /** Delays before each reconnect attempt, in ms; the list's length is the number of attempts. */
  reconnectDelaysMs?: number[];
  authToken?: () => string | null;
}

const DEFAULT_DELAYS = [250, 500, 1000, 2000, 4000];

export class ChatClient {
  private readonly base: string;
  private readonly fetchImpl: Fetch;
  private readonly delays: number[];
  private readonly authToken: () => string | null;

  constructor(options: ClientOptions) {
    this.base = withoutTrailingSlashes(options.apiBase);
    this.fetchImpl = options.fetch ?? ((input, init) => fetch(input, init));
    this.delays = options.reconnectDelaysMs ?? DEFAULT_DELAYS;
    this.authToken = options.authToken ?? (() => null);
  }

  url(path: string): string {
    return path.startsWith("http") ? path : this.base + path;
  }

  /**
   * Ask and stream the answer. A drop before `done`/`error` reconnects: to `stream_url` with
   * Last-Event-ID once the meta event is in, otherwise by repeating the POST with the same
   * `client_request_id` (the server attaches to the first message instead of asking twice).
   * With `from` (an answer already being written, found in history after a reload) nothing is posted:
   * the answer is followed from its `stream_url`, from the first event.
   */
  async stream(
    request: ChatRequest,
    handlers: StreamHandlers,
    signal: AbortSignal,
    from: string | null = null,
  ): Promise<StreamOutcome> {
    const body: ChatRequest = { ...request, client_request_id: request.client_request_id ?? uuid() };
    let lastId = 0;
    let streamUrl: string | null = from;
    let ended = false;
    let retryMs: number | null = null;
    const onFrame = (event: ChatEvent): void => {
      if (event.id <= lastId) return;
      lastId = event.id;
      if (event.type === "meta") streamUrl = event.data.stream_url;
      if (event.type === "done" || event.type === "error") ended = true;
      handlers.onEvent(event);
    };
    for (let attempt = 0; ; attempt++) {
      if (signal.aborted) return { kind: "aborted" };
      const parser = new SseParser();
      try {
        const response = streamUrl
          ? await this.request(streamUrl, { headers: { "Last-Event-ID": String(lastId) }, signal })
          : await this.request("/api/chat", { method: "POST", json: body, signal });
        if (response.status === 204) return { kind: "ended" }; // finished while we were away: nothing after lastId
        if (!response.ok) return { kind: "failed", failure: await failureOf(response) };
        if (!response.body) throw new TypeError("no response body");
        await readEventStream(
          response.body,
          (frame) => {
            const event = toChatEvent(frame);
            if (event) onFrame(event);
          },
          parser,
        );
        if (ended) return { kind: "ended" };
      } catch (error) {
        if (signal.aborted) return { kind: "aborted" };
        if (ended) return { kind: "ended" };
        if (!(error instanceof TypeError) && !isNetworkError(error)) throw error;
      } finally {
        retryMs = parser.retryMs ?? retryMs;
      }
      if (attempt >= this.delays.length) {
        return {
          kind: "failed",
          failure: { code: "network", message: "The connection to the server was lost.", retryable: true },
        };
      }
      handlers.onReconnecting();
      await sleep(retryMs ?? this.delays[attempt], signal);
    }
  }

  /** Stop a generation; false when the server cannot (no capability yet, or the route is missing). */
  async stop(streamUrl: string): Promise<boolean> {
    const cancelUrl = streamUrl.replace(/\/stream(?=\?|$)/, "");
    try {
      const response = await this.request(cancelUrl, { method: "DELETE" });
      return response.ok;
    } catch {
      return false;
    }
  }

  async history(session: Session): Promise<HistoryMessage[]> {
    const response = await this.request(`/api/sessions/${encodeURIComponent(session.id)}/messages?limit=200`, {
      headers: sessionHeaders(session),
    });
    const body = (await this.json(response)) as { messages: HistoryMessage[] };
    return body.messages;
  }

  async deleteSession(session: Session): Promise<void> {
    const response = await this.request(`/api/sessions/${encodeURIComponent(session.id)}`, {
      method: "DELETE",
      headers: sessionHeaders(session),
    });
    if (!response.ok && response.status !== 404) await this.json(response);
  }

  async feedback(messageId: string, rating: "up" | "down", session: Session | null, comment?: string): Promise<void> {
    const response = await this.request(`/api/messages/${encodeURIComponent(messageId)}/feedback`, {
      method: "POST",
      json: comment ? { rating, comment } : { rating },
      headers: sessionHeaders(session),
    });
    await this.json(response);
  }

  /** A signed-in reader's conversations, newest first (401 when nobody is signed in). */
  async sessions(limit = 50): Promise<SessionSummary[]> {
    const body = (await this.json(await this.request(`/api/sessions?limit=${limit}`))) as { sessions: SessionSummary[] };
    return body.sessions;
  }

  async modules(): Promise<ModuleInfo[]> {
    const body = (await this.json(await this.request("/api/modules"))) as { modules: ModuleInfo[] };
    return body.modules;
  }

  async faq(): Promise<FaqEntry[]> {
    const body = (await this.json(await this.request("/api/faq"))) as { entries: FaqEntry[] };
    return body.entries;
  }

  private request(
    path: string,
    init: { method?: string; json?: unknown; headers?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { ...(init.headers ?? {}) };
    if (init.json !== undefined) headers["Content-Type"] = "application/json";
    const token = this.authToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    return this.fetchImpl(this.url(path), {
      method: init.method ?? "GET",
      headers,
      body: init.json === undefined ? undefined : JSON.stringify(init.json),
      signal: init.signal,
    });
  }

  private async json(response: Response): Promise<unknown> {
    if (!response.ok) {
      const failure = await failureOf(response);
      throw new ApiError(response.status, failure.code, failure.message, retryAfterOf(response));
    }
    return response.json();
  }
}

/**
 * The header that proves a session is the caller's: its token. A signed-in reader's past conversation,
 * opened from the list, has none in this browser: the bearer token proves it instead.
 */
function sessionHeaders(session: Session | null): Record<string, string> {
  return session?.token ? { "X-Session-Token": session.token } : {};
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}

function withoutTrailingSlashes(url: string): string {
  let end = url.length;
  while (end > 0 && url[end - 1] === "/") end--;
  return url.slice(0, end);
}
