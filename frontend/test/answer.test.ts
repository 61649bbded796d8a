import { describe, expect, it } from "vitest";
import { canRate } from "../src/AnswerFeedback";
import { initialState, reducer, type AnswerMessage } from "../src/reducer";

function answer(overrides: Partial<AnswerMessage>): AnswerMessage {
  const state = reducer(initialState, { type: "ask", key: "u", answerKey: "a", request: { question: "q" } });
  const base = state.messages.find((m) => m.key === "a") as AnswerMessage;
  return { ...base, status: "done", messageId: "m1", finishReason: "stop", ...overrides };
}

describe("canRate", () => {
  it("offers thumbs on a finished, stored answer", () => {
    expect(canRate(answer({}))).toBe(true);
  });

  it("offers none where the rating cannot be kept or means nothing", () => {
    expect(canRate(answer({ notices: [{ code: "history_unavailable", message: "off" }] }))).toBe(false);
    expect(canRate(answer({ finishReason: "declined" }))).toBe(false);
    expect(canRate(answer({ finishReason: "cancelled" }))).toBe(false);
    expect(canRate(answer({ status: "streaming" }))).toBe(false);
  });
});
