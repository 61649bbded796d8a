import { describe, expect, it } from "vitest";
import { visibleNotices } from "../src/notices";
import type { AnswerMessage, Message } from "../src/reducer";

const answer = (key: string, codes: string[]): Message =>
  ({ key, role: "assistant", notices: codes.map((code) => ({ code, message: code })) }) as unknown as AnswerMessage;
const codes = (shown: Map<string, { code: string }[]>, key: string) => (shown.get(key) ?? []).map((n) => n.code);

describe("visibleNotices", () => {
  it("says what describes the server once per conversation", () => {
    const shown = visibleNotices([
      answer("a1", ["history_unavailable", "offline_generator"]),
      answer("a2", ["history_unavailable", "offline_generator", "low_confidence"]),
    ]);
    expect(codes(shown, "a1")).toEqual(["history_unavailable", "offline_generator"]);
    expect(codes(shown, "a2")).toEqual(["low_confidence"]);
  });

  it("always shows what is about the answer itself", () => {
    const shown = visibleNotices([answer("a1", ["scope_widened"]), answer("a2", ["scope_widened", "uncited"])]);
    expect(codes(shown, "a2")).toEqual(["scope_widened", "uncited"]);
  });
});
