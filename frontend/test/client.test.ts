import { describe, expect, it } from "vitest";
import { ChatClient, type Fetch } from "../src/client";
import type { ChatEvent } from "../src/protocol";

const enc = new TextEncoder();

function frame(id: number, event: string, data: unknown): string {
  return `event: ${event}\nid: ${id}\ndata: ${JSON.stringify(data)}\n\n`;
}

const META = frame(1, "meta", {
  message_id: "m1",
  session_id: "s1",
  session_token: "t",
  stream_url: "/api/chat/messages/m1/stream?cap=abc",
  mode: "textbook",
  confidence: 0.9,
  confidence_level: "high",
});

/** A body that sends `parts` and then either ends or fails like a dropped connection (after they are read). */
function body(parts: string[], drop: boolean): ReadableStream<Uint8Array> {
  const queue = [...parts];
  return new ReadableStream({
    pull(controller) {
      const part = queue.shift();
      if (part !== undefined) controller.enqueue(enc.encode(part));
      else if (drop) controller.error(new TypeError("network error"));
      else controller.close();
    },
  });
}

interface Call {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: unknown;
}

function scripted(responses: Array<() => Response>): { fetch: Fetch; calls: Call[] } {
  const calls: Call[] = [];
  const fetch: Fetch = async (input, init) => {
    calls.push({
      url: String(input),
      method: init?.method ?? "GET",
      headers: (init?.headers ?? {}) as Record<string, string>,
      body: init?.body ? JSON.parse(String(init.body)) : undefined,
    });
    const next = responses.shift();
    if (!next) throw new TypeError("Failed to fetch");
    return next();
  };
  return { fetch, calls };
}

const sse = (parts: string[], drop = false) => () =>
  new Response(body(parts, drop), { headers: { "Content-Type": "text/event-stream" } });

async function run(client: ChatClient) {
  const events: ChatEvent[] = [];
  let reconnects = 0;
  const outcome = await client.stream(
    { question: "What is QoS?" },
    { onEvent: (e) => events.push(e), onReconnecting: () => reconnects++ },
    new AbortController().signal,
  );
  return { outcome, events, reconnects };
}

describe("ChatClient.stream", () => {
  it("posts the question with a client_request_id and reads the answer to done", async () => {
    const { fetch, calls } = scripted([
      sse([META, frame(2, "token", { text: "Hi" }), frame(3, "done", { message_id: "m1", finish_reason: "stop", cited: [] })]),
    ]);
    const { outcome, events } = await run(new ChatClient({ apiBase: "http://x/", fetch }));
    expect(outcome.kind).toBe("ended");
    expect(events.map((e) => e.type)).toEqual(["meta", "token", "done"]);
    expect(calls[0].url).toBe("http://x/api/chat");
    expect(calls[0].method).toBe("POST");
    expect((calls[0].body as { client_request_id: string }).client_request_id).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("resumes from stream_url with Last-Event-ID after a drop, without duplicating events", async () => {
    const { fetch, calls } = scripted([
      sse([META, frame(2, "token", { text: "Hello " })], true),
      // The server replays from after event 2; an overlapping replay of 2 must still be ignored.
      sse([frame(2, "token", { text: "Hello " }), frame(3, "token", { text: "world" }), frame(4, "done", { message_id: "m1", finish_reason: "stop", cited: [] })]),
    ]);
    const { outcome, events, reconnects } = await run(new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1] }));
    expect(outcome.kind).toBe("ended");
    expect(reconnects).toBe(1);
    expect(calls[1].url).toBe("/api/chat/messages/m1/stream?cap=abc");
    expect(calls[1].headers["Last-Event-ID"]).toBe("2");
    const text = events.flatMap((e) => (e.type === "token" ? [e.data.text] : [])).join("");
    expect(text).toBe("Hello world");
  });

  it("repeats the POST with the same client_request_id when the drop comes before meta", async () => {
    const { fetch, calls } = scripted([
      () => {
        throw new TypeError("Failed to fetch");
      },
      sse([META, frame(2, "done", { message_id: "m1", finish_reason: "stop", cited: [] })]),
    ]);
    const { outcome } = await run(new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1] }));
    expect(outcome.kind).toBe("ended");
    expect(calls.map((c) => c.method)).toEqual(["POST", "POST"]);
    expect(calls[0].body).toEqual(calls[1].body);
  });

  it("treats a stream that ends without done as a drop", async () => {
    const { fetch } = scripted([
      sse([META, frame(2, "token", { text: "a" })]),
      sse([frame(3, "done", { message_id: "m1", finish_reason: "stop", cited: [] })]),
    ]);
    const { outcome, reconnects } = await run(new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1] }));
    expect([outcome.kind, reconnects]).toEqual(["ended", 1]);
  });

  it("follows an answer found in history from its stream_url without posting anything", async () => {
    const { fetch, calls } = scripted([
      sse([META, frame(2, "token", { text: "Hi" }), frame(3, "done", { message_id: "m1", finish_reason: "stop", cited: [] })]),
    ]);
    const client = new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1] });
    const seen: ChatEvent[] = [];
    const outcome = await client.stream(
      { question: "" },
      { onEvent: (e) => seen.push(e), onReconnecting: () => {} },
      new AbortController().signal,
      "/api/chat/messages/m1/stream?cap=abc",
    );
    expect(outcome.kind).toBe("ended");
    expect(calls.map((c) => [c.method, c.url, c.headers["Last-Event-ID"]])).toEqual([
      ["GET", "/api/chat/messages/m1/stream?cap=abc", "0"],
    ]);
    expect(seen.map((e) => e.type)).toEqual(["meta", "token", "done"]);
  });

  it("stops on 204 from the resume URL: the answer finished while we were away", async () => {
    const { fetch } = scripted([sse([META], true), () => new Response(null, { status: 204 })]);
    const { outcome } = await run(new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1] }));
    expect(outcome.kind).toBe("ended");
  });

  it("gives up after the last reconnect attempt with a retryable failure", async () => {
    const { fetch, calls } = scripted([sse([META], true), sse([], true), sse([], true)]);
    const { outcome } = await run(new ChatClient({ apiBase: "", fetch, reconnectDelaysMs: [1, 1] }));
    expect(outcome).toMatchObject({ kind: "failed", failure: { code: "network", retryable: true } });
    expect(calls).toHaveLength(3);
  });

  it("turns 429 into a failure carrying when the next question is allowed", async () => {
    const { fetch } = scripted([
      () =>
        new Response(JSON.stringify({ error: { code: "rate_limited", message: "Too many questions." } }), {
          status: 429,
          headers: { "Retry-After": "120", "Content-Type": "application/json" },
        }),
    ]);
    const before = Date.now();
    const { outcome } = await run(new ChatClient({ apiBase: "", fetch }));
    expect(outcome.failure?.code).toBe("rate_limited");
    expect(outcome.failure?.retryAt).toBeGreaterThanOrEqual(before + 120_000);
  });

  it("reports a 4xx error body as a non-retryable failure", async () => {
    const { fetch } = scripted([
      () => new Response(JSON.stringify({ error: { code: "too_long", message: "question is too long" } }), { status: 400 }),
    ]);
    const { outcome } = await run(new ChatClient({ apiBase: "", fetch }));
    expect(outcome.failure).toEqual({ code: "too_long", message: "question is too long", retryable: false });
  });
});

