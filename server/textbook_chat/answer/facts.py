"""Does an answer hold the facts a good answer holds, and does it read badly? Issue 30's strict rule, for ``eval``.

A fact counts when at least 60 % of its content words are in the answer: lower-cased, stop words and words of one
or two letters dropped, numbers kept, no stemming (a lower bound: a paraphrase is missed). Beside the facts, three
faults of form are counted: a lead-in quoted without what it introduces, a sentence said twice word for word, and
a book's navigation quoted (by the rule the offline answer applies). Retrieval and generation are the callers';
``ask`` runs both as the server does.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from textbook_chat.answer.extract import LIST_MARKER, is_navigation
from textbook_chat.answer.prompts import CITATION
from textbook_chat.book import mdx

if TYPE_CHECKING:
    from textbook_chat.answer.generation import ExtractiveGenerator
    from textbook_chat.search.conversations import TurnOutcome
    from textbook_chat.search.evaluate import Question
    from textbook_chat.search.retrieval import Retrieval, Retriever

FACT_SHARE = 0.6

# English function words (the usual short stop list); words of one or two letters are dropped anyway.
STOP_WORDS = frozenset(
    """about above after again against all also and any are aren't because been before being below between both
    but can cannot could did does doing down during each either etc few for from further had has have having her
    here hers herself him himself his how into its itself just let like may might more most much must myself nor
    not now off once one only other ought our ours ourselves out over own per same she should some such than that
    the their theirs them themselves then there these they this those through too under until upon very was were
    what when where whether which while who whom whose why will with within without would yet you your yours
    yourself yourselves via""".split()
)

_WORD = re.compile(r"[^\W_]+")
_MARKERS = re.compile(rf"(?<!\s)\s*{CITATION}")  # a run of spaces is tried from its start only
_BLOCK_START = re.compile(r"^\s*(?:[-*+]\s|\d{1,3}[.)]\s|```|~~~|\||>|\s{4})")
# A colon that closes a line (after any markers and a full stop), or a colon closed by a full stop mid-paragraph.
_LEAD_IN_EOL = re.compile(rf":[*_]*(?:\s*{CITATION})*\s*\.?[ \t]*$")
_LEAD_IN_STOPPED = re.compile(rf":(?:\s*{CITATION})*\s*\.(?=\s)")


def content_words(text: str) -> list[str]:
    """Lower-cased words, stop words and words of one or two letters dropped; anything holding a digit kept."""
    return [
        w for w in _WORD.findall(text.lower()) if any(c.isdigit() for c in w) or (len(w) > 2 and w not in STOP_WORDS)
    ]


def holds(answer_words: set[str], fact: str) -> bool:
    """Whether at least ``FACT_SHARE`` of the fact's content words are among the answer's."""
    wanted = content_words(fact)
    if not wanted:
        return False
    return sum(1 for w in wanted if w in answer_words) >= FACT_SHARE * len(wanted)


def dangling_lead_ins(answer: str) -> int:
    """Lead-ins (a colon that ends what is said) not followed by the list, code, table or quote they introduce."""
    marked = mdx.code_lines(answer)
    lines = [line for line, _ in marked]
    count = 0
    for i, (line, code) in enumerate(marked):
        if code:
            continue
        count += len(_LEAD_IN_STOPPED.findall(line.rstrip()))
        if _LEAD_IN_EOL.search(line) and not _LEAD_IN_STOPPED.search(line.rstrip()):
            # What follows is a list, code, a table or a quote, or a label line that introduces one itself.
            following = [later for later in lines[i + 1 :] if later.strip()]
            while following and _LEAD_IN_EOL.search(following[0]) and not _BLOCK_START.match(following[0]):
                following.pop(0)
            if not following or not _BLOCK_START.match(following[0]):
                count += 1
    return count


def repeated_sentences(answer: str) -> int:
    """Sentences (of four words or more) said again word for word, citation markers and case aside."""
    seen: set[str] = set()
    repeats = 0
    for line in (line for line, code in mdx.code_lines(answer) if not code):
        line = LIST_MARKER.sub("", _MARKERS.sub("", line))
        for piece in re.split(r"(?<=[.!?])\s+", line):
            key = " ".join(piece.lower().strip(" .!?").split())
            if len(key.split()) < 4:
                continue
            if key in seen:
                repeats += 1
            seen.add(key)
    return repeats


def navigation_lines(answer: str) -> int:
    """Lines that are a page's navigation, by the rule the offline answer leaves them out by (``extract.is_navigation``:
    a previous / next / back label, an arrow between links, or nothing but links), citation markers aside."""
    return sum(1 for line, code in mdx.code_lines(answer) if not code and is_navigation(_MARKERS.sub("", line)))


@dataclass(frozen=True)
class AnswerOutcome:
    id: str
    kind: str
    facts: int
    found: int
    words: int
    dangling: int
    repeated: int
    navigation: int
    missing: tuple[str, ...]
    answer: str


@dataclass(frozen=True)
class AnswerFigures:
    questions: int
    facts: int
    fact_recall: float
    all_facts: float  # share of answers holding every expected fact
    no_facts: float  # share of answers holding none
    median_words: float | None
    dangling_lead_ins: int  # answers quoting at least one lead-in without what it introduces
    repeated_sentences: int  # answers saying a sentence twice word for word
    navigation: int  # answers quoting navigation


def score(question_id: str, kind: str, answer: str, facts: Sequence[str]) -> AnswerOutcome:
    words = set(content_words(answer))
    missing = tuple(f for f in facts if not holds(words, f))
    return AnswerOutcome(
        id=question_id,
        kind=kind,
        facts=len(facts),
        found=len(facts) - len(missing),
        words=len(answer.split()),
        dangling=dangling_lead_ins(answer),
        repeated=repeated_sentences(answer),
        navigation=navigation_lines(answer),
        missing=missing,
        answer=answer,
    )


def figures(outcomes: Sequence[AnswerOutcome]) -> AnswerFigures:
    scored = [o for o in outcomes if o.facts]
    total = sum(o.facts for o in scored)
    return AnswerFigures(
        questions=len(scored),
        facts=total,
        fact_recall=round(sum(o.found for o in scored) / total, 4) if total else 0.0,
        all_facts=_share(o.found == o.facts for o in scored),
        no_facts=_share(o.found == 0 for o in scored),
        median_words=statistics.median(o.words for o in scored) if scored else None,
        dangling_lead_ins=sum(1 for o in outcomes if o.dangling),
        repeated_sentences=sum(1 for o in outcomes if o.repeated),
        navigation=sum(1 for o in outcomes if o.navigation),
    )


def table(result: AnswerFigures) -> str:
    def share(value: float) -> str:
        return f"{value:.3f}" if result.questions else "-"

    rows = [
        ("offline answers with expected facts", str(result.questions)),
        ("  facts expected", str(result.facts)),
        ("  fact recall", share(result.fact_recall)),
        ("  answers with every fact", share(result.all_facts)),
        ("  answers with none", share(result.no_facts)),
        ("  median length (words)", "-" if result.median_words is None else f"{result.median_words:.0f}"),
        ("  answers quoting a dangling lead-in", str(result.dangling_lead_ins)),
        ("  answers repeating a sentence", str(result.repeated_sentences)),
        ("  answers quoting navigation", str(result.navigation)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value:>7}" for name, value in rows)


def to_json(outcomes: Sequence[AnswerOutcome]) -> dict[str, Any]:
    return {"figures": asdict(figures(outcomes)), "questions": [asdict(o) for o in outcomes]}


async def ask(
    retriever: Retriever, generator: ExtractiveGenerator, question: Question, *, module_aware: bool = False
) -> AnswerOutcome:
    """The offline answer a reader gets to ``question`` (a declined question gets none), scored."""
    from textbook_chat.answer.generation import GenerationRequest

    module = question.module if (question.kind == "module_filter" or module_aware) else None
    selected = question.selected_text if question.kind == "selection" else None
    retrieval = await retriever.retrieve(question.question, module=module, selected_text=selected)
    answer = ""
    if not retrieval.declined:
        request = GenerationRequest(
            question=question.question,
            sources=retrieval.sources,
            history=(),
            mode=retrieval.mode,
            selected_text=selected,
            low_confidence=retrieval.level == "low",
        )
        answer = await generator.answer_async(request)
    return score(question.id, question.kind, answer, question.answer_facts)


def offline_answer(generator: ExtractiveGenerator) -> Callable[[str, Retrieval], Awaitable[tuple[str, list[int]]]]:
    """The offline answer to a question retrieved as ``Retrieval`` (in its conversation or not), as the server
    gives it, and the source numbers it cites, read as the server reads them (``generation.cited_numbers``): what a
    conversation set's next turn reads as its history (``search/conversations.py``)."""
    from textbook_chat.answer.generation import GenerationRequest, cited_numbers

    async def answer(question: str, retrieval: Retrieval) -> tuple[str, list[int]]:
        request = GenerationRequest(
            question=question,
            sources=retrieval.sources,
            history=(),
            mode=retrieval.mode,
            low_confidence=retrieval.level == "low",
            standalone=retrieval.standalone,
        )
        text = await generator.answer_async(request)
        return text, cited_numbers(text, len(retrieval.sources))

    return answer


async def run(
    retriever: Retriever,
    generator: ExtractiveGenerator,
    questions: Iterable[Question],
    *,
    module_aware: bool = False,
) -> list[AnswerOutcome]:
    """Every question that carries ``answer_facts``, asked and scored one after the other."""
    return [await ask(retriever, generator, q, module_aware=module_aware) for q in questions if q.answer_facts]


def conversation_table(turns: Sequence[TurnOutcome]) -> str:
    """The offline answers' facts in conversations: first questions, and follow-ups answered in their session,
    for the turns that carry ``answer_facts`` ("" when none does)."""
    groups = {
        "first questions": [t for t in turns if t.turn.kind == "first" and t.turn.answer_facts],
        "follow-ups, in context": [t for t in turns if t.turn.kind == "follow_up" and t.turn.answer_facts],
    }
    rows = []
    for name, group in groups.items():
        if group:
            scored = [score(f"{t.conversation}#{t.number}", t.turn.kind, t.answer, t.turn.answer_facts) for t in group]
            rows.append(f"offline answers to {name}\n{table(figures(scored))}")
    return "\n".join(rows)


def _share(flags: Iterable[bool]) -> float:
    values = list(flags)
    return round(sum(values) / len(values), 4) if values else 0.0
