"""The connection side of the store: the pool, per-call time limits and the circuit breaker.

Every block is bounded by DB_TIMEOUT_S and turns any database failure into ``DatabaseUnavailable``;
after a failure the store fails fast for a few seconds (a small circuit breaker) so a dead database costs
readers nothing but a notice. ``Store`` (sessions.py) puts its queries on top of ``Database``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, NoReturn

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from textbook_chat.core.errors import DatabaseUnavailable
from textbook_chat.store import migrate

log = logging.getLogger(__name__)

_BREAKER_S = 5.0  # how long to fail fast after the database failed
_TRIP_AFTER = 3  # failed queries in a row (none succeeding between them) that open the breaker


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


class Database:
    """A pool with time limits and a breaker; the queries are ``Store``'s (sessions.py)."""

    def __init__(self, pool: AsyncConnectionPool, *, timeout_s: float) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self._down_until = 0.0
        self._working = False  # a query succeeded since start-up or the last failure
        self._failures = 0  # failed blocks since the last one that worked
        self.migrations_pending = False  # a query found the schema missing; /health re-checks (schema_pending)

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

    async def schema_pending(self, timeout_s: float | None = None) -> bool:
        """Whether the database still needs ``python -m textbook_chat migrate`` (its ``alembic_version`` is behind)."""
        limit = timeout_s or self._timeout_s
        async with asyncio.timeout(limit), self._pool.connection(timeout=limit) as conn:
            try:
                cur = await conn.execute("SELECT version_num FROM alembic_version")
                applied = {str(row[0]) for row in await cur.fetchall()}
            except psycopg.errors.UndefinedTable:
                applied = set()
        self.migrations_pending = migrate.pending(applied)
        return self.migrations_pending

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
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            # Migrations were never run (or not all): like a database that is away, history is off and answers
            # wait in the writer, instead of every question failing with a 500 (issue 25).
            if not self.migrations_pending:
                log.warning(
                    "database schema not migrated (%s): run `python -m textbook_chat migrate`", type(exc).__name__
                )
            self.migrations_pending = True
            raise DatabaseUnavailable("Chat history is not set up on this server yet.") from exc
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
