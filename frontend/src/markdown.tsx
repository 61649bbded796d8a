/**
 * A small Markdown renderer for answers (paragraphs, headings, lists, quotes, fenced code, pipe tables, inline
 * code, emphasis, links) straight to React elements, so nothing is parsed as HTML; `[n]` becomes a citation link.
 * It tolerates the half-finished Markdown of a stream in progress (an unclosed fence is still code).
 */
import type { ReactNode } from "react";
import { CodeBlock } from "./CodeBlock";
import { readTable, tableLabel, type Align, type TableBlock } from "./markdownTable";

export interface CitationTarget {
  n: number;
  url: string;
  title: string;
}

type Block =
  | { kind: "code"; lang: string; text: string }
  | { kind: "heading"; level: number; text: string }
  | { kind: "list"; ordered: boolean; items: string[] }
  | { kind: "quote"; text: string }
  | ({ kind: "table" } & TableBlock)
  | { kind: "paragraph"; text: string };

const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^\s{0,3}\d{1,9}[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;

/** Whether a line opens a block of its own (and so ends a table's rows). */
function startsBlock(line: string): boolean {
  return [FENCE, HEADING, BULLET, NUMBERED, QUOTE].some((pattern) => pattern.test(line));
}

export function parseBlocks(markdown: string): Block[] {
  const lines = markdown.replace(/\r\n?/g, "\n").split("\n");
  const blocks: Block[] = [];
  let paragraph: string[] = [];
  const flush = (): void => {
    if (paragraph.length) blocks.push({ kind: "paragraph", text: paragraph.join("\n") });
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const marker = fence[1];
      const body: string[] = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(marker)) body.push(lines[i++]);
      blocks.push({ kind: "code", lang: fence[2], text: body.join("\n") });
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      flush();
      blocks.push({ kind: "heading", level: heading[1].length, text: heading[2] });
      continue;
    }
    const bullet = BULLET.exec(line);
    const numbered = bullet ? null : NUMBERED.exec(line);
    if (bullet || numbered) {
      flush();
      const ordered = Boolean(numbered);
      const pattern = ordered ? NUMBERED : BULLET;
      const items = [(bullet ?? numbered)![1]];
      while (i + 1 < lines.length) {
        const next = lines[i + 1];
        const item = pattern.exec(next);
        if (item) items.push(item[1]);
        else if (next.trim() && /^\s{2,}/.test(next)) items[items.length - 1] += " " + next.trim();
        else break;
        i++;
      }
      blocks.push({ kind: "list", ordered, items });
      continue;
    }
    const quote = QUOTE.exec(line);
    if (quote) {
      flush();
      const body = [quote[1]];
      while (i + 1 < lines.length && QUOTE.test(lines[i + 1])) body.push(QUOTE.exec(lines[++i])![1]);
      blocks.push({ kind: "quote", text: body.join("\n") });
      continue;
    }
    const table = readTable(lines, i, startsBlock);
    if (table) {
      flush();
      blocks.push({ kind: "table", ...table.table });
      i = table.end - 1;
      continue;
    }
    if (!line.trim()) flush();
    else paragraph.push(line);
  }
  flush();
  return blocks;
}

export function Markdown({ text, citations }: { text: string; citations: CitationTarget[] }): ReactNode {
  const byN = new Map(citations.map((c) => [c.n, c]));
  return parseBlocks(text).map((block, i) => renderBlock(block, i, byN));
}

function renderBlock(block: Block, key: number, byN: Map<number, CitationTarget>): ReactNode {
  switch (block.kind) {
    case "code":
      return <CodeBlock key={key} lang={block.lang} code={block.text} />;
    case "heading": {
      const Tag = `h${Math.min(block.level + 2, 6)}` as "h3";
      return <Tag key={key}>{inline(block.text, byN)}</Tag>;
    }
    case "list": {
      const items = block.items.map((item, j) => <li key={j}>{inline(item, byN)}</li>);
      return block.ordered ? <ol key={key}>{items}</ol> : <ul key={key}>{items}</ul>;
    }
    case "quote":
      return <blockquote key={key}>{inline(block.text, byN)}</blockquote>;
    case "paragraph":
      return <p key={key}>{inline(block.text, byN)}</p>;
    case "table":
      return renderTable(block, key, byN);
  }
}

