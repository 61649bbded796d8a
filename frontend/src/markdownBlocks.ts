/**
 * An answer's Markdown cut into blocks (paragraphs, headings, lists, quotes, fenced code, pipe tables), in time
 * linear in its length: each pattern matches a line's opening marker only, lines are capped before they are
 * matched, and a streaming answer is parsed on from where it can still change (blocks before it are kept).
 */
import { addRow, capLine, endsTable, openTable, type TableBlock } from "./markdownTable";

export type Block =
  | { kind: "code"; lang: string; text: string }
  | { kind: "heading"; level: number; text: string }
  | { kind: "list"; ordered: boolean; items: string[] }
  | { kind: "quote"; text: string }
  | ({ kind: "table" } & TableBlock)
  | { kind: "paragraph"; text: string };

// Opening markers only: no two neighbouring quantifiers here can match the same character.
const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s/;
const BULLET = /^\s{0,3}[-*+]\s/;
const NUMBERED = /^\s{0,3}\d{1,9}[.)]\s/;
const QUOTE = /^\s{0,3}>/;
const CONTINUATION = /^\s\s/;

/** Whether a line opens a block of its own (and so ends a table's rows). */
function startsBlock(line: string): boolean {
  const head = capLine(line);
  return [FENCE, HEADING, BULLET, NUMBERED, QUOTE].some((pattern) => pattern.test(head));
}

/** What follows a line's marker, without the spaces that separate them. */
function after(line: string, marker: RegExpExecArray): string {
  return line.slice(marker[0].length).trimStart();
}

/** A heading's text: without the closing run of `#` (when a space precedes it, as in CommonMark) and spaces. */
function headingText(rest: string): string {
  const text = rest.trimEnd();
  let end = text.length;
  while (end > 0 && text[end - 1] === "#") end--;
  if (end === 0) return "";
  return end < text.length && /\s/.test(text[end - 1]) ? text.slice(0, end).trimEnd() : text;
}

/** Where parsing can go on when more text is appended: nothing before `offset` can change any more. */
export interface Resume {
  offset: number;
  /** How many of the blocks are final. */
  blocks: number;
  /** A table still open at `offset`, with the rows before it. */
  table: TableBlock | null;
}

export interface ParsedMarkdown {
  readonly text: string;
  readonly blocks: readonly Block[];
  readonly resume: Resume;
}

const START: Resume = { offset: 0, blocks: 0, table: null };

export function parseBlocks(markdown: string): Block[] {
  return [...parseMarkdown(null, markdown).blocks];
}

/**
 * `text` parsed, reusing `previous` (the parse of an earlier text) when `text` extends the part of it that was
 * final: its blocks before that point are kept as they are (the same objects), and only the rest is parsed.
 */
export function parseMarkdown(previous: ParsedMarkdown | null, text: string): ParsedMarkdown {
  if (previous?.text === text) return previous;
  // `===` on the slices, not startsWith: V8 compares those a block at a time, startsWith a character at a time.
  const offset = previous ? previous.resume.offset : 0;
  const extends_ = previous !== null && text.slice(0, offset) === previous.text.slice(0, offset);
  const start = extends_ ? previous.resume : START;
  const { lines, starts } = splitLines(text, start.offset);
  const blocks = extends_ ? previous.blocks.slice(0, start.blocks) : [];
  // The last line may still grow, and a block's end is decided by the line after it: only lines before it are final.
  const reader = new BlockReader(lines, blocks, lines.length - 2);
  reader.read(start.table && { ...start.table, rows: start.table.rows.slice() });
  const mark = reader.stable;
  if (!mark) return { text, blocks, resume: start };
  const table = mark.table && { ...mark.table, rows: mark.table.rows.slice(0, mark.rows), rowCount: mark.rowCount };
  return { text, blocks, resume: { offset: starts[mark.line], blocks: mark.blocks, table } };
}

