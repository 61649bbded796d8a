"""The keyword side of hybrid search: text → BM25 term weights, as sparse vectors (Qdrant applies IDF) or an
in-memory ``KeywordIndex`` (embedded Qdrant's sparse search is too slow per question: see the README).

Identifiers are kept whole and also split (``rclpy.spin()`` → ``rclpy.spin``, ``rclpy``, ``spin``), so exact
names such as ``ros2 topic echo`` or ``ros2_control`` match even where the dense model blurs them.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from textbook_chat.core import rarity

_K1 = 1.2
_B = 0.75
_DIGITS = 5  # sparse weights are stored rounded
_AVERAGE_TERMS = 120.0  # typical chunk length in terms; document length normalisation is relative to it
_NAME = re.compile(r"[A-Za-z0-9]+(?:[._\-/][A-Za-z0-9]+)*")
_IDENTIFIER = re.compile(r"[a-z0-9]+(?:[._\-/:][a-z0-9]+)*")
_SEPARATOR = re.compile(r"[._\-/:]")  # what joins an identifier's parts
_OPTION = re.compile(r"(?<![\w-])--([A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)")  # a long command-line option
_STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having he
    her here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
    now of off on once only or other our ours ourselves out over own same she should so some such than that the
    their theirs them themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves use used using
    get gets one two way ways""".split()
)


@dataclass(frozen=True)
class Sparse:
    indices: tuple[int, ...]
    values: tuple[float, ...]


# Typographic hyphens join a compound as "-" does: a book's "teacher–student" (an en dash) is the compound a
# reader types as "teacher-student". The em dash, which sets off a clause, is left alone.
_HYPHENS = str.maketrans(dict.fromkeys("\u2010\u2011\u2012\u2013", "-"))


def terms(text: str) -> list[str]:
    """Lower-cased terms in order: whole identifiers and their parts, stopwords dropped, plurals folded."""
    result: list[str] = []
    for token in _IDENTIFIER.findall(text.translate(_HYPHENS).lower()):
        if _SEPARATOR.search(token) is None:  # most words: no parts to split into
            if token not in _STOPWORDS and len(token) > 1:
                result.append(_stem(token))
            continue
        result.append(token)
        result.extend(_stem(p) for p in _SEPARATOR.split(token) if p and p not in _STOPWORDS and len(p) > 1)
    return result


# Words that say what kind of question it is, not what it is about: absent from a book, they mean nothing.
_ASKING = frozenset(
    """explain describe tell mean meaning difference differ work works happen example examples kind kinds type types
    thing things need want make know like many much good best better usual typical typically common general
    different new old main simple simply important possible right wrong usually often always never""".split()
)


# Without wordfreq's list (``core/rarity.py``), word pieces stand in for rarity: a word MiniLM's 30k-piece
# vocabulary splits into this many pieces or more is rare or technical ("quadcopter"), and a two-piece word whose
# first piece is this short is spelled from a fragment, as a command is ("strace" st+race, "gdb" g+db).
SPECIFIC_PIECES = 3
FRAGMENT_CHARS = 2


def informative(text: str, *, exclude: Sequence[str] = ()) -> dict[str, float]:
    """A question's specific terms (``specific``), each weighing 1: the ones a book that answers the question
    must use somewhere. At most ``MAX_QUERY_TERMS`` of the question's terms are read."""
    weights: dict[str, float] = {}
    for term in bounded(terms(text)):
        if term in exclude or term in weights or term in _ASKING or len(term) < 3 or not term.isalpha():
            continue  # a compound ("two-link") is checked by its parts, an identifier by the names rule
        if specific(term):
            weights[term] = 1.0
    return weights


