"""Postgres: sessions, messages and citations. All SQL of the service lives here and in citations.py.

The queries are ``Store``'s; the pool, time limits and circuit breaker they run under are ``Database``'s
(database.py), and the values they read and write are in rows.py.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from textbook_chat.core import metrics
from textbook_chat.core.modes import Mode
from textbook_chat.store import citations as cited
from textbook_chat.store.database import Database
from textbook_chat.store.rows import (
    Citation,
    Completion,
    Exchange,
    LateQuestion,
    MessageRow,
    NewSession,
    Rating,
    SessionRow,
    SessionSummary,
    SessionToCreate,
    TurnRow,
    hash_token,
)

log = logging.getLogger(__name__)

_PURGE_BATCH_TIMEOUT_S = 60.0  # a purge batch may legitimately take longer than an interactive query


class Store(Database):
    """Sessions, their messages and citations, feedback, token budgets, and purging old sessions."""

    # -- sessions ---------------------------------------------------------------------------------

    async def create_session(self, *, user_id: str | None = None, metadata: dict[str, Any] | None = None) -> NewSession:
        session = NewSession(id=uuid.uuid4(), token=secrets.token_urlsafe(32))
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO chat_sessions (id, user_id, token_hash, metadata) VALUES (%s, %s, %s, %s)",
                (session.id, user_id, hash_token(session.token), Jsonb(metadata or {})),
            )
        return session

    async def get_session(self, session_id: uuid.UUID) -> SessionRow | None:
        row = await self._fetchone(
            "SELECT id, user_id, created_at, last_activity_at, metadata FROM chat_sessions WHERE id = %s",
            (session_id,),
        )
        return SessionRow(**row) if row else None

    async def authorize_session(
        self, session_id: uuid.UUID, *, token: str | None, user_id: str | None
    ) -> SessionRow | None:
        """The session if ``token`` matches its hash or ``user_id`` owns it; otherwise None (callers answer 404)."""
        row = await self._fetchone(f"SELECT {_SESSION_COLUMNS} FROM chat_sessions s WHERE s.id = %s", (session_id,))
        return _owned(row, token=token, user_id=user_id)

    async def session_for_question(
        self, session_id: uuid.UUID, *, token: str | None, user_id: str | None, since: datetime, in_flight_tokens: int
    ) -> tuple[SessionRow | None, int]:
        """A later question's two checks in one round trip: the session as ``authorize_session`` gives it, and
        the tokens its answers used since ``since``. An answer still streaming (started in the last 15 minutes:
        older ones are orphans a worker left) counts as ``in_flight_tokens``, its usage not known yet."""
        row = await self._fetchone(
            f"""
            SELECT {_SESSION_COLUMNS}, (
                SELECT coalesce(sum(
                    CASE WHEN m.role = 'assistant' AND m.status = 'streaming'
                              AND m.created_at > now() - interval '15 minutes'
                         THEN %s
                         ELSE coalesce(m.prompt_tokens, 0) + coalesce(m.completion_tokens, 0) END
                ), 0)
                FROM chat_messages m WHERE m.session_id = s.id AND m.created_at >= %s
            ) AS used
            FROM chat_sessions s WHERE s.id = %s
            """,
            (in_flight_tokens, since, session_id),
        )
        used = int(row.pop("used")) if row else 0
        return _owned(row, token=token, user_id=user_id), used

    async def delete_session(self, session_id: uuid.UUID) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute("DELETE FROM chat_sessions WHERE id = %s", (session_id,))
            return cur.rowcount > 0

    async def list_user_sessions(self, user_id: str, *, limit: int = 50) -> list[SessionSummary]:
        rows = await self._fetchall(
            """
            SELECT s.id, s.created_at, s.last_activity_at,
                   coalesce(left(first_q.content, 80), '') AS title,
                   (SELECT count(*) FROM chat_messages m WHERE m.session_id = s.id) AS message_count
            FROM chat_sessions s
            LEFT JOIN LATERAL (
                SELECT content FROM chat_messages
                WHERE session_id = s.id AND role = 'user' ORDER BY created_at LIMIT 1
            ) first_q ON true
            WHERE s.user_id = %s
            ORDER BY s.last_activity_at DESC
            LIMIT %s
            """,
            (user_id, limit),
        )
        return [SessionSummary(**row) for row in rows]

    # -- messages ---------------------------------------------------------------------------------

    async def start_exchange(
        self,
        session_id: uuid.UUID,
        *,
        question: str,
        mode: Mode = "textbook",
        module_filter: str | None = None,
        selected_text: str | None = None,
        client_request_id: uuid.UUID | None = None,
        new_session: SessionToCreate | None = None,
    ) -> Exchange:
        """Store the question and an empty ``streaming`` answer in one transaction, before generation.

        With a ``client_request_id`` seen before, nothing is written and the first exchange is returned.
        With ``new_session`` (whose id is ``session_id``), the session is created by the same statement: a
        first question costs one round trip, not two.
        """
        user_id, assistant_id = uuid.uuid4(), uuid.uuid4()
        if new_session is not None and new_session.id != session_id:
            raise ValueError("new_session must be the session the question goes into")
        async with self._conn() as conn:
            # One statement, so one round trip and atomic: the answer row and the session's activity are
            # written only when the question was (a client_request_id seen before inserts nothing). The
            # foreign keys are checked at the end of the statement, after the new session's row is in.
            cur = await conn.execute(
                """
                WITH new_session AS (
                    INSERT INTO chat_sessions (id, user_id, token_hash, metadata)
                    SELECT %(session_id)s, %(owner)s, %(token_hash)s, %(metadata)s
                    WHERE %(create)s
                ), question AS (
                    INSERT INTO chat_messages
                        (id, session_id, role, content, status, mode, module_filter, selected_text, client_request_id)
                    VALUES (%(user_id)s, %(session_id)s, 'user', %(question)s, 'complete', %(mode)s,
                            %(module_filter)s, %(selected_text)s, %(client_request_id)s)
                    ON CONFLICT (client_request_id) WHERE client_request_id IS NOT NULL AND role = 'user' DO NOTHING
                    RETURNING session_id
                ), answer AS (
                    INSERT INTO chat_messages (id, session_id, role, status, mode, module_filter, client_request_id)
                    SELECT %(assistant_id)s, session_id, 'assistant', 'streaming', %(mode)s, %(module_filter)s,
                           %(client_request_id)s
                    FROM question
                ), activity AS (
                    UPDATE chat_sessions SET last_activity_at = now()
                    WHERE id = (SELECT session_id FROM question)
                )
                SELECT count(*) FROM question
                """,
                {
                    "user_id": user_id,
                    "assistant_id": assistant_id,
                    "session_id": session_id,
                    "question": question,
                    "mode": mode,
                    "module_filter": module_filter,
                    "selected_text": selected_text,
                    "client_request_id": client_request_id,
                    "create": new_session is not None,
                    "owner": new_session.user_id if new_session else None,
                    "token_hash": hash_token(new_session.token) if new_session else None,
                    "metadata": Jsonb(new_session.metadata if new_session else {}),
                },
            )
            row = await cur.fetchone()
            if (row is None or row[0] == 0) and client_request_id is not None:
                # Seen before (a double click, a retry, or a concurrent twin that won): attach to that one.
                existing = await self._exchange_for_request(conn, client_request_id)
                if existing is not None:
                    return existing
        return Exchange(session_id, user_id, assistant_id, created=True)

    async def find_exchange(self, client_request_id: uuid.UUID) -> Exchange | None:
        """The exchange an earlier request with this ``client_request_id`` started, if any."""
        async with self._conn() as conn:
            return await self._exchange_for_request(conn, client_request_id)

    async def finish_message(self, message_id: uuid.UUID, completion: Completion) -> None:
        """Write the answer, its usage and its citations in one transaction (no per-token writes)."""
        await self.finish_messages([(message_id, completion)])

    async def finish_messages(
        self, batch: Sequence[tuple[uuid.UUID, Completion]], late: Sequence[tuple[uuid.UUID, LateQuestion]] = ()
    ) -> None:
        """``finish_message`` for many answers in one transaction (the answer writer's batches); idempotent.

        ``late`` holds, by answer id, the questions that could not be stored when they were asked: each is
        written first (with its session, if the question was to create one), then its answer like the rest.
        """
        if not batch:
            return
        async with self._conn() as conn, conn.pipeline(), conn.transaction():
            if late:
                await self._insert_late(conn, late)
            async with conn.cursor() as cur:
                await cur.executemany(
                    """
                    UPDATE chat_messages
                    SET content = %s, status = %s, confidence = %s, model = %s,
                        prompt_tokens = %s, completion_tokens = %s, latency_ms = %s, stream_marks = %s
                    WHERE id = %s
                    """,
                    [
                        (
                            c.content,
                            c.status,
                            c.confidence,
                            c.model,
                            c.prompt_tokens,
                            c.completion_tokens,
                            c.latency_ms,
                            list(c.stream_marks) or None,
                            message_id,
                        )
                        for message_id, c in batch
                    ],
                )
                await cur.executemany(  # the standalone form a question's retrieval used, kept with it
                    "UPDATE chat_messages SET standalone = %s WHERE id = %s AND role = 'user'",
                    [(c.standalone, c.question_id) for _, c in batch if c.standalone and c.question_id],
                )
            await cited.insert(conn, [(message_id, c) for message_id, done in batch for c in done.citations])
            await conn.execute(
                "UPDATE chat_sessions SET last_activity_at = now() "
                "WHERE id IN (SELECT session_id FROM chat_messages WHERE id = ANY(%s))",
                ([message_id for message_id, _ in batch],),
            )

    async def _insert_late(
        self, conn: psycopg.AsyncConnection[Any], late: Sequence[tuple[uuid.UUID, LateQuestion]]
    ) -> None:
        """The questions (and empty answers) of ``late``, each only into a session its asker owns; a question
        whose ``client_request_id`` is already stored, or whose session is gone, writes nothing."""
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO chat_sessions (id, user_id, token_hash, metadata) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (id) DO NOTHING",
                [
                    (q.session_id, q.user_id, q.token_hash, Jsonb(q.session_metadata))
                    for _, q in late
                    if q.new_session and q.token_hash is not None
                ],
            )
            await cur.executemany(
                """
                WITH owned AS (
                    SELECT id FROM chat_sessions
                    WHERE id = %(session_id)s AND (token_hash = %(token_hash)s OR user_id = %(user_id)s)
                ), question AS (
                    INSERT INTO chat_messages (id, session_id, role, content, status, mode, module_filter,
                                               selected_text, client_request_id, created_at)
                    SELECT %(user_message_id)s, id, 'user', %(question)s, 'complete', %(mode)s, %(module_filter)s,
                           %(selected_text)s, %(client_request_id)s, %(asked_at)s
                    FROM owned
                    ON CONFLICT DO NOTHING
                    RETURNING session_id
                )
                INSERT INTO chat_messages (id, session_id, role, status, mode, module_filter, client_request_id,
                                           created_at)
                SELECT %(answer_id)s, session_id, 'assistant', 'streaming', %(mode)s, %(module_filter)s,
                       %(client_request_id)s, %(asked_at)s
                FROM question
                ON CONFLICT DO NOTHING
                """,
                [{**_late_fields(q), "answer_id": answer_id} for answer_id, q in late],
            )

    async def add_citations(self, message_id: uuid.UUID, citations: Sequence[Citation]) -> None:
        async with self._conn() as conn, conn.transaction():
            await cited.insert(conn, [(message_id, c) for c in citations])

    async def get_message(self, message_id: uuid.UUID) -> MessageRow | None:
        row = await self._fetchone(
            f"SELECT {_MESSAGE_COLUMNS}, stream_marks FROM chat_messages WHERE id = %s", (message_id,)
        )
        if row is None:
            return None
        citations = await self._citations_for([message_id])
        return MessageRow(**row, citations=tuple(citations.get(message_id, ())))

    async def recent_turns(self, session_id: uuid.UUID, *, limit: int) -> list[TurnRow]:
        """The newest ``limit`` questions and completed answers, oldest first, in one round trip (a prompt's
        history: of an answer's citations only the titles and headings of the sections it cited, what the next
        question's retrieval reads; none of the empty or unfinished answers ``history`` also lists)."""
        rows = await self._fetchall(
            f"""
            SELECT m.id, m.role, m.content, m.standalone,
                CASE WHEN m.role = 'assistant' THEN {cited.SECTIONS} END AS sections
            FROM chat_messages m
            WHERE m.session_id = %s AND m.content <> '' AND (m.role = 'user' OR m.status = 'complete')
            ORDER BY m.created_at DESC, m.role ASC
            LIMIT %s
            """,
            (session_id, limit),
        )
        return [TurnRow(**{**row, "sections": cited.sections(row["sections"])}) for row in reversed(rows)]

    async def history(
        self, session_id: uuid.UUID, *, limit: int = 50, after: datetime | None = None
    ) -> list[MessageRow]:
        """Messages oldest first with their citations; ``after`` pages forward from a ``created_at``."""
        rows = await self._fetchall(
            f"""
            SELECT {_MESSAGE_COLUMNS} FROM chat_messages
            WHERE session_id = %s AND (%s::timestamptz IS NULL OR created_at > %s::timestamptz)
            ORDER BY created_at, role DESC
            LIMIT %s
            """,
            (session_id, after, after, limit),
        )
        citations = await self._citations_for([row["id"] for row in rows])
        return [MessageRow(**row, citations=tuple(citations.get(row["id"], ()))) for row in rows]

    async def set_feedback(
        self, message_id: uuid.UUID, session_id: uuid.UUID, rating: Rating, comment: str | None
    ) -> bool:
        """Last rating wins; only assistant messages of that session can be rated."""
        async with self._conn() as conn:
            cur = await conn.execute(
                """
                UPDATE chat_messages SET feedback = %s, feedback_comment = %s
                WHERE id = %s AND session_id = %s AND role = 'assistant'
                """,
                (rating, comment, message_id, session_id),
            )
            return cur.rowcount > 0

    async def end_streaming(self, message_id: uuid.UUID, status: Literal["failed", "interrupted"]) -> bool:
        """End an answer still ``streaming`` with ``status``: ``failed`` when its text could not be stored,
        ``interrupted`` when no process generates it any more (its own died mid-answer). False when it was not
        ``streaming``."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE chat_messages SET status = %s WHERE id = %s AND status = 'streaming'", (status, message_id)
            )
            return cur.rowcount == 1

    async def interrupt_streaming(self, older_than_s: float) -> int:
        """Mark answers left ``streaming`` by a dead process as ``interrupted`` (start-up housekeeping)."""
        async with self._conn() as conn:
            cur = await conn.execute(
                "UPDATE chat_messages SET status = 'interrupted' "
                "WHERE status = 'streaming' AND created_at < now() - make_interval(secs => %s)",
                (older_than_s,),
            )
            return cur.rowcount

    # -- retention --------------------------------------------------------------------------------

    async def purge(
        self,
        *,
        retention_days: int,
        batch_size: int = 1000,
        before_delete: Callable[[psycopg.AsyncConnection[Any], list[uuid.UUID]], Awaitable[object]] | None = None,
    ) -> int:
        """Delete sessions idle longer than ``retention_days``, ``batch_size`` per transaction.

        SKIP LOCKED lets two purges run at once without waiting on each other or deleting twice.
        ``before_delete`` runs in each batch's transaction with the sessions about to go (the report's
        fold keeps their numbers): if it fails, nothing of that batch is deleted.
        """
        total = 0
        while True:
            async with self._conn(timeout_s=_PURGE_BATCH_TIMEOUT_S) as conn, conn.transaction():
                await conn.execute(
                    "SELECT set_config('statement_timeout', %s, true)", (f"{_PURGE_BATCH_TIMEOUT_S:.0f}s",)
                )
                cur = await conn.execute(
                    """
                    SELECT id FROM chat_sessions
                    WHERE last_activity_at < now() - make_interval(days => %s)
                    ORDER BY last_activity_at
                    LIMIT %s
                    FOR UPDATE SKIP LOCKED
                    """,
                    (retention_days, batch_size),
                )
                ids = [row[0] for row in await cur.fetchall()]
                if ids and before_delete is not None:
                    await before_delete(conn, ids)
                if ids:
                    await conn.execute("DELETE FROM chat_sessions WHERE id = ANY(%s)", (ids,))
            total += len(ids)
            if len(ids) < batch_size:
                metrics.purged(total)
                return total

    async def _exchange_for_request(
        self, conn: psycopg.AsyncConnection[Any], client_request_id: uuid.UUID
    ) -> Exchange | None:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            """
            SELECT u.session_id, u.id AS user_message_id, a.id AS assistant_message_id, u.content AS question,
                   s.user_id AS owner_user_id, s.metadata ->> 'caller' AS caller_digest
            FROM chat_messages u
            JOIN chat_messages a ON a.client_request_id = u.client_request_id AND a.role = 'assistant'
            JOIN chat_sessions s ON s.id = u.session_id
            WHERE u.client_request_id = %s AND u.role = 'user'
            """,
            (client_request_id,),
        )
        row = await cur.fetchone()
        return Exchange(**row, created=False) if row else None

    async def _citations_for(self, message_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[Citation]]:
        rows = await self._fetchall(cited.OF_MESSAGES, (list(message_ids),)) if message_ids else []
        return cited.by_message(rows)


_SESSION_COLUMNS = "s.id, s.user_id, s.token_hash, s.created_at, s.last_activity_at, s.metadata"


def _owned(row: dict[str, Any] | None, *, token: str | None, user_id: str | None) -> SessionRow | None:
    """The session of ``row`` (``_SESSION_COLUMNS``) if ``token`` matches its hash or ``user_id`` owns it."""
    if row is None:
        return None
    token_hash = row.pop("token_hash")
    by_token = token is not None and hmac.compare_digest(token_hash, hash_token(token))
    by_user = user_id is not None and row["user_id"] == user_id
    return SessionRow(**row) if (by_token or by_user) else None


_MESSAGE_COLUMNS = (
    "id, session_id, role, content, status, mode, module_filter, selected_text, confidence, model, "
    "prompt_tokens, completion_tokens, latency_ms, feedback, feedback_comment, client_request_id, created_at"
)


def _late_fields(question: LateQuestion) -> dict[str, Any]:
    return {name: getattr(question, name) for name in _LATE_FIELDS}


_LATE_FIELDS = ("session_id", "token_hash", "user_id", "user_message_id", "question", "mode", "module_filter",
                "selected_text", "client_request_id", "asked_at")  # fmt: skip
