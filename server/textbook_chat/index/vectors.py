"""The book's index: its schema (named dense + sparse vectors), writes, hybrid queries, the module list.

Two engines, one data format: a Qdrant server (``QDRANT_URL``, through qdrant-client) or, by default, an
embedded Qdrant Edge shard under ``QDRANT_PATH`` (``index/edge.py``; one process opens it at a time).
The embedder that built the index is kept in its metadata (the collection's on a server, a side file
with Edge), so querying with another one fails clearly (``IndexMismatch``) instead of returning nonsense.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from textbook_chat.core.errors import IndexMismatch, RetrievalUnavailable
from textbook_chat.core.settings import Settings
from textbook_chat.index.engine import Backend, EngineError, HybridQuery
from textbook_chat.index.sparse import Sparse

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_SCROLL_FIELDS = ["file_path", "content_hash", "chunk_index", "url", "doc_url"]
_TIE_MARGIN = 8  # extra hits fetched so exact ties at the cut are broken by cosine and id, not by the engine


@dataclass(frozen=True)
class IndexedPoint:
    id: str
    file_path: str
    content_hash: str
    chunk_index: int
    url: str = ""  # where citations link: rewritten when only the book's address changed
    doc_url: str = ""


@dataclass(frozen=True)
class Hit:
    id: str
    fused_score: float  # rank-fusion score: orders hits, not comparable across queries
    dense_score: float  # cosine similarity with the query: what confidence is computed from
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Chapter:
    id: str
    title: str
    url: str
    position: float


@dataclass(frozen=True)
class ModuleInfo:
    id: str
    title: str
    url: str
    position: float
    chapters: tuple[Chapter, ...]


def open_backend(settings: Settings) -> Backend:
    """Qdrant server mode with ``QDRANT_URL``; otherwise the embedded Qdrant Edge shard under ``QDRANT_PATH``."""
    # Each engine's library is imported only when it is used: qdrant-client alone costs ~80 MB of memory.
    if settings.qdrant_url:
        from textbook_chat.index.qdrant_server import ServerCollection, connect

        return ServerCollection(connect(settings), settings.qdrant_collection)
    from textbook_chat.index.edge import EdgeCollection

    return EdgeCollection.open(settings.qdrant_path, settings.qdrant_collection)


class VectorIndex:
    """One interface over both engines: a Qdrant server (qdrant-client) or the embedded Qdrant Edge shard.

    Both answer the same hybrid query (dense and keyword prefetches fused by RRF, k=2) on the same data
    format; results are ordered the same way every time (exact ties broken by cosine, then id).
    """

    def __init__(self, backend: Backend, *, timeout_s: float) -> None:
        self.backend = backend
        self._timeout_s = timeout_s
        self._modules: list[ModuleInfo] | None = None
        self._title: tuple[str | None] | None = None  # the book's title once read (``book_title``)
        self._expected: tuple[str, str, int] | None = None
        self._verified = False
        self.generation = 0  # bumped on every write: caches of the index's contents watch it

    @classmethod
    def from_settings(cls, settings: Settings) -> VectorIndex:
        return cls(open_backend(settings), timeout_s=settings.qdrant_timeout_s)

    @property
    def embedded(self) -> bool:
        return self.backend.embedded

    async def close(self) -> None:
        await self.backend.close()

    def expect_embedder(self, *, embedder: str, model: str, dim: int) -> None:
        """Before the first query, check the collection was built by this embedder (else ``IndexMismatch``)."""
        self._expected = (embedder, model, dim)
        self._verified = False

    # -- metadata ---------------------------------------------------------------------------------

    async def read_metadata(self) -> dict[str, Any]:
        """What is kept with the index: the embedder that built it, and whatever ``write_metadata`` added."""
        return dict(await self._call(self.backend.read_metadata()))

    async def write_metadata(self, **values: Any) -> None:
        """Add or replace metadata keys (JSON values), kept with the index across restarts."""
        current = await self.read_metadata()
        await self._call(self.backend.write_metadata({**current, **values}))
        self._title = None

    async def book_title(self) -> str | None:
        """The book's name as its last ingest read it (``ingest.run``); None for an index ingested before that was
        kept. Read once, then again after a write of the metadata."""
        if self._title is None:
            title = (await self.read_metadata()).get("book_title")
            self._title = (title if isinstance(title, str) and title else None,)
        return self._title[0]

    # -- schema -----------------------------------------------------------------------------------

    async def ensure_collection(self, *, embedder: str, model: str, dim: int, recreate: bool = False) -> bool:
        """Create the collection for this embedder (True), or check the existing one matches it (False)."""
        exists = await self.backend.exists()
        if exists and recreate:
            await self.backend.drop()
            exists = False
        self._verified = False
        if exists:
            await self.check_embedder(embedder=embedder, model=model, dim=dim)
            return False
        await self.backend.create(dim, {"embedder": embedder, "model": model, "dim": dim})
        self._modules = self._title = None
        self.generation += 1
        return True

    async def check_embedder(self, *, embedder: str, model: str, dim: int) -> None:
        meta = await self.read_metadata()
        built = (meta.get("embedder"), meta.get("model"), meta.get("dim"))
        if built != (embedder, model, dim):
            raise IndexMismatch(
                f"The index was built with {built[0]}:{built[1]} ({built[2]} dimensions) but this server embeds "
                f"with {embedder}:{model} ({dim} dimensions). "
                "Re-ingest the book: python -m textbook_chat ingest PATH --force"
            )

    async def _verify(self) -> None:
        if self._expected is None or self._verified or not await self.exists():
            return
        embedder, model, dim = self._expected
        await self.check_embedder(embedder=embedder, model=model, dim=dim)
        self._verified = True

    async def exists(self) -> bool:
        return bool(await self._call(self.backend.exists()))

    async def count(self) -> int:
        return int(await self._call(self.backend.count()))

    # -- writes -----------------------------------------------------------------------------------

    async def indexed_points(self) -> list[IndexedPoint]:
        """Every point's id, file and content hash (what incremental ingest compares against)."""
        return [
            IndexedPoint(
                id=point_id,
                file_path=str(payload.get("file_path", "")),
                content_hash=str(payload.get("content_hash", "")),
                chunk_index=int(payload.get("chunk_index", -1)),
                url=str(payload.get("url", "")),
                doc_url=str(payload.get("doc_url", "")),
            )
            async for point_id, payload in self._scroll(_SCROLL_FIELDS)
        ]

    async def upsert(
        self,
        ids: Sequence[str],
        dense: Sequence[Sequence[float]],
        sparse: Sequence[Sparse],
        payloads: Sequence[Mapping[str, Any]],
    ) -> None:
        """Write points in batches, letting the event loop run between them (live streams keep flowing)."""
        for start in range(0, len(ids), self.backend.upsert_batch):
            end = start + self.backend.upsert_batch
            await self.backend.upsert(
                list(zip(ids[start:end], dense[start:end], sparse[start:end], payloads[start:end], strict=True))
            )
            await asyncio.sleep(0)
        self._modules = None
        self.generation += 1

    async def set_payloads(self, updates: Mapping[str, Mapping[str, Any]]) -> None:
        for point_id, payload in updates.items():
            await self.backend.set_payload(point_id, dict(payload))
        self._modules = None
        self.generation += 1

    async def delete(self, ids: Iterable[str]) -> None:
        id_list = list(ids)
        for start in range(0, len(id_list), 1024):
            await self.backend.delete(id_list[start : start + 1024])
        self._modules = None
        self.generation += 1

    # -- reads ----------------------------------------------------------------------------------

    async def hybrid_search(
        self,
        dense: Sequence[float],
        sparse: Sparse,
        *,
        limit: int,
        module: str | None = None,
        file_paths: Sequence[str] | None = None,
    ) -> list[Hit]:
        """Top ``limit`` by reciprocal-rank fusion of a dense and a keyword query, with dense cosines.

        A few more than ``limit`` are fetched and sorted by (fused score, cosine, id): engines return exact
        ties in any order, and the same question must get the same sources every time.
        """
        await self._verify()
        scored = await self._call(
            self.backend.hybrid(
                HybridQuery(dense, sparse, limit=limit + _TIE_MARGIN, module=module, file_paths=file_paths)
            )
        )
        cosines = _cosines(dense, [vector for *_, vector in scored])
        hits = [
            Hit(id=point_id, fused_score=float(fused), dense_score=cosine, payload=payload)
            for (point_id, fused, payload, _), cosine in zip(scored, cosines, strict=True)
        ]
        hits.sort(key=lambda h: (-round(h.fused_score, 9), -round(h.dense_score, 9), h.id))
        return hits[:limit]

    async def mentions(self, sparse: Sparse) -> bool:
        """Whether any chunk holds one of these keyword terms (a sparse query only matches chunks that share a term)."""
        if not sparse.indices:
            return False
        await self._verify()
        return bool(await self._call(self.backend.mentions(sparse)))

    async def section_headings(self) -> dict[str, str]:
        """Every section's URL (with its anchor) and its own heading, the last of its heading path."""
        headings: dict[str, str] = {}
        async for _, p in self._scroll(["url", "heading_path"]):
            path, url = p.get("heading_path") or (), p.get("url")
            if isinstance(url, str) and path and str(path[-1]).strip():
                headings.setdefault(url, str(path[-1]).strip())
        return headings

    async def section_openings(self) -> dict[str, tuple[str, str]]:
        """Every section's URL, its own heading and the text of its first chunk (the calibration's in-scope probes)."""
        first: dict[str, tuple[int, str, str]] = {}
        async for _, p in self._scroll(["url", "heading_path", "chunk_index", "text"]):
            path, url, position = p.get("heading_path") or (), p.get("url"), int(p.get("chunk_index", 0) or 0)
            if isinstance(url, str) and path and str(path[-1]).strip():
                if url not in first or position < first[url][0]:
                    first[url] = (position, str(path[-1]).strip(), str(p.get("text", "")))
        return {url: (heading, text) for url, (_, heading, text) in first.items()}

    async def modules(self) -> list[ModuleInfo]:
        """Modules and chapters present in the index, in book order (cached until the next write)."""
        if self._modules is not None:
            return self._modules
        fields = ["module", "module_title", "module_position", "chapter", "chapter_id", "doc_url", "doc_position"]
        found: dict[str, dict[str, Any]] = {}
        async for _, p in self._scroll(fields):
            module = found.setdefault(
                str(p.get("module", "")),
                {"title": p.get("module_title", ""), "position": p.get("module_position", 0.0), "chapters": {}},
            )
            module["chapters"].setdefault(
                str(p.get("chapter_id", "")),
                Chapter(
                    id=str(p.get("chapter_id", "")),
                    title=str(p.get("chapter", "")),
                    url=str(p.get("doc_url", "")),
                    position=float(p.get("doc_position", 0.0)),
                ),
            )
        result = []
        for module_id, info in found.items():
            chapters = sorted(info["chapters"].values(), key=lambda c: (c.position, c.id))
            result.append(
                ModuleInfo(
                    id=module_id,
                    title=str(info["title"]),
                    url=chapters[0].url if chapters else "",
                    position=float(info["position"]),
                    chapters=tuple(chapters),
                )
            )
        self._modules = sorted(result, key=lambda m: (m.position, m.id))
        return self._modules

    async def _scroll(self, fields: list[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every point's payload ``fields``, page by page, with an engine failure as RetrievalUnavailable."""
        try:
            async for n, item in _enumerate(self.backend.scroll(fields)):
                if n % 256 == 255:
                    await asyncio.sleep(0)  # an embedded engine answers without suspending: let streams run
                yield item
        except (ConnectionError, OSError, EngineError) as exc:
            log.warning("qdrant unavailable: %s", type(exc).__name__)
            raise RetrievalUnavailable("The textbook search is temporarily unavailable.") from exc

    async def _call(self, awaitable: Any) -> Any:
        """Bound one engine call by QDRANT_TIMEOUT_S and turn its failures into RetrievalUnavailable."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except (TimeoutError, ConnectionError, OSError, EngineError) as exc:
            log.warning("qdrant unavailable: %s", type(exc).__name__)
            raise RetrievalUnavailable("The textbook search is temporarily unavailable.") from exc


async def _enumerate(items: AsyncIterator[_T]) -> AsyncIterator[tuple[int, _T]]:
    n = 0
    async for item in items:
        yield n, item
        n += 1


def _cosines(dense: Sequence[float], vectors: Sequence[Sequence[float] | None]) -> list[float]:
    """Each vector's dot product with ``dense`` (both unit length: their cosine), 0.0 for a hit without one.

    One matrix product in float64 (a Python loop over 18 x 384 products took 0.3 ms of each question)."""
    rows = [i for i, vector in enumerate(vectors) if vector]
    found = [0.0] * len(vectors)
    if rows:
        matrix = np.array([vectors[i] for i in rows], dtype=np.float64)
        for i, value in zip(rows, (matrix @ np.asarray(dense, dtype=np.float64)).tolist(), strict=True):
            found[i] = value
    return found
