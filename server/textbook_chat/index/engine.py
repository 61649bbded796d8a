"""What ``VectorIndex`` asks of a storage engine, shared by both engines and the index that picks one.

The vector names, the payload fields indexed for filtering, one scored hit's shape, the errors an engine
raises, the hybrid query's policy (``HybridQuery``) and the ``Backend`` protocol that Qdrant Edge (edge.py) and a
Qdrant server (qdrant_server.py) both implement, each translating the same policy into its own API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from textbook_chat.index.sparse import Sparse

DENSE = "dense"
SPARSE = "sparse"
PAYLOAD_INDEXES = ("module", "chapter", "file_path", "content_hash")


class IndexLocked(RuntimeError):
    """Another process holds the embedded index; the message tells the operator what to do."""


# -- what VectorIndex asks of an engine ------------------------------------------------------------------------

Scored = tuple[str, float, dict[str, Any], list[float] | None]  # id, fused score, payload, dense vector

# Each of the dense and the keyword query reads this many times the hits asked for, before fusion.
PREFETCH_FACTOR = 2
# Reciprocal-rank fusion: a point at 0-based position p of a list scores 1 / (RRF_K + 1 + p), summed over lists.
# Qdrant's own default (a Qdrant server before 1.16 takes no other), so both engines rank a book alike.
RRF_K = 2


@dataclass(frozen=True)
class HybridQuery:
    """One hybrid search, as both engines run it: the chunks of ``module`` (if given) and of ``file_paths`` (any
    of them, if given); the best ``prefetch`` by dense cosine and, when the question has keyword terms, the best
    ``prefetch`` by BM25; the two lists fused by RRF with ``RRF_K``; the top ``limit`` with payload and dense vector."""

    dense: Sequence[float]
    sparse: Sparse
    limit: int
    module: str | None = None
    file_paths: Sequence[str] | None = None

    @property
    def prefetch(self) -> int:
        return self.limit * PREFETCH_FACTOR

    @property
    def keyword(self) -> bool:
        """Whether there is a keyword list to fuse (a question of stop words alone has none)."""
        return bool(self.sparse.indices)

    def filters(self) -> list[tuple[str, str | list[str]]]:
        """The payload conditions, all required: (field, the value) or (field, any of these values)."""
        found: list[tuple[str, str | list[str]]] = []
        if self.module:
            found.append(("module", self.module))
        if self.file_paths:
            found.append(("file_path", list(self.file_paths)))
        return found


class EngineError(RuntimeError):
    """A failure inside an engine: Qdrant Edge's bare ``Exception``s, qdrant-client's response errors."""


class Backend(Protocol):
    embedded: bool
    upsert_batch: int

    async def close(self) -> None: ...
    async def exists(self) -> bool: ...
    async def create(self, dim: int, metadata: dict[str, Any]) -> None: ...
    async def drop(self) -> None: ...
    async def read_metadata(self) -> dict[str, Any]: ...
    async def write_metadata(self, metadata: dict[str, Any]) -> None: ...
    async def count(self) -> int: ...
    def scroll(self, fields: list[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...
    async def upsert(self, points: list[tuple[str, Sequence[float], Sparse, Mapping[str, Any]]]) -> None: ...
    async def set_payload(self, point_id: str, payload: dict[str, Any]) -> None: ...
    async def delete(self, ids: list[str]) -> None: ...
    async def hybrid(self, query: HybridQuery) -> list[Scored]: ...
    async def mentions(self, sparse: Sparse) -> bool: ...
