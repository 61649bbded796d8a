/**
 * What an answer's retrieval confidence means to a reader, at every level: how much of the answer the book
 * itself supports, said in words (and a three-step meter), not as a number. Declined answers say so instead.
 */
import type { ConfidenceLevel, FinishReason } from "./protocol";

export interface ConfidenceCue {
  level: ConfidenceLevel;
  /** Filled steps of a three-step meter. */
  steps: 0 | 1 | 2 | 3;
  label: string;
  /** The longer explanation (the cue's tooltip and accessible description). */
  detail: string;
}

const CUES: Record<ConfidenceLevel, Omit<ConfidenceCue, "level">> = {
  high: {
    steps: 3,
    label: "Well supported by the book",
    detail: "The book's sections match this question closely; the answer is built from them.",
  },
  medium: {
    steps: 2,
    label: "Partly supported by the book",
    detail: "The book covers this in part; check the cited sections for what it leaves out.",
  },
  low: {
    steps: 1,
    label: "Weakly supported by the book",
    detail: "The book says little on this; read the cited sections before relying on the answer.",
  },
  none: {
    steps: 0,
    label: "Not covered by the book",
    detail: "Nothing in the book matched this question closely enough to answer from it.",
  },
};

/**
 * The cue for an answer's level; none while the level is unknown (an answer from history keeps only its
 * score), for an answer that was stopped, or for an FAQ answer given while the book could not be searched.
 */
export function confidenceCue(level: ConfidenceLevel | null, finishReason: FinishReason | null): ConfidenceCue | null {
  if (!level || finishReason === "cancelled" || finishReason === "fallback") return null;
  return { level, ...CUES[level] };
}
