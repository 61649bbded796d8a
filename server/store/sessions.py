"""Postgres: sessions, messages and citations. All SQL of the service lives here.

Every call is bounded by DB_TIMEOUT_S and turns any database failure into
``DatabaseUnavailable``; after a failure the store fails fast for a few seconds (a small circuit
breaker) so a dead database costs readers nothing but a notice.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NoReturn

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from server.core import metrics
from server.core.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

Role = Literal["user", "assistant"]
Status = Literal["streaming", "complete", "interrupted", "failed"]
Mode = Literal["textbook", "selection"]
Rating = Literal["up", "down"]

_BREAKER_S = 5.0  # how long to fail fast after the database failed
_TRIP_AFTER = 3  # failed queries in a row (none succeeding between them) that open the breaker
_PURGE_BATCH_TIMEOUT_S = 60.0  # a purge batch may legitimately take longer than an interactive query


@dataclass(frozen=True)
class NewSession:
    id: uuid.UUID
    token: str  # shown to the client once; only its hash is stored


@dataclass(frozen=True)
class SessionRow:
    id: uuid.UUID
    user_id: str | None
    created_at: datetime
    last_activity_at: datetime
    metadata: dict[str, Any]


@dataclass(frozen=True)
class SessionSummary:
    id: uuid.UUID
    created_at: datetime
    last_activity_at: datetime
    title: str  # the first question, shortened
    message_count: int


@dataclass(frozen=True)
class Citation:
    position: int
    chunk_id: str
    module: str | None
    chapter: str | None
    title: str | None
    url: str
    relevance_score: float | None
    excerpt: str | None


@dataclass(frozen=True)
class MessageRow:
    id: uuid.UUID
    session_id: uuid.UUID
    role: Role
    content: str
    status: Status
    mode: Mode
    module_filter: str | None
    selected_text: str | None
    confidence: float | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: int | None
    feedback: Rating | None
    feedback_comment: str | None
    client_request_id: uuid.UUID | None
    created_at: datetime
    citations: tuple[Citation, ...] = field(default=())


@dataclass(frozen=True)
class Exchange:
    """One question: the stored user message and the assistant message that answers it."""

    session_id: uuid.UUID
    user_message_id: uuid.UUID
    assistant_message_id: uuid.UUID
    created: bool  # False when a client_request_id matched an earlier question
    # For a matched earlier question: who asked it, so a repeat can be checked to come from the same caller.
    question: str | None = None
    owner_user_id: str | None = None
    caller_digest: str | None = None


@dataclass(frozen=True)
class Completion:
    """What the assistant message holds when generation ends."""

    content: str
    status: Status
    confidence: float | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: int | None = None
    citations: Sequence[Citation] = ()


def hash_token(token: str) -> str:
    # Session tokens are 256-bit random values, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


def create_pool(
    database_url: str, *, timeout_s: float, max_size: int = 20, queue_timeout_s: float | None = None
) -> AsyncConnectionPool:
    """A closed pool; ``Store.open`` opens it without waiting, so start-up works while Postgres is down."""
    statement_ms = max(1, int(timeout_s * 1000))
    return AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        open=False,
        timeout=queue_timeout_s if queue_timeout_s is not None else timeout_s,  # waiting for a free connection
        reconnect_timeout=0,  # keep retrying in the background for as long as the database is away
        kwargs={
            # One round trip per single-statement call (no BEGIN, no COMMIT); multi-statement writes use
            # conn.transaction(). On the question's path that is 3 round trips fewer per call.
            "autocommit": True,
            "connect_timeout": max(2, int(timeout_s + 0.999)),  # libpq takes whole seconds, at least 2
            "options": f"-c statement_timeout={statement_ms}",
            "application_name": "textbook-chat",
        },
    )


class Store:
    def __init__(self, pool: AsyncConnectionPool, *, timeout_s: float) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self._down_until = 0.0
        self._working = False  # a query succeeded since start-up or the last failure
        self._failures = 0  # failed blocks since the last one that worked

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close(timeout=self._timeout_s)

    @property
    def available(self) -> bool:
        """False while the breaker is open (a recent failure); callers may skip optional writes."""
        return time.monotonic() >= self._down_until

    async def ping(self, timeout_s: float | None = None) -> bool:
        """One ``SELECT 1`` within ``timeout_s``; ignores the breaker (health checks probe for recovery)."""
        try:
            async with asyncio.timeout(timeout_s or self._timeout_s):
                async with self._pool.connection(timeout=timeout_s or self._timeout_s) as conn:
                    await conn.execute("SELECT 1")
        except (TimeoutError, PoolTimeout, psycopg.Error, OSError):
            return False
        self._down_until = 0.0
        self._working = True
        return True

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
        row = await self._fetchone(
            "SELECT id, user_id, token_hash, created_at, last_activity_at, metadata FROM chat_sessions WHERE id = %s",
            (session_id,),
        )
        if row is None:
            return None
        token_hash = row.pop("token_hash")
        by_token = token is not None and hmac.compare_digest(token_hash, hash_token(token))
        by_user = user_id is not None and row["user_id"] == user_id
        return SessionRow(**row) if (by_token or by_user) else None

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
    ) -> Exchange:
        """Store the question and an empty ``streaming`` answer in one transaction, before generation.

        With a ``client_request_id`` seen before, nothing is written and the first exchange is returned.
        """
        user_id, assistant_id = uuid.uuid4(), uuid.uuid4()
        async with self._conn() as conn:
            # One statement, so one round trip and atomic: the answer row and the session's activity are
            # written only when the question was (a client_request_id seen before inserts nothing).
            cur = await conn.execute(
                """
                WITH question AS (
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

    async def finish_messages(self, batch: Sequence[tuple[uuid.UUID, Completion]]) -> None:
        """``finish_message`` for many answers in one transaction (the answer writer's batches); idempotent."""
        if not batch:
            return
        async with self._conn() as conn, conn.pipeline(), conn.transaction():
            async with conn.cursor() as cur:
                await cur.executemany(
                    """
                    UPDATE chat_messages
                    SET content = %s, status = %s, confidence = %s, model = %s,
                        prompt_tokens = %s, completion_tokens = %s, latency_ms = %s
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
                            message_id,
                        )
                        for message_id, c in batch
                    ],
                )
            await self._add_citations(conn, [(message_id, c) for message_id, done in batch for c in done.citations])
            await conn.execute(
                "UPDATE chat_sessions SET last_activity_at = now() "
                "WHERE id IN (SELECT session_id FROM chat_messages WHERE id = ANY(%s))",
                ([message_id for message_id, _ in batch],),
            )

    async def add_citations(self, message_id: uuid.UUID, citations: Sequence[Citation]) -> None:
        async with self._conn() as conn, conn.transaction():
            await self._add_citations(conn, [(message_id, c) for c in citations])

    async def get_message(self, message_id: uuid.UUID) -> MessageRow | None:
        row = await self._fetchone(f"SELECT {_MESSAGE_COLUMNS} FROM chat_messages WHERE id = %s", (message_id,))
        if row is None:
            return None
        citations = await self._citations_for([message_id])
        return MessageRow(**row, citations=tuple(citations.get(message_id, ())))

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

    async def tokens_used_since(self, session_id: uuid.UUID, since: datetime, *, in_flight_tokens: int = 0) -> int:
        """Tokens the session's answers used since ``since``; an answer still streaming (started in the last
        15 minutes: older ones are orphans a worker left) counts as ``in_flight_tokens``, its usage not known yet."""
        row = await self._fetchone(
            """
            SELECT coalesce(sum(
                CASE WHEN role = 'assistant' AND status = 'streaming'
                          AND created_at > now() - interval '15 minutes'
                     THEN %s
                     ELSE coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0) END
            ), 0) AS used
            FROM chat_messages WHERE session_id = %s AND created_at >= %s
            """,
            (in_flight_tokens, session_id, since),
        )
        return int(row["used"]) if row else 0

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

    @asynccontextmanager
    async def connection(self, *, timeout_s: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection for read-mostly tools (the report); committed when the block ends."""
        async with self._conn(timeout_s=timeout_s) as conn:
            yield conn

    # -- helpers ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def _conn(self, *, timeout_s: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection; the block gets ``timeout_s`` once it has one.

        Waiting for a free connection (a burst: every connection busy) is bounded by the pool's own timeout
        (DB_QUEUE_TIMEOUT_S), not by ``timeout_s``, and does not open the breaker: the database is busy, not
        down. Postgres holds each statement to ``timeout_s`` (statement_timeout); the block as a whole gets
        twice that and a second more, a guard against a peer that stopped answering, generous because a busy
        event loop or a batch of statements is not a dead database. The breaker opens when the pool has no
        connection at all, or after ``_TRIP_AFTER`` failed blocks in a row: one slow query in a burst that
        otherwise works fails alone.
        """
        if not self.available:
            raise DatabaseUnavailable("Chat history is temporarily unavailable.")
        limit = timeout_s or self._timeout_s
        connected = self._working
        try:
            async with AsyncExitStack() as stack:
                conn = await self._acquire(stack, limit)
                async with asyncio.timeout(2 * limit + 1.0):
                    yield conn
            self._working, self._failures = True, 0
        except PoolTimeout as exc:
            if connected or self._working:
                log.warning("database busy: no free connection within the queue timeout")
                raise DatabaseUnavailable("Chat history is busy right now.") from exc
            self._trip(exc)
        except (TimeoutError, psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            self._failures += 1
            if self._failures >= _TRIP_AFTER:
                self._trip(exc)
            log.warning("database query failed: %s (%d in a row)", type(exc).__name__, self._failures)
            raise DatabaseUnavailable("Chat history is temporarily unavailable.") from exc

    async def _acquire(self, stack: AsyncExitStack, limit: float) -> psycopg.AsyncConnection[Any]:
        """A free connection, released when ``stack`` closes.

        Right after a query worked, no free connection means a burst: wait in the queue (DB_QUEUE_TIMEOUT_S).
        Otherwise (start-up, or after a failure) the database may be away: give up within ``limit``, unless
        another query got through meanwhile (a burst that came before the first answer), then queue as well.
        """
        if not self._working:
            try:
                return await stack.enter_async_context(self._pool.connection(timeout=limit))
            except PoolTimeout:
                if not self._working:
                    raise
        return await stack.enter_async_context(self._pool.connection())

    def _trip(self, exc: BaseException) -> NoReturn:
        self._working, self._failures = False, 0
        self._down_until = time.monotonic() + _BREAKER_S
        log.warning("database unavailable: %s", type(exc).__name__)
        raise DatabaseUnavailable("Chat history is temporarily unavailable.") from exc

    async def _fetchone(self, query: str, params: Sequence[Any]) -> dict[str, Any] | None:
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, params)
            return await cur.fetchone()

    async def _fetchall(self, query: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        async with self._conn() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, params)
            return await cur.fetchall()

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

    async def _add_citations(
        self, conn: psycopg.AsyncConnection[Any], citations: Sequence[tuple[uuid.UUID, Citation]]
    ) -> None:
        """Every (message id, citation) pair in one statement, whatever the number of messages."""
        if not citations:
            return
        async with conn.cursor() as cur:
            await cur.executemany(
                """
                INSERT INTO source_citations
                    (id, message_id, position, chunk_id, module, chapter, title, url, relevance_score, excerpt)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
                    )
                    for message_id, c in citations
                ],
            )

    async def _citations_for(self, message_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[Citation]]:
        if not message_ids:
            return {}
        rows = await self._fetchall(
            """
            SELECT message_id, position, chunk_id, module, chapter, title, url, relevance_score, excerpt
            FROM source_citations WHERE message_id = ANY(%s) ORDER BY message_id, position
            """,
            (list(message_ids),),
        )
        grouped: dict[uuid.UUID, list[Citation]] = {}
        for row in rows:
            grouped.setdefault(row.pop("message_id"), []).append(Citation(**row))
        return grouped


_MESSAGE_COLUMNS = (
    "id, session_id, role, content, status, mode, module_filter, selected_text, confidence, model, "
    "prompt_tokens, completion_tokens, latency_ms, feedback, feedback_comment, client_request_id, created_at"
)
