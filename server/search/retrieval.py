"""Retrieval: embed, search (dense + keyword, fused), rerank and diversify, fit the budget, widen the scope.

Plain values in, dataclasses out (no Starlette). Confidence (``confidence.py``) comes from the kept
sources' relevance (dense cosine plus keyword coverage) and the names the book knows; the module filter
follows DESIGN.md's adaptive rules.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from server.core.errors import RetrievalUnavailable
from server.index import sparse
from server.index.embeddings import Embedder
from server.index.vectors import Hit, VectorIndex
from server.search import confidence, passages
from server.search.confidence import Calibration, Level

CANDIDATES = 10
TOP_K = 5
SELECTION_TOP_K = 3
CONTEXT_BUDGET_TOKENS = 3000
RELATED_K = 3
_KEYWORD_WEIGHT = 0.2  # how much covering the question's keywords lifts a candidate's dense score
_DUPLICATE_OVERLAP = 0.6  # word-set overlap above which two chunks say the same thing
_SELECTION_BOOST = 0.3
_EXCERPT_CHARS = 240
# Up to this many chunks the in-process search and rerank take under a millisecond (0.45 ms for the shared
# book's 2,379): cheaper on the event loop than a hop to a worker thread and back, which under load waits
# for the GIL and a core (bench/chat.py). Larger indexes search in a thread so the loop is not held.
_TERMS_CACHE = 20_000  # chunks whose keyword terms the rerank keeps (a book has a few thousand)

Mode = Literal["textbook", "selection"]
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

    def event(self) -> dict[str, Any]:
        """The ``sources`` event entry (DESIGN.md SSE protocol)."""
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

    @property
    def declined(self) -> bool:
        return self.level == "none"


class Retriever:
    """Embed, search (dense + keyword, fused), rerank and diversify, widen the scope, score confidence.

    The search is one Prefetch + RRF query, answered by the embedded Qdrant Edge shard or a Qdrant server
    (``VectorIndex.hybrid_search``); everything after it is the same for both.
    """

    def __init__(self, index: VectorIndex, embedder: Embedder, calibration: Calibration | None = None) -> None:
        self.index = index
        self.embedder = embedder
        self.calibration = calibration or confidence.CALIBRATIONS[embedder.name]
        self._terms: dict[tuple[str, str], frozenset[str]] = {}

    async def retrieve(
        self, question: str, *, module: str | None = None, selected_text: str | None = None
    ) -> Retrieval:
        started = time.perf_counter()
        if selected_text:
            result = await self._selection(question, selected_text, module)
        else:
            result = await self._textbook(question, module)
        return replace(result, timings_ms={"retrieval": round((time.perf_counter() - started) * 1000, 2)})

    async def evidence(self, text: str, dense: Sequence[float], *, hold_out: str | None = None) -> float:
        """The raw evidence for ``text`` in the whole book, before calibration, as ``retrieve`` measures it;
        ``hold_out`` leaves out the section at that URL (the in-scope probes of ``calibration.py``)."""
        query = _Query(text)
        ranked = [c for c in await self._search(dense, query, None) if c.hit.payload.get("url") != hold_out]
        unknown = await self._unknown_names(query, ranked)
        return confidence.weighted_similarity([c.relevance for c in _diversify(ranked, TOP_K)]) * _known(query, unknown)

    async def warm(self) -> None:
        """Load the embedder and touch the index now rather than on the first question."""
        dense = await self.embedder.embed_query("warm up")
        if await self.index.exists():
            await self._search(dense, _Query("warm up"), None)

    # -- textbook mode ----------------------------------------------------------------------------

    async def _textbook(self, question: str, module: str | None) -> Retrieval:
        dense = await self.embedder.embed_query(question)
        query = _Query(question)
        ranked = await self._search(dense, query, module)
        unknown = await self._unknown_names(query, ranked)
        if module is None:
            return self._finish(ranked, Scope(requested_module=None, searched="all"), query, unknown)

        filtered_confidence = self._confidence(_diversify(ranked, TOP_K), query, unknown)
        unfiltered: list[_Candidate] | None = None
        unfiltered_confidence: float | None = None
        if filtered_confidence < confidence.PARTIAL_FILTER:
            unfiltered = await self._search(dense, query, None)
            unknown_all = await self._unknown_names(query, unfiltered)
            unfiltered_confidence = self._confidence(_diversify(unfiltered, TOP_K), query, unknown_all)
        decision = confidence.filter_decision(filtered_confidence, unfiltered_confidence)
        name = await self._module_title(module)  # readers see the module's title, not its folder id
        if decision == "widened":
            assert unfiltered is not None
            note = f"Little about this in {name}; searched the whole book instead."
            scope = Scope(module, "all", decision, note)
            return self._finish(unfiltered, scope, query, unknown_all, [Notice("scope_widened", note)])
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
        return self._finish(ranked, scope, query, unknown, notices)

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
        query = _Query(question)
        ranked = await self._search(dense, _Query(text), module, rank_query=query)
        shingles = _shingles(selected_text)
        boosted = []
        for candidate in ranked:
            held = _held(shingles, str(candidate.hit.payload.get("text", "")))
            boosted.append(
                replace(candidate, rank_score=candidate.rank_score + _SELECTION_BOOST * held, contains=held >= 0.5)
            )
        boosted.sort(key=lambda c: c.rank_score, reverse=True)
        # Stricter than textbook mode: a citation must be at least "medium" on its own, unless it holds the selection.
        kept = [
            c
            for c in _diversify(boosted, SELECTION_TOP_K)
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
        self, dense: Sequence[float], query: _Query, module: str | None, *, rank_query: _Query | None = None
    ) -> list[_Candidate]:
        """The top CANDIDATES of the fused dense + keyword search, reranked."""
        ranking = rank_query or query
        hits = await self.index.hybrid_search(dense, sparse.query_vector(query.text), limit=CANDIDATES, module=module)
        return _rank(hits, ranking, self._terms_of)

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

    async def _unknown_names(self, query: _Query, ranked: Sequence[_Candidate]) -> tuple[str, ...]:
        """What the question names, and its informative terms, that the book never mentions (checked in the
        candidates, then the whole book)."""
        wanted = [*query.names, *(t for t in query.informative if t not in query.names)]
        missing = [term for term in wanted if not any(term in c.terms for c in ranked)]
        if not missing:
            return ()
        unknown = []
        for name in missing:
            if not await self.index.mentions(sparse.Sparse((sparse.term_index(name),), (1.0,))):
                unknown.append(name)
        return tuple(unknown)

    # -- shared -----------------------------------------------------------------------------------

    def _confidence(self, kept: Sequence[_Candidate], query: _Query, unknown: Sequence[str]) -> float:
        return confidence.score([c.relevance for c in kept], self.calibration, known=_known(query, unknown))

    def _finish(
        self,
        ranked: Sequence[_Candidate],
        scope: Scope,
        query: _Query,
        unknown: Sequence[str],
        notices: Sequence[Notice] = (),
    ) -> Retrieval:
        kept = _diversify(ranked, TOP_K)
        known = _known(query, unknown)
        similarity = confidence.weighted_similarity([c.relevance for c in kept]) * known
        score = confidence.score([c.relevance for c in kept], self.calibration, known=known)
        lvl = confidence.level(score)
        candidates = _sources(kept)
        if lvl == "none":
            related = _sources(_distinct_sections(ranked, RELATED_K))
            sources: tuple[Source, ...] = ()
        else:
            related = ()
            sources = _sources(_within_budget(kept))
            if lvl == "low":
                notices = [
                    Notice("low_confidence", "The book may not cover this well; check the cited sections."),
                    *notices,
                ]
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
        )


class _Query:
    """A question's keyword terms and the names in it, computed once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.terms = sparse.terms(text)
        self.keywords = frozenset(self.terms)
        self.names = tuple(sparse.names(text))
        self.informative = sparse.informative(text, exclude=self.names)


