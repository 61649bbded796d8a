"""Retrieval evaluation: ask a question set (``questions.jsonl``), score hits, declines and scope decisions.

Reads the format of ``shared/corpora/*/questions.jsonl``; the ``eval`` command in ``cli.py`` prints
``table(figures(...))``. Plotting (``plot``) needs the optional ``plot`` extra (matplotlib).
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textbook_chat.search import calibration as book_calibration
from textbook_chat.search import confidence
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.retrieval import Retrieval, Retriever
from textbook_chat.search.second_opinion import Thresholds

if TYPE_CHECKING:
    from textbook_chat.index.embeddings import Embedder
    from textbook_chat.index.vectors import VectorIndex

KINDS = ("answerable", "out_of_scope", "module_filter", "selection")


class QuestionFileError(ValueError):
    """A question file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Question:
    id: str
    kind: str
    question: str
    expected_files: tuple[str, ...] = ()
    module: str | None = None  # the module the answer sits in; the reader's filter for module_filter questions
    expected_module: str | None = None
    in_filter: bool | None = None
    selected_text: str | None = None
    source_file: str | None = None
    answerable: bool | None = None
    answer_facts: tuple[str, ...] = ()  # what a good answer holds (``answer/facts.py`` scores the offline answer)


@dataclass(frozen=True)
class Outcome:
    id: str
    kind: str
    confidence: float
    similarity: float  # raw evidence before calibration (weighted relevance x name factor)
    level: str
    declined: bool
    rank: int | None  # 1-based rank of the first candidate from an expected file, None when absent from the top 5
    files: tuple[str, ...]  # the candidates' files, best first
    searched: str
    decision: str | None
    expected: str | None  # module_filter: "module" or "all"; selection: the source file
    second_opinion: str | None = None  # "declined" / "answered" when it changed the decision, "kept", None: not asked
    cross_score: float | None = None  # the best logit it gave (every question with ``judge_all``)
    retrieval_ms: float = 0.0  # ``timings_ms.retrieval`` as the server reports it
    opinion_ms: float = 0.0  # of which the second opinion's (0 where it was not asked)


@dataclass(frozen=True)
class Figures:
    answerable: int
    hit_at_1: float
    hit_at_5: float
    mrr: float
    wrongly_declined: float
    out_of_scope: int
    out_of_scope_declined: float
    module_filter: int
    module_filter_matched: float
    module_filter_hit_at_5: float
    selection: int
    selection_cited_at_1: float
    selection_cited: float
    confidence_answerable_median: float | None
    confidence_out_of_scope_median: float | None
    second_opinion_asked: int = 0
    second_opinion_declined: int = 0  # answers it declined
    second_opinion_declined_out_of_scope: int = 0  # ... of which out of scope (right)
    second_opinion_answered: int = 0  # declines it overturned
    second_opinion_answered_answerable: int = 0  # ... of which answerable (right)


