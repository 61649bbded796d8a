"""A question in its conversation, offline: how much of the earlier questions' subject it needs, the standalone
form retrieval searches with (the question and the subject it took: historical query expansion, no model call),
and the fusion of the question read alone with the question read in context.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from textbook_chat.index import sparse
from textbook_chat.search.rerank import Candidate

# Words that point back at something said before: a question holding one reads its subject from the conversation.
_POINTING = frozenset(
    """it its it's itself they them their theirs themselves this that these those one ones former latter other
    others another second first third last previous above same such then he she him her""".split()
)
# Openings of an ellipsis: "and its limits?", "what about actions?", "or the other way round?"
_ELLIPSIS = re.compile(r"^\s*(?:and|or|but|also|so|what about|how about|same for|and what about)\b", re.I)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-/]*[A-Za-z0-9+]|[A-Za-z0-9]")
SUBJECT_WORDS = 8  # the subject carried forward: at most this many words, the newest first
CONTEXT_WEIGHT = 1.0  # a question pointing back: its reading in context counts fully in the fusion ...
ALONE_WEIGHT = 0.5  # ... and its own words count half (they may still say what the subject is not)
PARTIAL_WEIGHT = 1.0  # a fallback: both readings count alike
_RRF_K = 10  # reciprocal-rank fusion over the CANDIDATES of each reading


@dataclass(frozen=True)
class Earlier:
    """An earlier question of the session: as asked, and the standalone form retrieval used for it, if any."""

    question: str
    standalone: str | None = None

    @property
    def text(self) -> str:
        return self.standalone or self.question


@dataclass(frozen=True)
class Asked:
    """How one question is read: ``standalone`` is None when it takes no context (a first question, a question
    that names its own subject: a topic switch); else the question with the subject it took. A question of
    common words and no pointing word is searched alone first, and in context only if the book answers it
    weakly alone (``fallback``)."""

    question: str
    standalone: str | None = None
    context_weight: float = 0.0  # how much the reading in context counts in the fusion
    alone_weight: float = 1.0  # how much the question as asked counts
    own_terms: tuple[str, ...] = ()  # its own content terms: a follow-up the book does not answer has none of them
    fallback: bool = False  # read in context only when alone it is declined or of low confidence

    @property
    def in_context(self) -> bool:
        return self.standalone is not None and self.context_weight > 0

    def contextual(self) -> Asked:
        """The fallback: the same question read in context, both readings weighed alike."""
        return replace(self, context_weight=PARTIAL_WEIGHT, fallback=False)


def read(question: str, earlier: Sequence[Earlier]) -> Asked:
    """The question as retrieval reads it, given the session's earlier questions (oldest first)."""
    if not earlier:
        return Asked(question)
    own = sparse.content(question)
    pointing = _points_back(question)
    if not pointing and sparse.names(question):
        return Asked(question)  # a topic switch is never drowned by the topic before it
    subject = _subject(earlier[-1].text, exclude=own)
    if not subject:
        return Asked(question)
    standalone = f"{question.strip()} ({subject})"
    if pointing or len(own) < 2:
        return Asked(question, standalone, CONTEXT_WEIGHT, ALONE_WEIGHT, tuple(own))
    return Asked(question, standalone, own_terms=tuple(own), fallback=True)


def fuse(alone: Sequence[Candidate], in_context: Sequence[Candidate], asked: Asked) -> list[Candidate]:
    """The two readings' ranked candidates in one list, by weighted reciprocal-rank fusion; a passage found by
    both keeps the higher relevance (what confidence reads)."""
    fused: dict[str, Candidate] = {}
    score: dict[str, float] = {}
    for weight, ranked in ((asked.alone_weight, alone), (asked.context_weight, in_context)):
        for position, candidate in enumerate(ranked, start=1):
            key = candidate.hit.id
            score[key] = score.get(key, 0.0) + weight / (_RRF_K + position)
            kept = fused.get(key)
            if kept is None or candidate.relevance > kept.relevance:
                fused[key] = candidate
    ordered = sorted(fused, key=lambda key: -score[key])
    return [replace(fused[key], rank_score=round(score[key], 6)) for key in ordered]


def _points_back(question: str) -> bool:
    words = [w.lower() for w in _WORD.findall(question)]
    return bool(_ELLIPSIS.match(question)) or any(w in _POINTING for w in words)


def _subject(text: str, *, exclude: Sequence[str]) -> str:
    """The salient words of an earlier question's standalone form, in its order and casing: names, and the
    content words (``sparse.content``), less what the new question already says; the newest part first."""
    wanted = set(sparse.content(text)) - set(exclude)
    words: list[str] = []
    seen: set[str] = set()
    for word in _WORD.findall(text):
        parts = sparse.terms(word)
        key = word.lower()
        if key in seen:
            continue
        if any(p in wanted for p in parts) or (word.isdigit() and words):
            words.append(word)
            seen.add(key)
        if len(words) == SUBJECT_WORDS:
            break
    return " ".join(words)
