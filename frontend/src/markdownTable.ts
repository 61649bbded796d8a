/**
 * GitHub-flavoured Markdown pipe tables (https://github.github.com/gfm/#tables-extension-), parsed from lines
 * into cells of raw inline Markdown; src/markdown.tsx renders them.
 *
 * A table is a header row, a delimiter row (`| --- | :-: | --: |`) with as many cells as the header, then body
 * rows up to a blank line or a line that starts another block. As in GFM, any other line right after a table is
 * one more row. Outer pipes are optional, `\|` is a literal pipe, and a pipe inside a code span still splits
 * the cell (GFM asks writers to escape it there too). The delimiter row must hold a pipe, so `---` under a line
 * is never read as a one-column table. Mid-stream: a header alone stays a paragraph, a table shows once its
 * delimiter row is complete, and a last row still being typed is a row.
 */

export type Align = "left" | "center" | "right" | null;

export interface TableBlock {
  align: Align[];
  header: string[];
  rows: string[][];
}

const DELIMITER_CELL = /^:?-+:?$/;

/** A row's cells, trimmed: split at unescaped pipes, one leading and one trailing pipe dropped, `\|` → `|`. */
export function splitRow(line: string): string[] {
  const text = line.trim();
  const cells: string[] = [];
  let cell = "";
  let endsWithPipe = false;
  for (let i = text.startsWith("|") ? 1 : 0; i < text.length; i++) {
    const ch = text[i];
    endsWithPipe = false;
    if (ch === "\\" && i + 1 < text.length) {
      const next = text[++i];
      cell += next === "|" ? "|" : ch + next; // other escapes stay as written, for the inline renderer
    } else if (ch === "|") {
      cells.push(cell);
      cell = "";
      endsWithPipe = true;
    } else cell += ch;
  }
  if (!endsWithPipe) cells.push(cell);
  return cells.map((c) => c.trim());
}

/** The column alignments a delimiter row sets, or null when the line is not one. */
export function parseDelimiterRow(line: string): Align[] | null {
  if (!line.includes("|")) return null;
  const cells = splitRow(line);
  return cells.every((cell) => DELIMITER_CELL.test(cell)) ? cells.map(alignOf) : null;
}

function alignOf(delimiter: string): Align {
  const left = delimiter.startsWith(":");
  const right = delimiter.endsWith(":");
  return left && right ? "center" : right ? "right" : left ? "left" : null;
}

/** A body row cut or padded with empty cells to the header's width. */
export function fitRow(cells: string[], width: number): string[] {
  return Array.from({ length: width }, (_, j) => cells[j] ?? "");
}

/**
 * The table whose header row is `lines[start]`, and the index of the first line after it; null when the next
 * line is not a delimiter row with the header's cell count. `startsBlock` tells a line that ends the table.
 */
export function readTable(
  lines: string[],
  start: number,
  startsBlock: (line: string) => boolean,
): { table: TableBlock; end: number } | null {
  if (start + 1 >= lines.length || !lines[start].trim()) return null;
  const align = parseDelimiterRow(lines[start + 1]);
  const header = align && splitRow(lines[start]);
  if (!align || !header || header.length !== align.length) return null;
  const rows: string[][] = [];
  let end = start + 2;
  for (; end < lines.length && lines[end].trim() && !startsBlock(lines[end]); end++) {
    rows.push(fitRow(splitRow(lines[end]), align.length));
  }
  return { table: { align, header, rows }, end };
}

/** A name for the table's scroll box, from its header's plain text: "Table: Feature, ROS 1, ROS 2". */
export function tableLabel(header: string[]): string {
  const names = header.map(plainText).filter(Boolean);
  return names.length ? `Table: ${names.join(", ")}` : "Table";
}

/** Inline Markdown without its marks: link text kept, citation markers dropped, code and emphasis marks gone. */
function plainText(markdown: string): string {
  return markdown
    .replace(/\[([^\]\n]+)\]\([^)\s]+\)/g, "$1")
    .replace(/\[\d{1,3}(?:\s*,\s*\d{1,3})*\]/g, "")
    .replace(/[`*]+|(?<!\w)_+|_+(?!\w)/g, "")
    .replace(/\s+/g, " ")
    .trim();
}