def load_questions(path: Path) -> list[Question]:
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            kind = str(raw["kind"])
            if kind not in KINDS:
                raise ValueError(f"unknown kind {kind!r}")
            questions.append(
                Question(
                    id=str(raw["id"]),
                    kind=kind,
                    question=str(raw["question"]),
                    expected_files=tuple(raw.get("expected_files", ())),
                    module=raw.get("module"),
                    expected_module=raw.get("expected_module"),
                    in_filter=raw.get("in_filter"),
                    selected_text=raw.get("selected_text"),
                    source_file=raw.get("source_file"),
                    answerable=raw.get("answerable"),
                    answer_facts=tuple(str(f) for f in raw.get("answer_facts") or ()),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise QuestionFileError(f"{path}:{number}: not a question ({type(exc).__name__}: {exc})") from None
    if not questions:
        raise QuestionFileError(f"{path}: no questions")
    return questions


async def ask(
    retriever: Retriever, question: Question, *, module_aware: bool = False, judge_all: bool = False
) -> Outcome:
    """One question as a reader would ask it: module_filter questions always carry their filter, the
    other kinds only with ``module_aware`` (as if the reader had filtered to the module they were reading).
    ``judge_all``: record the cross-encoder's best logit for every question, not only where it was asked."""
    module = question.module if (question.kind == "module_filter" or module_aware) else None
    if question.kind == "selection":
        result = await retriever.retrieve(question.question, module=module, selected_text=question.selected_text)
        return _outcome(question, result, result.sources, expected=question.source_file)
    result = await retriever.retrieve(question.question, module=module)
    expected = None
    if question.kind == "module_filter":
        expected = "module" if question.in_filter else "all"
    outcome = _outcome(question, result, result.candidates, expected=expected)
    if judge_all and outcome.cross_score is None and retriever.second_opinion is not None:
        scores = await retriever.second_opinion.scores(question.question, [s.passage for s in result.candidates])
        outcome = replace(outcome, cross_score=round(max(scores), 3) if scores else None)
    return outcome


async def run(
    retriever: Retriever,
    questions: Iterable[Question],
    *,
    module_aware: bool = False,
    judge_all: bool = False,
    clients: int = 1,
) -> list[Outcome]:
    """The outcomes in the questions' order; ``clients`` readers ask at once (each its share, in turn)."""
    asked = list(questions)
    outcomes: list[Outcome | None] = [None] * len(asked)
    step = max(1, clients)

    async def reader(first: int) -> None:
        for n in range(first, len(asked), step):
            outcomes[n] = await ask(retriever, asked[n], module_aware=module_aware, judge_all=judge_all)

    await asyncio.gather(*(reader(first) for first in range(step)))
    return [o for o in outcomes if o is not None]


def figures(outcomes: Sequence[Outcome]) -> Figures:
    answerable = [o for o in outcomes if o.kind == "answerable"]
    oos = [o for o in outcomes if o.kind == "out_of_scope"]
    module_filter = [o for o in outcomes if o.kind == "module_filter"]
    selection = [o for o in outcomes if o.kind == "selection"]
    return Figures(
        answerable=len(answerable),
        hit_at_1=share(o.rank == 1 for o in answerable),
        hit_at_5=share(o.rank is not None for o in answerable),
        mrr=mean(1 / o.rank if o.rank else 0.0 for o in answerable),
        wrongly_declined=share(o.declined for o in answerable),
        out_of_scope=len(oos),
        out_of_scope_declined=share(o.declined for o in oos),
        module_filter=len(module_filter),
        module_filter_matched=share(o.searched == o.expected for o in module_filter),
        module_filter_hit_at_5=share(o.rank is not None for o in module_filter),
        selection=len(selection),
        selection_cited_at_1=share(o.rank == 1 for o in selection),
        selection_cited=share(o.rank is not None for o in selection),
        confidence_answerable_median=_median(o.confidence for o in answerable),
        confidence_out_of_scope_median=_median(o.confidence for o in oos),
        second_opinion_asked=sum(o.second_opinion is not None for o in outcomes),
        second_opinion_declined=sum(o.second_opinion == "declined" for o in outcomes),
        second_opinion_declined_out_of_scope=sum(o.second_opinion == "declined" for o in oos),
        second_opinion_answered=sum(o.second_opinion == "answered" for o in outcomes),
        second_opinion_answered_answerable=sum(o.second_opinion == "answered" for o in (*answerable, *module_filter)),
    )


def calibrate(outcomes: Sequence[Outcome]) -> Calibration:
    """Calibration points from answerable vs out-of-scope raw similarities, by a fixed rule (README):
    decline halfway across the gap between the classes (the largest out-of-scope and the smallest answerable
    value; the 90th and 10th percentiles when they overlap), low at the answerable 10th percentile, high at its
    75th percentile, each kept at least 0.05 above the previous one."""
    answerable = sorted(o.similarity for o in outcomes if o.kind == "answerable")
    oos = sorted(o.similarity for o in outcomes if o.kind == "out_of_scope")
    if len(answerable) < 4 or len(oos) < 2:
        raise ValueError("calibration needs at least 4 answerable and 2 out-of-scope questions")
    top_oos, bottom_answerable = oos[-1], answerable[0]
    if top_oos >= bottom_answerable:
        top_oos, bottom_answerable = book_calibration.quantile(oos, 0.9), book_calibration.quantile(answerable, 0.1)
    decline = (top_oos + bottom_answerable) / 2
    low = max(book_calibration.quantile(answerable, 0.1), decline + 0.05)
    high = max(book_calibration.quantile(answerable, 0.75), low + 0.05)
    return Calibration(decline=round(decline, 3), low=round(low, 3), high=round(min(high, 0.99), 3))


def calibrate_opinion(outcomes: Sequence[Outcome], thresholds: Thresholds) -> Thresholds:
    """The second opinion's thresholds from questions whose confidence lies in its band (``judge_all`` outcomes):
    decline halfway across the gap between the best logits of out-of-scope and answerable questions (the 90th
    and 10th percentiles when they overlap); overturn that + ``calibration.OVERTURN_GAP``, at least 0."""

    def logits(kind: str) -> list[float]:
        return sorted(
            o.cross_score
            for o in outcomes
            if o.kind == kind
            and o.cross_score is not None
            and thresholds.band_low <= o.confidence < thresholds.band_high
        )

    answerable, oos = logits("answerable"), logits("out_of_scope")
    if len(answerable) < 2 or len(oos) < 2:
        raise ValueError("the second opinion needs at least 2 answerable and 2 out-of-scope questions in its band")
    top_oos, bottom_answerable = oos[-1], answerable[0]
    if top_oos >= bottom_answerable:
        top_oos, bottom_answerable = book_calibration.quantile(oos, 0.9), book_calibration.quantile(answerable, 0.1)
    decline = round((top_oos + bottom_answerable) / 2, 2)
    overturn = round(max(0.0, decline + book_calibration.OVERTURN_GAP), 2)
    return replace(thresholds, decline_below=decline, overturn_above=max(overturn, decline + 0.01))


def declines(outcomes: Sequence[Outcome], calibration: Calibration) -> tuple[float, float]:
    """(out-of-scope declined, answerable wrongly declined) had ``calibration`` been in force."""
    answerable = [o.similarity for o in outcomes if o.kind == "answerable"]
    oos = [o.similarity for o in outcomes if o.kind == "out_of_scope"]

    def declined(raw: float) -> bool:
        return confidence.level(calibration.to_common(raw)) == "none"

    return share(declined(x) for x in oos), share(declined(x) for x in answerable)


def cross_validate(outcomes: Sequence[Outcome]) -> list[tuple[Calibration, float, float]]:
    """Two folds (alternate questions of each kind): calibrate on one, measure declines on the other."""
    folds: tuple[list[Outcome], list[Outcome]] = ([], [])
    seen: dict[str, int] = {}
    for outcome in outcomes:
        n = seen.get(outcome.kind, 0)
        seen[outcome.kind] = n + 1
        folds[n % 2].append(outcome)
    result = []
    for train, test in (folds, folds[::-1]):
        calibration = calibrate(train)
        result.append((calibration, *declines(test, calibration)))
    return result


async def save_calibration(
    index: VectorIndex, embedder: Embedder, retriever: Retriever, outcomes: Sequence[Outcome]
) -> str:
    """``eval --calibrate --save``: keep with the index the calibration these questions suggest, and the second
    opinion's thresholds when they give them; says what it kept. ValueError when they suggest no calibration."""
    derived = calibrate(outcomes)
    thresholds = await book_calibration.stored_thresholds(index, embedder)
    lines = []
    opinion = retriever.second_opinion
    if opinion is not None and opinion.available:
        try:
            thresholds = calibrate_opinion(outcomes, opinion.thresholds)
        except ValueError as exc:
            lines.append(f"second opinion's thresholds kept as they were: {exc}")
    await book_calibration.save(index, embedder, derived, "questions", thresholds)
    lines.append(f"saved with the index: {book_calibration.points(derived)} (serve uses it after a restart)")
    if thresholds is not None:
        lines.append(f"second opinion saved: {thresholds.describe()}")
    return "\n".join(lines)


def opinion_report(outcomes: Sequence[Outcome], thresholds: Thresholds) -> str:
    """The second opinion's thresholds in use, and the ones these questions suggest (``calibrate_opinion``)."""
    lines = [f"second opinion in use:  {thresholds.describe()}"]
    try:
        lines.append(f"derived from these:     {calibrate_opinion(outcomes, thresholds).describe()}")
    except ValueError as exc:
        lines.append(f"second opinion:         cannot derive from these: {exc}")
    return "\n".join(lines)


def calibration_report(outcomes: Sequence[Outcome], current: Calibration) -> str:
    """The calibration these questions suggest, and how well each fold's calibration does on the other fold."""
    lines = [f"calibration in use:     {book_calibration.points(current)}"]
    try:
        lines.append(f"derived from these:     {book_calibration.points(calibrate(outcomes))}")
        for n, (calibration, declined, wrongly) in enumerate(cross_validate(outcomes), start=1):
            lines.append(
                f"fold {n} -> other fold:  {book_calibration.points(calibration)}; "
                f"out of scope declined {declined:.3f}, answerable wrongly declined {wrongly:.3f}"
            )
    except ValueError as exc:
        lines.append(f"cannot calibrate: {exc}")
    return "\n".join(lines)


def table(result: Figures, *, title: str = "") -> str:
    def cell(count: int, value: float) -> str:
        return f"{value:.3f}" if count else "-"

    rows = [
        ("answerable questions", str(result.answerable)),
        ("  hit@1", cell(result.answerable, result.hit_at_1)),
        ("  hit@5", cell(result.answerable, result.hit_at_5)),
        ("  MRR", cell(result.answerable, result.mrr)),
        ("  wrongly declined", cell(result.answerable, result.wrongly_declined)),
        ("out-of-scope questions", str(result.out_of_scope)),
        ("  declined", cell(result.out_of_scope, result.out_of_scope_declined)),
        ("module-filter questions", str(result.module_filter)),
        ("  decision matches (module kept / widened)", cell(result.module_filter, result.module_filter_matched)),
        ("  hit@5", cell(result.module_filter, result.module_filter_hit_at_5)),
        ("selection questions", str(result.selection)),
        ("  selection's file cited first", cell(result.selection, result.selection_cited_at_1)),
        ("  selection's file cited", cell(result.selection, result.selection_cited)),
        ("median confidence, answerable", _optional(result.confidence_answerable_median)),
        ("median confidence, out of scope", _optional(result.confidence_out_of_scope_median)),
        ("second opinion asked", str(result.second_opinion_asked)),
        (
            "  answers it declined (out of scope)",
            f"{result.second_opinion_declined} ({result.second_opinion_declined_out_of_scope})",
        ),
        (
            "  declines it overturned (answerable)",
            f"{result.second_opinion_answered} ({result.second_opinion_answered_answerable})",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [title] if title else []
    lines += [f"{name:<{width}}  {value:>7}" for name, value in rows]
    return "\n".join(lines)


def to_json(result: Figures, outcomes: Sequence[Outcome], *, embedder: str, calibration: Calibration) -> dict[str, Any]:
    return {
        "embedder": embedder,
        "calibration": asdict(calibration),
        "figures": asdict(result),
        "questions": [asdict(o) for o in outcomes],
    }


def plot(outcomes: Sequence[Outcome], calibration: Calibration, path: Path, *, title: str = "") -> None:
    """Histogram of raw similarities, answerable vs out of scope, with the calibrated thresholds marked."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, an optional extra: .venv/bin/pip install 'matplotlib' (or '.[plot]')"
        ) from None
    answerable = [o.similarity for o in outcomes if o.kind in ("answerable", "module_filter")]
    oos = [o.similarity for o in outcomes if o.kind == "out_of_scope"]
    figure, axes = plt.subplots(figsize=(8, 4))
    bins = [i / 50 for i in range(51)]
    axes.hist(answerable, bins=bins, alpha=0.6, label=f"answerable ({len(answerable)})", color="tab:blue")
    axes.hist(oos, bins=bins, alpha=0.6, label=f"out of scope ({len(oos)})", color="tab:red")
    for raw, name in ((calibration.decline, "decline"), (calibration.low, "low"), (calibration.high, "high")):
        axes.axvline(raw, color="black", linestyle="--", linewidth=1)
        axes.text(raw, axes.get_ylim()[1] * 0.95, f" {name} {raw:.2f}", fontsize=8, va="top")
    axes.set_xlabel("raw evidence: weighted relevance x name factor (before calibration)")
    axes.set_ylabel("questions")
    axes.set_title(title or "Retrieval confidence: answerable vs out of scope")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to add it."""


def _outcome(question: Question, result: Retrieval, ranked: Sequence[Any], *, expected: str | None) -> Outcome:
    files = tuple(s.file_path for s in ranked)
    verdict = result.second_opinion
    wanted = set(question.expected_files) or ({question.source_file} if question.source_file else set())
    rank = next((n for n, f in enumerate(files, start=1) if f in wanted), None)
    return Outcome(
        id=question.id,
        kind=question.kind,
        confidence=result.confidence,
        similarity=round(result.similarity, 4),
        level=result.level,
        declined=result.declined,
        rank=rank,
        files=files,
        searched=result.scope.searched,
        decision=result.scope.decision,
        expected=expected,
        second_opinion=None if verdict is None else (verdict.change or "kept"),
        cross_score=None if verdict is None else verdict.score,
        retrieval_ms=result.timings_ms.get("retrieval", 0.0),
        opinion_ms=0.0 if verdict is None else verdict.ms,
    )


def share(flags: Iterable[bool]) -> float:
    """The share of true flags, to 4 places; 0 for none."""
    values = list(flags)
    return round(sum(values) / len(values), 4) if values else 0.0


def mean(values: Iterable[float]) -> float:
    """The mean, to 4 places; 0 for none."""
    items = list(values)
    return round(sum(items) / len(items), 4) if items else 0.0


def _median(values: Iterable[float]) -> float | None:
    items = list(values)
    return round(statistics.median(items), 4) if items else None


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
