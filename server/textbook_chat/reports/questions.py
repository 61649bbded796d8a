"""The questions the report and the purge-time fold read: one row per question with what became of its answer,
why it counts as a gap (if it does), and the configured embedder's vectors of the gap ones (cached in
``question_vectors``). Grouping them into topics is ``topics.py``'s; what is made of the groups is the callers'.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

import numpy as np
import psycopg

from textbook_chat.index.embeddings import Embedder
from textbook_chat.search import confidence

Reason = Literal["declined", "low", "rated_down"]
_EMBED_BATCH = 256

# One row per question in the period, with what became of its answer (the next message of its session).
_QUESTIONS_SQL = """
WITH pairs AS (
    SELECT m.id, m.session_id, m.role, m.created_at, m.mode, m.module_filter,
           lead(m.role) OVER w AS next_role, lead(m.model) OVER w AS model,
           lead(m.confidence) OVER w AS confidence, lead(m.feedback) OVER w AS feedback
    FROM chat_messages m
    WHERE m.created_at >= %(since)s AND m.created_at < %(until)s
      AND (%(sessions)s::uuid[] IS NULL OR m.session_id = ANY(%(sessions)s::uuid[]))
    WINDOW w AS (PARTITION BY m.session_id ORDER BY m.created_at, m.role DESC)
)
SELECT p.id, p.created_at, p.mode, p.module_filter,
       CASE WHEN p.next_role = 'assistant' THEN p.model END AS model,
       CASE WHEN p.next_role = 'assistant' THEN p.confidence END AS confidence,
       CASE WHEN p.next_role = 'assistant' THEN p.feedback END AS feedback,
       s.last_activity_at >= %(retained)s AS retained
FROM pairs p JOIN chat_sessions s ON s.id = p.session_id
WHERE p.role = 'user'
ORDER BY p.created_at
"""


@dataclass(slots=True)
class Question:
    id: uuid.UUID
    day: date
    module: str
    selection: bool
    level: str
    feedback: str | None
    retained: bool
    reasons: tuple[Reason, ...]
    text: str = ""


def gap_reasons(model: str | None, confidence_value: float | None, feedback: str | None) -> tuple[Reason, ...]:
    """Why a question counts as a gap: its answer was declined, had low confidence, or was rated down."""
    reasons: list[Reason] = []
    if model == "decline":
        reasons.append("declined")
    elif confidence_value is not None and confidence.level(confidence_value) == "low":
        reasons.append("low")
    if feedback == "down":
        reasons.append("rated_down")
    return tuple(reasons)


def answer_level(model: str | None, confidence_value: float | None) -> str:
    if model == "decline":
        return "declined"
    if confidence_value is None:
        return "unanswered"  # failed, interrupted, or still streaming
    return confidence.level(confidence_value)


async def read(
    conn: psycopg.AsyncConnection[Any],
    since: datetime,
    until: datetime,
    retained: datetime,
    *,
    sessions: Sequence[uuid.UUID] | None = None,
) -> list[Question]:
    """Every question asked in [since, until) (of ``sessions`` only, when given), the gap ones with their text."""
    rows: list[Question] = []
    params = {"since": since, "until": until, "retained": retained, "sessions": list(sessions) if sessions else None}
    async with conn.cursor() as cur:
        await cur.execute(_QUESTIONS_SQL, params)
        async for qid, created, mode, module, model, conf, feedback, keep in cur:
            rows.append(
                Question(
                    id=qid,
                    day=created.astimezone(UTC).date(),
                    module=module or "",
                    selection=mode == "selection",
                    level=answer_level(model, conf),
                    feedback=feedback,
                    retained=bool(keep),
                    reasons=gap_reasons(model, conf, feedback),
                )
            )
    gap_ids = [q.id for q in rows if q.reasons]
    if gap_ids:
        async with conn.cursor() as cur:
            # A follow-up is grouped under what it was about: its standalone form ("How do I install it?
            # (Gazebo)"), the question with the context its retrieval took, where it took any.
            await cur.execute(
                "SELECT id, COALESCE(standalone, content) FROM chat_messages WHERE id = ANY(%s)", (gap_ids,)
            )
            texts = dict(await cur.fetchall())
        for q in rows:
            if q.reasons:
                q.text = texts.get(q.id, "")
    return rows


async def vectors_for(
    conn: psycopg.AsyncConnection[Any],
    embedder: Embedder,
    ids: Sequence[uuid.UUID],
    texts: Sequence[str],
    *,
    cache: bool = True,
) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The embedder's vectors of these questions: cached ones read, the rest embedded (each text once) and cached.

    Writes go through the caller's transaction (the pool's connection block commits them).
    """
    if not ids:
        return np.zeros((0, 0), dtype=np.float32)
    model = embedder_key(embedder)
    async with conn.cursor() as cur:
        await cur.execute(
            "SELECT message_id, vector FROM question_vectors WHERE message_id = ANY(%s) AND model = %s",
            (list(ids), model),
        )
        cached = {mid: bytes(vec) for mid, vec in await cur.fetchall()}
    missing = [i for i, mid in enumerate(ids) if mid not in cached]
    distinct = list(dict.fromkeys(texts[i] for i in missing))
    fresh: dict[str, bytes] = {}
    for start in range(0, len(distinct), _EMBED_BATCH):
        batch = distinct[start : start + _EMBED_BATCH]
        for text, vector in zip(batch, await embedder.embed_documents(batch), strict=True):
            fresh[text] = np.asarray(vector, dtype=np.float32).tobytes()
    for i in missing:
        cached[ids[i]] = fresh[texts[i]]
    if missing and cache:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO question_vectors (message_id, model, vector) VALUES (%s, %s, %s) "
                "ON CONFLICT (message_id) DO UPDATE SET model = EXCLUDED.model, vector = EXCLUDED.vector",
                [(ids[i], model, cached[ids[i]]) for i in missing],
            )
    return np.stack([np.frombuffer(cached[mid], dtype=np.float32) for mid in ids])


def embedder_key(embedder: Embedder) -> str:
    return f"{embedder.name}:{getattr(embedder, 'model', '')}"
