"""The sources an answer cited (``source_citations``): written with the answer, read with a session's messages, and
what the session's next question reads of them, the cited sections' titles and headings (``SECTIONS``).
``Store`` runs these statements (sessions.py) under its pool and breaker."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from textbook_chat.store.rows import Citation

# One answer's cited sections, in citation order, as JSON pairs [page title, heading path]: a scalar subquery on the
# answer row ``m`` (null for an answer that cited none); ``TurnRow.sections``.
SECTIONS = """(
    SELECT json_agg(json_build_array(coalesce(c.title, ''), coalesce(c.heading_path, '{}')) ORDER BY c.position)
    FROM source_citations c WHERE c.message_id = m.id
)"""

OF_MESSAGES = """
    SELECT message_id, position, chunk_id, module, chapter, title, url, relevance_score, excerpt,
        coalesce(heading_path, '{}') AS heading_path
    FROM source_citations WHERE message_id = ANY(%s) ORDER BY message_id, position
"""


async def insert(conn: psycopg.AsyncConnection[Any], citations: Sequence[tuple[uuid.UUID, Citation]]) -> None:
    """Every (message id, citation) pair in one statement, whatever the number of messages.

    A message that is not there (its conversation deleted while it was answered, or a late question that
    was not its asker's to write) gets none, instead of failing the whole batch on the foreign key."""
    if not citations:
        return
    async with conn.cursor() as cur:
        await cur.executemany(
            """
            INSERT INTO source_citations
                (id, message_id, position, chunk_id, module, chapter, title, url, relevance_score, excerpt,
                 heading_path)
            SELECT v.* FROM (VALUES (%s::uuid, %s::uuid, %s::int, %s, %s, %s, %s, %s, %s::real, %s, %s::text[]))
                AS v(id, message_id, position, chunk_id, module, chapter, title, url, relevance_score, excerpt,
                     heading_path)
            WHERE EXISTS (SELECT 1 FROM chat_messages m WHERE m.id = v.message_id)
            ON CONFLICT (message_id, position) DO NOTHING
            """,
            [
                (
                    uuid.uuid4(),
                    message_id,
                    c.position,
                    c.chunk_id,
                    c.module,
                    c.chapter,
                    c.title,
                    c.url,
                    c.relevance_score,
                    c.excerpt,
                    list(c.heading_path),
                )
                for message_id, c in citations
            ],
        )


def sections(value: Sequence[Sequence[Any]] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``SECTIONS`` as read: (page title, heading path) of each cited section."""
    return tuple((str(title), tuple(str(h) for h in path)) for title, path in value or ())


def by_message(rows: Sequence[dict[str, Any]]) -> dict[uuid.UUID, list[Citation]]:
    """The rows of ``OF_MESSAGES``, each message's citations in order."""
    grouped: dict[uuid.UUID, list[Citation]] = {}
    for row in rows:
        fields = dict(row)
        grouped.setdefault(fields.pop("message_id"), []).append(read(fields))
    return grouped


def read(fields: Mapping[str, Any]) -> Citation:
    """A citation from its fields as a row or a spilled answer's JSON holds them (a list, or nothing, for its
    heading path)."""
    return Citation(**{**fields, "heading_path": tuple(fields.get("heading_path") or ())})