/** A table in a box that scrolls sideways when it is wider than the panel; keyboard users can focus and scroll it. */
function renderTable(table: TableBlock, key: number, byN: Map<number, CitationTarget>): ReactNode {
  const cell = (Tag: "th" | "td", text: string, column: number): ReactNode => (
    <Tag key={column} scope={Tag === "th" ? "col" : undefined} style={alignStyle(table.align[column])}>
      {inline(text, byN)}
    </Tag>
  );
  return (
    <div key={key} className="tc-table-scroll" role="region" aria-label={tableLabel(table.header)} tabIndex={0}>
      <table>
        <thead>
          <tr>{table.header.map((text, j) => cell("th", text, j))}</tr>
        </thead>
        <tbody>
          {table.rows.map((row, r) => (
            <tr key={r}>{row.map((text, j) => cell("td", text, j))}</tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function alignStyle(align: Align): { textAlign: NonNullable<Align> } | undefined {
  return align ? { textAlign: align } : undefined;
}

// Order matters: code spans first (nothing inside them is Markdown), then links, citations, emphasis.
const INLINE =
  /(`+)([\s\S]*?[^`])\1(?!`)|\[([^\]\n]+)\]\(([^)\s]+)\)|\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]|\*\*([^*\n]+)\*\*|__([^_\n]+)__|\*([^*\s][^*\n]*)\*|(?<![\w])_([^_\s][^_\n]*)_(?![\w])/g;

export function inline(text: string, byN: Map<number, CitationTarget>): ReactNode[] {
  const out: ReactNode[] = [];
  let last = 0;
  let key = 0;
  for (const match of text.matchAll(INLINE)) {
    const start = match.index ?? 0;
    if (start > last) out.push(text.slice(last, start));
    last = start + match[0].length;
    const [, ticks, code, linkText, href, numbers, strong1, strong2, em1, em2] = match;
    if (ticks) out.push(<code key={key++}>{code.trim() ? code.replace(/^ (.*) $/, "$1") : code}</code>);
    else if (linkText !== undefined) {
      out.push(
        !safeHref(href) ? (
          linkText
        ) : externalHref(href) ? (
          // Off the site: a new tab, shown as such, never the page the panel sits in (issue 25).
          <a key={key++} href={href} className="tc-external" target="_blank" rel="noopener noreferrer nofollow">
            {inline(linkText, byN)}
            <span aria-hidden="true"> ↗</span>
            <span className="tc-visually-hidden"> (opens another site)</span>
          </a>
        ) : (
          <a key={key++} href={href} target="_top">
            {inline(linkText, byN)}
          </a>
        ),
      );
    } else if (numbers !== undefined) {
      const refs = numbers.split(",").map((s) => Number(s.trim()));
      if (refs.every((n) => byN.has(n))) refs.forEach((n) => out.push(citationLink(byN.get(n)!, key++)));
      else out.push(match[0]);
    } else if (strong1 ?? strong2) out.push(<strong key={key++}>{inline(strong1 ?? strong2, byN)}</strong>);
    else out.push(<em key={key++}>{inline(em1 ?? em2, byN)}</em>);
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function citationLink(target: CitationTarget, key: number): ReactNode {
  return (
    <a key={key} className="tc-cite" href={target.url} title={target.title} data-cite={target.n}>
      [{target.n}]
    </a>
  );
}

/** Only web and page-relative links: never `javascript:` or `data:` from model output. */
export function safeHref(href: string): boolean {
  return /^(https?:\/\/|\/|#)/i.test(href);
}

/** A link that leaves this site: an absolute URL, or a protocol-relative one (`//host/x`; browsers read `/\host`
 * the same way), which starts with a slash like a path on this site but is not one. */
export function externalHref(href: string): boolean {
  return /^(https?:)?[\/\\]{2}/i.test(href);
}