def content(text: str) -> list[str]:
    """A question's content terms, in order and once each (at most ``MAX_QUERY_TERMS``): its terms less the words
    that say what kind of question it is (``_ASKING``), function words the keyword side keeps (``_FUNCTION``), the
    one- and two-letter ones, negated auxiliaries ("aren't" would leave "aren") and a hyphenated compound's whole
    (its parts are content words of their own: "ready-made" is "ready" and "made"); what it is about."""
    return [
        t
        for t in bounded(terms(_NEGATED.sub(" ", text)))
        if t not in _ASKING and t not in _FUNCTION and len(t) > 2 and "-" not in t
    ]


# Prepositions, indefinite pronouns and adverbs the keyword side keeps (they are in no stopword list it was built
# with) but that say nothing of what a question is about: "onto my laptop", "besides it", "nobody", "actually".
_FUNCTION = frozenset(
    """onto upon within without via across toward towards among amongst beside besides behind beyond around
    anyone anybody someone somebody something anything everything nothing nobody everyone everybody
    actually really maybe perhaps quite rather already still even ever soon instead""".split()
)


_NEGATED = re.compile(r"\b[A-Za-z]+n['\u2019]t\b")
CLIPPED_MIN = 4  # a clipped form keeps at least this many letters ("auth", "repo", "config")
CLIPPED_BY = 3  # ... and drops at least this many ("auth" of "authorization"; not "rust" of "rusty")


_WORDISH = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CAMEL_PART = re.compile(r"[A-Z]?[a-z]+")
INNER_WORDS_CACHED = 4096  # chunks whose identifiers' words are kept (``inner_words``)


@lru_cache(maxsize=INNER_WORDS_CACHED)
def inner_words(text: str) -> frozenset[str]:
    """The words inside the camel-case identifiers of ``text``, lower-cased: ``showSearchResult`` holds "show",
    "search" and "result", ``HttpClient`` "http" and "client". ``terms`` keeps such an identifier whole (one
    lower-cased word), so a book that writes "show" only in code reads as never using it; its vocabulary
    (``vocabulary.BookWords``) reads these too."""
    found: set[str] = set()
    for token in _WORDISH.findall(text):
        if token.islower() or token.isupper() or not any(c.isupper() for c in token[1:]):
            continue  # a word, an acronym or a capitalised word: no inner capital to split at
        found.update(part.lower() for part in _CAMEL_PART.findall(token) if len(part) > 2)
    return frozenset(found)


def clipped(term: str, vocabulary: Iterable[str]) -> bool:
    """Whether ``term`` is a clipped form of a word in ``vocabulary`` ("auth" for "authorization", "config" for
    "configuration", "repo" for "repository"): a reader's short form of a word the book spells out. Only a word
    rare in English is read so (``specific``): "tour" is not short for "tournament"."""
    if len(term) < CLIPPED_MIN or not term.isalpha() or not specific(term):
        return False
    return any(len(word) >= len(term) + CLIPPED_BY and word.startswith(term) for word in vocabulary)


def specific(term: str) -> bool:
    """Whether a lower-case word is rare enough in English that a book answering about it must use it: under
    ``rarity.RARE_BELOW`` in wordfreq's list ("strace", "conda", "quadcopter"; not "gait" or "yolk"), or, without
    the list, by its word pieces."""
    rare = rarity.rare(term, _english_forms(term))
    if rare is not None:
        return rare
    pieces = _pieces(term)
    return len(pieces) >= SPECIFIC_PIECES or (len(pieces) == 2 and len(pieces[0]) <= FRAGMENT_CHARS)


def specificity(term: str) -> float:
    """How strongly a term the book never uses says that a question is about something else: 1.0 for an
    identifier or a word rare in English (``telling``), falling linearly with the word's Zipf frequency from
    ``rarity.RARE_BELOW`` to 0.0 at ``rarity.EVERYDAY_AT``. "pasta" (3.9) says much, "wall" (5.0) or "put" (5.7)
    little: a reader's everyday words are how they ask, not what about. Without the list, ``telling`` decides."""
    if telling(term):
        return 1.0
    value = rarity.zipf(term, _english_forms(term))
    if value is None:
        return 1.0
    span = rarity.EVERYDAY_AT - rarity.RARE_BELOW
    return max(0.0, min(1.0, (rarity.EVERYDAY_AT - value) / span))


