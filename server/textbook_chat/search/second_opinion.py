"""The second opinion: where the first stage and the term evidence disagree, the cross-encoder reads the question with
the passages' sentences nearest it; a decline needs it and one more piece of evidence, an answer after a decline
needs it clearly high.

``plan`` says whether it is asked at all (docs/evaluation.md "The second opinion"); ``judge`` reads the fewest pairs
that settle the question (one at a time, ``settled``), caches each pair's score by question
and chunk, and runs the model off the event loop with bounded concurrency (``core/crossencoder.py``). Its thresholds
are derived per book at ingest from in-scope and out-of-scope probes (``calibration.py``) and kept with the index.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from textbook_chat.core.crossencoder import CrossEncoder, CrossEncoderUnavailable
from textbook_chat.index import sparse
from textbook_chat.search import confidence

log = logging.getLogger(__name__)

Change = Literal["declined", "answered"]
Plan = Literal["answer", "decline", "ask"]

# A pair is the question and the passage's sentences nearest it (``nearest``), cut to this many word pieces: on the
# three books' sets 80 pieces of 50 words decided as 128 pieces of the passage's start did, at about 60 % of the cost;
# 64 pieces of 40 words lost a right answer (docs/evaluation.md "The second opinion").
MAX_TOKENS = 80
NEAREST_WORDS = 50  # the passage's words read, heading path aside
# On an answer, two pairs read more than this below the decline logit settle it: the third is not read. On the four
# books' question and conversation sets the third pair changed no decision then; it did within the margin ("how do
# I check mine for errors?" asked alone: -6.6 and -8, saved by a third at -5.4 on a book declining below -6).
CLEARLY_OFF = 2.0
MAX_PAIRS = 3  # on the three books' sets the 4th and 5th passages never changed a decision or an order
CACHE_SIZE = 4096  # (question, chunk) scores kept: a panel's suggested questions repeat
# The band, on the common confidence scale (so in raw evidence it is each book's own): from halfway below the
# decline point (0.2) to just above the low-confidence point (0.3).
BAND = (0.1, 0.35)
# MS MARCO logits: a passage that answers scores about +9, an unrelated one about -11; between the two, a
# book's thresholds are derived from its probes (``calibration.opinion_rule``) within these bounds.
DEFAULT_DECLINE_BELOW = -7.0
DEFAULT_OVERTURN_ABOVE = 1.0
# How far the cross-encoder must prefer a later passage to lift it above an earlier one of the first stage: on the
# three books' question sets a margin of 2 pushed right passages down (MRR 0.936 -> 0.922 on one), 3 and more never
# did; 4 leaves room.
LIFT_MARGIN = 4.0
# How far above the overturn logit a passage must score to lift a decline of a question naming a thing the book
# never mentions, or to keep an answer to one: a passage about its neighbours reached overturn + 1.2 ("How does the
# scan operator keep a running total?" against the passage on reduce; "the same with the Zoom Video SDK?" read with
# the subject it took, against the book's own SDK page), one that answered a name the book spells another way
# overturn + 3.7 ("the ROS-TCP connector", before hyphenated names were matched by their parts).
NAMED_MARGIN = 2.0
# The share of a question's content words the book never uses, in any form, from which that is evidence the book
# does not answer it: readers' paraphrases of the three books reached 0.33, questions about other subjects 0.5-1.0.
ABSENT = 0.5
# First-stage confidence (common scale) under which it is evidence for a decline: the lowest quarter of the "low"
# level. Paraphrases the book answers sat at 0.23-0.30 on the fetched book, where the cross-encoder read them low.
WEAK = confidence.DECLINE + (confidence.LOW - confidence.DECLINE) / 4
# ... but only beside this share of the question's content words absent from the book: weak passages and a low
# logit are both the passages' relevance. Readers' paraphrases the two unseen books answer, declined on weak
# passages and a logit of -10, had 0.08 and 0.29 absent; questions about other subjects there 0.4-0.75.
WEAK_ABSENT = 1 / 3


@dataclass(frozen=True)
class Thresholds:
    """Where the second opinion is asked (``band``, common scale) and what it takes to change a decision."""

    decline_below: float = DEFAULT_DECLINE_BELOW  # the best passage's logit under this (with other evidence): declined
    overturn_above: float = DEFAULT_OVERTURN_ABOVE  # over this: a decline is overturned
    band_low: float = BAND[0]
    band_high: float = BAND[1]
    weak_below: float = WEAK  # first-stage confidence under this is evidence for a decline

    def __post_init__(self) -> None:
        if not self.decline_below < self.overturn_above or not 0.0 <= self.band_low < self.band_high <= 1.0:
            raise ValueError(f"second-opinion thresholds out of order: {self}")

    def lifts_above(self, *, named: bool) -> float:
        """The logit a passage must beat to lift a decline: ``overturn_above``, ``NAMED_MARGIN`` more where the
        question names a thing the book never mentions."""
        return self.overturn_above + (NAMED_MARGIN if named else 0.0)

    @property
    def midpoint(self) -> float:
        """Halfway from ``decline_below`` to ``overturn_above``: over it, a decline on weak evidence alone is lifted."""
        return (self.decline_below + self.overturn_above) / 2

    def describe(self) -> str:
        return (
            f"asked at confidence {self.band_low:.2f}-{self.band_high:.2f} where other evidence doubts the first "
            f"stage (a rare word or a name the book never uses, {ABSENT:.0%} of its words absent from the book, or "
            f"{WEAK_ABSENT:.0%} with confidence under {self.weak_below:.3f}); declines below logit "
            f"{self.decline_below:.2f} with that evidence (not above {self.overturn_above:.2f} where the question "
            f"names a thing the book never mentions), "
            f"overturns a decline above {self.overturn_above:.2f} (above {self.midpoint:.2f} when only the passages' "
            f"evidence was weak, above {self.lifts_above(named=True):.2f} when it names such a thing)"
        )


@dataclass(frozen=True)
class Evidence:
    """What the first stage found, beside the cross-encoder."""

    confidence: float  # common scale, after the names / terms factor
    unscaled: float  # the same before it
    unknown_rare: bool  # a term of the question the book never uses that tells (``sparse.telling``)
    absent: float = 0.0  # the share of its content words the book never uses (``vocabulary.BookWords.absent_share``)
    # It names a thing the book never mentions (a product, a tool, an operator: "MobX", "GitHub Sponsors", "the scan
    # operator"; rare in English or not): the passages about its neighbours are not about it, so an answer stands,
    # and a decline the names rule caused is lifted, only where one of them answers clearly (``NAMED_MARGIN``).
    unknown_name: bool = False

    def doubts(self, thresholds: Thresholds) -> bool:
        """Evidence other than the cross-encoder that the book may not answer: about the question's words, since
        weak passages alone are what the cross-encoder reads again (the two would be one signal counted twice);
        weak passages count with a third of the question's words absent from the book (``WEAK_ABSENT``)."""
        weak = self.confidence < thresholds.weak_below and self.absent >= WEAK_ABSENT
        return weak or self.unknown_rare or self.unknown_name or self.absent >= ABSENT

    @property
    def only_weak(self) -> bool:
        """The passages' evidence is weak and nothing else doubts: no names or terms rule lowered it, no rare word
        or name the book never uses, most of the question's words in the book. The cross-encoder's midpoint
        decides."""
        return (
            self.unscaled < confidence.DECLINE
            and not self.unknown_rare
            and not self.unknown_name
            and self.absent < ABSENT
        )


