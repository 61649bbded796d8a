"""Choosing and rendering the offline answer: ranked units in, the answer's Markdown out.

``extract.py`` cuts a source into quotable units; this module picks the ones that fit the question's budget
(a near-duplicate merged into the unit it repeats, both sources cited), puts the best first and the rest of
each source in the source's order, and writes them as paragraphs and blocks with their ``[n]`` markers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from textbook_chat.answer.extract import LIST_ITEM, Unit
from textbook_chat.index import sparse

DUPLICATE_OVERLAP = 0.8  # share of the smaller unit's terms the other holds: the same point said twice
DUPLICATE_MIN_TERMS = 5

Shape = Literal["define", "steps", "other"]

_DEFINE = re.compile(r"^\s*(?:what\s+(?:is|are|was|were|does|do)\b|who\s+|define\b|what's\b|meaning of\b)", re.I)
_STEPS = re.compile(
    r"\b(?:how\s+(?:do|can|should|would)\s+(?:i|we|you|one)\b|how to\b|steps?\b|procedure\b|"
    r"walk me through|set\s*up|install|configure|build|create)",
    re.I,
)


@dataclass(frozen=True)
class Budget:
    units: int
    words: int


BUDGETS: dict[Shape, Budget] = {
    "define": Budget(units=3, words=90),
    "steps": Budget(units=4, words=170),
    "other": Budget(units=4, words=130),
}
PER_SOURCE = 3


def shape(question: str) -> Shape:
    """What length of answer the question asks for: a definition, steps, or anything else."""
    if _STEPS.search(question):
        return "steps"
    if _DEFINE.match(question):
        return "define"
    return "other"


def choose(ranked: Sequence[Unit], budget: Budget) -> list[Unit]:
    """The first units of ``ranked`` (best first) that fit ``budget``; a near-duplicate of a chosen unit is merged
    into it (its source cited too) instead of being said again. The result keeps ``ranked``'s order."""
    chosen: list[Unit] = []
    per_source: dict[int | None, int] = {}
    words = 0
    for candidate in ranked:
        twin = next((i for i, c in enumerate(chosen) if _same_point(candidate, c)), None)
        if twin is not None:
            kept = chosen[twin]
            if candidate.n is not None and candidate.n not in kept.cites:
                chosen[twin] = replace(kept, cites=(*kept.cites, candidate.n))
            continue
        if len(chosen) == budget.units or per_source.get(candidate.n, 0) == PER_SOURCE:
            continue
        if chosen and words + candidate.words > budget.words:
            continue
        chosen.append(replace(candidate, cites=(candidate.n,) if candidate.n is not None else ()))
        per_source[candidate.n] = per_source.get(candidate.n, 0) + 1
        words += candidate.words
    return chosen


def order(chosen: Sequence[Unit]) -> list[Unit]:
    """The first (best) unit first; then the rest of its source in the source's order; then each other source, in
    the order of its best unit, in its own order."""
    if not chosen:
        return []
    best = chosen[0]
    groups: dict[int | None, list[Unit]] = {}
    for unit in chosen:  # dicts keep insertion order: a source's place is that of its best unit
        groups.setdefault(unit.n, []).append(unit)
    result = [best]
    for group in groups.values():
        result += sorted((u for u in group if u is not best), key=lambda u: u.position)
    return result


def render(ordered: Sequence[Unit]) -> str:
    """Sentences of one source run together as a paragraph, its markers after the last; a block stands apart, its
    marker before its lead-in's colon. A block without a lead-in is introduced by its heading ("From “PID
    Control” [1]:"), once for consecutive blocks under the same heading (rows of one table)."""
    parts: list[str] = []
    paragraph: list[str] = []
    paragraph_cites: tuple[int, ...] = ()
    label: tuple[str, tuple[int, ...]] | None = None  # the heading and markers of the last label written

    def flush() -> None:
        nonlocal paragraph
        if paragraph:
            parts.append(_cite_end(" ".join(paragraph), paragraph_cites))
        paragraph = []

    for unit in ordered:
        if unit.kind == "sentence":
            if paragraph and unit.cites != paragraph_cites:
                flush()
            paragraph.append(_stop(unit.body))
            paragraph_cites = unit.cites
            label = None
            continue
        flush()
        if unit.lead:
            parts.append(f"{_cite_lead(unit.lead, unit.cites)}\n\n{unit.body}")
            label = None
        elif unit.heading and label == (unit.heading, unit.cites):
            parts[-1] += f"\n{unit.body}" if _is_list(parts[-1]) and _is_list(unit.body) else f"\n\n{unit.body}"
        elif unit.heading:
            parts.append(f"From “{unit.heading}” {_markers(unit.cites)}:\n\n{unit.body}".replace(" :", ":"))
            label = (unit.heading, unit.cites)
        else:
            parts.append(_cite_block_end(unit.body, unit.cites))
            label = None
    flush()
    return "\n\n".join(parts)


def _is_list(text: str) -> bool:
    return bool(LIST_ITEM.match(text.splitlines()[-1])) if text.strip() else False


def _same_point(a: Unit, b: Unit) -> bool:
    """The same point said twice: most of the shorter unit's own words (its heading aside) are in the other. A unit
    of fewer than ``DUPLICATE_MIN_TERMS`` terms is too short to tell."""
    ta, tb = _own_terms(a), _own_terms(b)
    if min(len(ta), len(tb)) < DUPLICATE_MIN_TERMS:
        return a.body == b.body
    return len(ta & tb) / min(len(ta), len(tb)) >= DUPLICATE_OVERLAP


def _own_terms(unit: Unit) -> frozenset[str]:
    return frozenset(sparse.terms(f"{unit.lead}\n{unit.body}"))


def _markers(cites: Sequence[int]) -> str:
    return "".join(f"[{n}]" for n in cites)


def _stop(text: str) -> str:
    return text if text[-1:] in ".!?" else f"{text}."


def _cite_end(text: str, cites: Sequence[int]) -> str:
    if not cites:
        return text
    match = re.search(r"([.!?])([*_]*)$", text)
    if match:
        return f"{text[: match.start()]} {_markers(cites)}{match.group(1)}{match.group(2)}"
    return f"{text} {_markers(cites)}"


def _cite_lead(lead: str, cites: Sequence[int]) -> str:
    if not cites:
        return lead
    match = re.search(r":([\s*_]*)$", lead)
    if match is None:  # not a lead-in after all: the marker goes at its end
        return _cite_end(lead, cites)
    return f"{lead[: match.start()].rstrip()} {_markers(cites)}:{match.group(1).rstrip()}"


def _cite_block_end(body: str, cites: Sequence[int]) -> str:
    if not cites:
        return body
    if body.rstrip().endswith(("```", "~~~")):
        return f"{body}\n\n{_markers(cites)}"
    return f"{body.rstrip()} {_markers(cites)}"
