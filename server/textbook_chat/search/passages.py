"""What kind of passage a chunk is: teaching prose, an assessment (a quiz, review questions), or an exercise.

A textbook's quizzes and assignments restate its topics in the reader's own words ("What does X tell a
walking robot?"), so a question resembles them more than the chapter that answers it. Their kind is read
from their form alone, never from what they are about: headings that name a quiz or an assignment, lines
that ask or offer lettered options, answer keys, instructions to the student. Ranking pushes them below
teaching passages unless the reader asks for practice, and the extractive answer never quotes a question,
an answer option or an exercise prompt as if it were the book's teaching.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Kind = Literal["teaching", "assessment", "exercise"]

ASSESSMENT_PENALTY = 0.15  # a quiz chunk sits this far below a teaching chunk of the same relevance
EXERCISE_PENALTY = 0.05  # assignments and labs often explain as they instruct: a lighter push
QUESTION_PENALTY = 0.1  # times the share of asking lines, for a teaching passage that poses questions
_ASSESSMENT_SHARE = 0.3  # a passage whose lines ask or offer options this often is an assessment, whatever its heading
_ASSESSMENT_LINES = 3  # ... if it has at least this many (one rhetorical question does not make a quiz)
# A chunk's form is read again for every question that finds it (its rank, then its source): kept for this many
# chunks (a book has a few thousand). The reading is a pure function of the text and headings, so it is kept by
# them; it cost ~1 ms of each question's retrieval (the line-by-line regexes), before the first token.
FORMS_CACHED = 4096


def kind_of(payload: Mapping[str, Any]) -> Kind:
    """A chunk's kind, from its headings (page title included) and the form of its lines."""
    headings = (str(payload.get("title", "")), *(str(h) for h in payload.get("heading_path", ()) or ()))
    return _classified(str(payload.get("text", "")), headings)


@functools.lru_cache(maxsize=FORMS_CACHED)
def _classified(text: str, headings: tuple[str, ...]) -> Kind:
    return classify(text, headings)


def classify(text: str, headings: Sequence[str]) -> Kind:
    heading_text = " \n".join(headings)
    if _ASSESSMENT_HEADING.search(heading_text) or _mostly_asks(text):
        return "assessment"
    if _EXERCISE_HEADING.search(heading_text):
        return "exercise"
    return "teaching"


def rank_penalty(payload: Mapping[str, Any], question: str) -> float:
    """How far ranking pushes a chunk down for what it is; nothing when the reader asks for practice."""
    if asks_for_practice(question):
        return 0.0
    kind = kind_of(payload)
    if kind == "assessment":
        return ASSESSMENT_PENALTY
    if kind == "exercise":
        return EXERCISE_PENALTY
    return QUESTION_PENALTY * question_share(str(payload.get("text", "")))


def asks_for_practice(question: str) -> bool:
    """The reader wants the quiz, the exercises or the assignment themselves."""
    return bool(_PRACTICE_WORDS.search(question))


@functools.lru_cache(maxsize=FORMS_CACHED)
def question_share(text: str) -> float:
    """The share of a passage's lines that ask a question or offer a lettered answer option."""
    lines = _lines(text)
    return sum(1 for line in lines if is_question_line(line)) / len(lines) if lines else 0.0


def _mostly_asks(text: str) -> bool:
    """A quiz without a quiz heading: several asking lines, and a good share of all its lines."""
    lines = _lines(text)
    asking = sum(1 for line in lines if is_question_line(line))
    return asking >= _ASSESSMENT_LINES and asking >= _ASSESSMENT_SHARE * len(lines)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def is_question_line(line: str) -> bool:
    stripped = _EMPHASIS.sub("", line).strip()
    return stripped.endswith("?") or bool(_OPTION.match(stripped))


def is_not_teaching(sentence: str, kind: Kind) -> bool:
    """A sentence an answer must not present as the book's teaching: a question, an answer option, an
    answer key, a numbered quiz item, or (in an exercise or assessment) an instruction to the student."""
    plain = _EMPHASIS.sub("", sentence).strip()
    if plain.endswith("?") or _OPTION.match(plain) or _ITEM.match(plain) or _KEY.match(plain):
        return True
    return kind != "teaching" and bool(_INSTRUCTION.match(plain))


_EMPHASIS = re.compile(r"[*_`]+")
_OPTION = re.compile(r"^(?:[-*]\s*)?(?:\(?[a-hA-H][).]|\[[ xX]\])\s")
_ITEM = re.compile(r"^(?:question|q|exercise|problem|task)\s*\d+\s*[:.)-]", re.I)
_KEY = re.compile(r"^(?:correct\s+)?(?:answer|solution|hint)s?\s*(?:key)?\s*[:\-]", re.I)
_ASSESSMENT_HEADING = re.compile(
    r"\b(?:quiz(?:zes)?|exams?|self[- ]check|knowledge check|check your understanding|"
    r"review questions|discussion questions|multiple[- ]choice|short[- ]answer|question \d+|answer key)\b",
    re.I,
)
_EXERCISE_HEADING = re.compile(
    r"\b(?:exercises?|assignments?|homework|deliverables?|rubric|grading|submission|practical lab|"
    r"hands-on lab|lab (?:overview|report|tasks?|exercises?|duration|setup|instructions))\b",
    re.I,
)
_PRACTICE_WORDS = re.compile(
    r"\b(?:quiz(?:zes)?|exams?|exercises?|assignments?|homework|labs?|rubric|grading|practice questions?|"
    r"review questions|deliverables?)\b",
    re.I,
)
# An instruction to the student: a sentence that opens with a bare command verb.
_INSTRUCTION = re.compile(
    r"^(?:design|implement|create|write|build|explain|describe|compare|discuss|analy[sz]e|choose|select|"
    r"submit|document|evaluate|develop|list|identify|calculate|propose|measure|record|modify|extend|"
    r"demonstrate|justify|include|prepare|present|complete|answer|provide|draw|sketch|outline|summari[sz]e|"
    r"research|investigate|reflect|consider|test|validate|deploy)\b",
    re.I,
)
