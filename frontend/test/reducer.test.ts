import { describe, expect, it } from "vitest";
import type { ChatEvent, HistoryMessage } from "../src/protocol";
import { initialState, reducer, type AnswerMessage, type ChatState } from "../src/reducer";

const meta: ChatEvent = {
  type: "meta",
  id: 1,
  data: {
    message_id: "m1",
    session_id: "s1",
    session_token: "tok",
    stream_url: "/api/chat/messages/m1/stream?cap=c",
    mode: "textbook",
    confidence: 0.8,
    confidence_level: "high",
    scope: { requested_module: null, searched: "all", note: null },
  },
};
const source = { n: 1, module: "02-ros2", chapter: "Nodes", title: "Nodes", url: "/docs/ros2/nodes#qos", excerpt: "QoS" };

function asked(): ChatState {
  return reducer(initialState, { type: "ask", key: "u1", answerKey: "a1", request: { question: "What is QoS?" } });
}

function answer(state: ChatState): AnswerMessage {
  const found = state.messages.find((m) => m.key === "a1");
  if (!found || found.role !== "assistant") throw new Error("no answer");
  return found;
}

function apply(state: ChatState, ...events: ChatEvent[]): ChatState {
  return events.reduce((s, event) => reducer(s, { type: "event", key: "a1", event }), state);
}

const token = (id: number, text: string): ChatEvent => ({ type: "token", id, data: { text } });
const done: ChatEvent = { type: "done", id: 6, data: { message_id: "m1", finish_reason: "stop", cited: [1] } };