def plan(thresholds: Thresholds, evidence: Evidence) -> Plan:
    """``answer`` or ``decline`` where the first stage and the term evidence agree (no second opinion), else ``ask``:

    - a first-stage answer is doubted only within the band and with other evidence (``Evidence.doubts``);
    - a decline the names / terms rules caused (the passages alone would have answered) is reconsidered, unless a
      rare word the book never uses says so and the passages themselves are weak;
    - a decline the passages caused is reconsidered within the band (``judge`` answers it above ``midpoint``
      when nothing else doubts, above ``overturn_above`` otherwise)."""
    if evidence.confidence >= confidence.DECLINE:
        if evidence.confidence >= thresholds.band_high or not evidence.doubts(thresholds):
            return "answer"
        return "ask"
    if evidence.unscaled >= confidence.DECLINE:
        agree = evidence.unknown_rare and evidence.unscaled < confidence.LOW
        return "decline" if agree else "ask"
    return "ask" if evidence.confidence >= thresholds.band_low else "decline"


@dataclass(frozen=True)
class Verdict:
    """What the second opinion said on one question."""

    score: float  # the best logit among the passages read
    change: Change | None  # the decision it changed, if any
    order: tuple[int, ...]  # the passages in their new order (``lifted``)
    ms: float
    pairs: int = 0  # pairs the model read (the cache and an early stop save the rest)


def nearest(question: str, passage: str, words: int = NEAREST_WORDS) -> str:
    """The passage's heading line, then its sentences (or lines) that share the most terms with the question, in
    the passage's order, up to ``words`` words; its start when none shares a term."""
    heading, _, text = passage.partition("\n")
    wanted = set(sparse.terms(question))
    pieces = [p for p in _PIECES.split(text) if p.strip() and not p.lstrip().startswith(("```", "~~~"))]
    scored = sorted(range(len(pieces)), key=lambda i: (-len(wanted & set(sparse.terms(pieces[i]))), i))
    kept: list[int] = []
    used = 0
    for i in scored:
        size = len(pieces[i].split())
        if kept and used + size > words:
            continue
        kept.append(i)
        used += size
        if used >= words:
            break
    body = " ".join(" ".join(pieces[i].split()) for i in sorted(kept))
    return f"{heading}\n{' '.join(body.split()[:words])}"


