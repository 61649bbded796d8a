"""A question's readings and their search: the question as asked and, when it takes context (``context.py``),
in context (the standalone form's vector with the question's blended with the earlier questions', the subject's
terms at half weight); each searched and the two ranked lists fused (``context.fuse``). A first question is read,
and searched, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol

from textbook_chat.index.embeddings import Embedder
from textbook_chat.search import context
from textbook_chat.search.context import Asked
from textbook_chat.search.rerank import Candidate, Query

Reading = tuple[list[float], Query]  # a dense vector and the keyword query it is searched with


class Search(Protocol):
    """The retriever's one search and rerank (``Retriever._search``)."""

    def __call__(self, dense: Sequence[float], query: Query, module: str | None) -> Awaitable[list[Candidate]]: ...


class FollowUps:
    """The readings of a question, and their fused search."""

    def __init__(self, embedder: Embedder, search: Search, *, keep: int) -> None:
        self.embedder = embedder
        self._search = search
        self._keep = keep  # the sources retrieval keeps: the reading alone's best is always among them

    async def readings(self, asked: Asked) -> list[Reading]:
        """The question as asked, and in context when it takes context: the vector of the standalone form (focused
        on what the earlier sections' headings call its subject, ``Asked.focused``) with the question's blended
        with the earlier questions' (``context.blend``; theirs cached since they were asked, the two new ones
        embedded side by side) and the standalone form's terms, the subject's weighing less (``context.keywords``).
        A fallback's first pass (``Asked.fallback``) is the question alone."""
        if not asked.in_context or asked.standalone is None:
            return [(await self.embedder.embed_query(asked.question), Query(asked.question))]
        texts = (asked.question, asked.focused or asked.standalone, *asked.prior)
        alone, standalone, *prior = await asyncio.gather(*(self.embedder.embed_query(t) for t in texts))
        in_context = Query(asked.standalone, context.keywords(asked))
        return [(alone, Query(asked.question)), (context.blend(alone, prior, standalone), in_context)]

    async def search(self, readings: Sequence[Reading], asked: Asked, module: str | None) -> list[Candidate]:
        """Each reading searched (``Retriever._search``), and fused (``context.fuse``) when there are two."""
        ranked = [await self._search(dense, query, module) for dense, query in readings]
        return ranked[0] if len(ranked) == 1 else context.fuse(ranked[0], ranked[1], asked, keep=self._keep)
