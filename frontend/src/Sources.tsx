/** The sections an answer cites (or, apart, the related ones): "Module › Chapter › Heading" links, each with its
 * excerpt on hover where there is a mouse, or behind "Preview" on a touch screen. */
import { useState, type ReactNode } from "react";
import type { Source } from "./protocol";

export function Sources({
  sources,
  heading,
  titles,
  muted = false,
}: {
  sources: Source[];
  heading: string;
  titles: Map<string, string>;
  muted?: boolean;
}): ReactNode {
  // The excerpt shows on hover where there is a mouse; on a touch screen the "Preview" toggle opens it in place.
  const [previewing, setPreviewing] = useState<number | null>(null);
  return (
    <section className={muted ? "tc-sources tc-sources--related" : "tc-sources"} aria-label={heading}>
      <h4>{heading}</h4>
      <ol>
        {sources.map((s) => (
          <li key={s.n} value={s.n} className={previewing === s.n ? "tc-previewing" : undefined}>
            <a href={s.url} className="tc-source" data-n={s.n} target="_top">
              {sourceLabel(s, titles)}
            </a>
            {s.excerpt && (
              <>
                <button
                  type="button"
                  className="tc-link tc-preview-toggle"
                  aria-expanded={previewing === s.n}
                  aria-controls={`tc-excerpt-${s.n}`}
                  onClick={() => setPreviewing(previewing === s.n ? null : s.n)}
                >
                  {previewing === s.n ? "Hide preview" : "Preview"}
                </button>
                <span className="tc-excerpt" id={`tc-excerpt-${s.n}`} role="tooltip">
                  {s.excerpt}
                </span>
              </>
            )}
          </li>
        ))}
      </ol>
    </section>
  );
}

/** "Module › Chapter › Heading", skipping parts that repeat the previous one. */
export function sourceLabel(source: Source, moduleTitles: Map<string, string> = new Map()): string {
  const module = moduleTitles.get(source.module) ?? source.module;
  const parts = [module, source.chapter || source.title, ...(source.heading_path ?? [])];
  const out: string[] = [];
  for (const part of parts) {
    const clean = (part ?? "").trim();
    if (clean && !out.includes(clean)) out.push(clean);
  }
  return out.join(" › ");
}

