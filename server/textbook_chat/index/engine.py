"""What ``VectorIndex`` asks of a storage engine, shared by both engines and the index that picks one.

The vector names, the payload fields indexed for filtering, one scored hit's shape, the errors an engine
raises, and the ``Backend`` protocol that Qdrant Edge (edge.py) and a Qdrant server (qdrant_server.py)
both implement. It is a module of its own so the engines need not import vectors.py, which imports them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from textbook_chat.index.sparse import Sparse

DENSE = "dense"
SPARSE = "sparse"
PAYLOAD_INDEXES = ("module", "chapter", "file_path", "content_hash")


class IndexLocked(RuntimeError):
    """Another process holds the embedded index; the message tells the operator what to do."""


# -- what VectorIndex asks of an engine ------------------------------------------------------------------------

Scored = tuple[str, float, dict[str, Any], list[float] | None]  # id, fused score, payload, dense vector


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
    async def hybrid(
        self,
        dense: Sequence[float],
        sparse: Sparse,
        *,
        limit: int,
        module: str | None,
        file_paths: Sequence[str] | None,
    ) -> list[Scored]: ...
    async def mentions(self, sparse: Sparse) -> bool: ...
