"""A question in its conversation, offline: how much of the earlier questions' subject it needs, the standalone
form retrieval searches with (the question and the subject it took: historical query expansion, no model call),
the dense vector of the reading in context (the standalone form's own, steered by the question's blended with the
earlier questions' vectors, which were computed when they were asked), and the fusion of the two readings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from textbook_chat.book import mdx
from textbook_chat.index import sparse
from textbook_chat.search.rerank import Candidate, Query, known_share

# Words that point back at something said before: a question holding one reads its subject from the conversation
# ("also" adds to it: "what if I also want to record meetings?" after the server's hardware asks for more of it).
_POINTING = frozenset(
    """it its it's itself they them their theirs themselves this that these those one ones former latter other
    others another second first third last previous above same such then he she him her his hers mine yours
    ours also""".split()
)
# Openings of an ellipsis: "and its limits?", "what about actions?", "or the other way round?"
_ELLIPSIS = re.compile(r"^\s*(?:and|or|but|also|so|what about|how about|same for|and what about)\b", re.I)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-/]*[A-Za-z0-9+]|[A-Za-z0-9]")
SUBJECT_WORDS = 8  # the subject carried forward: at most this many words, the newest first
CONTEXT_WEIGHT = 1.0  # a question pointing back: its reading in context counts fully in the fusion, and its
ALONE_WEIGHT = 0.15  # own words this much for each content term (and the base), up to the same weight: the more
# it says of its own, the more it may have moved on ("what does the Module 3 assignment ask me to build with it?");
# the reading in context holds its words too (the standalone form is embedded), so alone they need less weight
PARTIAL_WEIGHT = 1.0  # a fallback: both readings count alike
ANSWER_NAMES = 3  # names of the last answer carried forward, after the subject of the question before
ANSWER_NAME_MIN = 2  # ... each named at least this often in it
_MARKERS = re.compile(r"\[\d+\]|\]\([^)]*\)")  # citation markers and link targets say nothing of the subject
_RRF_K = 10  # reciprocal-rank fusion over the CANDIDATES of each reading
EVIDENCE_POWER = 2  # how sharply the reading alone gains or loses weight with its evidence (``alone_weight``)
PRIOR_WEIGHT = 0.5  # the earlier questions' vector in the reading in context, against the question's own 1.0
PRIOR_QUESTIONS = 3  # at most this many earlier questions make it up: the last, and those it took context from
STANDALONE_WEIGHT = 2.0  # the standalone form's own vector in the reading in context, against the blend's 1.0


@dataclass(frozen=True)
class Earlier:
    """An earlier question of the session: as asked, the standalone form retrieval used for it (if any), the
    answer it got (what "the other one" or "the second format" may point into), and the headings of the sections
    it was answered from (what the book calls its subject)."""

    question: str
    standalone: str | None = None
    answer: str = ""
    headings: str = ""  # the page titles and heading paths of the sections the answer was given from

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
    prior: tuple[str, ...] = ()  # the earlier questions whose vectors blend into the reading in context, oldest first
    subject: str = ""  # what the standalone form adds to the question (in its brackets)
    points_back: bool = False  # it holds a word pointing back ("it", "that") or opens with an ellipsis ("and ...")
    # The standalone form with only the subject's words the earlier answer's cited headings hold (``_focus``),
    # where they hold some but not all: what the reading in context's own vector reads. None: the standalone form.
    focused: str | None = None

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
    last = earlier[-1]
    asked_about = _subject(last.text, exclude=own)
    named = _answer_names(last.answer, exclude=[*own, *sparse.terms(asked_about)])
    subject = " ".join(filter(None, (asked_about, named)))
    if not subject:
        return Asked(question)
    standalone = expanded(question, subject)
    focus = _focus(asked_about, last.headings)
    focused = expanded(question, " ".join(filter(None, (focus, named)))) if focus and focus != asked_about else None
    prior = _prior(earlier)
    if pointing or len(own) < 2:
        weight = _alone_weight(question, own)
        return Asked(
            question,
            standalone,
            CONTEXT_WEIGHT,
            weight,
            tuple(own),
            prior=prior,
            subject=subject,
            points_back=pointing,
            focused=focused,
        )
    return Asked(
        question, standalone, own_terms=tuple(own), fallback=True, prior=prior, subject=subject, focused=focused
    )


def expanded(question: str, subject: str) -> str:
    """The standalone form: the question as asked, then the subject it took in brackets."""
    return f"{question.strip()} ({subject})"


def is_expanded(question: str, standalone: str | None) -> bool:
    """Whether ``standalone`` is ``question`` with a subject added (``expanded``), not a question of its own (the
    model's rewrite, ``FOLLOW_UP_REWRITE``)."""
    return bool(standalone) and str(standalone).startswith(f"{question.strip()} (") and str(standalone).endswith(")")


def keywords(asked: Asked) -> sparse.Sparse:
    """The keyword query of the reading in context (``weighed``), as on the dense side (``blend``)."""
    own, subject = (sparse.bounded(sparse.terms(text)) for text in (asked.question, asked.subject))
    return sparse.query_vector_of(weighed(own, subject))


def weighed(own: Sequence[str], subject: Sequence[str]) -> dict[str, float]:
    """A follow-up's terms and their weights: its own weigh 1 and those of the subject it took PRIOR_WEIGHT (a
    term in both is its own): the earlier subject steers, the question's words lead. Retrieval's keyword query
    (``keywords``) and the offline answer's choice of units read them."""
    weights = dict.fromkeys(subject, PRIOR_WEIGHT)
    weights.update(dict.fromkeys(own, 1.0))
    return weights


def alone_weight(asked: Asked, alone: Sequence[Candidate], in_context: Sequence[Candidate]) -> float:
    """How much the question read alone counts, from its own evidence: its weight by its own words, times the
    square of how its best passage's relevance compares with the best in context, up to CONTEXT_WEIGHT. Where
    the book answers the words alone better than in context, they have moved on; where worse, they lean on it."""
    best_alone = max((c.relevance for c in alone), default=0.0)
    best_in_context = max((c.relevance for c in in_context), default=0.0)
    if best_in_context <= 0.0:
        return asked.alone_weight
    return min(CONTEXT_WEIGHT, asked.alone_weight * (best_alone / best_in_context) ** EVIDENCE_POWER)


def blend(question: Sequence[float], prior: Sequence[Sequence[float]], standalone: Sequence[float] = ()) -> list[float]:
    """The dense vector of the reading in context: the question's, plus PRIOR_WEIGHT of the earlier questions'
    (``Asked.prior``, oldest first, each blended into the next the same way), normalised; then, where the standalone
    form was embedded, STANDALONE_WEIGHT of its vector added, normalised again. The earlier questions' vectors were
    computed when they were asked (the embedder's query cache holds them); the standalone form's is computed beside
    the question's own. The embedded standalone form reads the subject with the question's words, as a hand rewrite
    does; the blend keeps the earlier questions' wording, which a subject of a few salient words loses."""
    blended: np.ndarray | None = None
    for vector in (*prior, question):
        current = np.asarray(vector, dtype=np.float64)
        if blended is not None:
            current = current + PRIOR_WEIGHT * blended
        blended = current / (np.linalg.norm(current) or 1.0)
    assert blended is not None
    if len(standalone):
        blended = blended + STANDALONE_WEIGHT * np.asarray(standalone, dtype=np.float64)
        blended = blended / (np.linalg.norm(blended) or 1.0)
    return [float(x) for x in blended]


def fuse(alone: Sequence[Candidate], in_context: Sequence[Candidate], asked: Asked, *, keep: int) -> list[Candidate]:
    """The two readings' ranked candidates in one list, by weighted reciprocal-rank fusion; a passage found by
    both keeps the higher relevance (what confidence reads). The reading alone weighs by what the question says
    of its own (``Asked.alone_weight``) and by the book's evidence for it (``alone_weight``).

    Its best passage keeps a place among the first ``keep`` (the sources retrieval keeps), the last if the fusion
    ranked it lower: where the earlier subject outweighs the question's own words (a follow-up that moved to
    another page, "if that number is low, how do I make their first days smoother?"), what the words alone found
    best is still read."""
    fused: dict[str, Candidate] = {}
    score: dict[str, float] = {}
    for weight, ranked in ((alone_weight(asked, alone, in_context), alone), (asked.context_weight, in_context)):
        for position, candidate in enumerate(ranked, start=1):
            key = candidate.hit.id
            score[key] = score.get(key, 0.0) + weight / (_RRF_K + position)
            kept = fused.get(key)
            if kept is None or candidate.relevance > kept.relevance:
                fused[key] = candidate
    ordered = sorted(fused, key=lambda key: -score[key])
    if alone and alone[0].hit.id not in ordered[:keep]:
        ordered.remove(alone[0].hit.id)
        ordered.insert(keep - 1, alone[0].hit.id)
    return [replace(fused[key], rank_score=round(score[key], 6)) for key in ordered]


def _prior(earlier: Sequence[Earlier]) -> tuple[str, ...]:
    """The earlier questions the reading in context blends in, as asked (as their vectors were computed): the
    last, and before it each one the next took context from (it had a standalone form), PRIOR_QUESTIONS at most."""
    chain = [earlier[-1].question]
    for position in range(len(earlier) - 1, 0, -1):
        if earlier[position].standalone is None or len(chain) == PRIOR_QUESTIONS:
            break
        chain.append(earlier[position - 1].question)
    return tuple(reversed(chain))


def _alone_weight(question: str, own: Sequence[str]) -> float:
    if sparse.names(question):
        return CONTEXT_WEIGHT
    return min(CONTEXT_WEIGHT, ALONE_WEIGHT * (1 + len(own)))


def _points_back(question: str) -> bool:
    words = [w.lower() for w in _WORD.findall(question)]
    return bool(_ELLIPSIS.match(question)) or any(w in _POINTING for w in words)


def _answer_names(answer: str, *, exclude: Sequence[str]) -> str:
    """The names the last answer used most (``sparse.names``: ``URDF``, ``Isaac Sim``), ANSWER_NAMES at most,
    in their casing: what "the other one" may be, when the question before did not name it."""
    if not answer:
        return ""
    prose = _MARKERS.sub(" ", mdx.without_code(answer))  # the identifiers of a quoted listing are not its subject
    counts: dict[str, int] = {}
    spelled: dict[str, str] = {}
    skip = set(exclude)
    for name in sparse.names(prose):
        parts = set(sparse.terms(name)[1:])  # a compound's words: "ROS/ROS" after "ROS" adds nothing
        if name not in skip and not (parts and parts <= skip):
            counts[name] = 0
    for word in _WORD.findall(prose):
        key = word.lower()
        if key in counts:
            counts[key] += 1
            if word[0].isupper() or not word.isalpha():
                spelled.setdefault(key, word)  # as a name is written, not as the word at the start of a list
    best = sorted((n for n in spelled if counts[n] >= ANSWER_NAME_MIN), key=lambda n: -counts[n])[:ANSWER_NAMES]
    return " ".join(spelled[n] for n in best)


def section_headings(sections: Iterable[tuple[str, Sequence[str]]]) -> str:
    """``Earlier.headings`` of the sections an answer cited, each as (page title, heading path): one line each."""
    return "\n".join(" › ".join(filter(None, (title, *path))) for title, path in sections)


def _focus(subject: str, headings: str) -> str:
    """The words of ``subject`` that the earlier answer's section headings hold (a number after a word they hold
    too: "ROS 2"), in order: what the book calls the thing a follow-up points back to ("secure domain" of "set
    secure domain registered users create rooms"). The rest of the subject is how the earlier question asked
    about it; searched with its full weight, it pulls a follow-up back to the section that answered it. "" where
    the headings hold none of it (or there are none)."""
    named = set(sparse.terms(headings))
    kept: list[str] = []
    held = False
    for word in subject.split():
        held = any(term in named for term in sparse.terms(word)) or (held and word.isdigit())
        if held:
            kept.append(word)
    return " ".join(kept)


def _subject(text: str, *, exclude: Sequence[str]) -> str:
    """The salient words of an earlier question's standalone form, in its order and casing: names, and the
    content words (``sparse.content``), less what the new question already says; the newest part first."""
    wanted = set(sparse.content(text)) - set(exclude)
    words: list[str] = []
    seen: set[str] = set()
    for word in _WORD.findall(text):
        parts = sparse.terms(word)
        key = word.lower()
        if key in seen or key in _POINTING:  # "ones", "mine", "second" point at the subject; they are not it
            continue
        if any(p in wanted for p in parts) or (word.isdigit() and words):
            words.append(word)
            seen.add(key)
        if len(words) == SUBJECT_WORDS:
            break
    return " ".join(words)


def known(query: Query, unknown: Sequence[str], asked: Asked | None = None) -> float:
    """``known_share`` of the question as asked; a follow-up read in context also loses evidence for its own
    content terms the book never uses ("and how do I cook pasta?"): the context's subject is not its subject."""
    share = known_share(query, unknown)
    if asked is None or not asked.in_context or not asked.own_terms:
        return share
    absent = set(unknown) & set(asked.own_terms)
    # A question pointing back is about the subject by its grammar ("how would I put up a wall against that?"): its
    # everyday words the book lacks are how the reader asks. Without a pointing word, each absent word counts fully.
    weigh = sparse.specificity if asked.points_back else (lambda term: 1.0)
    missing = sum(weigh(term) for term in absent) / len(set(asked.own_terms))
    # Squared: a word or two of several the book does not use is a paraphrase ("does it talk to ROS 2?"); most of
    # them absent is another subject ("and how do I cook pasta?")
    return min(share, 1.0 - missing**2)
