"""Group questions into topics by meaning, and name each topic by its most telling words.

The vectors are the configured embedder's (unit length, so cosine distance is ``1 - dot``). Grouping is
scikit-learn's agglomerative clustering with average linkage and a distance threshold: the number of
topics comes from the questions, not from a setting, and a lone odd question stays a topic of one.
Agglomerative clustering holds a pairwise distance matrix, so at most ``MAX_CLUSTERED`` distinct
questions (the most recent) are clustered; the rest join the topic whose centre they are closest to, or
none when nothing is close (they are still counted, as "other questions").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.cluster import AgglomerativeClustering
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, TfidfVectorizer

# Average cosine distance under which questions share a topic. With MiniLM, questions on one subject
# (bread baking, football, mortgages) average 0.5-0.65 apart, unrelated subjects 0.92-1.0, and the
# questions of one whole textbook 0.79: 0.8 keeps subjects apart and lets close book questions meet.
DISTANCE_THRESHOLD = 0.8
MAX_CLUSTERED = 3000
LABEL_WORDS = 3
# Words that say a question is a question, not what it is about.
_QUESTION_WORDS = frozenset(
    "what how why when where which who whom whose does do did can could would should is are was were explain "
    "tell describe define mean means meaning difference between use used using work works example examples "
    "book chapter section module please give know need want get make way good best better worth sure "
    "question questions quick sorry topic hi hello thanks thank anyone".split()
)
STOP_WORDS = sorted(ENGLISH_STOP_WORDS | _QUESTION_WORDS)

Vector = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Grouping:
    """``labels[i]`` is the topic of question ``i`` (``-1``: near no topic); topics are numbered largest first."""

    labels: list[int]
    centroids: list[Vector]

    @property
    def count(self) -> int:
        return len(self.centroids)


def group(vectors: Vector, *, threshold: float = DISTANCE_THRESHOLD, max_clustered: int = MAX_CLUSTERED) -> Grouping:
    """Topics for ``vectors`` (rows, unit length), the last ``max_clustered`` rows clustered, the rest assigned."""
    n = vectors.shape[0]
    if n == 0:
        return Grouping([], [])
    if n == 1:
        return Grouping([0], [vectors[0]])
    start = max(0, n - max_clustered)
    clustered = vectors[start:]
    raw = AgglomerativeClustering(
        n_clusters=None, metric="cosine", linkage="average", distance_threshold=threshold
    ).fit_predict(clustered)
    labels = np.full(n, -1, dtype=np.int64)
    labels[start:] = raw
    centroids = _centroids(vectors, labels)
    if start:
        labels[:start] = _assign(vectors[:start], centroids, threshold)
    # Renumber largest first (ties: the topic seen most recently first), and recompute the centres.
    sizes = np.bincount(labels[labels >= 0], minlength=len(centroids))
    latest = np.zeros(len(centroids), dtype=np.int64)
    for i, label in enumerate(labels):
        if label >= 0:
            latest[label] = i
    order = sorted(range(len(centroids)), key=lambda t: (-sizes[t], -latest[t]))
    renumber = {old: new for new, old in enumerate(order)}
    final = [renumber[int(label)] if label >= 0 else -1 for label in labels]
    return Grouping(final, _centroids(vectors, np.asarray(final)))


def assign(vectors: Vector, centroids: Sequence[Vector], *, threshold: float = DISTANCE_THRESHOLD) -> list[int]:
    """The index of the closest centre within ``threshold`` for each row, or ``-1``."""
    if not len(centroids) or vectors.shape[0] == 0:
        return [-1] * vectors.shape[0]
    return [int(x) for x in _assign(vectors, list(centroids), threshold)]


def labels(texts: Sequence[str], topic_of: Sequence[int], count: int, *, words: int = LABEL_WORDS) -> list[str]:
    """For each topic ``0..count-1``, the words that tell its questions apart from the rest, joined with " · ".

    Every question is a document (TF-IDF fitted once over all of them); a term scores its mean weight over
    the topic's questions, so a word most of them use and the others do not comes first, and a word one
    question used does not.
    """
    vectorizer = TfidfVectorizer(
        stop_words=STOP_WORDS, token_pattern=r"(?u)\b[^\W\d_][\w-]+\b", sublinear_tf=True, ngram_range=(1, 2)
    )
    members: list[list[int]] = [[] for _ in range(count)]
    for i, topic in enumerate(topic_of):
        if 0 <= topic < count:
            members[topic].append(i)
    try:
        matrix = vectorizer.fit_transform(texts).tocsr()
    except ValueError:  # nothing but stop words
        return [_fallback_label([texts[i] for i in rows]) for rows in members]
    vocabulary = vectorizer.get_feature_names_out()
    return [
        _best_terms(np.asarray(matrix[rows].mean(axis=0)).ravel(), vocabulary, words)
        or _fallback_label([texts[i] for i in rows])
        for rows in members
    ]


def _best_terms(weights: NDArray[np.float64], vocabulary: NDArray[np.str_], words: int) -> str:
    chosen: list[str] = []
    for index in np.argsort(-weights, kind="stable")[: words * 4]:
        if weights[index] <= 0 or len(chosen) == words:
            break
        term = str(vocabulary[index])
        # A bigram is kept only when it says more than the words already chosen.
        if any(term in kept or kept in term for kept in chosen):
            continue
        chosen.append(term)
    return " · ".join(chosen)


def _fallback_label(texts: Sequence[str]) -> str:
    first = re.sub(r"\s+", " ", texts[0]).strip() if texts else ""
    return first[:40] or "(empty)"


def _centroids(vectors: Vector, labels: NDArray[np.int64]) -> list[Vector]:
    count = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 0
    centres: list[Vector] = []
    for topic in range(count):
        members = vectors[labels == topic]
        centre = members.mean(axis=0)
        norm = float(np.linalg.norm(centre))
        centres.append((centre / norm if norm else centre).astype(np.float32))
    return centres


def _assign(vectors: Vector, centroids: list[Vector], threshold: float) -> NDArray[np.int64]:
    similarity = vectors @ np.stack(centroids).T
    best = similarity.argmax(axis=1)
    close = 1.0 - similarity[np.arange(vectors.shape[0]), best] <= threshold
    return np.where(close, best, -1).astype(np.int64)