def _known(query: _Query, unknown: Sequence[str]) -> float:
    """How much evidence survives what the book never mentions: the question's unknown names, or its unknown
    informative terms weighted by how specific they are, whichever leaves less."""
    names = confidence.name_factor(query.names, [u for u in unknown if u in query.names])
    terms = confidence.term_factor(query.informative, [u for u in unknown if u in query.informative])
    return min(names, terms)


def searchable(payload: Mapping[str, Any]) -> str:
    """What the keyword side reads: the breadcrumb (module, headings; a crumb equal to the one before it once) and
    the text, as ingestion builds the sparse vectors the engine searches, so the rerank counts the same terms."""
    crumbs: list[str] = []
    for crumb in (str(payload.get("module_title", "")), *(str(h) for h in payload.get("heading_path", ()))):
        if crumb and (not crumbs or crumbs[-1] != crumb):
            crumbs.append(crumb)
    return " ".join(crumbs) + "\n" + str(payload.get("text", ""))


def _rank(hits: Sequence[Hit], query: _Query, terms_of: Callable[[Hit], frozenset[str]]) -> list[_Candidate]:
    """Rerank: dense similarity leads; covering the question's keywords lifts a passage; a quiz or an exercise
    resembles the question without answering it, so it is pushed down (``passages.py``)."""
    candidates = []
    for position, hit in enumerate(hits):
        terms = terms_of(hit)
        coverage = len(query.keywords & terms) / len(query.keywords) if query.keywords else 0.0
        relevance = min(1.0, hit.dense_score + _KEYWORD_WEIGHT * coverage)
        rank_score = relevance - passages.rank_penalty(hit.payload, query.text) + 0.02 / (1 + position)
        candidates.append(_Candidate(hit=hit, rank_score=rank_score, relevance=relevance, terms=terms))
    candidates.sort(key=lambda c: c.rank_score, reverse=True)
    return candidates


