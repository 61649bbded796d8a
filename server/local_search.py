"""In-process hybrid search over a copy of an embedded collection: the same Prefetch + RRF query Qdrant runs.

Embedded Qdrant's ``query_points`` costs 100-400 ms per hybrid question here; this copy answers it in ~2 ms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from server import sparse
from server.index import Hit

# Qdrant's RRF exactly: a point at 0-based position p of a prefetch list scores 1 / (RRF_K + p), summed over the
# lists, with Qdrant's default k of 2 (qdrant_client/hybrid/fusion.py mirrors the server). The compose file's Qdrant
# (1.15) cannot take another k, so the copy follows Qdrant rather than the literature's 60: both paths then pick the
# same candidates (tests/test_retrieval.py compares them).
RRF_K = 2


class Snapshot:
    """An in-process copy of an embedded collection: unit vectors, payloads, module of each, keyword index."""

    def __init__(self, points: Sequence[tuple[str, Sequence[float], Mapping[str, Any]]], generation: int) -> None:
        self.generation = generation
        self.ids = [point_id for point_id, _, _ in points]
        self.position = {point_id: i for i, point_id in enumerate(self.ids)}
        self.payloads = [payload for _, _, payload in points]
        matrix = np.array([vector for _, vector, _ in points], dtype=np.float32).reshape(len(points), -1)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        self.vectors = matrix / np.where(norms == 0, 1.0, norms)
        self.modules = np.array([str(p.get("module", "")) for p in self.payloads], dtype=object)
        texts = [searchable(p) for p in self.payloads]
        self.keywords = sparse.KeywordIndex(texts)
        self.terms = [frozenset(sparse.terms(t)) for t in texts]

    def search(self, dense: Sequence[float], query_terms: Sequence[str], limit: int, module: str | None) -> list[Hit]:
        """Reciprocal-rank fusion of the best ``2 * limit`` by cosine and by BM25, as Qdrant's Prefetch + RRF does."""
        if not self.ids:
            return []
        query = np.asarray(dense, dtype=np.float32)
        query = query / (float(np.linalg.norm(query)) or 1.0)
        # einsum, not ``@``: a BLAS matrix-vector product wakes OpenBLAS's thread pool, whose spinning threads
        # then slow the next ONNX embedding ~2x on 2 cores; einsum's own loop costs ~0.2 ms for 2k chunks.
        cosines = np.einsum("ij,j->i", self.vectors, query)
        keyword = self.keywords.scores(query_terms)
        allowed = self.modules == module if module else np.ones(len(self.ids), dtype=bool)
        fused: dict[int, float] = {}
        for scores, positive_only in ((cosines, False), (keyword, True)):
            masked = np.where(allowed & (scores > 0 if positive_only else True), scores, -np.inf)
            best = _top(masked, limit * 2)
            for position, i in enumerate(best):
                fused[i] = fused.get(i, 0.0) + 1.0 / (RRF_K + position)
        order = sorted(fused, key=lambda i: fused[i], reverse=True)[:limit]
        return [
            Hit(id=self.ids[i], fused_score=fused[i], dense_score=float(cosines[i]), payload=self.payloads[i])
            for i in order
        ]


def _top(scores: npt.NDArray[np.floating[Any]], k: int) -> list[int]:
    finite = int(np.isfinite(scores).sum())
    k = min(k, finite)
    if k == 0:
        return []
    best = np.argpartition(-scores, k - 1)[:k]
    return [int(i) for i in best[np.argsort(-scores[best], kind="stable")]]


def searchable(payload: Mapping[str, Any]) -> str:
    """What the keyword side reads: the breadcrumb (module, headings; a crumb equal to the one before it once) and
    the text, as ingestion builds the sparse vectors Qdrant searches, so both paths count the same terms."""
    crumbs: list[str] = []
    for crumb in (str(payload.get("module_title", "")), *(str(h) for h in payload.get("heading_path", ()))):
        if crumb and (not crumbs or crumbs[-1] != crumb):
            crumbs.append(crumb)
    return " ".join(crumbs) + "\n" + str(payload.get("text", ""))
