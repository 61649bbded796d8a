"""Conversation sets: each later turn asked in its session (the earlier questions and the standalone forms
retrieval used for them), asked alone, and as its hand-written standalone rewrite; hit@5, MRR and declines.

The format is docs/evaluation.md's ("Conversation sets"); the ``eval`` command prints ``table(figures(...))``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from textbook_chat.search import context
from textbook_chat.search.context import Earlier
from textbook_chat.search.evaluate import mean, share
from textbook_chat.search.retrieval import Retrieval, Retriever

TurnKind = Literal["first", "follow_up", "switch", "out_of_scope"]
_LATER_KINDS = ("follow_up", "switch", "out_of_scope")


class ConversationFileError(ValueError):
    """A conversation set that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Turn:
    question: str
    kind: TurnKind
    expected_files: tuple[str, ...] = ()
    standalone: str | None = None  # a hand-written standalone rewrite (the upper bound)
    module: str | None = None  # the module filter the reader sent it with
    other_page: bool = False  # a follow-up whose expected files share none with the first question's
    answer_facts: tuple[str, ...] = ()  # what a good answer to it holds (``answer/facts.py`` scores the offline one)


@dataclass(frozen=True)
class Conversation:
    id: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Asking:
    """One way a turn was asked: its rank (1-based, first expected file in the top 5), declined, and timing."""

    rank: int | None
    declined: bool
    ms: float
    standalone: str | None = None  # the form retrieval used (in context)


@dataclass(frozen=True)
class TurnOutcome:
    conversation: str
    number: int  # 1 for the first question
    turn: Turn
    in_context: Asking
    alone: Asking
    rewrite: Asking | None = None
    answer: str = ""  # the offline answer it got in its session ("" when declined, or not asked for one)


def is_conversation_set(path: Path) -> bool:
    """Whether ``path`` holds conversations (its first line has ``turns``), not single questions."""
    try:
        with path.open(encoding="utf-8") as lines:
            first = json.loads(next((line for line in lines if line.strip()), "null"))
        return isinstance(first, dict) and "turns" in first
    except (OSError, ValueError):
        return False  # the question loader says what is wrong with it