def _english_forms(term: str) -> list[str]:
    """The forms a word's frequency in English is read by: its own (``forms``) and those of the word a prefixed one
    is made from (``_unprefixed``)."""
    return [*forms(term), *(form for base in _unprefixed(term) for form in forms(base))]


def _unprefixed(term: str) -> list[str]:
    """The word a prefixed one is made from ("overexposed" -> "exposed", "misconfigured" -> "configured"): an
    English derivative of a common word is no more specific than the word (wordfreq's small list lacks most of
    them). Only for the rarity of a word: a book that uses "exposed" does not use "overexposed"."""
    return [term[len(prefix) :] for prefix in _PREFIXES if term.startswith(prefix) and len(term) - len(prefix) >= 4]


def telling(term: str) -> bool:
    """Whether a term the book never uses tells that the book does not answer the question: an identifier
    ("ros2_control", "rclpy.spin", "esp32") or a word rare in English (``specific``); a compound of common
    words ("back-to-back", "step-by-step") is a paraphrase, unless one of its parts is rare ("urdf-based")."""
    parts = term.split("-")
    if not all(part.isalpha() for part in parts):
        return True
    return any(specific(part) for part in parts if part)


# A question's distinct terms read by the keyword search, the names and specific-terms rules and the rerank: a
# question of 2,000 words costs what one of this many does (issue 34). Readers' questions hold 3-15.
MAX_QUERY_TERMS = 32


def forms(term: str) -> list[str]:
    """A lower-case word and the bases its inflection may come from ("queried" -> "query", "overwriting" ->
    "overwrite", "running" -> "run"), the word a derived one is made from ("viewable" -> "view", "breakage" ->
    "break": a book that uses the word answers about its derivative, and a derivative of a common word is no
    specific term), and a name written without its separators ("socket.io" -> "socketio",
    "ros2-control" -> "ros2control"): a book that writes one of them uses the word."""
    found = [term]
    for suffix, base in _DERIVATIONS:
        stem = term[: -len(suffix)]
        if term.endswith(suffix) and len(stem) >= 4:
            found.append(stem + base)
    joined = _JOINERS.sub("", term)
    if joined != term and len(joined) >= 3:
        found.append(joined)
    for suffix, base in _INFLECTIONS:
        stem = term[: -len(suffix)]
        if term.endswith(suffix) and len(stem) >= 3:
            found.append(stem + base)
            if not base and len(stem) >= 4 and stem[-1] == stem[-2] and stem[-1] not in "aeiouls":
                found.append(stem[:-1])  # a doubled consonant: "running" -> "run"
    return list(dict.fromkeys(found))


_DERIVATIONS = (
    ("able", ""), ("able", "e"), ("ible", ""), ("ible", "e"), ("age", ""), ("age", "e"), ("ment", ""), ("ness", ""),
    ("less", ""), ("ful", ""), ("ly", ""),
)  # fmt: skip
_JOINERS = re.compile(r"[._/+\-]")
# English derivational prefixes of three letters and more (two-letter ones, "re" "un" "de" "co", make too many
# accidental words of names: "redis", "unity", "debian", "conda").
_PREFIXES = (
    "counter", "super", "inter", "under", "multi", "over", "anti", "semi", "out", "pre", "mis", "non", "dis", "sub",
)  # fmt: skip
_INFLECTIONS = (("ing", ""), ("ing", "e"), ("ied", "y"), ("ed", ""), ("ed", "e"), ("ies", "y"), ("es", ""), ("er", ""))


def bounded(found: Sequence[str]) -> list[str]:
    """The first ``MAX_QUERY_TERMS`` distinct terms of ``found``, in order."""
    return list(dict.fromkeys(found))[:MAX_QUERY_TERMS]


