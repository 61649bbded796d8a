"""What a purge keeps of the sessions it deletes: their questions' numbers, not their words (``fold``), so the
report's trends outlive retention. Deleting the sessions is ``store``'s; reading what was kept is ``report.py``'s.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import psycopg

from textbook_chat.index.embeddings import Embedder
from textbook_chat.reports import questions as asked
from textbook_chat.reports import topics
from textbook_chat.reports.questions import Question


async def fold(
    conn: psycopg.AsyncConnection[Any], embedder: Embedder, session_ids: Sequence[uuid.UUID]
) -> tuple[int, int]:
    """Keep the numbers of these sessions' questions, not their words, before the sessions are deleted.

    Daily totals per module go to ``question_days``; gap questions are grouped into topics, each matched
    to a topic kept by an earlier purge (by centre) or kept as a new one (its label and centre, no text),
    and counted per day in ``gap_topic_days``. Runs inside the caller's transaction. Returns
    (questions, gap questions) folded.
    """
    if not session_ids:
        return 0, 0
    first, last = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)  # all their questions
    questions = await asked.read(conn, first, last, retained=last, sessions=session_ids)
    totals: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions)
    gap_totals: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions if q.reasons)
    selections: Counter[tuple[date, str]] = Counter((q.day, q.module) for q in questions if q.selection)
    gaps = [q for q in questions if q.reasons]
    if totals:
        async with conn.cursor() as cur:
            await cur.executemany(
                """
                INSERT INTO question_days (day, module, questions, gaps, selection) VALUES (%s, %s, %s, %s, %s)
                ON CONFLICT (day, module) DO UPDATE SET questions = question_days.questions + EXCLUDED.questions,
                    gaps = question_days.gaps + EXCLUDED.gaps, selection = question_days.selection + EXCLUDED.selection
                """,
                [(d, m, n, gap_totals[(d, m)], selections[(d, m)]) for (d, m), n in totals.items()],
            )
    if gaps:
        await _fold_topics(conn, embedder, gaps)
    return len(questions), len(gaps)


async def _fold_topics(conn: psycopg.AsyncConnection[Any], embedder: Embedder, gaps: list[Question]) -> None:
    words = [q.text for q in gaps]
    # Not cached: the rows they would be cached for are about to go.
    vectors = await asked.vectors_for(conn, embedder, [q.id for q in gaps], words, cache=False)
    grouping = topics.group(vectors)
    model = asked.embedder_key(embedder)
    async with conn.cursor() as cur:
        await cur.execute("SELECT id, centroid FROM gap_topics WHERE model = %s ORDER BY created_at, id", (model,))
        known = [(tid, np.frombuffer(bytes(c), dtype=np.float32)) for tid, c in await cur.fetchall()]
    matches = topics.assign(np.stack(grouping.centroids), [c for _, c in known]) if known else []
    names = topics.labels(words, grouping.labels, grouping.count)
    topic_ids: list[uuid.UUID] = []
    for topic_no, centre in enumerate(grouping.centroids):
        if known and matches[topic_no] >= 0:
            topic_ids.append(known[matches[topic_no]][0])
            continue
        topic_ids.append(uuid.uuid4())
        async with conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO gap_topics (id, model, label, centroid) VALUES (%s, %s, %s, %s)",
                (topic_ids[-1], model, names[topic_no], centre.tobytes()),
            )
    counts: Counter[tuple[uuid.UUID, date]] = Counter(
        (topic_ids[topic_no], gaps[i].day) for i, topic_no in enumerate(grouping.labels) if topic_no >= 0
    )
    async with conn.cursor() as cur:
        await cur.executemany(
            """
            INSERT INTO gap_topic_days (topic_id, day, questions) VALUES (%s, %s, %s)
            ON CONFLICT (topic_id, day) DO UPDATE SET questions = gap_topic_days.questions + EXCLUDED.questions
            """,
            [(tid, day, n) for (tid, day), n in counts.items()],
        )
