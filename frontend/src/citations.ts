/**
 * Which sources an answer really cites. The server sends every source the answer was allowed to cite; the
 * reader should see the ones its text points to ([1], [2][3], [1, 2]) as its sources, and the rest apart,
 * as related reading. An answer with no markers at all (none yet while it streams) lists them all.
 */
import type { Source } from "./protocol";

const MARKERS = /\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]/g;

export function citedNumbers(text: string): Set<number> {
  const found = new Set<number>();
  for (const match of text.matchAll(MARKERS)) {
    for (const part of match[1].split(",")) found.add(Number(part.trim()));
  }
  return found;
}

export function splitSources(text: string, sources: Source[]): { cited: Source[]; related: Source[] } {
  const numbers = citedNumbers(text);
  const cited = sources.filter((s) => numbers.has(s.n));
  if (cited.length === 0) return { cited: sources, related: [] };
  return { cited, related: sources.filter((s) => !numbers.has(s.n)) };
}
