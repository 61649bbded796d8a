/**
 * A small Markdown renderer for answers (paragraphs, headings, lists, quotes, fenced code, pipe tables, inline
 * code, emphasis, links) straight to React elements, so nothing is parsed as HTML; `[n]` becomes a citation link.
 * It tolerates the half-finished Markdown of a stream in progress (an unclosed fence is still code). While an
 * answer streams, only its last, growing blocks are parsed and drawn again (src/markdownBlocks.ts).
 */
import { memo, useMemo, useRef, type ReactNode } from "react";
import { CodeBlock } from "./CodeBlock";
import { parseMarkdown, type Block, type ParsedMarkdown } from "./markdownBlocks";
import { inline, type CitationTarget } from "./markdownInline";
import { tableCutNote, tableLabel, type Align, type TableBlock } from "./markdownTable";

export { parseBlocks } from "./markdownBlocks";
export { externalHref, inline, safeHref, type CitationTarget } from "./markdownInline";

type Citations = Map<number, CitationTarget>;

export function Markdown({ text, citations }: { text: string; citations: CitationTarget[] }): ReactNode {
  // The parse of the text drawn last: a text that extends it is parsed from where it could still change.
  const parsed = useRef<ParsedMarkdown | null>(null);
  parsed.current = parseMarkdown(parsed.current, text);
  const sameCitations = citations.map((c) => `${c.n}\n${c.url}\n${c.title}`).join("\n");
  // eslint-disable-next-line react-hooks/exhaustive-deps
  const byN = useMemo(() => new Map(citations.map((c) => [c.n, c])), [sameCitations]);
  return parsed.current.blocks.map((block, i) => <BlockView key={i} block={block} byN={byN} />);
}

/** One block, drawn again only when it changed (a final block keeps its object from one parse to the next). */
const BlockView = memo(function BlockView({ block, byN }: { block: Block; byN: Citations }): ReactNode {
  switch (block.kind) {
    case "code":
      return <CodeBlock lang={block.lang} code={block.text} />;
    case "heading": {
      const Tag = `h${Math.min(block.level + 2, 6)}` as "h3";
      return <Tag>{inline(block.text, byN)}</Tag>;
    }
    case "list": {
      const items = block.items.map((item, j) => (
        <li key={j}>
          <Inline text={item} byN={byN} />
        </li>
      ));
      return block.ordered ? <ol>{items}</ol> : <ul>{items}</ul>;
    }
    case "quote":
      return <blockquote>{inline(block.text, byN)}</blockquote>;
    case "paragraph":
      return <p>{inline(block.text, byN)}</p>;
    case "table":
      return <Table table={block} byN={byN} />;
  }
});

/** Inline Markdown, drawn again only when its text changed (the items of a list that is still growing). */
const Inline = memo(function Inline({ text, byN }: { text: string; byN: Citations }): ReactNode {
  return inline(text, byN);
});

/** A table in a box that scrolls sideways when it is wider than the panel; keyboard users can focus and scroll it.
 * At most MAX_TABLE_ROWS rows and MAX_TABLE_COLUMNS columns are drawn; a note under it says what was cut. */
function Table({ table, byN }: { table: TableBlock; byN: Citations }): ReactNode {
  const cut = tableCutNote(table);
  return (
    <>
      <div className="tc-table-scroll" role="region" aria-label={tableLabel(table.header)} tabIndex={0}>
        <table>
          <thead>
            <Row tag="th" cells={table.header} align={table.align} byN={byN} />
          </thead>
          <tbody>
            {table.rows.map((row, r) => (
              <Row key={r} tag="td" cells={row} align={table.align} byN={byN} />
            ))}
          </tbody>
        </table>
      </div>
      {cut && (
        <p className="tc-table-cut tc-muted" role="note">
          {cut}
        </p>
      )}
    </>
  );
}

/** One row; a row already drawn keeps its cells (the same array) while the table streams on, and is skipped. */
const Row = memo(function Row(props: { tag: "th" | "td"; cells: string[]; align: Align[]; byN: Citations }): ReactNode {
  const { tag: Tag, cells, align, byN } = props;
  return (
    <tr>
      {cells.map((text, j) => (
        <Tag key={j} scope={Tag === "th" ? "col" : undefined} style={alignStyle(align[j])}>
          {inline(text, byN)}
        </Tag>
      ))}
    </tr>
  );
});

function alignStyle(align: Align): { textAlign: NonNullable<Align> } | undefined {
  return align ? { textAlign: align } : undefined;
}
