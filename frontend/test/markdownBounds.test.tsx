import { renderToStaticMarkup } from "react-dom/server";
import { describe, expect, it } from "vitest";
import { Markdown, parseBlocks } from "../src/markdown";
import { parseMarkdown, type ParsedMarkdown } from "../src/markdownBlocks";
import { MAX_LINE_CHARS, MAX_TABLE_COLUMNS, MAX_TABLE_ROWS } from "../src/markdownTable";

// Issue 34: text from the model is hostile input. Drawing it must take time linear in its length.
const html = (text: string): string => renderToStaticMarkup(<Markdown text={text} citations={[]} />);

function timed(text: string): { out: string; ms: number } {
  const start = performance.now();
  const out = html(text);
  return { out, ms: performance.now() - start };
}

const rows = (n: number): string =>
  "| n | square |\n|---|---|\n" + Array.from({ length: n }, (_, i) => `| ${i} | ${i * i} |`).join("\n");
const columns = (n: number): string => {
  const row = (cell: string): string => "|" + Array<string>(n).fill(cell).join("|") + "|";
  return [row(" h "), row("---"), row(" 1 ")].join("\n");
};

describe("hostile answers", () => {
  it("draws a heading line of 10,000 spaces in under 50 ms", () => {
    html("# Warm-up\n\nSome *text* and `code` [x](/docs/y)."); // module and JIT start-up are not the heading's
    const { out, ms } = timed("# a" + " ".repeat(10_000) + "b");
    expect(out).toMatch(/^<h3>a {10000}b<\/h3>$/);
    expect(ms).toBeLessThan(50);
  });

  it("draws each shape that made the old patterns backtrack in time linear in its length", () => {
    const shapes = {
      "bullet, spaces, line separator": "- " + " ".repeat(20_000) + "x\u2028y",
      "numbered, spaces, line separator": "1. " + " ".repeat(20_000) + "x\u2028y",
      "a run of backticks": "`".repeat(5_000),
      "backtick runs of every length": Array.from({ length: 150 }, (_, i) => "`".repeat(i + 1) + "a").join(" "),
      "open brackets": "[".repeat(20_000),
      "links never closed": "[a](x".repeat(5_000),
      "a header cell of underscores": "| " + "_".repeat(15_000) + "a |\n|---|",
      "emphasis never closed": "*a" + " _b".repeat(5_000),
    };
    for (const [shape, text] of Object.entries(shapes)) {
      html(text.slice(0, 100)); // the same paths, warm
      expect(timed(text).ms, shape).toBeLessThan(250);
    }
  });

  it("cuts a line longer than MAX_LINE_CHARS, and says so with an ellipsis", () => {
    const out = html("x".repeat(MAX_LINE_CHARS + 5_000));
    expect(out).toBe(`<p>${"x".repeat(MAX_LINE_CHARS)}…</p>`);
  });

  it("draws MAX_TABLE_ROWS rows of a 5,000-row table, with a note that the rest is cut", () => {
    const { out, ms } = timed(rows(5_000));
    expect(out.match(/<tr>/g)).toHaveLength(1 + MAX_TABLE_ROWS);
    expect(out).toContain(`<tr><td>${MAX_TABLE_ROWS - 1}</td>`);
    expect(out).not.toContain(`<tr><td>${MAX_TABLE_ROWS}</td>`);
    expect(out).toMatch(new RegExp(`role="note">Table cut: showing ${MAX_TABLE_ROWS} of 5,000 rows\\.</p>$`));
    expect(ms).toBeLessThan(500);
  });

  it("draws MAX_TABLE_COLUMNS columns of a 10,000-column table, with a note that the rest is cut", () => {
    const { out, ms } = timed(columns(10_000));
    expect(out.match(/<th /g)).toHaveLength(MAX_TABLE_COLUMNS);
    expect(out.match(/<td>/g)).toHaveLength(MAX_TABLE_COLUMNS);
    expect(out).toContain(`Table cut: showing ${MAX_TABLE_COLUMNS} of 10,000 columns.`);
    expect(ms).toBeLessThan(500);
  });

  it("draws a table that fits whole, without a note", () => {
    expect(html(rows(MAX_TABLE_ROWS))).not.toContain("Table cut");
  });
});

describe("incremental parsing", () => {
  const pieces = [
    "Some text", " [1]", "\n", "\n\n", "\r\n", "\r", "# Head", "## Close ##", "- item", "1. step", "  more",
    "> quote", "```py\n", "```", "| a | b |", "|---|:-:|", "| 1 | 2 |", "x \\| y", "`code`", "**bold**", "    ",
  ];

  function randomText(next: () => number, length: number): string {
    let text = "";
    for (let k = 0; k < length; k++) text += pieces[next() % pieces.length];
    return text;
  }

  it("gives the same blocks as a full parse, on every prefix of random answers streamed in random chunks", () => {
    let seed = 34;
    const next = (): number => (seed = (seed * 1103515245 + 12345) % 2147483648);
    for (let answer = 0; answer < 300; answer++) {
      const text = randomText(next, 30);
      let parsed: ParsedMarkdown | null = null;
      for (let end = 0; end < text.length; end += 1 + (next() % 12)) {
        const previous: ParsedMarkdown | null = parsed;
        parsed = parseMarkdown(previous, text.slice(0, end));
        expect(parsed.blocks, JSON.stringify(text.slice(0, end))).toEqual(parseBlocks(text.slice(0, end)));
        // The blocks that were final are kept as they were: the renderer skips drawing them again.
        for (let b = 0; previous && b < previous.resume.blocks; b++) expect(parsed.blocks[b]).toBe(previous.blocks[b]);
      }
      expect(parseMarkdown(parsed, text).blocks).toEqual(parseBlocks(text));
    }
  });

  it("parses a text that does not extend the previous one from its start", () => {
    const first = parseMarkdown(null, "# One\n\nFirst paragraph.\n\n- a\n");
    expect(parseMarkdown(first, "# Two\n\nOther.").blocks).toEqual(parseBlocks("# Two\n\nOther."));
  });

  it("streams a 5,000-row table parsing only its last rows again, in linear time", () => {
    const text = rows(5_000);
    let parsed: ParsedMarkdown | null = null;
    const start = performance.now();
    for (let end = 40; end < text.length + 40; end += 40) {
      parsed = parseMarkdown(parsed, text.slice(0, end));
      const tail = parsed.text.length - parsed.resume.offset;
      expect(tail).toBeLessThan(40); // two lines at most: the last complete row and the one being written
    }
    expect(performance.now() - start).toBeLessThan(1_000); // a full parse per chunk: over 1,250 × 10 ms
    expect(parsed!.blocks).toEqual(parseBlocks(text));
    expect(parsed!.blocks[0]).toMatchObject({ kind: "table", rowCount: 5_000 });
  });
});
