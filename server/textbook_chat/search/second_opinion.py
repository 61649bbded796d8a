"""The second opinion: where retrieval is unsure whether the book answers, the cross-encoder reads the question
with the top passages, and a clearly low score declines the answer while a clearly high one overturns a decline.

Asked only in doubt (``Thresholds.in_doubt``): a confidence within the band around the decline point, or a
decline that the names / specific-terms rules caused (the passages alone would have answered). Confident
questions never pay for it. Its thresholds are derived per book at ingest (``calibration.py``) and kept with
the index; ``retrieval.py`` applies the verdict (and orders the candidates by it) to the ``Retrieval``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from textbook_chat.core.crossencoder import CrossEncoder, CrossEncoderUnavailable
from textbook_chat.search import confidence

log = logging.getLogger(__name__)

Change = Literal["declined", "answered"]

# Pairs are cut to this many word pieces: on both books 128 gave the same decisions and the same ranking as 256
# at half the cost (README "Confidence calibration").
MAX_TOKENS = 128
# The band, on the common confidence scale (so in raw evidence it is each book's own): from halfway below the
# decline point (0.2) to just above the low-confidence point (0.3).
BAND = (0.1, 0.35)
# MS MARCO logits: a passage that answers scores about +9, an unrelated one about -11; between the two, a
# book's thresholds are derived from its probes (``calibration.opinion_rule``) within these bounds.
DEFAULT_DECLINE_BELOW = -7.0
DEFAULT_OVERTURN_ABOVE = 1.0


@dataclass(frozen=True)
class Thresholds:
    """Where the second opinion is asked (``band``, common scale) and what it takes to change a decision."""

    decline_below: float = DEFAULT_DECLINE_BELOW  # the best passage's logit under this: the answer is declined
    overturn_above: float = DEFAULT_OVERTURN_ABOVE  # over this: a decline is overturned
    band_low: float = BAND[0]
    band_high: float = BAND[1]

    def __post_init__(self) -> None:
        if not self.decline_below < self.overturn_above or not 0.0 <= self.band_low < self.band_high <= 1.0:
            raise ValueError(f"second-opinion thresholds out of order: {self}")

    def in_doubt(self, score: float, unscaled: float) -> bool:
        """``score``: the common-scale confidence; ``unscaled``: the same before the names / terms factor."""
        if self.band_low <= score < self.band_high:
            return True
        return score < confidence.DECLINE <= unscaled  # a decline the rules caused, not the passages

    def describe(self) -> str:
        return (
            f"asked at confidence {self.band_low:.2f}-{self.band_high:.2f} or on a decline the names/terms rules "
            f"caused; declines below logit {self.decline_below:.2f}, "
            f"overturns a decline above {self.overturn_above:.2f}"
        )


@dataclass(frozen=True)
class Verdict:
    """What the second opinion said on one question."""

    score: float  # the best logit among the passages read
    change: Change | None  # the decision it changed, if any
    order: tuple[int, ...]  # the passages by their logit, best first
    ms: float


class SecondOpinion:
    """The cross-encoder with a book's thresholds. Without the cross-encoder's files it says nothing (logged once),
    and retrieval decides as it did before it existed."""

    def __init__(self, encoder: CrossEncoder | None, thresholds: Thresholds | None = None) -> None:
        self.encoder = encoder
        self.thresholds = thresholds or Thresholds()
        self._failed = encoder is None

    @classmethod
    def load(cls, thresholds: Thresholds | None = None) -> SecondOpinion:
        """With the installed cross-encoder (weights loaded on first use), or without one when it is missing."""
        from textbook_chat.core import crossencoder

        try:
            crossencoder.verified_dir()
        except CrossEncoderUnavailable as exc:
            log.warning("no second opinion on uncertain answers: %s", exc)
            return cls(None, thresholds)
        return cls(CrossEncoder(max_tokens=MAX_TOKENS, batch_size=1), thresholds)

    @property
    def available(self) -> bool:
        return not self._failed

    def warm_up(self) -> None:
        if self.encoder is not None and not self._failed:
            try:
                self.encoder.warm_up()
            except Exception as exc:  # noqa: BLE001 -- any failure of the model: answer without it, once logged
                self._fail(exc)

    async def scores(self, question: str, passages: Sequence[str]) -> list[float] | None:
        """The logit of each passage, or None when the cross-encoder cannot run."""
        if self.encoder is None or self._failed or not passages:
            return None
        try:
            return [float(x) for x in await self.encoder.ascore(question, passages)]
        except Exception as exc:  # noqa: BLE001 -- a missing or broken model degrades to no second opinion
            self._fail(exc)
            return None

    async def judge(self, question: str, passages: Sequence[str], *, declined: bool) -> Verdict | None:
        started = time.perf_counter()
        scores = await self.scores(question, passages)
        if scores is None:
            return None
        best = max(scores)
        change: Change | None = None
        if not declined and best < self.thresholds.decline_below:
            change = "declined"
        elif declined and best > self.thresholds.overturn_above:
            change = "answered"
        order = tuple(sorted(range(len(scores)), key=lambda i: -scores[i]))  # stable: ties keep retrieval's order
        return Verdict(round(best, 3), change, order, round((time.perf_counter() - started) * 1000, 2))

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()

    def _fail(self, exc: Exception) -> None:
        if not self._failed:
            log.warning("the second opinion is off until restart; answering without it (%s)", exc)
        self._failed = True