describe("ChatClient.stop", () => {
  it("sends DELETE to the message URL with the same capability", async () => {
    const { fetch, calls } = scripted([() => new Response("{}", { status: 200 })]);
    expect(await new ChatClient({ apiBase: "", fetch }).stop("/api/chat/messages/m1/stream?cap=abc")).toBe(true);
    expect([calls[0].method, calls[0].url]).toEqual(["DELETE", "/api/chat/messages/m1?cap=abc"]);
  });

  it("answers false when the server has no such route", async () => {
    const { fetch } = scripted([() => new Response("{}", { status: 404 })]);
    expect(await new ChatClient({ apiBase: "", fetch }).stop("/api/chat/messages/m1/stream?cap=abc")).toBe(false);
  });
});

describe("ChatClient conversations", () => {
  const json = (value: unknown, status = 200) => () =>
    new Response(JSON.stringify(value), { status, headers: { "Content-Type": "application/json" } });

  it("lists a signed-in reader's conversations with their bearer token", async () => {
    const listed = [{ id: "s1", title: "ZMP", message_count: 4, created_at: "2026-11-01T10:00:00Z", last_activity_at: "2026-11-02T10:00:00Z" }];
    const { fetch, calls } = scripted([json({ sessions: listed })]);
    const client = new ChatClient({ apiBase: "https://chat.example.org", fetch, authToken: () => "jwt" });
    expect(await client.sessions()).toEqual(listed);
    expect(calls[0].url).toBe("https://chat.example.org/api/sessions?limit=50");
    expect(calls[0].headers.Authorization).toBe("Bearer jwt");
  });

  it("reads a conversation opened from that list by the bearer token alone, with no empty session token", async () => {
    const { fetch, calls } = scripted([json({ messages: [] }), json({ messages: [] })]);
    const client = new ChatClient({ apiBase: "", fetch, authToken: () => "jwt" });
    await client.history({ id: "s1", token: "" });
    await client.history({ id: "s2", token: "tok" });
    expect(calls.map((c) => c.headers["X-Session-Token"])).toEqual([undefined, "tok"]);
  });

  it("says 401 when nobody is signed in", async () => {
    const { fetch } = scripted([json({ error: { code: "sign_in_required", message: "Sign in." } }, 401)]);
    await expect(new ChatClient({ apiBase: "", fetch }).sessions()).rejects.toMatchObject({ status: 401 });
  });
});
