"""The offline generator: an answer quoted from the book's sources, without a model.

Keyword overlap with the question decides which units (``extract.py``) may be quoted; the cross-encoder, when
its weights are installed, reads the best few and decides their order; ``compose.py`` chooses what fits the
question's budget and writes it with its ``[n]`` markers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from textbook_chat.answer import compose, extract
from textbook_chat.answer.generator import Finished, GenerationRequest, GenEvent, Token, Usage
from textbook_chat.core.crossencoder import CrossEncoder, CrossEncoderUnavailable, available
from textbook_chat.index import sparse
from textbook_chat.search import context

if TYPE_CHECKING:
    from textbook_chat.search.retrieval import Source

log = logging.getLogger(__name__)

# Keyword overlap decides what may be quoted; the cross-encoder reads the best few of those and decides their
# order, so what fits the answer's budget is what answers best. Four short units (a heading and 20 words, about
# 40 word pieces with the question) take 25-50 ms on one core of this machine, several times that under load;
# past CROSS_ENCODER_WAIT_S the answer goes out in keyword order rather than keep the reader waiting (README).
CROSS_ENCODER_UNITS = 4
CROSS_ENCODER_WAIT_S = 0.25
# A listing no sentence introduces is quoted where it answers best, but its keywords count half: identifiers
# match a question's words without saying what the code shows, and at full weight such a listing displaced the
# lead-in whose steps a reader needed ("To create a workspace:"); at half it still answers follow-ups whose answer
# is only in code ("how do I cancel a goal of one?"): docs/results/2026-11.md, the eighth session.
BARE_CODE_WEIGHT = 0.5
ANSWERS_LOGIT = 0.0  # with no keyword in common, a unit is quoted only when the cross-encoder says it answers


def offline_generator(
    cross_encoder: CrossEncoder | None = None, *, wait_s: float = CROSS_ENCODER_WAIT_S
) -> ExtractiveGenerator:
    """The offline generator as the server builds it: ranking with ``cross_encoder`` (a new one when none is
    given and its weights are installed), by keyword overlap when they are not. ``eval`` waits for the
    cross-encoder however long it takes (``wait_s=math.inf``), so its figures do not follow the machine's load."""
    if cross_encoder is None:
        cross_encoder = _process_cross_encoder()
    return ExtractiveGenerator(cross_encoder=cross_encoder, cross_encoder_wait_s=wait_s)


@functools.cache
def _process_cross_encoder() -> CrossEncoder | None:
    """One cross-encoder per process (its session is ~22 MB): every app a process builds shares it."""
    return CrossEncoder() if available() else None


