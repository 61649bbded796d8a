import { describe, expect, it } from "vitest";
import { citedNumbers, splitSources } from "../src/citations";
import type { Source } from "../src/protocol";

const source = (n: number): Source => ({ n, module: "m", chapter: "c", title: `t${n}`, url: `/docs/x#${n}`, excerpt: "" }) as Source;
const five = [1, 2, 3, 4, 5].map(source);

describe("citedNumbers", () => {
  it("reads single, adjacent and listed markers", () => {
    expect([...citedNumbers("A [1]. B [2][3]. C [1, 5].")].sort()).toEqual([1, 2, 3, 5]);
  });
  it("ignores links and other brackets", () => {
    expect(citedNumbers("See [the docs](https://x) and [note]").size).toBe(0);
  });
});

describe("splitSources", () => {
  it("puts the cited sources first and the rest apart as related", () => {
    const { cited, related } = splitSources("ZMP [1] and the polygon [3].", five);
    expect(cited.map((s) => s.n)).toEqual([1, 3]);
    expect(related.map((s) => s.n)).toEqual([2, 4, 5]);
  });
  it("lists every source when the text cites none (yet)", () => {
    expect(splitSources("Thinking", five)).toEqual({ cited: five, related: [] });
  });
});
