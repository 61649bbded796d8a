import { describe, expect, it } from "vitest";

// Issue 35: the panel in files of one concept each, none over MAX_LINES lines: every file under src/, CSS too.
const MAX_LINES = 250;
const SRC = new URL("../src/", import.meta.url);

interface Fs {
  readdirSync(path: URL, options: { recursive: true }): string[];
  readFileSync(path: URL, encoding: "utf8"): string;
  statSync(path: URL): { isFile(): boolean };
}
// node:fs by a computed name: the panel's TypeScript has the DOM's types, not node's (no @types/node here).
const fs = (await import(/* @vite-ignore */ ["node", "fs"].join(":"))) as Fs;

function sources(): { path: string; lines: number }[] {
  return fs
    .readdirSync(SRC, { recursive: true })
    .filter((path) => fs.statSync(new URL(path, SRC)).isFile())
    .map((path) => {
      const text = fs.readFileSync(new URL(path, SRC), "utf8");
      return { path, lines: text.split("\n").length - (text.endsWith("\n") ? 1 : 0) };
    });
}

describe("the panel's source files", () => {
  it("are all read, whatever their kind", () => {
    const paths = sources().map((s) => s.path);
    expect(paths).toEqual(expect.arrayContaining(["ChatPanel.tsx", "client.ts", "panel.css"]));
    expect(sources().find((s) => s.path === "ChatPanel.tsx")!.lines).toBeGreaterThan(100);
  });

  it(`are at most ${MAX_LINES} lines each`, () => {
    expect(sources().filter(({ lines }) => lines > MAX_LINES)).toEqual([]);
  });
});