@lru_cache(maxsize=65536)
def _pieces(term: str) -> tuple[str, ...]:
    tokenizer = _wordpiece()
    if tokenizer is None:  # no local model installed: length stands in for rarity
        return (term,) * (1 + len(term) // 8)
    return tuple(tokenizer.encode(term, add_special_tokens=False).tokens) or (term,)


def _wordpiece() -> Any:
    try:
        from textbook_chat.core.tokens import wordpiece_tokenizer

        return wordpiece_tokenizer()  # the process's one copy (9 MB each), shared with counting and the embedder
    except Exception:  # noqa: BLE001 -- no local model installed: length stands in for rarity
        return None


# "the scan operator", "the chmod command": a word a question names by the kind of thing it is in code.
_KIND_NAMED = re.compile(
    r"\bthe\s+([A-Za-z][A-Za-z0-9_]*)\s+(?:operator|function|method|command|package|library|plugin|hook|flag|"
    r"decorator|directive|keyword)s?\b",
    re.I,
)


def names(text: str) -> list[str]:
    """The terms of what a question names: identifiers (``ros2_control``, ``ESP32``, ``MoveIt``), capitalised
    words after the first (``Tesla``, ``Cartographer``) and a word named by its kind ("the scan operator", "the
    chmod command"). A book that never mentions one cannot answer about it.

    A question with no lower-case letter (caps lock) says nothing by its capitals: only digits, dots and
    underscores make a name there."""
    found: list[str] = []
    for match in _named(text.translate(_HYPHENS)):
        parts = terms(match.group())
        if parts[0] not in found:
            found.append(parts[0])  # the whole identifier comes first; its parts are ordinary words
            if len(found) == MAX_QUERY_TERMS:
                break
    return found


def options(text: str) -> list[str]:
    """The terms of the long command-line options ``text`` writes (``--audit-policy-file``, ``--dry-run``): names a
    book that documents them writes whole, so their parts being its words says nothing (``vocabulary.BookWords``)."""
    written = (terms(match.group(1)) for match in _OPTION.finditer(text.translate(_HYPHENS)))
    return [found[0] for found in written if found]


def _named(text: str) -> Iterator[re.Match[str]]:
    """The words of ``text`` that name something (``names``), in order."""
    cased = any(c.islower() for c in text)
    kinds = {match.start(1) for match in _KIND_NAMED.finditer(text) if match.group(1).lower() not in _ASKING}
    flags = {match.start(1) for match in _OPTION.finditer(text)}
    for position, match in enumerate(_NAME.finditer(text)):
        token = match.group()
        identifier = any(c.isdigit() or c in "_." for c in token) or (cased and any(c.isupper() for c in token[1:]))
        identifier = identifier or match.start() in kinds  # "the scan operator": a word named by its kind
        identifier = identifier or _tool_shaped(token) or match.start() in flags  # "--dry-run": an option
        capitalised = cased and position > 0 and token[0].isupper() and not _starts_sentence(text, match.start())
        if not (identifier or capitalised) or token.lower() in _STOPWORDS or token == "I":
            continue
        if all(c.isdigit() or c in "._" for c in token):
            continue  # a bare number ("case 17", "2022", "3.10") is a quantity, not a thing the book must name
        if terms(token):
            yield match


def _tool_shaped(token: str) -> bool:
    """A hyphenated word with a part rare in English ("kube-hunter", "kube-bench"): a tool's or a package's name,
    not a compound of common words ("step-by-step", "cherry-pick"), whatever its case."""
    parts = token.lower().split("-")
    return len(parts) > 1 and any(len(part) >= 3 and part.isalpha() and specific(part) for part in parts)


_OPENERS = " \t\"'(“‘*_-+>#"  # what may stand between a sentence's or a line's start and its first word


def compound_names(text: str) -> list[str]:
    """What a question names in two or more words ("Microsoft Teams", "Google Meet", "Zoom Video SDK"): runs of
    name words (``names``), capitalised or holding a digit, with only spaces between, each as its lower-case words
    joined by single spaces; at most ``MAX_QUERY_TERMS``."""
    text = text.translate(_HYPHENS)
    runs: list[list[str]] = []
    end = -1
    for match in _named(text):
        token = match.group()
        if not (token[0].isupper() or any(c.isdigit() for c in token)):
            continue
        between = text[end : match.start()] if end >= 0 else ""
        if runs and between and not between.strip():
            runs[-1].append(token.lower())
        else:
            runs.append([token.lower()])
        end = match.end()
    return bounded([" ".join(run) for run in runs if len(run) >= 2])


def _starts_sentence(text: str, start: int) -> bool:
    """Whether a word opens a sentence ("… AI? Thanks!") or a line's list item or quotation ("- Set gravity",
    "“Setup”" in an answer a follow-up reads), where capitals are grammar, not a name."""
    before = text[max(0, start - 64) : start].rstrip(_OPENERS)  # a bounded look back: linear in the question
    return not before or before[-1] in ".!?:;\n"


def document_vector(text: str) -> Sparse:
    """BM25-style saturated term frequencies with length normalisation (IDF comes from Qdrant)."""
    return _vector(_bm25(terms(text)))


def query_vector(text: str) -> Sparse:
    return _vector(dict.fromkeys(bounded(terms(text)), 1.0))


def query_vector_of(weights: dict[str, float]) -> Sparse:
    """A keyword query whose terms weigh unequally (a follow-up's own words and the earlier subject's)."""
    return _vector(weights)


class KeywordIndex:
    """BM25 over a fixed list of documents, in memory: postings per term as numpy arrays."""

    def __init__(self, documents: Sequence[str]) -> None:
        postings: dict[str, tuple[list[int], list[float]]] = {}
        for number, text in enumerate(documents):
            for term, weight in _bm25(terms(text)).items():
                docs, weights = postings.setdefault(term, ([], []))
                docs.append(number)
                weights.append(round(weight, _DIGITS))  # as stored in Qdrant (``_vector``), so near-ties break alike
        self.size = len(documents)
        self._postings: dict[str, tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]] = {}
        for term, (docs, weights) in postings.items():
            idf = math.log(1 + (self.size - len(docs) + 0.5) / (len(docs) + 0.5))
            self._postings[term] = (np.array(docs, dtype=np.int32), np.array(weights, dtype=np.float64) * idf)

    def __contains__(self, term: object) -> bool:
        return term in self._postings

    def scores(self, query_terms: Sequence[str]) -> npt.NDArray[np.float64]:
        """BM25 score of every document for these terms (0 where none occurs)."""
        result = np.zeros(self.size, dtype=np.float64)
        for term in dict.fromkeys(query_terms):
            posting = self._postings.get(term)
            if posting is not None:
                result[posting[0]] += posting[1]
        return result


def _bm25(document_terms: Sequence[str]) -> dict[str, float]:
    counts = Counter(document_terms)
    length = sum(counts.values()) or 1
    norm = _K1 * (1 - _B + _B * length / _AVERAGE_TERMS)
    return {term: tf * (_K1 + 1) / (tf + norm) for term, tf in counts.items()}


def _vector(weights: dict[str, float]) -> Sparse:
    by_index: dict[int, float] = {}
    for term, weight in weights.items():
        index = term_index(term)
        by_index[index] = by_index.get(index, 0.0) + weight
    ordered = sorted(by_index.items())
    return Sparse(tuple(i for i, _ in ordered), tuple(round(v, _DIGITS) for _, v in ordered))


@lru_cache(maxsize=65536)
def term_index(term: str) -> int:
    """A stable 32-bit id for a term (never Python's per-process ``hash``)."""
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "big")


@lru_cache(maxsize=65536)  # a book's words repeat: most are stemmed once
def _stem(word: str) -> str:
    # Plural folding only: enough for "topics"/"topic", "policies"/"policy", without mangling identifiers.
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word
