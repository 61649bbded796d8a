import { describe, expect, it } from "vitest";
import { answerAsText } from "../src/copyText";
import type { Source } from "../src/protocol";

describe("answerAsText", () => {
  const source = (n: number): Source =>
    ({ n, url: `https://book.example.org/docs/s${n}#h`, title: `S${n}`, module: "m", chapter: "", excerpt: "", heading_path: [] }) as unknown as Source;

  it("is the answer's text, then its cited sources with their links", () => {
    const text = answerAsText("  ZMP stays inside the polygon [1][2].\n", [source(1), source(2)], (s) => `Module › ${s.title}`);
    expect(text).toBe(
      "ZMP stays inside the polygon [1][2].\n\nSources:\n" +
        "[1] Module › S1: https://book.example.org/docs/s1#h\n[2] Module › S2: https://book.example.org/docs/s2#h",
    );
  });

  it("is the text alone when nothing is cited", () => {
    expect(answerAsText("The book does not cover this.", [], () => "")).toBe("The book does not cover this.");
  });
});
