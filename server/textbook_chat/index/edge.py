"""The embedded index: a Qdrant Edge shard (``qdrant-edge-py``, pinned), Qdrant's own engine in this process.

Same engine and data format as a Qdrant server, so the embedded and server paths run the same hybrid
query. Layout under ``QDRANT_PATH``: ``edge/<collection>/`` (the shard, with its write-ahead log, never
disabled: it is what keeps a killed ingest consistent and a second opener out) and
``edge/<collection>.json`` (what Edge has no place for: the embedder that built it, calibration; written
atomically). Edge holds the GIL during calls and raises bare ``Exception``s: calls here are short (a
query is ~0.5 ms, writes come in batches of ``upsert_batch``) and every failure becomes ``EngineError``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import qdrant_edge as edge

from textbook_chat.core import memory, private
from textbook_chat.index.engine import DENSE, RRF_K, SPARSE, EngineError, HybridQuery, IndexLocked, Scored
from textbook_chat.index.sparse import Sparse

log = logging.getLogger(__name__)

_SCROLL_PAGE = 1024
_LOCKED = (
    "the embedded index at {root} is in use by another process (a running server?). Stop it first, let the "
    "server ingest at start-up (serve --book PATH), or use a Qdrant server (QDRANT_URL) for concurrent access."
)


class EdgeCollection:
    embedded = True
    upsert_batch = 64  # ~8 ms of engine time per batch: the event loop runs between batches

    def __init__(self, root: Path, collection: str) -> None:
        self.root = root
        self.path = root / "edge" / collection
        self.meta_path = root / "edge" / f"{collection}.json"
        self._shard: edge.EdgeShard | None = None
        self._lock_file: IO[str] | None = None

    @classmethod
    def open(cls, root: Path, collection: str) -> EdgeCollection:
        """Open the shard if there is one (``IndexLocked`` when another process has it, shard or not yet)."""
        found = cls(root, collection)
        found._lock()
        if found.path.is_dir() and any(found.path.iterdir()):
            try:
                found._shard = found._load()
            except BaseException:
                assert found._lock_file is not None
                found._lock_file.close()
                raise
        elif found.legacy:
            log.warning(
                "the embedded index at %s was made by an older version (qdrant-client local mode); rebuild it: "
                "python -m textbook_chat ingest BOOK --force, or serve --book BOOK (which rebuilds it)",
                root,
            )
        return found

    def _lock(self) -> None:
        """One opener per index, before a shard exists too (two ingests at once), as Edge's WAL lock does after."""
        private.own_dir(self.path.parent)
        self._lock_file = (self.path.parent / f"{self.path.name}.lock").open("a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise IndexLocked(_LOCKED.format(root=self.root)) from None

    @property
    def legacy(self) -> bool:
        """Files of the embedded format before Edge (qdrant-client's local mode) are here."""
        return (self.root / "meta.json").exists() or (self.root / "collection").is_dir()

    def _load(self) -> edge.EdgeShard:
        # With the config, Edge checks it against the shard's and keeps it: a shard made before
        # ``max_search_threads`` was set takes it here. Without a dimension (no metadata yet), as stored.
        dim = self._stored_dim()
        try:
            try:
                shard = edge.EdgeShard.load(str(self.path), _config(dim) if dim else None)
            except Exception as exc:
                if dim is None or "WouldBlock" in str(exc):
                    raise
                log.warning("the embedded index at %s keeps its stored settings: %s", self.path, exc)
                shard = edge.EdgeShard.load(str(self.path))
        except Exception as exc:
            if "WouldBlock" in str(exc):
                raise IndexLocked(_LOCKED.format(root=self.root)) from None
            raise EngineError(f"the embedded index at {self.path} cannot be opened: {exc}") from exc
        # Loading reads the whole write-ahead log (every write since the shard was made: 8 MB for the shared
        # book's 2,379 chunks), and its pages stay resident though only the log's tail is written again.
        memory.release_file_pages(self.path / "wal")
        return shard

    def _stored_dim(self) -> int | None:
        try:
            dim = json.loads(self.meta_path.read_text(encoding="utf-8")).get("dim")
        except (OSError, ValueError, AttributeError):
            return None
        return dim if isinstance(dim, int) and dim > 0 else None

    def _open_shard(self) -> edge.EdgeShard:
        if self._shard is None:
            raise EngineError(f"no embedded index at {self.path}: run python -m textbook_chat ingest BOOK")
        return self._shard

    async def close(self) -> None:
        await self._close_shard()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the lock
            self._lock_file = None

    async def _close_shard(self) -> None:
        if self._shard is not None:
            shard, self._shard = self._shard, None
            try:
                shard.flush()
            finally:
                shard.close()

    async def exists(self) -> bool:
        return self._shard is not None and self.meta_path.exists()

    async def create(self, dim: int, metadata: dict[str, Any]) -> None:
        config = _config(dim)
        await self.drop()
        private.own_dir(self.path.parent)
        try:
            self._shard = edge.EdgeShard.create(str(self.path), config)
        except Exception as exc:
            raise EngineError(f"cannot create the embedded index at {self.path}: {exc}") from exc
        await self.write_metadata(metadata)
        if self.legacy:
            for old in (self.root / "meta.json", self.root / "collection", self.root / ".lock"):
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    old.unlink(missing_ok=True)
            log.info("removed the older embedded index's files from %s", self.root)

    async def drop(self) -> None:
        await self._close_shard()
        self.meta_path.unlink(missing_ok=True)
        if self.path.exists():
            shutil.rmtree(self.path)

    async def read_metadata(self) -> dict[str, Any]:
        try:
            data = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise EngineError(f"{self.meta_path} is not valid JSON: {exc}") from exc
        return dict(data) if isinstance(data, dict) else {}

    async def write_metadata(self, metadata: dict[str, Any]) -> None:
        private.own_dir(self.meta_path.parent)
        tmp = self.meta_path.with_suffix(".json.tmp")
        with private.open_private(tmp) as out:
            json.dump(metadata, out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(self.meta_path)

    async def count(self) -> int:
        return int(self._run(lambda shard: shard.count(edge.CountRequest(exact=True))))

    async def scroll(self, fields: list[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        offset: Any = None
        while True:
            request = edge.ScrollRequest(offset=offset, limit=_SCROLL_PAGE, with_payload=fields, with_vector=False)
            records, offset = self._run(lambda shard, request=request: shard.scroll(request))
            for record in records:
                yield str(record.id), dict(record.payload or {})
            if offset is None:
                return

    async def upsert(self, points: list[tuple[str, Sequence[float], Sparse, Mapping[str, Any]]]) -> None:
        batch = [
            edge.Point(
                id=point_id,
                vector={
                    DENSE: list(vector),
                    SPARSE: edge.SparseVector(indices=list(sp.indices), values=list(sp.values)),
                },
                payload=dict(payload),
            )
            for point_id, vector, sp, payload in points
        ]
        self._run(lambda shard: shard.update(edge.UpdateOperation.upsert_points(batch)))

    async def set_payload(self, point_id: str, payload: dict[str, Any]) -> None:
        self._run(lambda shard: shard.update(edge.UpdateOperation.set_payload([point_id], payload)))

    async def delete(self, ids: list[str]) -> None:
        self._run(lambda shard: shard.update(edge.UpdateOperation.delete_points(list[Any](ids))))

    async def hybrid(self, query: HybridQuery) -> list[Scored]:
        conditions: list[Any] = [
            edge.FieldCondition(
                key=key, match=edge.MatchAny(value) if isinstance(value, list) else edge.MatchValue(value)
            )
            for key, value in query.filters()
        ]
        query_filter = edge.Filter(must=conditions) if conditions else None
        lists = [edge.Query.Nearest(list(query.dense), using=DENSE)]
        if query.keyword:
            keyword = edge.SparseVector(indices=list(query.sparse.indices), values=list(query.sparse.values))
            lists.append(edge.Query.Nearest(keyword, using=SPARSE))
        request = edge.QueryRequest(
            limit=query.limit,
            prefetches=[edge.Prefetch(limit=query.prefetch, query=q, filter=query_filter) for q in lists],
            query=edge.Fusion.Rrf(k=RRF_K),  # type: ignore[arg-type]
            with_payload=True,
            with_vector=[DENSE],
        )
        points = self._run(lambda shard: shard.query(request))
        scored: list[Scored] = []
        for point in points:
            vectors = point.vector  # each read of a point's field converts it from Rust afresh: read it once
            vector = vectors.get(DENSE) if isinstance(vectors, dict) else None
            scored.append((str(point.id), float(point.score), point.payload or {}, vector or None))
        return scored

    async def mentions(self, sparse: Sparse) -> bool:
        keyword = edge.SparseVector(indices=list(sparse.indices), values=list(sparse.values))
        request = edge.QueryRequest(limit=1, query=edge.Query.Nearest(keyword, using=SPARSE), with_payload=False)
        return bool(self._run(lambda shard: shard.query(request)))

    def _run(self, call: Any) -> Any:
        shard = self._open_shard()
        try:
            return call(shard)
        except Exception as exc:
            raise EngineError(f"embedded index: {exc}") from exc


def _config(dim: int) -> edge.EdgeConfig:
    return edge.EdgeConfig(
        # Cold: memory-mapped and read on first use, not pre-warmed. The vectors are a few MB (every query
        # reads them all), but a pre-warmed segment reads its whole preallocated 32 MB chunk into RSS.
        vectors={DENSE: edge.EdgeVectorParams(size=dim, distance=edge.Distance.Cosine, memory=edge.Memory.Cold)},
        sparse_vectors={SPARSE: edge.EdgeSparseVectorParams(modifier=edge.Modifier.Idf)},
        # One search thread, not Edge's default of eight: a query holds the GIL and takes under a millisecond
        # over one or two segments, so more threads only wait. The shared book's shard, random queries: p50 0.40 ms
        # against 0.57, 7 threads and ~2.4 MB of RSS fewer (docs/results/2026-11.md, seventh session).
        max_search_threads=1,
    )