class ExtractiveGenerator:
    """Streams the units of the sources that best answer the question (sentences, lead-ins with their lists,
    table rows with their headers), each with its ``[n]`` marker; ``extract.py`` cuts, chooses and renders.

    With a ``CrossEncoder`` the units are ranked by how well they answer the question (it reads the
    ``CROSS_ENCODER_UNITS`` best by keyword overlap); without one, or when it fails, by keyword overlap alone.
    """

    name = "extractive"

    def __init__(
        self,
        *,
        pace_s: float = 0.008,
        words_per_token: int = 3,
        cross_encoder: CrossEncoder | None = None,
        cross_encoder_wait_s: float = CROSS_ENCODER_WAIT_S,
    ) -> None:
        self._pace_s = pace_s  # a readable stream for the demo, ~0.4 s for a whole answer
        self._words_per_token = words_per_token
        self.cross_encoder = cross_encoder
        self.cross_encoder_wait_s = cross_encoder_wait_s

    async def aclose(self) -> None:
        return None

    def warm_up(self) -> None:
        """Load the cross-encoder now (start-up) rather than on a reader's first question."""
        if self.cross_encoder is not None:
            try:
                self.cross_encoder.warm_up()
            except CrossEncoderUnavailable as exc:
                log.warning("offline answers rank by keywords only: %s", exc)
                self.cross_encoder = None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenEvent]:
        text = await self.answer_async(request)
        words = re.split(r"(?<=\s)(?=\S)", text)
        for i in range(0, len(words), self._words_per_token):
            yield Token("".join(words[i : i + self._words_per_token]))
            await asyncio.sleep(self._pace_s)
        yield Finished("stop", Usage(0, 0), self.name)

    async def answer_async(self, request: GenerationRequest) -> str:
        """The answer, the cross-encoder run off the event loop."""
        plan = self._plan(request)
        if isinstance(plan, str):
            return plan
        scores: list[float] | None = None
        if (pairs := self._pairs(request, plan)) is not None:
            assert self.cross_encoder is not None
            reading = self.cross_encoder.ascore(*pairs)
            try:
                logits = await asyncio.wait_for(reading, self.cross_encoder_wait_s)
                scores = [float(x) for x in logits]
            except TimeoutError:
                log.info("cross-encoder slower than %.2f s; answering in keyword order", self.cross_encoder_wait_s)
            except CrossEncoderUnavailable as exc:
                log.warning("offline answers rank by keywords only: %s", exc)
                self.cross_encoder = None
            except Exception as exc:  # onnxruntime's own errors: this answer goes out in keyword order
                log.warning("cross-encoder failed (%s); answering in keyword order", type(exc).__name__)
        return self._finish(request, plan, scores)

    def answer(self, request: GenerationRequest) -> str:
        """The answer, synchronously (the cross-encoder on this thread)."""
        plan = self._plan(request)
        if isinstance(plan, str):
            return plan
        scores: list[float] | None = None
        if (pairs := self._pairs(request, plan)) is not None:
            assert self.cross_encoder is not None
            scores = [float(x) for x in self.cross_encoder.score(*pairs)]
        return self._finish(request, plan, scores)

    def _pairs(self, request: GenerationRequest, plan: _Plan) -> tuple[str, list[str]] | None:
        """What the cross-encoder reads (the question, and the units worth reading), or None when there is no
        cross-encoder or nothing worth its time. A follow-up is read as asked where retrieval added its subject
        (``context.is_expanded``): the units already share the subject's words (``_wanted``), and the order
        should put first what answers what was asked now; a model's rewrite is a question of its own, read whole."""
        if self.cross_encoder is None or not plan.worth_reading:
            return None
        question = request.standalone or request.question
        if context.is_expanded(request.question, request.standalone):
            question = request.question
        return question, [u.scoring_text() for u in plan.to_read]

    def _plan(self, request: GenerationRequest) -> _Plan | str:
        """Every unit with its keyword score, and the ones the cross-encoder should read; or a final answer."""
        wanted = _wanted(request)
        if request.selected_text:
            cite = _citing_source(request.selected_text, request.sources)
            candidates = [_lexical(u, wanted) for u in extract.units(request.selected_text, cite)]
        elif not request.sources:
            return "I couldn't find passages in the textbook that answer this."
        else:
            words_only = _in_words(request.question)
            candidates = [
                _lexical(u, wanted, weight=1.0 if source.kind == "teaching" else 0.5)
                for source in request.sources
                for u in extract.units(source.text, source.n, source.kind)
                if not (words_only and u.bare_code)
            ]
        ranked = [u for u in sorted(candidates, key=lambda u: u.score, reverse=True) if u.score > 0]
        if ranked:
            return _Plan(ranked, ranked[:CROSS_ENCODER_UNITS], overlap=True, wanted=wanted)
        # Nothing in common with the question: the cross-encoder may still find an answer among each source's
        # opening units (a paraphrase); keyword overlap alone has nothing to offer.
        firsts = {u.n: u for u in reversed(candidates)}
        return _Plan([], [firsts[n] for n in sorted(firsts, key=lambda n: n or 0)], overlap=False, wanted=wanted)

    def _finish(self, request: GenerationRequest, plan: _Plan, scores: Sequence[float] | None) -> str:
        budget = compose.BUDGETS[compose.shape(request.question)]
        ranked = plan.eligible
        if scores is not None:
            read = [replace(u, score=s + _source_prior(u.n)) for u, s in zip(plan.to_read, scores, strict=True)]
            if not plan.overlap:
                read = [u for u in read if u.score > ANSWERS_LOGIT]
            by_answer = sorted(read, key=lambda u: u.score, reverse=True)
            ranked = by_answer + [u for u in ranked[len(plan.to_read) :]]
        chosen = compose.choose(ranked, budget)
        if request.selected_text:
            if not chosen:
                return "The selected text does not seem to answer this question; try asking about the whole book."
            return "From the selected text: " + compose.render(compose.order(chosen))
        if not chosen:
            chosen = _code_instead(request, plan.wanted)
        if not chosen:
            best = request.sources[0]
            return f"The closest passage is in “{' › '.join(best.heading_path) or best.title}” [{best.n}]."
        return compose.render(_labelled(compose.order(chosen), request.sources))


