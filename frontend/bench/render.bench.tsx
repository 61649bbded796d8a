/**
 * Render time of the hostile answers of issue 34: a heading line of thousands of spaces, tables of 5,000 rows
 * and of 10,000 columns, and a 5,000-row table parsed once per streamed chunk. Run: `npx vitest bench --run`.
 */
import { renderToStaticMarkup } from "react-dom/server";
import { bench, describe } from "vitest";
import { Markdown } from "../src/markdown";
import { parseBlocks, parseMarkdown, type ParsedMarkdown } from "../src/markdownBlocks";

const once = { iterations: 1, time: 0, warmupIterations: 0, warmupTime: 0 };
const draw = (text: string): string => renderToStaticMarkup(<Markdown text={text} citations={[]} />);
const spaces = 10_000;
const rows = (n: number): string => "| a | b |\n|---|---|\n" + Array.from({ length: n }, (_, i) => `| ${i} | x |`).join("\n");
const wide = (n: number): string => {
  const cells = (cell: string): string => "|" + Array(n).fill(cell).join("|") + "|";
  return [cells(" h "), cells("---"), cells(" 1 ")].join("\n");
};

describe("hostile answers, drawn once", () => {
  bench(`heading: "# a" + ${spaces} spaces + "b"`, () => void draw("# a" + " ".repeat(spaces) + "b"), once);
  bench("table of 5,000 rows", () => void draw(rows(5_000)), once);
  bench("table of 10,000 columns", () => void draw(wide(10_000)), once);
});

describe("a 5,000-row table streamed in 40-character chunks, parsed after each", () => {
  const text = rows(5_000);
  const chunks = Array.from({ length: Math.ceil(text.length / 40) }, (_, i) => text.slice(0, (i + 1) * 40));
  bench("incrementally (the panel)", () => {
    let parsed: ParsedMarkdown | null = null;
    for (const prefix of chunks) parsed = parseMarkdown(parsed, prefix);
  }, once);
  bench("from the start each time (before)", () => {
    for (const prefix of chunks) parseBlocks(prefix);
  }, once);
});
