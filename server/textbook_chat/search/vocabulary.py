"""Which words the book uses: what a question names or asks that the book never mentions, and how much of it.

A word counts as the book's when the passages retrieved hold it (or one of its forms, or it spelled out where the
word is a clipping of it), else when the index holds it anywhere, else when the passages write it inside an
identifier (``showSearchResult``: ``sparse.inner_words``); confidence (``context.known``) and the second
opinion (``second_opinion.Evidence``) read what is not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet

from textbook_chat.index import sparse
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search.context import Asked
from textbook_chat.search.rerank import Candidate, Query


class BookWords:
    def __init__(self, index: VectorIndex) -> None:
        self.index = index

    async def unknown(self, query: Query, ranked: Sequence[Candidate], asked: Asked | None = None) -> tuple[str, ...]:
        """What the question names, and its informative terms, that the book never mentions (checked in the
        candidates, then the whole book); in context, its own content terms too (``context.known``)."""
        wanted = [*query.names, *(t for t in query.informative if t not in query.names)]
        if asked is not None and asked.in_context:
            wanted += [t for t in asked.own_terms if t not in wanted]
        seen = frozenset().union(*(c.terms for c in ranked))
        missing = [term for term in wanted if not await self.uses(term, seen, whole=term in query.options)]
        return tuple(_outside_identifiers(missing, (str(c.hit.payload.get("text", "")) for c in ranked)))

    async def absent_share(self, question: str, passages: Sequence[str]) -> float:
        """The share of the question's content words (``sparse.content``) that the book never uses, in any form
        (``passages``: the retrieved ones, read first)."""
        words = sparse.content(question)  # distinct, in order
        if not words:
            return 0.0
        seen = set().union(*(sparse.terms(passage) for passage in passages))
        missing = [word for word in words if not await self.uses(word, seen)]
        return len(_outside_identifiers(missing, passages)) / len(words)

    async def uses(self, term: str, seen: AbstractSet[str], *, whole: bool = False) -> bool:
        """Whether the book uses ``term``: in the retrieved passages (``seen``, their terms), in one of its forms
        or spelled out in full where ``term`` is a clipping of a word; else anywhere in the book. A hyphenated term
        is the book's where each of its parts is: the same compound written another way ("the ROS-TCP connector"
        in a book of "ROS-TCP-Connector" and "ROS TCP Connector"); a command-line option only whole (``whole``)."""
        if not seen.isdisjoint(sparse.forms(term)) or sparse.clipped(term, seen) or await self.mentioned(term):
            return True
        parts = [part for part in term.split("-") if part]
        if len(parts) < 2 or whole:
            return False
        for part in parts:  # one at a time: the first part the book lacks settles it, with no more lookups
            if not await self.uses(part, seen):
                return False
        return True

    async def mentioned(self, term: str) -> bool:
        """Whether the book uses ``term`` or one of its forms anywhere."""
        for form in sparse.forms(term):
            if await self.index.mentions(sparse.Sparse((sparse.term_index(form),), (1.0,))):
                return True
        return False


def unwritten_compounds(question: str, passages: Sequence[str], unknown: Iterable[str]) -> list[str]:
    """What the question names in several words ("Microsoft Teams", ``sparse.compound_names``) that the passages
    never write together (spaced, hyphenated, joined, in Markdown: ``_JOINED``), though the book uses each word: a
    book of "Microsoft Outlook" and "teams" says nothing of Microsoft Teams. Read in the retrieved passages only: a
    book that writes the name has it among them, the question's words being its keywords. A compound with a word
    the book never uses is left to the names rule (``unknown``)."""
    absent = set(unknown)
    found = []
    texts = [passage.lower() for passage in passages]
    for compound in sparse.compound_names(question):
        words = compound.split()
        if any(part in absent for word in words for part in sparse.terms(word)):
            continue
        written = re.compile(r"(?<![a-z0-9])" + _JOINED.join(map(re.escape, words)) + r"(?![a-z0-9])")
        if not any(written.search(text) for text in texts):
            found.append(compound)
    return found


_JOINED = r"[^a-z0-9]{0,3}"  # what may stand between a name's words: "Let's Encrypt", "**Microsoft** Teams", "Zoom-SDK"


def _outside_identifiers(missing: list[str], texts: Iterable[str]) -> list[str]:
    """The terms of ``missing`` that ``texts`` do not write inside an identifier either (``sparse.inner_words``:
    "show" in ``showSearchResult``); read only where some term is still missing after the passages and the index."""
    if not missing:
        return missing
    inner = frozenset().union(*(sparse.inner_words(text) for text in texts))
    return [term for term in missing if inner.isdisjoint(sparse.forms(term))]