@dataclass(frozen=True)
class _Plan:
    eligible: list[extract.Unit]  # the units sharing a keyword with the question, best first
    to_read: list[extract.Unit]  # those the cross-encoder reads (the first of ``eligible``)
    overlap: bool  # False: nothing shares a keyword; ``to_read`` is each source's opening unit
    wanted: dict[str, float]  # the terms the units were scored by, and their weights (``_wanted``)

    @property
    def worth_reading(self) -> bool:
        """Whether the cross-encoder's opinion can change the answer: two units to order, or any to judge."""
        return len(self.to_read) > 1 or (not self.overlap and bool(self.to_read))


def _wanted(request: GenerationRequest) -> dict[str, float]:
    """The keyword terms a unit is scored by: the question's own, and for a follow-up read in context those of the
    standalone form too, weighed as retrieval weighs them (``context.weighed``): what "how do I set it up?" is
    about."""
    return context.weighed(sparse.terms(request.question), sparse.terms(request.standalone or ""))


def _code_instead(request: GenerationRequest, wanted: Mapping[str, float]) -> list[extract.Unit]:
    """No sentence answers: the teaching sources' code block sharing most with the question (``wanted``: the terms
    its units were scored by), under its heading."""
    codes = [
        _lexical(u, wanted)
        for source in request.sources
        if source.kind == "teaching"
        for u in extract.code_units(source.text, source.n, _section(source))
    ]
    best = max(codes, key=lambda u: u.score, default=None)
    return [replace(best, cites=(best.n,) if best.n is not None else ())] if best and best.score > 0 else []


def _section(source: Source) -> str:
    return source.heading_path[-1] if source.heading_path else ""


def _labelled(ordered: Sequence[extract.Unit], sources: Sequence[Source]) -> list[extract.Unit]:
    """A listing chosen from before any heading of its chunk is introduced by its source's section heading ("From
    “Cancelling a goal” [1]:"), the first under each heading (chunks of one long section share it); it was scored
    without it, as a sentence there is."""
    sections: dict[int | None, str] = {source.n: _section(source) for source in sources}
    said = {u.heading for u in ordered if u.heading and u.kind == "block" and not u.lead}
    result = []
    for unit in ordered:
        label = sections.get(unit.n, "")
        if unit.bare_code and not unit.heading and label and label not in said:
            unit = replace(unit, heading=label)
            said.add(label)
        result.append(unit)
    return result


def _lexical(unit: extract.Unit, wanted: Mapping[str, float], weight: float = 1.0) -> extract.Unit:
    """Keyword overlap with the question (its terms' weights summed); ``weight`` < 1 for a quiz's or an
    exercise's own explanations, and BARE_CODE_WEIGHT of that for a listing no sentence introduces."""
    overlap = sum(w for term, w in wanted.items() if term in unit.terms)
    if unit.bare_code:
        weight *= BARE_CODE_WEIGHT
    score = weight * overlap / math.sqrt(len(unit.terms) or 1) if overlap else 0.0
    if score:
        score += 0.15 / (unit.n or 1) + 0.05 / (1 + unit.position)  # earlier sources and opening units break ties
    return replace(unit, score=score)


_REASON = re.compile(r"^\W*why\b", re.I)


def _in_words(question: str) -> bool:
    """A definition or a reason is said in sentences: a listing no sentence introduces does not answer "what is
    X?" or "why does X fail?"."""
    return compose.shape(question) == "define" or bool(_REASON.match(question))


def _source_prior(n: int | None) -> float:
    """Retrieval's order breaks near-ties of the cross-encoder: the first source a little ahead."""
    return 0.5 / (n or 1)


def _citing_source(selected: str, sources: Sequence[Source]) -> int | None:
    needle = " ".join(re.findall(r"\w+", selected.lower()))[:200]
    for source in sources:
        if needle and needle in " ".join(re.findall(r"\w+", source.text.lower())):
            return source.n
    return sources[0].n if sources else None
