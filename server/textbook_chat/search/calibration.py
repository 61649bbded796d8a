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

The second opinion's thresholds (``second_opinion.py``) come from the same probes: the cross-encoder reads the
``OPINION_PROBES`` out-of-scope probes that look closest to the book with their top passages; the best logit
among them is how high an unrelated question scores against this book. ``opinion_rule``: decline below that
+ ``LOGIT_MARGIN`` (kept within ``DECLINE_WINDOW``), overturn a decline above it + ``OVERTURN_GAP`` (at least 0,
MS MARCO's own boundary). Its band is fixed on the common scale, so in raw evidence it is the book's own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from textbook_chat.core.errors import RetrievalUnavailable
from textbook_chat.index import sparse
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search import confidence
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.second_opinion import Thresholds

if TYPE_CHECKING:
    from textbook_chat.search.retrieval import Retriever

log = logging.getLogger(__name__)

Source = Literal["book", "questions"]

MAX_SECTIONS = 150
DECLINE_MARGIN = 0.03
LOW_MARGIN = 0.03
MIN_GAP = 0.05
OPINION_PROBES = 10
LOGIT_MARGIN = 3.0
DECLINE_WINDOW = (-8.0, -6.0)
OVERTURN_GAP = 8.0
IN_SCOPE_SECTIONS = 20
IN_SCOPE_LOW = 0.1
_HEADING_NUMBER = re.compile(r"^[\d.\s]+")

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
    """A calibration with the evidence it came from (what ``python -m textbook_chat calibrate`` prints)."""

    calibration: Calibration
    out_of_scope: tuple[float, ...]  # raw evidence of each out-of-scope probe, sorted
    in_scope: tuple[float, ...]  # raw evidence of each held-out section heading, sorted
    seconds: float
    thresholds: Thresholds | None = None  # the second opinion's; None without the cross-encoder
    opinion_probes: tuple[float, ...] = ()  # the best logit of each out-of-scope probe it read, sorted
    opinion_seconds: float = 0.0
    opinion_in_scope: tuple[float, ...] = ()  # the best logit of each in-scope probe it read, sorted


async def derive(retriever: Retriever, index: VectorIndex) -> Derived:
    """Probe the book behind ``retriever`` and apply the rule above."""
    started = time.perf_counter()
    sections = await _sections(index)
    probes = [*OUT_OF_SCOPE_PROBES, *(heading for _, heading in sections)]
    vectors = await retriever.embedder.embed_documents(probes, background=True)  # a server may be answering
    outside: list[float] = []
    passages: list[list[str]] = []
    for text, vector in zip(OUT_OF_SCOPE_PROBES, vectors[: len(OUT_OF_SCOPE_PROBES)], strict=True):
        evidence, read = await retriever.probe(text, vector)
        outside.append(evidence)
        passages.append(read)
        await asyncio.sleep(0)  # each probe is a search that never suspends: readers' streams run between them
    inside: list[float] = []
    for (url, heading), vector in zip(sections, vectors[len(OUT_OF_SCOPE_PROBES) :], strict=True):
        inside.append(await retriever.evidence(heading, vector, hold_out=url))
        await asyncio.sleep(0)
    prior = confidence.CALIBRATIONS[retriever.embedder.name]
    seconds = time.perf_counter() - started
    opinion_started = time.perf_counter()
    logits = await _opinion_probes(retriever, outside, passages)
    in_scope_logits = await _in_scope_opinion_probes(retriever, index) if logits else []
    return Derived(
        calibration=rule(outside, inside, prior),
        out_of_scope=tuple(sorted(round(x, 4) for x in outside)),
        in_scope=tuple(sorted(round(x, 4) for x in inside)),
        seconds=seconds,
        thresholds=opinion_rule(logits, in_scope_logits) if logits else None,
        opinion_probes=tuple(sorted(round(x, 3) for x in logits)),
        opinion_seconds=time.perf_counter() - opinion_started if logits else 0.0,
        opinion_in_scope=tuple(sorted(round(x, 3) for x in in_scope_logits)),
    )


async def _opinion_probes(
    retriever: Retriever, evidence: Sequence[float], passages: Sequence[list[str]]
) -> list[float]:
    """The best logit of each of the OPINION_PROBES out-of-scope probes with the most evidence (ties: probe order);
    empty without the cross-encoder."""
    opinion = retriever.second_opinion
    if opinion is None or not opinion.available:
        return []
    closest = sorted(range(len(evidence)), key=lambda i: (-evidence[i], i))[:OPINION_PROBES]
    logits = []
    for i in closest:
        scores = await opinion.scores(OUT_OF_SCOPE_PROBES[i], passages[i])
        if scores is None:
            return []
        if scores:
            logits.append(max(scores))
    return logits


async def _in_scope_opinion_probes(retriever: Retriever, index: VectorIndex) -> list[float]:
    """The best logit of the in-scope probes: for up to IN_SCOPE_SECTIONS sections (evenly spread), the heading as
    a question, and the opening sentence without the heading's words (a paraphrase), each searched in the book."""
    opinion = retriever.second_opinion
    if opinion is None:
        return []
    openings = sorted((await index.section_openings()).items())
    step = max(1, -(-len(openings) // IN_SCOPE_SECTIONS))
    probes: list[str] = []
    for _, (heading, text) in openings[::step]:
        probes.append(f"What is {_HEADING_NUMBER.sub('', heading).strip()}?")
        paraphrase = without_heading_words(heading, text)
        if paraphrase:
            probes.append(paraphrase)
    if not probes:
        return []
    vectors = await retriever.embedder.embed_documents(probes, background=True)
    logits = []
    for text, vector in zip(probes, vectors, strict=True):
        _, read = await retriever.probe(text, vector)
        scores = await opinion.scores(text, read)
        if scores is None:
            return []
        if scores:
            logits.append(max(scores))
    return logits


def without_heading_words(heading: str, text: str, words: int = 20) -> str:
    """The first prose line of ``text``, its first ``words`` words, without the heading's terms ("" when fewer than
    five words stay): a question that names the topic only in other words."""
    banned = set(sparse.terms(heading))
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("```", "#", "|", "<", "import ", "!")):
            continue
        kept = [w for w in line.split()[:words] if not banned & set(sparse.terms(w))]
        if len(kept) >= 5:
            return " ".join(kept)
    return ""


def opinion_rule(out_of_scope_logits: Sequence[float], in_scope_logits: Sequence[float] = ()) -> Thresholds:
    """The module docstring's rule for the second opinion's thresholds."""
    low, high = DECLINE_WINDOW
    decline = max(out_of_scope_logits) + LOGIT_MARGIN
    if len(in_scope_logits) >= 5:  # between the two distributions: out of scope's top, in scope's low tail
        decline = min(decline, (max(out_of_scope_logits) + quantile(sorted(in_scope_logits), IN_SCOPE_LOW)) / 2)
    decline = min(max(decline, low), high)
    return Thresholds(decline_below=round(decline, 2), overturn_above=round(max(0.0, decline + OVERTURN_GAP), 2))


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


async def stored_thresholds(index: VectorIndex, embedder: Embedder) -> Thresholds | None:
    """The second opinion's thresholds kept with the index for this embedder, or None."""
    record = await _kept(index)
    return _parse_thresholds(record) if _parse(record, embedder) is not None else None


async def source(index: VectorIndex) -> Source | None:
    """Where the kept calibration came from: the book (ingest, ``calibrate``) or an operator's questions."""
    return _source(await _kept(index))


async def save(
    index: VectorIndex,
    embedder: Embedder,
    calibration: Calibration,
    source: Source,
    thresholds: Thresholds | None = None,
) -> None:
    record: dict[str, Any] = {
        **asdict(calibration),
        "embedder": embedder.name,
        "model": embedder.model,
        "query_model": embedder.query_model,
        "source": source,
        "derived_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if thresholds is not None:
        record["second_opinion"] = asdict(thresholds)
    await index.write_metadata(calibration=record)


async def after_ingest(retriever: Retriever, index: VectorIndex, *, book_changed: bool) -> Calibration:
    """Re-derive after an ingest that changed the book (or when none is stored); an operator's own calibration
    (``eval --calibrate --save``) is kept. Puts what is now in force for the index into ``retriever`` (its
    calibration and its second opinion's thresholds) and returns the calibration."""
    record = await _kept(index)
    kept = _parse(record, retriever.embedder)
    # Scores come from the question's vector: one derived with another query model (the float32 graph before
    # questions were embedded in int8) is re-derived, as a changed book's is.
    questions_changed = not isinstance(record, Mapping) or record.get("query_model") != retriever.embedder.query_model
    if kept is not None and (_source(record) == "questions" or not (book_changed or questions_changed)):
        if _source(record) == "questions":
            log.info("kept the calibration derived from your questions; `calibrate` derives one from the book again")
        use(retriever, kept, _parse_thresholds(record))
        return kept
    derived = await derive(retriever, index)
    await save(index, retriever.embedder, derived.calibration, "book", derived.thresholds)
    log.info(
        "calibration derived from the book in %.1f s (+%.1f s for the second opinion): %s",
        derived.seconds,
        derived.opinion_seconds,
        points(derived.calibration),
    )
    use(retriever, derived.calibration, derived.thresholds)
    return derived.calibration


def use(retriever: Retriever, calibration: Calibration, thresholds: Thresholds | None) -> None:
    """Put a calibration (and the second opinion's thresholds, when there are any) into force for ``retriever``."""
    retriever.calibration = calibration
    if retriever.second_opinion is not None and thresholds is not None:
        retriever.second_opinion.thresholds = thresholds


def points(calibration: Calibration) -> str:
    return f"decline {calibration.decline:.3f}, low {calibration.low:.3f}, high {calibration.high:.3f}"


def report(derived: Derived, prior: Calibration) -> str:
    """What ``calibrate`` prints: the points, the embedder's defaults, and the distributions behind them."""

    def spread(values: Sequence[float]) -> str:
        if not values:
            return "none"
        marks = ", ".join(f"p{round(q * 100)} {quantile(values, q):.3f}" for q in (0.05, 0.1, 0.25, 0.5, 0.75, 0.95))
        return f"{len(values)} probes: {marks}, max {values[-1]:.3f}"

    lines = [
        f"derived from the book:  {points(derived.calibration)}  ({derived.seconds:.1f} s)",
        f"embedder's defaults:    {points(prior)}",
        f"out-of-scope probes:    {spread(derived.out_of_scope)}",
        f"in-scope probes:        {spread(derived.in_scope)}",
        f"rule: decline = min(out-of-scope p95 + {DECLINE_MARGIN}, in-scope p10); "
        f"low = max(in-scope median - {LOW_MARGIN}, decline + {MIN_GAP}); high = low + the defaults' low-high span",
    ]
    if derived.thresholds is None:
        lines.append("second opinion:         none (the cross-encoder is not installed)")
        return "\n".join(lines)
    t = derived.thresholds
    raw_band = (derived.calibration.to_raw(t.band_low), derived.calibration.to_raw(t.band_high))
    logits = ", ".join(f"{x:.2f}" for x in derived.opinion_probes)
    lines += [
        f"second opinion:         {t.describe()}  ({derived.opinion_seconds:.1f} s)",
        f"  its band in raw evidence: {raw_band[0]:.3f}-{raw_band[1]:.3f}",
        f"  best logit of the {len(derived.opinion_probes)} closest out-of-scope probes: {logits}",
        f"  best logit of the {len(derived.opinion_in_scope)} in-scope probes: "
        + ", ".join(f"{x:.2f}" for x in derived.opinion_in_scope),
        f"  rule: decline below = min(max out-of-scope logit + {LOGIT_MARGIN}, halfway from it to the in-scope "
        f"p{round(IN_SCOPE_LOW * 100)}), within {DECLINE_WINDOW[0]}..{DECLINE_WINDOW[1]}; "
        f"overturn above = that + {OVERTURN_GAP}, at least 0",
    ]
    return "\n".join(lines)


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


def _parse_thresholds(kept: Any) -> Thresholds | None:
    value = kept.get("second_opinion") if isinstance(kept, Mapping) else None
    if not isinstance(value, Mapping):
        return None
    try:
        return Thresholds(**{k: float(value[k]) for k in ("decline_below", "overturn_above", "band_low", "band_high")})
    except (KeyError, TypeError, ValueError):
        log.warning("the second opinion's thresholds stored with the index are unreadable; using its defaults")
        return None


def _parse(kept: Any, embedder: Embedder) -> Calibration | None:
    if not isinstance(kept, Mapping) or kept.get("embedder") != embedder.name or kept.get("model") != embedder.model:
        return None
    try:
        return Calibration(decline=float(kept["decline"]), low=float(kept["low"]), high=float(kept["high"]))
    except (KeyError, TypeError, ValueError):
        log.warning("the calibration stored with the index is unreadable; using the embedder's defaults")
        return None