describe("reducer", () => {
  it("adds the question and a pending answer when asking", () => {
    const state = asked();
    expect(state.messages.map((m) => m.role)).toEqual(["user", "assistant"]);
    expect(answer(state).status).toBe("pending");
  });

  it("builds the answer from meta, sources, notices and tokens, then finishes on done", () => {
    const state = apply(
      asked(),
      meta,
      { type: "sources", id: 2, data: { sources: [source] } },
      { type: "notice", id: 3, data: { code: "offline_generator", message: "Offline." } },
      token(4, "QoS is "),
      token(5, "a policy [1]."),
      done,
    );
    const a = answer(state);
    expect(a.text).toBe("QoS is a policy [1].");
    expect(a.sources).toEqual([source]);
    expect(a.notices.map((n) => n.code)).toEqual(["offline_generator"]);
    expect(a.streamUrl).toBe("/api/chat/messages/m1/stream?cap=c");
    expect([a.status, a.finishReason, a.cited]).toEqual(["done", "stop", [1]]);
  });

  it("ignores replayed events after a reconnect, so no text is duplicated", () => {
    let state = apply(asked(), meta, token(2, "Hello "), token(3, "world"));
    state = reducer(state, { type: "reconnecting", key: "a1" });
    expect(answer(state).status).toBe("reconnecting");
    state = apply(state, meta, token(2, "Hello "), token(3, "world"), token(4, "!"));
    expect(answer(state).text).toBe("Hello world!");
    expect(answer(state).status).toBe("streaming");
  });

  it("keeps the session from the first meta and ignores later metas without a token", () => {
    let state = apply(asked(), meta);
    expect(state.session).toEqual({ id: "s1", token: "tok" });
    state = reducer(state, { type: "ask", key: "u2", answerKey: "a2", request: { question: "More?" } });
    state = reducer(state, { type: "event", key: "a2", event: { ...meta, data: { ...meta.data, session_token: null } } });
    expect(state.session).toEqual({ id: "s1", token: "tok" });
  });

  it("records a stream error and keeps the text so far", () => {
    const state = apply(asked(), meta, token(2, "Partial"), {
      type: "error",
      id: 3,
      data: { code: "llm_unavailable", message: "Try again.", retryable: true },
    });
    const a = answer(state);
    expect([a.status, a.text, a.failure?.code]).toEqual(["error", "Partial", "llm_unavailable"]);
  });

  it("remembers when a 429 allows the next question", () => {
    const state = reducer(asked(), {
      type: "failed",
      key: "a1",
      failure: { code: "rate_limited", message: "Slow down.", retryable: true, retryAt: 12345 },
    });
    expect(state.rateLimitedUntil).toBe(12345);
    expect(answer(state).status).toBe("error");
  });

  it("does not turn a finished answer into a failure or a cancellation", () => {
    let state = apply(asked(), meta, token(2, "Done."), { ...done, id: 3 });
    state = reducer(state, { type: "failed", key: "a1", failure: { code: "network", message: "x", retryable: true } });
    state = reducer(state, { type: "cancelled", key: "a1" });
    expect([answer(state).status, answer(state).finishReason]).toEqual(["done", "stop"]);
    expect(apply(state, token(9, "late")).messages).toBe(state.messages);
  });

  it("marks a locally stopped answer as cancelled", () => {
    const state = reducer(apply(asked(), meta, token(2, "Half")), { type: "cancelled", key: "a1" });
    expect([answer(state).status, answer(state).finishReason, answer(state).text]).toEqual(["done", "cancelled", "Half"]);
  });

  it("resets a failed answer to pending on retry, keeping its request", () => {
    let state = reducer(asked(), { type: "failed", key: "a1", failure: { code: "x", message: "x", retryable: true } });
    state = reducer(state, { type: "retry", key: "a1" });
    expect([answer(state).status, answer(state).failure, answer(state).request?.question]).toEqual([
      "pending",
      null,
      "What is QoS?",
    ]);
  });

  it("restores history with citations as sources", () => {
    const history: HistoryMessage[] = [
      { id: "q", role: "user", content: "Q?", status: "complete", mode: "selection", module_filter: null, selected_text: "quote", confidence: null, feedback: null, citations: [] },
      { id: "a", role: "assistant", content: "A [1]", status: "complete", mode: "textbook", module_filter: null, selected_text: null, confidence: 0.5, feedback: "up", citations: [{ n: 1, module: "m", chapter: "c", title: "t", url: "/u", excerpt: "e" }] },
    ];
    const state = reducer(initialState, { type: "history", session: { id: "s", token: "t" }, messages: history });
    expect(state.session).toEqual({ id: "s", token: "t" });
    const [q, a] = state.messages;
    expect(q).toMatchObject({ role: "user", text: "Q?", selectedText: "quote" });
    expect(a).toMatchObject({ role: "assistant", text: "A [1]", status: "done", feedback: "up", messageId: "a" });
    expect((a as AnswerMessage).sources[0].url).toBe("/u");
  });

  it("restores an answer still being written as reconnecting to its stream, to be rebuilt by the replay", () => {
    const history: HistoryMessage[] = [
      { id: "q", role: "user", content: "Q?", status: "complete", mode: "textbook", module_filter: null, selected_text: null, confidence: null, feedback: null, citations: [] },
      { id: "a", role: "assistant", content: "Half an ans", status: "streaming", mode: "textbook", module_filter: null, selected_text: null, confidence: null, feedback: null, citations: [], stream_url: "/api/chat/messages/a/stream?cap=x" },
    ];
    let state = reducer(initialState, { type: "history", session: { id: "s", token: "t" }, messages: history });
    const restored = state.messages[1] as AnswerMessage;
    expect([restored.status, restored.streamUrl, restored.text, restored.finishReason]).toEqual([
      "reconnecting",
      "/api/chat/messages/a/stream?cap=x",
      "",
      null,
    ]);
    state = reducer(state, { type: "event", key: "a", event: { type: "token", id: 2, data: { text: "Half an answer." } } });
    state = reducer(state, { type: "event", key: "a", event: { type: "done", id: 3, data: { message_id: "a", finish_reason: "stop", cited: [] } } });
    const finished = state.messages[1] as AnswerMessage;
    expect([finished.status, finished.text, finished.finishReason]).toEqual(["done", "Half an answer.", "stop"]);
  });

  it("starts over on new chat but keeps a running rate limit", () => {
    let state = apply(asked(), meta);
    state = { ...state, rateLimitedUntil: 99 };
    state = reducer(state, { type: "new_chat" });
    expect(state).toEqual({ messages: [], session: null, rateLimitedUntil: 99 });
  });

  it("records feedback on one answer", () => {
    const state = reducer(apply(asked(), meta, { ...done, id: 2 }), { type: "feedback", key: "a1", rating: "down" });
    expect(answer(state).feedback).toBe("down");
  });
});

describe("feedback that could not be saved", () => {
  it("un-presses the thumb when the rating is taken back", () => {
    let state = reducer(initialState, { type: "ask", key: "u9", answerKey: "a9", request: { question: "q" } });
    const key = "a9";
    state = reducer(state, { type: "feedback", key, rating: "down" });
    expect((state.messages.find((m) => m.key === key) as AnswerMessage).feedback).toBe("down");
    state = reducer(state, { type: "feedback", key, rating: null });
    const answer = state.messages.find((m) => m.key === key) as AnswerMessage;
    expect(answer.feedback).toBeNull();
  });
});
