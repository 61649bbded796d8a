/**
 * Inline Markdown of an answer (code spans, links, `[n]` citations, emphasis) straight to React elements, in one
 * left-to-right pass whose every pattern is linear; no HTML from the model is ever rendered.
 */
import type { ReactNode } from "react";

export interface CitationTarget {
  n: number;
  url: string;
  title: string;
}

// Tried where a special character is, in this order; no repeated class here can also match the character that
// ends it, so each attempt reads at most to the next such character (link text stops at `[` too).
const LINK = /\[([^[\]\n]+)\]\(([^()\s]+)\)/y;
const CITATION = /\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]/y;
const STRONG = /\*\*([^*\n]+)\*\*|__([^_\n]+)__/y;
const EMPHASIS = /\*([^*\s][^*\n]*)\*|(?<![\w])_([^_\s][^_\n]*)_(?![\w])/y;

/**
 * Backtick runs (start, length) and, for each, the index of the next run of the same length: a code span opens
 * at a run and closes at the next run as long (CommonMark), found in one pass instead of by backtracking.
 */
function backtickRuns(text: string): { starts: number[]; lengths: number[]; closer: number[] } {
  const starts: number[] = [];
  const lengths: number[] = [];
  for (let i = text.indexOf("`"); i !== -1; i = text.indexOf("`", i)) {
    let end = i;
    while (text[end] === "`") end++;
    starts.push(i);
    lengths.push(end - i);
    i = end;
  }
  const closer = new Array<number>(starts.length).fill(-1);
  const nextOfLength = new Map<number, number>();
  for (let r = starts.length - 1; r >= 0; r--) {
    closer[r] = nextOfLength.get(lengths[r]) ?? -1;
    nextOfLength.set(lengths[r], r);
  }
  return { starts, lengths, closer };
}

export function inline(text: string, byN: Map<number, CitationTarget>): ReactNode[] {
  const out: ReactNode[] = [];
  const runs = text.includes("`") ? backtickRuns(text) : null;
  let run = 0;
  let last = 0;
  let key = 0;
  const emit = (start: number, end: number, node: ReactNode): void => {
    if (start > last) out.push(text.slice(last, start));
    out.push(node);
    last = end;
  };
  const special = /[`[*_]/g; // where a mark can start; one per call, as inline() recurses
  for (let match = special.exec(text); match; match = special.exec(text)) {
    const at = match.index;
    let end = at + 1;
    if (text[at] === "`" && runs) {
      while (runs.starts[run] < at) run++;
      const close = runs.starts[run] === at ? runs.closer[run] : -1;
      end = runs.starts[run] === at ? at + runs.lengths[run] : at + 1;
      if (close !== -1) {
        const code = text.slice(end, runs.starts[close]);
        end = runs.starts[close] + runs.lengths[close];
        emit(at, end, <code key={key++}>{codeText(code)}</code>);
      }
    } else if (text[at] === "[") {
      const link = sticky(LINK, text, at);
      const numbers = link ? null : sticky(CITATION, text, at);
      if (link) {
        end = at + link[0].length;
        emit(at, end, linkNode(link[1], link[2], byN, key++));
      } else if (numbers) {
        end = at + numbers[0].length;
        const refs = numbers[1].split(",").map((s) => Number(s.trim()));
        if (refs.every((n) => byN.has(n))) emit(at, end, refs.map((n) => citationLink(byN.get(n)!, key++)));
      }
    } else {
      const strong = sticky(STRONG, text, at);
      const em = strong ? null : sticky(EMPHASIS, text, at);
      if (strong) emit(at, (end = at + strong[0].length), <strong key={key++}>{inline(strong[1] ?? strong[2], byN)}</strong>);
      else if (em) emit(at, (end = at + em[0].length), <em key={key++}>{inline(em[1] ?? em[2], byN)}</em>);
    }
    special.lastIndex = end;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function sticky(pattern: RegExp, text: string, at: number): RegExpExecArray | null {
  pattern.lastIndex = at;
  return pattern.exec(text);
}

/** A code span's text: one space each side is dropped when both are there and it is not all spaces. */
function codeText(code: string): string {
  return code.length > 2 && code.startsWith(" ") && code.endsWith(" ") && code.trim() ? code.slice(1, -1) : code;
}

function linkNode(text: string, href: string, byN: Map<number, CitationTarget>, key: number): ReactNode {
  if (!safeHref(href)) return text;
  return externalHref(href) ? (
    // Off the site: a new tab, shown as such, never the page the panel sits in (issue 25).
    <a key={key} href={href} className="tc-external" target="_blank" rel="noopener noreferrer nofollow">
      {inline(text, byN)}
      <span aria-hidden="true"> ↗</span>
      <span className="tc-visually-hidden"> (opens another site)</span>
    </a>
  ) : (
    <a key={key} href={href} target="_top">
      {inline(text, byN)}
    </a>
  );
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