def settled(
    scores: Sequence[float | None], *, declined: bool, thresholds: Thresholds, confirming: bool = False
) -> bool:
    """Whether the pairs read so far (``None``: not read) decide the question, whatever the rest would say: a
    passage answers clearly; or, on an answer, one passage is not clearly off (a decline needs every pair read low),
    or two are far below the decline logit (``CLEARLY_OFF``); or, on a decline, the first stage's best passage
    clearly does not answer (the two stages agree). ``confirming``: the question names a thing the book never
    mentions; an answer to it is settled only by a passage that answers clearly (``NAMED_MARGIN``), a decline of
    it by such a passage or by the first passage clearly off."""
    known = [s for s in scores if s is not None]
    if not known:
        return False
    if max(known) > thresholds.lifts_above(named=confirming):
        return True
    if confirming and not declined:
        return False
    if not declined:
        clearly_off = len(known) >= 2 and max(known) < thresholds.decline_below - CLEARLY_OFF
        return clearly_off or max(known) >= thresholds.decline_below
    return scores[0] is not None and scores[0] < thresholds.decline_below


def lifted(scores: Sequence[float | None], margin: float = LIFT_MARGIN) -> tuple[int, ...]:
    """The first-stage order, where a scored passage moves above an earlier scored one only when its logit beats
    that one's by ``margin`` (unscored passages keep their places)."""
    order = list(range(len(scores)))
    for position in range(1, len(order)):
        j = position
        while j > 0:
            here, above = scores[order[j]], scores[order[j - 1]]
            if here is None or above is None or here <= above + margin:
                break
            order[j - 1], order[j] = order[j], order[j - 1]
            j -= 1
    return tuple(order)


def _unconfirmed(best: float, evidence: Evidence, thresholds: Thresholds) -> bool:
    """An answer naming a thing the book never mentions, with no passage the cross-encoder says clearly answers: a
    follow-up is read with the subject it took, which makes the book's passages on that subject look like answers
    ("how would I do the same with the Zoom Video SDK?" after the book's own SDK: overturn + 1.2)."""
    return evidence.unknown_name and best <= thresholds.lifts_above(named=True)


def _overturns(best: float, evidence: Evidence, thresholds: Thresholds) -> bool:
    """Whether the best passage lifts a decline: above the overturn logit, and clearly above it where the question
    names a thing the book never mentions; not where most of its words are not the book's and the passages alone
    declined it too."""
    return best > thresholds.lifts_above(named=evidence.unknown_name) and (
        evidence.unscaled >= confidence.DECLINE or evidence.absent < ABSENT
    )


class SecondOpinion:
    """The cross-encoder with a book's thresholds. Without the cross-encoder's files it says nothing (logged once),
    and retrieval decides as it did before it existed."""

    def __init__(self, encoder: CrossEncoder | None, thresholds: Thresholds | None = None) -> None:
        self.encoder = encoder
        self.thresholds = thresholds or Thresholds()
        self._failed = encoder is None
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()

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
        """The logit of each passage (read as ``nearest`` gives it), or None when the cross-encoder cannot run."""
        if self.encoder is None or self._failed or not passages:
            return None
        try:
            return [float(x) for x in await self.encoder.ascore(question, [nearest(question, p) for p in passages])]
        except Exception as exc:  # noqa: BLE001 -- a missing or broken model degrades to no second opinion
            self._fail(exc)
            return None

    async def judge(self, question: str, passages: Sequence[tuple[str, str]], evidence: Evidence) -> Verdict | None:
        """``passages``: (chunk id, text) in the first stage's order. Reads them one pair at a time, up to
        ``MAX_PAIRS``, until the decision is ``settled``; None when the cross-encoder cannot run."""
        started = time.perf_counter()
        declined = evidence.confidence < confidence.DECLINE
        t = self.thresholds
        key = " ".join(question.lower().split())  # what the uncased model reads: cased or spaced alike
        scores: list[float | None] = [self._cache.get((key, chunk)) for chunk, _ in passages]
        read = 0
        for i in range(min(MAX_PAIRS, len(passages))):
            if settled(scores, declined=declined, thresholds=t, confirming=evidence.unknown_name):
                break
            if scores[i] is not None:
                continue
            found = await self.scores(question, [passages[i][1]])
            if found is None:
                return None
            read += 1
            scores[i] = found[0]
            self._remember((key, passages[i][0]), found[0])
        best = max(s for s in scores if s is not None)
        change: Change | None = None
        if not declined and evidence.doubts(t) and (best < t.decline_below or _unconfirmed(best, evidence, t)):
            change = "declined"
        elif declined and _overturns(best, evidence, t):
            change = "answered"
        elif declined and evidence.only_weak and best > t.midpoint:
            change = "answered"
        ms = round((time.perf_counter() - started) * 1000, 2)
        return Verdict(round(best, 3), change, lifted(scores), ms, read)

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()

    def _remember(self, key: tuple[str, str], value: float) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def _fail(self, exc: Exception) -> None:
        if not self._failed:
            log.warning("the second opinion is off until restart; answering without it (%s)", exc)
        self._failed = True


_PIECES = re.compile(r"\n+|(?<=[.!?])\s+")
