import { describe, expect, it } from "vitest";
import { confidenceCue } from "../src/confidence";

describe("confidenceCue", () => {
  it("says how well the book supports an answer at every level, with a meter that falls with it", () => {
    const cues = (["high", "medium", "low", "none"] as const).map((level) => confidenceCue(level, "stop")!);
    expect(cues.map((c) => c.label)).toEqual([
      "Well supported by the book",
      "Partly supported by the book",
      "Weakly supported by the book",
      "Not covered by the book",
    ]);
    expect(cues.map((c) => c.steps)).toEqual([3, 2, 1, 0]);
    expect(new Set(cues.map((c) => c.detail)).size).toBe(4);
  });

  it("says nothing without a level, for a stopped answer, or for an FAQ answer given while search was down", () => {
    expect(confidenceCue(null, "stop")).toBeNull();
    expect(confidenceCue("high", "cancelled")).toBeNull();
    expect(confidenceCue("none", "fallback")).toBeNull();
    expect(confidenceCue("none", "declined")?.label).toBe("Not covered by the book");
  });
});
