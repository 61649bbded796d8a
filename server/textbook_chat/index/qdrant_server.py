"""A collection on a Qdrant server, through qdrant-client (and, in tests only, its local mode as a stand-in).

Imported only with ``QDRANT_URL`` set (``index.open_backend``): qdrant-client costs ~80 MB of memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from textbook_chat.core.settings import Settings
from textbook_chat.index.engine import DENSE, PAYLOAD_INDEXES, RRF_K, SPARSE, EngineError, HybridQuery, Scored
from textbook_chat.index.sparse import Sparse

T = TypeVar("T")
_SERVER_DEFAULT_RRF_K = 2  # Qdrant's RRF constant when none is given


def connect(settings: Settings) -> AsyncQdrantClient:
    return AsyncQdrantClient(
        url=settings.qdrant_url,
        api_key=settings.qdrant_api_key.reveal() if settings.qdrant_api_key else None,
        timeout=max(1, round(settings.qdrant_timeout_s)),
        check_compatibility=False,  # the check is a network call at construction time
    )


async def _engine(call: Awaitable[T]) -> T:
    try:
        return await call
    except (UnexpectedResponse, ResponseHandlingException) as exc:
        raise EngineError(f"qdrant: {type(exc).__name__}") from exc


class ServerCollection:
    """A collection on a Qdrant server, through qdrant-client (also its local mode, as a stand-in in tests)."""

    embedded = False
    upsert_batch = 256

    def __init__(self, client: AsyncQdrantClient, collection: str) -> None:
        self.client = client
        self.collection = collection

    async def close(self) -> None:
        await self.client.close()

    async def exists(self) -> bool:
        return bool(await _engine(self.client.collection_exists(self.collection)))

    async def create(self, dim: int, metadata: dict[str, Any]) -> None:
        await self.client.create_collection(
            self.collection,
            vectors_config={DENSE: models.VectorParams(size=dim, distance=models.Distance.COSINE)},
            sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            metadata=metadata,
        )
        if self.client.init_options.get("url"):  # a real server (local mode ignores payload indexes, and warns)
            for field in PAYLOAD_INDEXES:
                await self.client.create_payload_index(self.collection, field, models.PayloadSchemaType.KEYWORD)

    async def drop(self) -> None:
        await self.client.delete_collection(self.collection)

    async def read_metadata(self) -> dict[str, Any]:
        info = await _engine(self.client.get_collection(self.collection))
        return dict(info.config.metadata or {})

    async def write_metadata(self, metadata: dict[str, Any]) -> None:
        await self.client.update_collection(self.collection, metadata=metadata)

    async def count(self) -> int:
        return int((await _engine(self.client.count(self.collection, exact=True))).count)

    async def scroll(self, fields: list[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        offset: Any = None
        while True:
            records, offset = await _engine(
                self.client.scroll(self.collection, limit=1024, offset=offset, with_payload=fields, with_vectors=False)
            )
            for record in records:
                yield str(record.id), dict(record.payload or {})
            if offset is None:
                return

    async def upsert(self, points: list[tuple[str, Sequence[float], Sparse, Mapping[str, Any]]]) -> None:
        structs = [
            models.PointStruct(
                id=point_id,
                vector={
                    DENSE: list(vector),
                    SPARSE: models.SparseVector(indices=list(sp.indices), values=list(sp.values)),
                },
                payload=dict(payload),
            )
            for point_id, vector, sp, payload in points
        ]
        await self.client.upsert(self.collection, points=structs, wait=True)

    async def set_payload(self, point_id: str, payload: dict[str, Any]) -> None:
        await self.client.set_payload(self.collection, payload=payload, points=[point_id], wait=True)

    async def delete(self, ids: list[str]) -> None:
        selector = models.PointIdsList(points=list[models.ExtendedPointId](ids))
        await self.client.delete(self.collection, points_selector=selector, wait=True)

    async def hybrid(self, query: HybridQuery) -> list[Scored]:
        conditions: list[models.Condition] = [
            models.FieldCondition(
                key=key,
                match=models.MatchAny(any=value) if isinstance(value, list) else models.MatchValue(value=value),
            )
            for key, value in query.filters()
        ]
        query_filter = models.Filter(must=conditions) if conditions else None
        prefetch = [models.Prefetch(query=list(query.dense), using=DENSE, limit=query.prefetch, filter=query_filter)]
        if query.keyword:
            keyword = models.SparseVector(indices=list(query.sparse.indices), values=list(query.sparse.values))
            prefetch.append(models.Prefetch(query=keyword, using=SPARSE, limit=query.prefetch, filter=query_filter))
        response = await _engine(
            self.client.query_points(
                self.collection,
                prefetch=prefetch,
                query=_fusion(),
                limit=query.limit,
                with_payload=True,
                with_vectors=[DENSE],
            )
        )
        scored: list[Scored] = []
        for point in response.points:
            vector = point.vector[DENSE] if isinstance(point.vector, dict) else point.vector
            scored.append((str(point.id), point.score, dict(point.payload or {}), list(vector) if vector else None))  # type: ignore[arg-type]
        return scored

    async def mentions(self, sparse: Sparse) -> bool:
        response = await _engine(
            self.client.query_points(
                self.collection,
                query=models.SparseVector(indices=list(sparse.indices), values=list(sparse.values)),
                using=SPARSE,
                limit=1,
                with_payload=False,
            )
        )
        return bool(response.points)


def _fusion() -> models.FusionQuery | models.RrfQuery:
    """RRF with the policy's ``RRF_K``: a server before 1.16 (the compose file's 1.15) takes no k, and its default
    is the policy's, so the plain fusion is sent then; any other k is sent as a parameter."""
    if RRF_K == _SERVER_DEFAULT_RRF_K:
        return models.FusionQuery(fusion=models.Fusion.RRF)
    return models.RrfQuery(rrf=models.Rrf(k=RRF_K))