/** The lines of `text` from `from` on (split at LF, CR or CRLF), and where each starts. */
function splitLines(text: string, from: number): { lines: string[]; starts: number[] } {
  const lines: string[] = [];
  const starts: number[] = [];
  let start = from;
  for (let i = from; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch !== 10 && ch !== 13) continue;
    lines.push(text.slice(start, i));
    starts.push(start);
    if (ch === 13 && text.charCodeAt(i + 1) === 10) i++;
    start = i + 1;
  }
  lines.push(text.slice(start));
  starts.push(start);
  return { lines, starts };
}

interface Mark {
  line: number;
  blocks: number;
  table: TableBlock | null;
  rows: number;
  rowCount: number;
}

/** One pass over lines, adding blocks; `stable` is the last point at or before line `stableLimit` to resume at. */
class BlockReader {
  stable: Mark | null = null;
  private paragraph: string[] = [];

  constructor(
    private readonly lines: string[],
    private readonly blocks: Block[],
    private readonly stableLimit: number,
  ) {}

  read(openTable: TableBlock | null): void {
    let i = openTable ? this.rows(openTable, 0) : 0;
    while (i < this.lines.length) {
      if (!this.paragraph.length) this.mark(i, null);
      i = this.block(i);
    }
    this.flush();
  }

  private mark(line: number, table: TableBlock | null): void {
    if (line > this.stableLimit) return;
    const rows = table ? table.rows.length : 0;
    this.stable = { line, blocks: this.blocks.length, table, rows, rowCount: table ? table.rowCount : 0 };
  }

  private flush(): void {
    if (this.paragraph.length) this.blocks.push({ kind: "paragraph", text: this.paragraph.join("\n") });
    this.paragraph = [];
  }

  /** Read the block (or paragraph line) at line `i`; the index of the line after it. */
  private block(i: number): number {
    const { lines } = this;
    const line = capLine(lines[i]);
    const fence = FENCE.exec(line);
    if (fence) {
      this.flush();
      const body: string[] = [];
      let j = i + 1;
      for (; j < lines.length && !lines[j].trim().startsWith(fence[1]); j++) body.push(capLine(lines[j]));
      this.blocks.push({ kind: "code", lang: fence[2], text: body.join("\n") });
      return j + 1;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      this.flush();
      this.blocks.push({ kind: "heading", level: heading[1].length, text: headingText(after(line, heading)) });
      return i + 1;
    }
    const bullet = BULLET.exec(line);
    const numbered = bullet ? null : NUMBERED.exec(line);
    if (bullet || numbered) {
      this.flush();
      const pattern = bullet ? BULLET : NUMBERED;
      const items = [after(line, (bullet ?? numbered)!)];
      let j = i + 1;
      for (; j < lines.length; j++) {
        const next = capLine(lines[j]);
        const item = pattern.exec(next);
        if (item) items.push(after(next, item));
        else if (next.trim() && CONTINUATION.test(next)) items[items.length - 1] += " " + next.trim();
        else break;
      }
      this.blocks.push({ kind: "list", ordered: !bullet, items });
      return j;
    }
    if (QUOTE.test(line)) {
      this.flush();
      const body: string[] = [];
      let j = i;
      for (let quote; j < lines.length && (quote = QUOTE.exec(capLine(lines[j]))); j++) {
        body.push(capLine(lines[j]).slice(quote[0].length).replace(/^\s/, ""));
      }
      this.blocks.push({ kind: "quote", text: body.join("\n") });
      return j;
    }
    const table = i + 1 < lines.length ? openTable(lines[i], lines[i + 1]) : null;
    if (table) {
      this.flush();
      return this.rows(table, i + 2);
    }
    if (!line.trim()) this.flush();
    else this.paragraph.push(line);
    return i + 1;
  }

  /** Add `table`'s body rows from line `i` on, then the table; the index of the line after it. */
  private rows(table: TableBlock, i: number): number {
    let j = i;
    for (; j < this.lines.length && !endsTable(this.lines[j], startsBlock); j++) {
      this.mark(j, table);
      addRow(table, this.lines[j]);
    }
    this.blocks.push({ kind: "table", ...table });
    return j;
  }
}
