"""The calibration a book gives itself: decline / low / high points derived from the indexed book, no questions.

Two sets of probes are searched against the book exactly as a reader's question is (``Retriever.evidence``):

- out of scope: ``OUT_OF_SCOPE_PROBES``, everyday questions on subjects no technical textbook covers. What
  they score is the book's background: how similar an unrelated question looks against this book's text.
- in scope: the headings of up to ``MAX_SECTIONS`` sections (every n-th in URL order, so the same book gives
  the same probes), each searched with its own section held out, as a reader's paraphrase finds the topic
  without finding its heading word for word.

The rule (README "Confidence calibration"), on raw evidence:

- decline = the out-of-scope probes' 95th percentile + ``DECLINE_MARGIN``, but never above the in-scope
  probes' 10th percentile (a book whose sections score low keeps answering them);
- low = the in-scope median - ``LOW_MARGIN``, at least ``MIN_GAP`` above decline;
- high = low + the embedder's own low-to-high span (a property of its similarity scale, not of a book).

Deterministic, and cheap: the probes are embedded in one batch, then one search each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from server.core.errors import RetrievalUnavailable
from server.index.embeddings import Embedder
from server.index.vectors import VectorIndex
from server.search import confidence
from server.search.confidence import Calibration

if TYPE_CHECKING:
    from server.search.retrieval import Retriever

log = logging.getLogger(__name__)

Source = Literal["book", "questions"]

MAX_SECTIONS = 150
DECLINE_MARGIN = 0.03
LOW_MARGIN = 0.03
MIN_GAP = 0.05

OUT_OF_SCOPE_PROBES = (
    "How long should I knead bread dough?",
    "What is the best way to pay off a mortgage early?",
    "Who won the football World Cup in 2014?",
    "How do I file my taxes as a freelancer?",
    "What are the symptoms of the flu?",
    "How do I repot an orchid?",
    "What is the capital of Australia?",
    "How do I tune a guitar to drop D?",
    "Which wine goes well with salmon?",
    "How do I remove a red wine stain from a carpet?",
    "What caused the fall of the Roman Empire?",
    "How many calories are in a banana?",
    "How do I train my puppy to sit?",
    "What is the plot of Pride and Prejudice?",
    "How do I change a flat tyre on a bicycle?",
    "What is the difference between a Roth IRA and a traditional IRA?",
    "How should I prepare for a job interview?",
    "What is the best time of year to visit Japan?",
    "How do I knit a scarf for beginners?",
    "How does a bank set the interest rate on a loan?",
    "What are the rules of cricket?",
    "How do I make a sourdough starter?",
    "What vaccines does a cat need?",
    "How do I write a cover letter?",
    "What is the tallest mountain in Africa?",
    "How do I get rid of aphids on roses?",
    "What is the difference between baking soda and baking powder?",
    "How do I start meditating?",
    "Who painted the Mona Lisa?",
    "How do I negotiate a higher salary?",
    "What is a healthy diet for losing weight?",
    "How do I clean a cast iron pan?",
    "What are the main causes of inflation?",
    "How do I learn to swim as an adult?",
    "What is the history of the Olympic Games?",
    "How do I grow tomatoes on a balcony?",
    "What should I pack for a week of hiking?",
    "How do I fix a leaking kitchen tap?",
    "What is the difference between a will and a trust?",
    "How do I improve my chess openings?",
)


@dataclass(frozen=True)
class Derived:
    """A calibration with the evidence it came from (what ``python -m server calibrate`` prints)."""

    calibration: Calibration
    out_of_scope: tuple[float, ...]  # raw evidence of each out-of-scope probe, sorted
    in_scope: tuple[float, ...]  # raw evidence of each held-out section heading, sorted
    seconds: float


async def derive(retriever: Retriever, index: VectorIndex) -> Derived:
    """Probe the book behind ``retriever`` and apply the rule above."""
    started = time.perf_counter()
    sections = await _sections(index)
    probes = [*OUT_OF_SCOPE_PROBES, *(heading for _, heading in sections)]
    vectors = await retriever.embedder.embed_documents(probes, background=True)  # a server may be answering
    outside: list[float] = []
    for text, vector in zip(OUT_OF_SCOPE_PROBES, vectors[: len(OUT_OF_SCOPE_PROBES)], strict=True):
        outside.append(await retriever.evidence(text, vector))
        await asyncio.sleep(0)  # each probe is a search that never suspends: readers' streams run between them
    inside: list[float] = []
    for (url, heading), vector in zip(sections, vectors[len(OUT_OF_SCOPE_PROBES) :], strict=True):
        inside.append(await retriever.evidence(heading, vector, hold_out=url))
        await asyncio.sleep(0)
    prior = confidence.CALIBRATIONS[retriever.embedder.name]
    return Derived(
        calibration=rule(outside, inside, prior),
        out_of_scope=tuple(sorted(round(x, 4) for x in outside)),
        in_scope=tuple(sorted(round(x, 4) for x in inside)),
        seconds=time.perf_counter() - started,
    )


def rule(out_of_scope: Sequence[float], in_scope: Sequence[float], prior: Calibration) -> Calibration:
    """The module docstring's rule; with fewer than 5 sections the book is too small to say, and ``prior`` stays."""
    if len(in_scope) < 5:
        return prior
    outside, inside = sorted(out_of_scope), sorted(in_scope)
    decline = min(quantile(outside, 0.95) + DECLINE_MARGIN, quantile(inside, 0.10))
    decline = min(max(decline, 0.05), 0.85)
    low = max(quantile(inside, 0.5) - LOW_MARGIN, decline + MIN_GAP)
    high = max(low + (prior.high - prior.low), low + MIN_GAP)
    return Calibration(decline=round(decline, 3), low=round(min(low, 0.9), 3), high=round(min(high, 0.97), 3))


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of sorted ``values`` (numpy's default method)."""
    position = (len(values) - 1) * q
    below = int(position)
    above = min(below + 1, len(values) - 1)
    return values[below] + (values[above] - values[below]) * (position - below)


async def stored(index: VectorIndex, embedder: Embedder) -> Calibration | None:
    """The calibration kept with the index for this embedder, or None (none stored, or the index is away)."""
    return _parse(await _kept(index), embedder)


async def source(index: VectorIndex) -> Source | None:
    """Where the kept calibration came from: the book (ingest, ``calibrate``) or an operator's questions."""
    return _source(await _kept(index))


async def save(index: VectorIndex, embedder: Embedder, calibration: Calibration, source: Source) -> None:
    await index.write_metadata(
        calibration={
            **asdict(calibration),
            "embedder": embedder.name,
            "model": embedder.model,
            "source": source,
            "derived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )


async def after_ingest(retriever: Retriever, index: VectorIndex, *, book_changed: bool) -> Calibration:
    """Re-derive after an ingest that changed the book (or when none is stored); an operator's own calibration
    (``eval --calibrate --save``) is kept. Returns the calibration now in force for the index."""
    record = await _kept(index)
    kept = _parse(record, retriever.embedder)
    if kept is not None and _source(record) == "questions":
        log.info("kept the calibration derived from your questions; `calibrate` derives one from the book again")
        return kept
    if kept is not None and not book_changed:
        return kept
    derived = await derive(retriever, index)
    await save(index, retriever.embedder, derived.calibration, "book")
    log.info("calibration derived from the book in %.1f s: %s", derived.seconds, points(derived.calibration))
    return derived.calibration


def points(calibration: Calibration) -> str:
    return f"decline {calibration.decline:.3f}, low {calibration.low:.3f}, high {calibration.high:.3f}"


def report(derived: Derived, prior: Calibration) -> str:
    """What ``calibrate`` prints: the points, the embedder's defaults, and the distributions behind them."""

    def spread(values: Sequence[float]) -> str:
        if not values:
            return "none"
        marks = ", ".join(f"p{round(q * 100)} {quantile(values, q):.3f}" for q in (0.05, 0.1, 0.25, 0.5, 0.75, 0.95))
        return f"{len(values)} probes: {marks}, max {values[-1]:.3f}"

    return "\n".join(
        [
            f"derived from the book:  {points(derived.calibration)}  ({derived.seconds:.1f} s)",
            f"embedder's defaults:    {points(prior)}",
            f"out-of-scope probes:    {spread(derived.out_of_scope)}",
            f"in-scope probes:        {spread(derived.in_scope)}",
            f"rule: decline = min(out-of-scope p95 + {DECLINE_MARGIN}, in-scope p10); "
            f"low = max(in-scope median - {LOW_MARGIN}, decline + {MIN_GAP}); high = low + the defaults' low-high span",
        ]
    )


async def _sections(index: VectorIndex) -> list[tuple[str, str]]:
    """(section URL, heading) of up to MAX_SECTIONS sections, evenly spread over the book in URL order."""
    ordered = sorted((await index.section_headings()).items())
    step = max(1, -(-len(ordered) // MAX_SECTIONS))  # ceiling: at most MAX_SECTIONS
    return ordered[::step]


async def _kept(index: VectorIndex) -> Any:
    """The calibration record in the index's metadata, as stored (None when absent or the index is away)."""
    try:
        return (await index.read_metadata()).get("calibration")
    except RetrievalUnavailable:
        return None


def _source(kept: Any) -> Source | None:
    value = kept.get("source") if isinstance(kept, Mapping) else None
    return value if value in ("book", "questions") else None


def _parse(kept: Any, embedder: Embedder) -> Calibration | None:
    if not isinstance(kept, Mapping) or kept.get("embedder") != embedder.name or kept.get("model") != embedder.model:
        return None
    try:
        return Calibration(decline=float(kept["decline"]), low=float(kept["low"]), high=float(kept["high"]))
    except (KeyError, TypeError, ValueError):
        log.warning("the calibration stored with the index is unreadable; using the embedder's defaults")
        return None
