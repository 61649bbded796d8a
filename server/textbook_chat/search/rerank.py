"""The rerank: a question's terms, candidates scored by dense similarity and keyword coverage, duplicates and
repeated sections dropped, the context budget kept, and a chunk's plain-prose excerpt.

``retrieval.py`` searches and decides; this module holds the pure steps it runs on the engine's hits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from textbook_chat.book import mdx
from textbook_chat.index import sparse
from textbook_chat.index.vectors import Hit
from textbook_chat.search import confidence, passages

CONTEXT_BUDGET_TOKENS = 3000
_KEYWORD_WEIGHT = 0.2  # how much covering the question's keywords lifts a candidate's dense score
_DUPLICATE_OVERLAP = 0.6  # word-set overlap above which two chunks say the same thing
_EXCERPT_CHARS = 240


class Query:
    """A question's keyword terms (at most ``sparse.MAX_QUERY_TERMS`` distinct ones), the names in it and its
    command-line options, computed once; ``vector`` is what the keyword search is sent (each term weighing 1 unless
    ``vector`` is given)."""

    def __init__(self, text: str, vector: sparse.Sparse | None = None) -> None:
        self.text = text
        self.vector = vector or sparse.query_vector(text)
        self.terms = sparse.bounded(sparse.terms(text))
        self.keywords = frozenset(self.terms)
        self.names = tuple(sparse.names(text))
        self.informative = sparse.informative(text, exclude=self.names)
        self.options = frozenset(sparse.options(text))  # the book's only where written whole (``BookWords.uses``)


def known_share(query: Query, unknown: Sequence[str]) -> float:
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


def rank(hits: Sequence[Hit], query: Query, terms_of: Callable[[Hit], frozenset[str]]) -> list[Candidate]:
    """Rerank: dense similarity leads; covering the question's keywords lifts a passage; a quiz or an exercise
    resembles the question without answering it, so it is pushed down (``passages.py``)."""
    candidates = []
    for position, hit in enumerate(hits):
        terms = terms_of(hit)
        coverage = len(query.keywords & terms) / len(query.keywords) if query.keywords else 0.0
        relevance = min(1.0, hit.dense_score + _KEYWORD_WEIGHT * coverage)
        rank_score = relevance - passages.rank_penalty(hit.payload, query.text) + 0.02 / (1 + position)
        candidates.append(Candidate(hit=hit, rank_score=rank_score, relevance=relevance, terms=terms))
    candidates.sort(key=lambda c: c.rank_score, reverse=True)
    return candidates


@dataclass(frozen=True)
class Candidate:
    hit: Hit
    rank_score: float
    relevance: float = 0.0  # dense similarity plus the keyword-coverage bonus: what confidence is computed from
    terms: frozenset[str] = frozenset()
    contains: bool = False

    @property
    def url(self) -> str:
        return str(self.hit.payload.get("url", ""))

    @property
    def token_count(self) -> int:
        return int(self.hit.payload.get("token_count", 0))


class Section(Protocol):
    """What budget and section rules read of a passage: a ``Candidate`` or a ``retrieval.Source`` alike."""

    @property
    def url(self) -> str: ...

    @property
    def token_count(self) -> int: ...


S = TypeVar("S", bound=Section)


def diversify(ranked: Sequence[Candidate], k: int) -> list[Candidate]:
    """Best first, skipping a chunk that mostly repeats one already kept (overlapping pieces, restated quizzes)."""
    kept: list[Candidate] = []
    kept_words: list[frozenset[str]] = []
    for candidate in ranked:
        words = _words(str(candidate.hit.payload.get("text", "")))
        if any(overlap(words, other) > _DUPLICATE_OVERLAP for other in kept_words):
            continue
        kept.append(candidate)
        kept_words.append(words)
        if len(kept) == k:
            break
    return kept


def within_budget(kept: Sequence[S], budget: int = CONTEXT_BUDGET_TOKENS) -> list[S]:
    """Best first, the passages whose tokens fit ``budget`` together (the first always)."""
    result: list[S] = []
    used = 0
    for passage in kept:
        if result and used + passage.token_count > budget:
            continue  # a smaller, later source may still fit
        result.append(passage)
        used += passage.token_count
    return result


def distinct_sections(ranked: Sequence[S], k: int) -> list[S]:
    """The first ``k`` passages of ``ranked`` from different sections (URLs)."""
    seen: set[str] = set()
    result = []
    for passage in ranked:
        if passage.url in seen:
            continue
        seen.add(passage.url)
        result.append(passage)
        if len(result) == k:
            break
    return result


@functools.lru_cache(maxsize=passages.FORMS_CACHED)
def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """The start of a chunk as plain prose: no code fences, no Markdown marks, cut at a word."""
    prose = mdx.without_code(text)
    prose = _MARKS.sub("", prose)
    prose = " ".join(prose.split())
    if len(prose) <= limit:
        return prose
    return prose[:limit].rsplit(" ", 1)[0] + "…"


@functools.lru_cache(maxsize=passages.FORMS_CACHED)
def _words(text: str) -> frozenset[str]:
    """A chunk's distinct words, as ``diversify`` compares them (read once per chunk, like its form)."""
    return frozenset(WORD.findall(text.lower()))


def overlap(a: AbstractSet[str], b: AbstractSet[str]) -> float:
    return len(a & b) / min(len(a), len(b)) if a and b else 0.0


def shingles(text: str) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return {tuple(words[i : i + 3]) for i in range(max(1, len(words) - 2))} if words else set()


def held(selection: set[tuple[str, ...]], text: str) -> float:
    """How much of the selection a chunk holds, as a share of the word triples of whichever is shorter: 1.0 when
    the chunk holds all of a short selection, and also when it lies wholly inside a selection spanning chunks."""
    chunk = shingles(text)
    # A chunk of a few words would "lie wholly inside" almost any selection, so it counts as at least 10 triples.
    return len(selection & chunk) / min(len(selection), max(len(chunk), 10)) if selection and chunk else 0.0


WORD = re.compile(r"\w+")
_MARKS = re.compile(r"[#*_`>|]|\[(?=[^\[\]]*\]\()|\]\([^)\[\]]*\)")
