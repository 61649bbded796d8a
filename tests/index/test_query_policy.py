"""One query policy, two engines: the same ``HybridQuery`` (filters, a prefetch of twice the limit, dense and keyword
lists fused by RRF with one k) ranks the same points with the same fused scores on Qdrant Edge and on the Qdrant
server's API (qdrant-client's local mode standing in for a server)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import AsyncQdrantClient

from textbook_chat.index.edge import EdgeCollection
from textbook_chat.index.engine import PREFETCH_FACTOR, RRF_K, Backend, HybridQuery
from textbook_chat.index.qdrant_server import ServerCollection
from textbook_chat.index.sparse import Sparse

DIM = 8
MODULES = ("m1", "m2")


def _points() -> list[tuple[str, Sequence[float], Sparse, Mapping[str, Any]]]:
    rng = np.random.default_rng(35)
    points: list[tuple[str, Sequence[float], Sparse, Mapping[str, Any]]] = []
    for i in range(40):
        vector = rng.standard_normal(DIM)
        terms = sorted({int(t) for t in rng.integers(0, 30, size=4)})
        payload = {"module": MODULES[i % 2], "file_path": f"doc-{i % 5}.md", "text": f"chunk {i}"}
        sparse = Sparse(tuple(terms), tuple(float(v) for v in rng.uniform(0.5, 2.0, size=len(terms))))
        points.append((str(uuid.UUID(int=i + 1)), list(vector / np.linalg.norm(vector)), sparse, payload))
    return points


async def _ranked(backend: Backend, query: HybridQuery) -> list[tuple[str, float]]:
    return [(point_id, round(score, 6)) for point_id, score, _, _ in await backend.hybrid(query)]


async def test_both_engines_rank_a_hybrid_query_alike_with_and_without_filters(tmp_path: Path) -> None:
    edge = EdgeCollection.open(tmp_path / "edge", "textbook")
    server = ServerCollection(AsyncQdrantClient(path=str(tmp_path / "server")), "textbook")
    try:
        for backend in (edge, server):
            await backend.create(DIM, {})
            await backend.upsert(_points())
        rng = np.random.default_rng(7)
        queries = [
            HybridQuery(list(rng.standard_normal(DIM)), Sparse((1, 5, 9), (1.0, 1.0, 1.0)), limit=6),
            HybridQuery(list(rng.standard_normal(DIM)), Sparse((2, 3), (1.0, 0.5)), limit=4, module="m2"),
            HybridQuery(list(rng.standard_normal(DIM)), Sparse((), ()), limit=5, file_paths=["doc-1.md", "doc-3.md"]),
        ]
        for query in queries:
            on_edge, on_server = dict(await _ranked(edge, query)), dict(await _ranked(server, query))
            # The same fused scores in the same order; points tied on a score may come in any order (VectorIndex
            # breaks ties by cosine and id), so at the cut a tie may keep a different one of them.
            assert sorted(on_edge.values()) == sorted(on_server.values()) and len(on_edge) == query.limit
            assert {i: on_edge[i] for i in on_edge.keys() & on_server.keys()} == {
                i: on_server[i] for i in on_edge.keys() & on_server.keys()
            }
            assert len(on_edge.keys() & on_server.keys()) >= query.limit - 2
        # The filters hold on both: module m2 is every odd point, doc-1/doc-3 the points i % 5 in (1, 3).
        kept = {str(uuid.UUID(int=i + 1)) for i in range(40) if i % 5 in (1, 3)}
        assert {point_id for point_id, _ in await _ranked(edge, queries[2])} <= kept
    finally:
        await edge.close()
        await server.close()


def test_the_policy_reads_twice_the_limit_and_fuses_with_qdrants_own_k() -> None:
    query = HybridQuery([0.0] * DIM, Sparse((), ()), limit=18, module="m1", file_paths=("a.md",))
    assert (query.prefetch, PREFETCH_FACTOR, RRF_K) == (36, 2, 2)
    assert query.filters() == [("module", "m1"), ("file_path", ["a.md"])]
    assert not query.keyword  # a question of stop words alone: the dense list only
