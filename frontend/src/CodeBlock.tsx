/**
 * A fenced code block in an answer: highlighted by prism-react-renderer (the highlighter Docusaurus sites
 * already ship, so on a book's site the panel shares the site's copy) and with a Copy button. Tokens get
 * Prism's class names only; their colours come from panel.css, so they follow the light and dark themes.
 * A language Prism does not know (bash, say) stays plain text, and so does code too long to highlight quickly.
 */
import { Highlight, type PrismTheme } from "prism-react-renderer";
import { memo, type ReactNode } from "react";
import { CopyButton } from "./CopyButton";

const CLASSES_ONLY: PrismTheme = { plain: {}, styles: [] };
/** Longer code is shown plain: Prism's grammars are not all linear, and a block is highlighted again as it streams. */
export const MAX_HIGHLIGHT_CHARS = 20_000;

/** Fence names people write → Prism's language names. */
const ALIASES: Record<string, string> = {
  py: "python",
  "c++": "cpp",
  cc: "cpp",
  hpp: "cpp",
  h: "c",
  xml: "markup",
  html: "markup",
  urdf: "markup",
  sdf: "markup",
  launch: "markup",
  yml: "yaml",
  ts: "typescript",
  js: "javascript",
};

export function prismLanguage(lang: string): string {
  const name = lang.trim().toLowerCase();
  return ALIASES[name] ?? name;
}

/** Drawn again only when its code changed (a finished block keeps its text while the answer streams on). */
export const CodeBlock = memo(function CodeBlock({ lang, code }: { lang: string; code: string }): ReactNode {
  const language = code.length > MAX_HIGHLIGHT_CHARS ? "text" : prismLanguage(lang) || "text";
  return (
    <div className="tc-codeblock">
      <Highlight theme={CLASSES_ONLY} code={code} language={language}>
        {({ tokens, getLineProps, getTokenProps }) => (
          <pre className="tc-code" data-lang={lang || undefined}>
            <code>
              {tokens.map((line, i) => {
                const { className } = getLineProps({ line });
                return (
                  <span key={i} className={className}>
                    {line.map((token, j) => {
                      const props = getTokenProps({ token });
                      return (
                        <span key={j} className={props.className}>
                          {props.children}
                        </span>
                      );
                    })}
                    {i < tokens.length - 1 ? "\n" : null}
                  </span>
                );
              })}
            </code>
          </pre>
        )}
      </Highlight>
      <CopyButton text={() => code} what="code" />
    </div>
  );
});
