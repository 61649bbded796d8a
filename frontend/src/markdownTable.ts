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
 *
 * What is kept is bounded (issue 34): the first MAX_TABLE_COLUMNS columns and MAX_TABLE_ROWS body rows, each cell
 * cut at MAX_LINE_CHARS; `columns` and `rowCount` say how many there were, so the panel can say the rest is cut.
 */

export type Align = "left" | "center" | "right" | null;

export interface TableBlock {
  align: Align[];
  header: string[];
  /** The body rows kept (at most MAX_TABLE_ROWS), each as wide as `header`. */
  rows: string[][];
  /** How many columns the table has (`header` holds at most MAX_TABLE_COLUMNS of them). */
  columns: number;
  /** How many body rows the table has. */
  rowCount: number;
}

export const MAX_TABLE_ROWS = 100;
export const MAX_TABLE_COLUMNS = 20;
/** The longest line (or table cell) an answer is drawn with; the rest of it is cut, marked by "…". */
export const MAX_LINE_CHARS = 16_000;

const DELIMITER_CELL = /^:?-+:?$/;

/** `text` cut to MAX_LINE_CHARS (never inside a surrogate pair), with "…" where it was cut. */
export function capLine(text: string): string {
  if (text.length <= MAX_LINE_CHARS) return text;
  const high = text.charCodeAt(MAX_LINE_CHARS - 1);
  const end = high >= 0xd800 && high <= 0xdbff ? MAX_LINE_CHARS - 1 : MAX_LINE_CHARS;
  return text.slice(0, end) + "…";
}

/**
 * A row's cells, trimmed: split at unescaped pipes, one leading and one trailing pipe dropped, `\|` → `|`. Only
 * the first `keep` cells are built (each cut at MAX_LINE_CHARS); `count` is how many there are. One pass.
 */
export function scanRow(line: string, keep: number = Infinity): { cells: string[]; count: number } {
  const text = line.trim();
  const cells: string[] = [];
  let count = 0;
  let from = text.startsWith("|") ? 1 : 0;
  let cell = "";
  let endsWithPipe = false;
  const close = (i: number): void => {
    if (count++ < keep) cells.push(capLine((cell + text.slice(from, i)).trim()));
    cell = "";
    from = i + 1;
  };
  for (let i = from; i < text.length; i++) {
    endsWithPipe = false;
    if (text[i] === "\\" && i + 1 < text.length) {
      // `\|` is a literal pipe; other escapes stay as written, for the inline renderer
      if (text[i + 1] === "|" && count < keep) cell += text.slice(from, i) + "|";
      if (text[i + 1] === "|") from = i + 2;
      i++;
    } else if (text[i] === "|") {
      close(i);
      endsWithPipe = true;
    }
  }
  if (!endsWithPipe) close(text.length);
  return { cells, count };
}

/** A row's cells (all of them): see scanRow. */
export function splitRow(line: string): string[] {
  return scanRow(line).cells;
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

/** The table that `header` and `delimiter` open (no rows yet), or null when they do not open one. */
export function openTable(header: string, delimiter: string): TableBlock | null {
  if (!header.trim()) return null;
  const align = parseDelimiterRow(delimiter);
  if (!align) return null;
  const head = scanRow(header, MAX_TABLE_COLUMNS);
  if (head.count !== align.length) return null;
  return { align: align.slice(0, MAX_TABLE_COLUMNS), header: head.cells, rows: [], columns: align.length, rowCount: 0 };
}

/** Add a body row: counted always, kept while fewer than MAX_TABLE_ROWS are. */
export function addRow(table: TableBlock, line: string): void {
  if (table.rowCount++ < MAX_TABLE_ROWS) table.rows.push(fitRow(scanRow(line, MAX_TABLE_COLUMNS).cells, table.header.length));
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
  const table = start + 1 < lines.length ? openTable(lines[start], lines[start + 1]) : null;
  if (!table) return null;
  let end = start + 2;
  for (; end < lines.length && endsTable(lines[end], startsBlock) === false; end++) addRow(table, lines[end]);
  return { table, end };
}

/** Whether `line` ends a table rather than adding a row to it. */
export function endsTable(line: string, startsBlock: (line: string) => boolean): boolean {
  return !line.trim() || startsBlock(line);
}

/** What was cut from a table, in words ("Showing 200 of 5,000 rows."), or null when all of it is drawn. */
export function tableCutNote(table: TableBlock): string | null {
  const parts: string[] = [];
  if (table.rowCount > table.rows.length) parts.push(`${table.rows.length} of ${table.rowCount.toLocaleString("en")} rows`);
  if (table.columns > table.header.length) parts.push(`${table.header.length} of ${table.columns.toLocaleString("en")} columns`);
  return parts.length ? `Table cut: showing ${parts.join(" and ")}.` : null;
}

/** A name for the table's scroll box, from its header's plain text: "Table: Feature, ROS 1, ROS 2". */
export function tableLabel(header: string[]): string {
  const names = header.map(plainText).filter(Boolean);
  return names.length ? `Table: ${names.join(", ")}` : "Table";
}

/** Inline Markdown without its marks: link text kept, citation markers dropped, code and emphasis marks gone.
 * Each pattern is linear: no class that repeats can also match the character that ends it. */
function plainText(markdown: string): string {
  return markdown
    .replace(/\[([^[\]\n]+)\]\([^()\s]+\)/g, "$1")
    .replace(/\[\d{1,3}(?:\s*,\s*\d{1,3})*\]/g, "")
    .replace(/[`*]+|(?<!\w)_+|(?<!_)_+(?![\w])/g, "")
    .replace(/\s+/g, " ")
    .trim();
}
