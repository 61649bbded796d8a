"""Confidence: how sure retrieval is that the book answers the question, on one scale for every embedder.

The weighted mean of the top-5 similarities (weights 0.4, 0.25, 0.15, 0.1, 0.1; docs/evaluation.md, "How confidence
is computed"); below 0.2 decline, 0.2–0.3 low, 0.3–0.7 medium, from 0.7 high. MiniLM and OpenAI similarities live on
different scales, so each embedder has a ``Calibration``: the raw weighted means that correspond to the design's 0.2
/ 0.3 / 0.7, mapped piecewise-linearly. Everything downstream (levels, the adaptive module filter, the
``confidence`` in ``meta``) uses the common scale. Two additions to the design: a passage's similarity is its dense
cosine plus a keyword-coverage bonus (``retrieval.py``), and the weighted mean is scaled by the squared share of the
question's names (identifiers, proper nouns) that the book mentions at all. The numbers and how they were chosen are
in docs/evaluation.md ("Confidence calibration").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Level = Literal["none", "low", "medium", "high"]
FilterDecision = Literal["strict", "partial", "widened", "limited"]

WEIGHTS = (0.4, 0.25, 0.15, 0.1, 0.1)
DECLINE = 0.2  # below: decline and suggest related sections
LOW = 0.3  # below: answer with a low-confidence notice
HIGH = 0.7  # from here: high confidence
STRICT_FILTER = 0.7  # module filter kept as asked
PARTIAL_FILTER = 0.4  # module results, with a scope_partial notice
WIDEN_MARGIN = 0.2  # widen when searching everything beats the module by this much


@dataclass(frozen=True)
class Calibration:
    """The raw weighted similarity that maps to the design's DECLINE, LOW and HIGH for one embedder."""

    decline: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0.0 < self.decline < self.low < self.high < 1.0:
            raise ValueError(f"calibration points must increase within (0, 1): {self}")

    def to_common(self, raw: float) -> float:
        """Piecewise-linear through (0,0), (decline,0.2), (low,0.3), (high,0.7), (1,1); clamped to [0,1]."""
        points = ((0.0, 0.0), (self.decline, DECLINE), (self.low, LOW), (self.high, HIGH), (1.0, 1.0))
        raw = min(1.0, max(0.0, raw))
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if raw <= x1:
                return y0 + (raw - x0) * (y1 - y0) / (x1 - x0)
        return 1.0

    def to_raw(self, common: float) -> float:
        """The inverse of ``to_common`` (where the mapping rises)."""
        points = ((0.0, 0.0), (self.decline, DECLINE), (self.low, LOW), (self.high, HIGH), (1.0, 1.0))
        common = min(1.0, max(0.0, common))
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if common <= y1:
                return x0 + (common - y0) * (x1 - x0) / (y1 - y0)
        return 1.0


# OpenAI's numbers are the design's own (its seeds were written for text-embedding-3-small). MiniLM's
# were calibrated on the shared question set; see the README for the distributions behind them.
CALIBRATIONS: dict[str, Calibration] = {
    "openai": Calibration(decline=0.2, low=0.3, high=0.7),
    "local": Calibration(decline=0.287, low=0.486, high=0.735),
}


def weighted_similarity(similarities: Sequence[float]) -> float:
    """Weighted mean of the five best similarities; missing ones count as 0 (thin evidence is weak evidence)."""
    best = sorted(similarities, reverse=True)[: len(WEIGHTS)]
    return sum(w * max(0.0, s) for w, s in zip(WEIGHTS, best, strict=False)) / sum(WEIGHTS)


def known_share(names: Sequence[str], unknown: Sequence[str]) -> float:
    """The share of what a question names (``sparse.names``) that the book mentions somewhere; 1.0 with no names."""
    return 1.0 - len(set(unknown)) / len(set(names)) if names else 1.0


def name_factor(names: Sequence[str], unknown: Sequence[str]) -> float:
    """How much evidence survives the question's unknown names: the known share, squared. A question usually
    asks about every thing it names, so one unknown name among two leaves a quarter, not half."""
    return known_share(names, unknown) ** 2


def term_factor(weights: Mapping[str, float], unknown: Sequence[str]) -> float:
    """The weighted share of a question's informative terms the book mentions, squared (1.0 with none)."""
    total = sum(weights.values())
    if not total:
        return 1.0
    absent = sum(weights.get(term, 0.0) for term in set(unknown))
    return (1.0 - absent / total) ** 2


def score(similarities: Sequence[float], calibration: Calibration, *, known: float = 1.0) -> float:
    """The common-scale confidence. ``known`` scales the evidence down by the share of the question's names the
    book never mentions: passages about ROS answer nothing about MoveIt, however similar they look."""
    return round(calibration.to_common(weighted_similarity(similarities) * known), 4)


def level(confidence: float) -> Level:
    if confidence < DECLINE:
        return "none"
    if confidence < LOW:
        return "low"
    if confidence < HIGH:
        return "medium"
    return "high"


def filter_decision(filtered: float, unfiltered: float | None) -> FilterDecision:
    """The adaptive module filter (docs/evaluation.md, "How confidence is computed"); ``unfiltered`` is only
    needed (and searched) below PARTIAL_FILTER."""
    if filtered >= STRICT_FILTER:
        return "strict"
    if filtered >= PARTIAL_FILTER:
        return "partial"
    if unfiltered is not None and unfiltered > filtered + WIDEN_MARGIN:
        return "widened"
    return "limited"
