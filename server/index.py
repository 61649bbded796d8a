"""The Qdrant collection: its schema (named dense + sparse vectors), writes, hybrid queries, the module list.

Embedded mode (``QDRANT_PATH``) when ``QDRANT_URL`` is unset; one process may open a path at a time.
The embedder that built the collection is kept in the collection's metadata, so querying with another
one fails clearly (``IndexMismatch``) instead of returning nonsense.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from server.errors import IndexMismatch, RetrievalUnavailable
from server.settings import Settings
from server.sparse import Sparse

log = logging.getLogger(__name__)

DENSE = "dense"
SPARSE = "sparse"
_PAYLOAD_INDEXES = ("module", "chapter", "file_path", "content_hash")
_SCROLL_FIELDS = ["file_path", "content_hash", "chunk_index"]
_UPSERT_BATCH = 256


class IndexLocked(RuntimeError):
    """Another process holds the embedded index; the message tells the operator what to do."""


@dataclass(frozen=True)
class IndexedPoint:
    id: str
    file_path: str
    content_hash: str
    chunk_index: int


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


def open_client(settings: Settings) -> AsyncQdrantClient:
    if settings.qdrant_url:
        return AsyncQdrantClient(
            url=settings.qdrant_url,
            api_key=settings.qdrant_api_key.reveal() if settings.qdrant_api_key else None,
            timeout=max(1, round(settings.qdrant_timeout_s)),
            check_compatibility=False,  # the check is a network call at construction time
        )
    settings.qdrant_path.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return AsyncQdrantClient(path=str(settings.qdrant_path))
        except RuntimeError as exc:
            if "already accessed" not in str(exc):
                raise
        # The refused opener leaves its lock file open; collect it here, where its ResourceWarning is ignored.
        gc.collect()
    raise IndexLocked(
        f"the embedded index at {settings.qdrant_path} is in use by another process (a running server?). "
        "Stop it first, let the server ingest at start-up (serve --book PATH), or use a Qdrant server "
        "(QDRANT_URL) for concurrent access."
    )


class VectorIndex:
    def __init__(self, client: AsyncQdrantClient, *, collection: str, timeout_s: float, server_mode: bool) -> None:
        self.client = client
        self.collection = collection
        self._timeout_s = timeout_s
        self._server_mode = server_mode
        self._modules: list[ModuleInfo] | None = None
        self._expected: tuple[str, str, int] | None = None
        self._verified = False
        self.generation = 0  # bumped on every write: in-process copies of the index (retrieval.py) watch it

    @classmethod
    def from_settings(cls, settings: Settings) -> VectorIndex:
        return cls(
            open_client(settings),
            collection=settings.qdrant_collection,
            timeout_s=settings.qdrant_timeout_s,
            server_mode=settings.qdrant_url is not None,
        )

    async def close(self) -> None:
        await self.client.close()

    def expect_embedder(self, *, embedder: str, model: str, dim: int) -> None:
        """Before the first query, check the collection was built by this embedder (else ``IndexMismatch``)."""
        self._expected = (embedder, model, dim)
        self._verified = False

    # -- schema -----------------------------------------------------------------------------------

    async def ensure_collection(self, *, embedder: str, model: str, dim: int, recreate: bool = False) -> bool:
        """Create the collection for this embedder (True), or check the existing one matches it (False)."""
        exists = await self.client.collection_exists(self.collection)
        if exists and recreate:
            await self.client.delete_collection(self.collection)
            exists = False
        self._verified = False
        if exists:
            await self.check_embedder(embedder=embedder, model=model, dim=dim)
            return False
        await self.client.create_collection(
            self.collection,
            vectors_config={DENSE: models.VectorParams(size=dim, distance=models.Distance.COSINE)},
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            metadata={"embedder": embedder, "model": model, "dim": dim},
        )
        if self._server_mode:
            # Embedded mode ignores payload indexes and warns, so only a server gets them.
            for field in _PAYLOAD_INDEXES:
                await self.client.create_payload_index(self.collection, field, models.PayloadSchemaType.KEYWORD)
        self._modules = None
        self.generation += 1
        return True

    async def check_embedder(self, *, embedder: str, model: str, dim: int) -> None:
        info = await self._call(self.client.get_collection(self.collection))
        meta = info.config.metadata or {}
        built = (meta.get("embedder"), meta.get("model"), meta.get("dim"))
        if built != (embedder, model, dim):
            raise IndexMismatch(
                f"The index was built with {built[0]}:{built[1]} ({built[2]} dimensions) but this server embeds "
                f"with {embedder}:{model} ({dim} dimensions). Re-ingest the book: python -m server ingest PATH --force"
            )

    async def _verify(self) -> None:
        if self._expected is None or self._verified or not await self.exists():
            return
        embedder, model, dim = self._expected
        await self.check_embedder(embedder=embedder, model=model, dim=dim)
        self._verified = True

    async def exists(self) -> bool:
        return bool(await self._call(self.client.collection_exists(self.collection)))

    async def count(self) -> int:
        result = await self._call(self.client.count(self.collection, exact=True))
        return int(result.count)

    # -- writes -----------------------------------------------------------------------------------

    async def indexed_points(self) -> list[IndexedPoint]:
        """Every point's id, file and content hash (what incremental ingest compares against)."""
        points: list[IndexedPoint] = []
        offset: Any = None
        while True:
            records, offset = await self.client.scroll(
                self.collection, limit=1024, offset=offset, with_payload=_SCROLL_FIELDS, with_vectors=False
            )
            for record in records:
                payload = record.payload or {}
                points.append(
                    IndexedPoint(
                        id=str(record.id),
                        file_path=str(payload.get("file_path", "")),
                        content_hash=str(payload.get("content_hash", "")),
                        chunk_index=int(payload.get("chunk_index", -1)),
                    )
                )
            if offset is None:
                return points

    @property
    def embedded(self) -> bool:
        return not self._server_mode

    async def points(self) -> list[tuple[str, list[float], dict[str, Any]]]:
        """Every point's id, dense vector and payload (retrieval's in-process copy of an embedded index)."""
        await self._verify()
        points: list[tuple[str, list[float], dict[str, Any]]] = []
        offset: Any = None
        while True:
            records, offset = await self._call(
                self.client.scroll(self.collection, limit=1024, offset=offset, with_payload=True, with_vectors=[DENSE])
            )
            for record in records:
                vector = record.vector[DENSE] if isinstance(record.vector, dict) else record.vector
                points.append((str(record.id), list(vector or []), dict(record.payload or {})))
            if offset is None:
                return points

    async def upsert(
        self,
        ids: Sequence[str],
        dense: Sequence[Sequence[float]],
        sparse: Sequence[Sparse],
        payloads: Sequence[Mapping[str, Any]],
    ) -> None:
        for start in range(0, len(ids), _UPSERT_BATCH):
            end = start + _UPSERT_BATCH
            points = [
                models.PointStruct(
                    id=point_id,
                    vector={
                        DENSE: list(vector),
                        SPARSE: models.SparseVector(indices=list(sp.indices), values=list(sp.values)),
                    },
                    payload=dict(payload),
                )
                for point_id, vector, sp, payload in zip(
                    ids[start:end], dense[start:end], sparse[start:end], payloads[start:end], strict=True
                )
            ]
            await self.client.upsert(self.collection, points=points, wait=True)
        self._modules = None
        self.generation += 1

    async def set_payloads(self, updates: Mapping[str, Mapping[str, Any]]) -> None:
        for point_id, payload in updates.items():
            await self.client.set_payload(self.collection, payload=dict(payload), points=[point_id], wait=True)
        self._modules = None
        self.generation += 1

    async def delete(self, ids: Iterable[str]) -> None:
        id_list: list[models.ExtendedPointId] = list(ids)
        for start in range(0, len(id_list), 1024):
            await self.client.delete(
                self.collection, points_selector=models.PointIdsList(points=id_list[start : start + 1024]), wait=True
            )
        self._modules = None
        self.generation += 1

    # -- reads ------------------------------------------------------------------------------------

    async def hybrid_search(
        self,
        dense: Sequence[float],
        sparse: Sparse,
        *,
        limit: int,
        module: str | None = None,
        file_paths: Sequence[str] | None = None,
    ) -> list[Hit]:
        """Top ``limit`` by reciprocal-rank fusion of a dense and a keyword query, with dense cosines."""
        await self._verify()
        conditions: list[models.Condition] = []
        if module:
            conditions.append(models.FieldCondition(key="module", match=models.MatchValue(value=module)))
        if file_paths:
            conditions.append(models.FieldCondition(key="file_path", match=models.MatchAny(any=list(file_paths))))
        query_filter = models.Filter(must=conditions) if conditions else None
        prefetch = [models.Prefetch(query=list(dense), using=DENSE, limit=limit * 2, filter=query_filter)]
        if sparse.indices:
            prefetch.append(
                models.Prefetch(
                    query=models.SparseVector(indices=list(sparse.indices), values=list(sparse.values)),
                    using=SPARSE,
                    limit=limit * 2,
                    filter=query_filter,
                )
            )
        response = await self._call(
            self.client.query_points(
                self.collection,
                prefetch=prefetch,
                query=models.FusionQuery(fusion=models.Fusion.RRF),
                limit=limit,
                with_payload=True,
                with_vectors=[DENSE],
            )
        )
        hits = []
        for point in response.points:
            vector = point.vector[DENSE] if isinstance(point.vector, dict) else point.vector
            cosine = sum(a * b for a, b in zip(dense, vector, strict=True)) if vector else 0.0
            hits.append(
                Hit(id=str(point.id), fused_score=point.score, dense_score=float(cosine), payload=point.payload or {})
            )
        return hits

    async def mentions(self, sparse: Sparse) -> bool:
        """Whether any chunk holds one of these keyword terms (a sparse query only matches chunks that share a term)."""
        if not sparse.indices:
            return False
        await self._verify()
        response = await self._call(
            self.client.query_points(
                self.collection,
                query=models.SparseVector(indices=list(sparse.indices), values=list(sparse.values)),
                using=SPARSE,
                limit=1,
                with_payload=False,
            )
        )
        return bool(response.points)

    async def modules(self) -> list[ModuleInfo]:
        """Modules and chapters present in the index, in book order (cached until the next write)."""
        if self._modules is not None:
            return self._modules
        fields = ["module", "module_title", "module_position", "chapter", "chapter_id", "doc_url", "doc_position"]
        found: dict[str, dict[str, Any]] = {}
        offset: Any = None
        while True:
            records, offset = await self._call(
                self.client.scroll(self.collection, limit=2048, offset=offset, with_payload=fields, with_vectors=False)
            )
            for record in records:
                p = record.payload or {}
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
            if offset is None:
                break
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

    async def _call(self, awaitable: Any) -> Any:
        """Bound one Qdrant call by QDRANT_TIMEOUT_S and turn its failures into RetrievalUnavailable."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except (TimeoutError, UnexpectedResponse, ResponseHandlingException, ConnectionError, OSError) as exc:
            log.warning("qdrant unavailable: %s", type(exc).__name__)
            raise RetrievalUnavailable("The textbook search is temporarily unavailable.") from exc