@dataclass(frozen=True)
class _Candidate:
    hit: Hit
    rank_score: float
    relevance: float = 0.0  # dense similarity plus the keyword-coverage bonus: what confidence is computed from
    terms: frozenset[str] = frozenset()
    contains: bool = False


def _diversify(ranked: Sequence[_Candidate], k: int) -> list[_Candidate]:
    """Best first, skipping a chunk that mostly repeats one already kept (overlapping pieces, restated quizzes)."""
    kept: list[_Candidate] = []
    kept_words: list[set[str]] = []
    for candidate in ranked:
        words = set(_WORD.findall(str(candidate.hit.payload.get("text", "")).lower()))
        if any(_overlap(words, other) > _DUPLICATE_OVERLAP for other in kept_words):
            continue
        kept.append(candidate)
        kept_words.append(words)
        if len(kept) == k:
            break
    return kept


def _within_budget(kept: Sequence[_Candidate], budget: int = CONTEXT_BUDGET_TOKENS) -> list[_Candidate]:
    result: list[_Candidate] = []
    used = 0
    for candidate in kept:
        tokens = int(candidate.hit.payload.get("token_count", 0))
        if result and used + tokens > budget:
            continue  # a smaller, later source may still fit
        result.append(candidate)
        used += tokens
    return result


def _distinct_sections(ranked: Sequence[_Candidate], k: int) -> list[_Candidate]:
    seen: set[str] = set()
    result = []
    for candidate in ranked:
        url = str(candidate.hit.payload.get("url", ""))
        if url in seen:
            continue
        seen.add(url)
        result.append(candidate)
        if len(result) == k:
            break
    return result


def _sources(kept: Sequence[_Candidate]) -> tuple[Source, ...]:
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


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """The start of a chunk as plain prose: no code fences, no Markdown marks, cut at a word."""
    prose = _FENCE.sub(" ", text)
    prose = _MARKS.sub("", prose)
    prose = " ".join(prose.split())
    if len(prose) <= limit:
        return prose
    return prose[:limit].rsplit(" ", 1)[0] + "…"


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + 3]) for i in range(max(1, len(words) - 2))} if words else set()


def _held(selection: set[tuple[str, ...]], text: str) -> float:
    """How much of the selection a chunk holds, as a share of the word triples of whichever is shorter: 1.0 when
    the chunk holds all of a short selection, and also when it lies wholly inside a selection spanning chunks."""
    chunk = _shingles(text)
    # A chunk of a few words would "lie wholly inside" almost any selection, so it counts as at least 10 triples.
    return len(selection & chunk) / min(len(selection), max(len(chunk), 10)) if selection and chunk else 0.0


_WORD = re.compile(r"\w+")
_FENCE = re.compile(r"```.*?(```|$)|~~~.*?(~~~|$)", re.S)
_MARKS = re.compile(r"[#*_`>|]|\[(?=[^\]]*\]\()|\]\([^)]*\)")
