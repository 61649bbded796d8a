"""Retrieval: embed, search (dense + keyword, fused), rerank and diversify, fit the budget, widen the scope.

Plain values in, dataclasses out (no Starlette). Confidence (``confidence.py``) comes from the kept sources'
relevance (dense cosine plus keyword coverage) and the names the book knows; the module filter follows the adaptive
rules of docs/evaluation.md ("How confidence is computed"). Where confidence is in doubt, the cross-encoder's second
opinion (``second_opinion.py``) may decline or answer after all, and orders the candidates it read.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from textbook_chat.core import metrics, rarity
from textbook_chat.core.errors import RetrievalUnavailable
from textbook_chat.core.inflight import InFlight
from textbook_chat.core.modes import Mode
from textbook_chat.index import sparse
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import Hit, VectorIndex
from textbook_chat.search import compound, confidence, context, passages, vocabulary
from textbook_chat.search.confidence import Calibration, Level
from textbook_chat.search.context import Asked, Earlier
from textbook_chat.search.followup import FollowUps
from textbook_chat.search.rerank import CONTEXT_BUDGET_TOKENS as CONTEXT_BUDGET_TOKENS
from textbook_chat.search.rerank import (
    Candidate,
    Query,
    distinct_sections,
    diversify,
    held,
    known_share,
    rank,
    shingles,
    within_budget,
)
from textbook_chat.search.rerank import excerpt as excerpt
from textbook_chat.search.rerank import searchable as searchable
from textbook_chat.search.second_opinion import Evidence, SecondOpinion, Verdict, plan
from textbook_chat.search.vocabulary import BookWords

CANDIDATES = 10
TOP_K = 5
SELECTION_TOP_K = 3
RELATED_K = 3
_SELECTION_BOOST = 0.3
# Up to this many chunks the in-process search and rerank take under a millisecond (0.45 ms for the shared
# book's 2,379): cheaper on the event loop than a hop to a worker thread and back, which under load waits
# for the GIL and a core (bench/chat.py). Larger indexes search in a thread so the loop is not held.
_TERMS_CACHE = 20_000  # chunks whose keyword terms the rerank keeps (a book has a few thousand)

NoticeCode = Literal["low_confidence", "scope_widened", "scope_partial", "scope_limited"]


@dataclass(frozen=True)
class Source:
    n: int
    chunk_id: str
    file_path: str
    module: str
    module_title: str
    chapter: str
    title: str
    heading_path: tuple[str, ...]
    url: str
    score: float  # dense similarity with the question
    excerpt: str
    text: str
    token_count: int
    kind: passages.Kind = "teaching"

    @property
    def passage(self) -> str:
        """What the cross-encoder reads: the heading path, then the text."""
        return " > ".join(self.heading_path) + "\n" + self.text

    def event(self) -> dict[str, Any]:
        """The ``sources`` event entry (docs/sse-protocol.md)."""
        return {
            "n": self.n,
            "chunk_id": self.chunk_id,
            "file_path": self.file_path,
            "module": self.module,
            "chapter": self.chapter,
            "title": self.title,
            "heading_path": list(self.heading_path),
            "url": self.url,
            "score": round(self.score, 4),
            "excerpt": self.excerpt,
        }


@dataclass(frozen=True)
class Scope:
    requested_module: str | None
    searched: Literal["module", "all"]
    decision: confidence.FilterDecision | None = None
    note: str | None = None

    def event(self) -> dict[str, Any]:
        return {"requested_module": self.requested_module, "searched": self.searched, "note": self.note}


@dataclass(frozen=True)
class Notice:
    code: NoticeCode
    message: str


@dataclass(frozen=True)
class Retrieval:
    mode: Mode
    sources: tuple[Source, ...]  # what the answer may cite, numbered 1..n; empty when declined
    confidence: float
    level: Level
    scope: Scope
    notices: tuple[Notice, ...] = ()
    related: tuple[Source, ...] = ()  # on a decline: the closest sections, to suggest
    timings_ms: dict[str, float] = field(default_factory=dict)
    similarity: float = 0.0  # the raw evidence (weighted relevance x name factor) before calibration
    candidates: tuple[Source, ...] = ()  # the diversified top 5, kept even on a decline (for evaluation)
    unknown_terms: tuple[str, ...] = ()  # names, then specific terms, in the question that the book never uses
    unscaled: float = 0.0  # the common-scale confidence before the names / terms factor
    second_opinion: Verdict | None = None  # the cross-encoder's, where it was asked
    standalone: str | None = None  # the question with the context it took (``context.py``); None: as asked

    @property
    def declined(self) -> bool:
        return self.level == "none"


class Retriever:
    """Embed, search (dense + keyword, fused), rerank and diversify, widen the scope, score confidence.

    The search is one Prefetch + RRF query, answered by the embedded Qdrant Edge shard or a Qdrant server
    (``VectorIndex.hybrid_search``); everything after it is the same for both.
    """

    def __init__(
        self,
        index: VectorIndex,
        embedder: Embedder,
        calibration: Calibration | None = None,
        second_opinion: SecondOpinion | None = None,
    ) -> None:
        self.index = index
        self.embedder = embedder
        self.calibration = calibration or confidence.CALIBRATIONS[embedder.name]
        self.second_opinion = second_opinion
        self._terms: dict[tuple[str, str], frozenset[str]] = {}
        self.words = BookWords(index)  # which words the book uses
        self.follow_ups = FollowUps(embedder, self._search, keep=TOP_K)
        self._first_questions = InFlight[tuple[str, str | None], Retrieval]()

    async def retrieve(
        self,
        question: str,
        *,
        module: str | None = None,
        selected_text: str | None = None,
        earlier: Sequence[Earlier] = (),
    ) -> Retrieval:
        """``earlier``: the session's earlier questions, oldest first; a follow-up is read in their context
        (``context.py``). A selection is its own context, and the module filter applies as sent. Readers asking
        the same first question at once (a panel's suggestion) share one retrieval of it."""
        if selected_text or earlier:
            return await self._read(question, module, selected_text, earlier)
        start = functools.partial(self._read, question, module, None, ())
        return await self._first_questions((question, module), start)

    async def _read(
        self, question: str, module: str | None, selected_text: str | None, earlier: Sequence[Earlier]
    ) -> Retrieval:
        started = time.perf_counter()
        if selected_text:
            result = await self._selection(question, selected_text, module)
        else:
            asked = context.read(question, earlier)
            result = await self._textbook(asked, module)
            if asked.fallback and result.level in ("none", "low"):
                # Common words the book answers weakly alone: read them in the conversation's context too.
                fallback = asked.contextual()
                in_context = await self._textbook(fallback, module)
                if in_context.confidence > result.confidence:
                    result, asked = in_context, fallback
            read_for = asked.standalone
            if result.level == "none" and not asked.in_context:
                result, read_for = await self._best_part(question, result, module)
            result = await self._reconsider(question, result, standalone=read_for)
            result = replace(result, standalone=asked.standalone if asked.in_context else None)
        return replace(result, timings_ms={"retrieval": round((time.perf_counter() - started) * 1000, 2)})

    async def _best_part(self, question: str, whole: Retrieval, module: str | None) -> tuple[Retrieval, str | None]:
        """A question that joins two or more (``compound.py``), which as a whole reads as nothing the book answers:
        its part the book answers best, if one reads better than the whole, and that part (what the second opinion
        then reads the passages for); else ``whole`` as it was."""
        best, read_for = whole, None
        for part in compound.parts(question):
            reading = await self._textbook(Asked(part), module)
            if reading.confidence > best.confidence:
                best, read_for = reading, part
        return best, read_for

    async def evidence(self, text: str, dense: Sequence[float], *, hold_out: str | None = None) -> float:
        """The raw evidence for ``text`` in the whole book, before calibration, as ``retrieve`` measures it;
        ``hold_out`` leaves out the section at that URL (the in-scope probes of ``calibration.py``)."""
        evidence, _ = await self.probe(text, dense, hold_out=hold_out)
        return evidence

    async def probe(self, text: str, dense: Sequence[float], *, hold_out: str | None = None) -> tuple[float, list[str]]:
        """``evidence`` and the passages the second opinion would read for it (``calibration.py``'s probes)."""
        query = Query(text)
        ranked = [c for c in await self._search(dense, query, None) if c.hit.payload.get("url") != hold_out]
        unknown = await self.words.unknown(query, ranked)
        kept = diversify(ranked, TOP_K)
        evidence = confidence.weighted_similarity([c.relevance for c in kept]) * known_share(query, unknown)
        return evidence, [s.passage for s in _sources(kept)]

    async def warm(self) -> None:
        """Load the embedder, the word list and the second opinion's model, and touch the index, before any question."""
        rarity.load()
        dense = await self.embedder.embed_query("warm up")
        if await self.index.exists():
            await self._search(dense, Query("warm up"), None)
        if self.second_opinion is not None:
            self.second_opinion.warm_up()

    # -- the second opinion -----------------------------------------------------------------------

    async def _reconsider(self, question: str, result: Retrieval, *, standalone: str | None = None) -> Retrieval:
        """Where the first stage and the term evidence disagree, ask the cross-encoder about the question (a
        follow-up's ``standalone`` form, where there is one: the subject it took is what the passages are read
        for); apply what it says (``second_opinion.py``). The words the book never uses are counted in the question
        as asked: the subject a follow-up took from the conversation is the book's by construction."""
        opinion = self.second_opinion
        if opinion is None or not result.candidates:
            return result
        unknown = set(result.unknown_terms)
        evidence = Evidence(
            confidence=result.confidence,
            unscaled=result.unscaled,
            unknown_rare=any(sparse.telling(t) for t in unknown),
            unknown_name=bool(unknown & set(sparse.names(question))),
        )
        if plan(opinion.thresholds, replace(evidence, absent=1.0)) != "ask":
            return result  # whatever the book's vocabulary says (its words, its names): no need to look it up
        retrieved = [(s.chunk_id, s.passage) for s in result.candidates]
        texts = [passage for _, passage in retrieved]
        evidence = replace(
            evidence,
            absent=await self.words.absent_share(question, texts),
            unknown_name=evidence.unknown_name or bool(vocabulary.unwritten_compounds(question, texts, unknown)),
        )
        if plan(opinion.thresholds, evidence) != "ask":
            return result
        verdict = await opinion.judge(standalone or question, retrieved, evidence)
        if verdict is None:
            return result
        metrics.SECOND_OPINIONS.labels(verdict.change or "kept").inc()
        candidates = tuple(replace(result.candidates[i], n=n) for n, i in enumerate(verdict.order, start=1))
        scope_notices = tuple(n for n in result.notices if n.code != "low_confidence")
        declined = verdict.change == "declined" or (result.declined and verdict.change != "answered")
        if declined:
            score = result.confidence if result.declined else min(result.confidence, _JUST_BELOW_DECLINE)
            related = result.related or _renumbered(distinct_sections(candidates, RELATED_K))
            return replace(
                result,
                sources=(),
                confidence=score,
                level=confidence.level(score),
                notices=scope_notices,
                related=related,
                candidates=candidates,
                second_opinion=verdict,
            )
        score = max(result.confidence, confidence.DECLINE)
        lvl = confidence.level(score)
        notices = (_LOW_NOTICE, *scope_notices) if lvl == "low" else scope_notices
        kept = _renumbered(within_budget(candidates))
        return replace(
            result,
            sources=kept,
            confidence=score,
            level=lvl,
            notices=notices,
            related=(),
            candidates=candidates,
            second_opinion=verdict,
        )

    # -- textbook mode ----------------------------------------------------------------------------

    async def _textbook(self, asked: Asked, module: str | None) -> Retrieval:
        readings = await self.follow_ups.readings(asked)
        query = readings[0][1]
        ranked = await self.follow_ups.search(readings, asked, module)
        unknown = await self.words.unknown(query, ranked, asked)
        if module is None:
            return self._finish(ranked, Scope(requested_module=None, searched="all"), query, unknown, asked=asked)

        filtered_confidence = self._confidence(diversify(ranked, TOP_K), query, unknown, asked)
        unfiltered: list[Candidate] | None = None
        unfiltered_confidence: float | None = None
        if filtered_confidence < confidence.PARTIAL_FILTER:
            unfiltered = await self.follow_ups.search(readings, asked, None)
            unknown_all = await self.words.unknown(query, unfiltered, asked)
            unfiltered_confidence = self._confidence(diversify(unfiltered, TOP_K), query, unknown_all, asked)
        decision = confidence.filter_decision(filtered_confidence, unfiltered_confidence)
        name = await self._module_title(module)  # readers see the module's title, not its folder id
        if decision == "widened":
            assert unfiltered is not None
            note = f"Little about this in {name}; searched the whole book instead."
            scope = Scope(module, "all", decision, note)
            return self._finish(unfiltered, scope, query, unknown_all, [Notice("scope_widened", note)], asked=asked)
        scope = Scope(module, "module", decision)
        notices: list[Notice] = []
        if decision == "partial":
            note = f"Answered from {name} only; other modules may say more."
            scope = replace(scope, note=note)
            notices.append(Notice("scope_partial", note))
        elif decision == "limited":
            note = f"{name} has little on this. Remove the module filter to search the whole book."
            scope = replace(scope, note=note)
            notices.append(Notice("scope_limited", note))
        return self._finish(ranked, scope, query, unknown, notices, asked=asked)

    async def module_ids(self) -> list[str]:
        """The ids of the modules in the index, in book order; empty when it cannot say (no index, or it is down)."""
        try:
            return [m.id for m in await self.index.modules()] if await self.index.exists() else []
        except RetrievalUnavailable:
            return []

    async def _module_title(self, module: str) -> str:
        try:
            titles = {m.id: m.title for m in await self.index.modules()}
        except RetrievalUnavailable:
            return module
        return titles.get(module) or module

    # -- selection mode ---------------------------------------------------------------------------

    async def _selection(self, question: str, selected_text: str, module: str | None) -> Retrieval:
        """The answer comes from the selection; retrieval only finds where it sits in the book, for citations."""
        text = f"{selected_text[:1500]}\n{question}"
        dense = await self.embedder.embed_query(text)
        query = Query(question)
        ranked = await self._search(dense, Query(text), module, rank_query=query)
        selection = shingles(selected_text)
        boosted = []
        for candidate in ranked:
            share = held(selection, str(candidate.hit.payload.get("text", "")))
            boosted.append(
                replace(candidate, rank_score=candidate.rank_score + _SELECTION_BOOST * share, contains=share >= 0.5)
            )
        boosted.sort(key=lambda c: c.rank_score, reverse=True)
        # Stricter than textbook mode: a citation must be at least "medium" on its own, unless it holds the selection.
        kept = [
            c
            for c in diversify(boosted, SELECTION_TOP_K)
            if c.contains or self.calibration.to_common(c.relevance) >= confidence.LOW
        ]
        sources = _sources(kept)
        similarity = confidence.weighted_similarity([c.relevance for c in kept])
        # The selection itself is the evidence, so the reader always gets an answer attempt, never a decline.
        score = max(confidence.score([c.relevance for c in kept], self.calibration), confidence.LOW)
        return Retrieval(
            mode="selection",
            sources=sources,
            confidence=score,
            level=confidence.level(score),
            scope=Scope(requested_module=module, searched="module" if module else "all"),
            similarity=similarity,
            candidates=sources,
        )

    # -- search -----------------------------------------------------------------------------------

    async def _search(
        self, dense: Sequence[float], query: Query, module: str | None, *, rank_query: Query | None = None
    ) -> list[Candidate]:
        """The top CANDIDATES of the fused dense + keyword search, reranked."""
        ranking = rank_query or query
        hits = await self.index.hybrid_search(dense, query.vector, limit=CANDIDATES, module=module)
        return rank(hits, ranking, self._terms_of)

    def _terms_of(self, hit: Hit) -> frozenset[str]:
        """A chunk's keyword terms for the rerank, computed once per chunk version (cached by id and hash)."""
        key = (hit.id, str(hit.payload.get("content_hash", "")))
        terms = self._terms.get(key)
        if terms is None:
            terms = frozenset(sparse.terms(searchable(hit.payload)))
            if len(self._terms) >= _TERMS_CACHE:
                self._terms.pop(next(iter(self._terms)))
            self._terms[key] = terms
        return terms

    # -- shared -----------------------------------------------------------------------------------

    def _confidence(
        self, kept: Sequence[Candidate], query: Query, unknown: Sequence[str], asked: Asked | None = None
    ) -> float:
        return confidence.score(
            [c.relevance for c in kept], self.calibration, known=context.known(query, unknown, asked)
        )

    def _finish(
        self,
        ranked: Sequence[Candidate],
        scope: Scope,
        query: Query,
        unknown: Sequence[str],
        notices: Sequence[Notice] = (),
        *,
        asked: Asked | None = None,
    ) -> Retrieval:
        kept = diversify(ranked, TOP_K)
        share = context.known(query, unknown, asked)
        similarity = confidence.weighted_similarity([c.relevance for c in kept]) * share
        score = confidence.score([c.relevance for c in kept], self.calibration, known=share)
        lvl = confidence.level(score)
        candidates = _sources(kept)
        if lvl == "none":
            related = _sources(distinct_sections(ranked, RELATED_K))
            sources: tuple[Source, ...] = ()
        else:
            related = ()
            sources = _sources(within_budget(kept))
            if lvl == "low":
                notices = [_LOW_NOTICE, *notices]
        return Retrieval(
            "textbook",
            sources,
            score,
            lvl,
            scope,
            tuple(notices),
            related,
            similarity=similarity,
            candidates=candidates,
            unknown_terms=tuple(unknown),
            unscaled=confidence.score([c.relevance for c in kept], self.calibration),
        )


def _renumbered(sources: Sequence[Source]) -> tuple[Source, ...]:
    """``sources`` numbered 1..n in their order (the second opinion's order, after a budget or a section rule)."""
    return tuple(replace(source, n=n) for n, source in enumerate(sources, start=1))


def _sources(kept: Sequence[Candidate]) -> tuple[Source, ...]:
    sources = []
    for n, candidate in enumerate(kept, start=1):
        p = candidate.hit.payload
        text = str(p.get("text", ""))
        sources.append(
            Source(
                n=n,
                chunk_id=candidate.hit.id,
                file_path=str(p.get("file_path", "")),
                module=str(p.get("module", "")),
                module_title=str(p.get("module_title", "")),
                chapter=str(p.get("chapter", "")),
                title=str(p.get("title", "")),
                heading_path=tuple(p.get("heading_path", ())),
                url=str(p.get("url", "")),
                score=candidate.hit.dense_score,
                excerpt=excerpt(text),
                text=text,
                token_count=int(p.get("token_count", 0)),
                kind=passages.kind_of(p),
            )
        )
    return tuple(sources)


_LOW_NOTICE = Notice("low_confidence", "The book may not cover this well; check the cited sections.")
_JUST_BELOW_DECLINE = round(confidence.DECLINE - 0.0001, 4)