def load(path: Path) -> list[Conversation]:
    conversations = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            turns_raw = raw["turns"]
            if not isinstance(turns_raw, list) or len(turns_raw) < 2:
                raise ValueError("a conversation needs at least two turns")
            first_files: set[str] = set()
            turns = []
            for position, t in enumerate(turns_raw):
                kind = "first" if position == 0 else str(t.get("kind", "follow_up"))
                if position and kind not in _LATER_KINDS:
                    raise ValueError(f"unknown kind {kind!r}")
                files = tuple(str(f) for f in t.get("expected_files") or ())
                if kind != "out_of_scope" and not files:
                    raise ValueError(f"turn {position + 1} has no expected_files")
                if position == 0:
                    first_files = set(files)
                turns.append(
                    Turn(
                        question=str(t["question"]),
                        kind=kind,  # type: ignore[arg-type]
                        expected_files=files,
                        standalone=t.get("standalone"),
                        module=t.get("module"),
                        other_page=kind == "follow_up" and not first_files & set(files),
                        answer_facts=tuple(str(f) for f in t.get("answer_facts") or ()),
                    )
                )
            conversations.append(Conversation(str(raw["id"]), tuple(turns)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConversationFileError(f"{path}:{number}: not a conversation ({type(exc).__name__}: {exc})") from None
    if not conversations:
        raise ConversationFileError(f"{path}: no conversations")
    return conversations


# The answer a reader gets (the offline one in ``eval``) and the numbers of the sources it cites.
Answer = Callable[[str, Retrieval], Awaitable[tuple[str, Sequence[int]]]]


async def run(
    retriever: Retriever, conversations: Iterable[Conversation], answer: Answer | None = None
) -> list[TurnOutcome]:
    """Every turn in its session, as the API retrieves it (the earlier questions, each with the standalone form
    its retrieval used and the answer it got from ``answer``), and alone; later turns with a hand rewrite also
    as that rewrite, alone."""
    outcomes = []
    for conversation in conversations:
        earlier: list[Earlier] = []
        for number, turn in enumerate(conversation.turns, start=1):
            result = await retriever.retrieve(turn.question, module=turn.module, earlier=earlier)
            in_context = _asking(turn, result)
            alone = (
                in_context
                if not earlier
                else _asking(turn, await retriever.retrieve(turn.question, module=turn.module))
            )
            rewrite = None
            if turn.standalone and number > 1:
                rewrite = _asking(turn, await retriever.retrieve(turn.standalone, module=turn.module))
            said, cited = (
                await answer(turn.question, result) if answer is not None and not result.declined else ("", ())
            )
            outcomes.append(TurnOutcome(conversation.id, number, turn, in_context, alone, rewrite, said))
            sections = ((s.title, s.heading_path) for s in result.sources if s.n in cited)
            earlier.append(Earlier(turn.question, result.standalone, said, context.section_headings(sections)))
    return outcomes


@dataclass(frozen=True)
class Line:
    """hit@5 and MRR of a group of turns, one way of asking them."""

    count: int
    hit_at_5: float
    mrr: float
    declined: float


def line(askings: Sequence[Asking]) -> Line:
    return Line(
        len(askings),
        share(a.rank is not None for a in askings),
        mean(1 / a.rank if a.rank else 0.0 for a in askings),
        share(a.declined for a in askings),
    )


def figures(outcomes: Sequence[TurnOutcome]) -> dict[str, dict[str, Line]]:
    """By group (follow-ups, other-page follow-ups, topic switches, first questions), by way of asking."""
    groups = {
        "follow-ups": [o for o in outcomes if o.turn.kind == "follow_up"],
        "  on another page than the first question's": [o for o in outcomes if o.turn.other_page],
        "topic switches": [o for o in outcomes if o.turn.kind == "switch"],
        "first questions": [o for o in outcomes if o.turn.kind == "first"],
    }
    result: dict[str, dict[str, Line]] = {}
    for name, group in groups.items():
        ways = {"in context": line([o.in_context for o in group]), "alone": line([o.alone for o in group])}
        rewritten = [o for o in group if o.rewrite is not None]
        if rewritten:
            ways["hand rewrite"] = line([o.rewrite for o in rewritten if o.rewrite is not None])
            ways["in context, same turns"] = line([o.in_context for o in rewritten])
        result[name] = ways
    return result


def table(outcomes: Sequence[TurnOutcome], *, title: str = "") -> str:
    rows = [title] if title else []
    rows.append(f"{'turns':<46} {'asked':<24} {'n':>3} {'hit@5':>6} {'MRR':>6} {'declined':>8}")
    for name, ways in figures(outcomes).items():
        for way, figure in ways.items():
            rows.append(
                f"{name:<46} {way:<24} {figure.count:>3} {figure.hit_at_5:>6.3f} {figure.mrr:>6.3f} "
                f"{figure.declined:>8.3f}"
            )
            name = ""
    oos = [o for o in outcomes if o.turn.kind == "out_of_scope"]
    rows.append(
        f"{'out-of-scope follow-ups':<46} {'in context':<24} {len(oos):>3} {'':>6} {'':>6} "
        f"{share(o.in_context.declined for o in oos):>8.3f}"
    )
    first = [o.in_context.ms for o in outcomes if o.turn.kind == "first"]
    later = [o.in_context.ms for o in outcomes if o.turn.kind != "first"]
    if first and later:
        rows.append(
            f"retrieval p50: first questions {statistics.median(first):.1f} ms, "
            f"later turns in context {statistics.median(later):.1f} ms"
        )
    return "\n".join(rows)


def misses(outcomes: Sequence[TurnOutcome]) -> str:
    """The later turns missed, wrongly declined or ranked below their hand rewrite in context, with the
    standalone form retrieval used."""
    lines = []
    for o in outcomes:
        if o.turn.kind in ("follow_up", "switch") and (o.in_context.rank is None or o.in_context.declined):
            why = "declined" if o.in_context.declined else "miss"
            lines.append(f"{o.conversation}#{o.number} {why}: {o.turn.question!r} -> {o.in_context.standalone!r}")
        elif o.rewrite is not None and o.rewrite.rank is not None and (o.in_context.rank or 99) > o.rewrite.rank:
            lines.append(
                f"{o.conversation}#{o.number} rank {o.in_context.rank} (rewrite {o.rewrite.rank}): "
                f"{o.turn.question!r} -> {o.in_context.standalone!r}"
            )
        elif o.turn.kind == "out_of_scope" and not o.in_context.declined:
            lines.append(f"{o.conversation}#{o.number} answered out of scope: {o.turn.question!r}")
    return "\n".join(lines)


def _asking(turn: Turn, result: Retrieval) -> Asking:
    files = [s.file_path for s in result.candidates]
    wanted = set(turn.expected_files)
    rank = next((n for n, f in enumerate(files, start=1) if f in wanted), None)
    return Asking(rank, result.declined, result.timings_ms.get("retrieval", 0.0), result.standalone)
