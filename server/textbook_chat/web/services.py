"""The long-lived clients one process holds (Postgres pool, Redis, Qdrant, the embedder), opened and closed together.

A dependency that is configured but down does not stop start-up: its client is still created and
reconnects by itself; requests see a degraded answer until it is back.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import Embedder, create_embedder
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.store.database import create_pool
from textbook_chat.store.sessions import Store
from textbook_chat.web.auth import Authenticator
from textbook_chat.web.ratelimit import RateLimiter, StreamSlots

if TYPE_CHECKING:
    from redis.asyncio import BlockingConnectionPool, Redis

    from textbook_chat.chat.service import ChatService

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    store: Store | None = None  # None: DATABASE_URL unset (history off, stateless notice)
    redis: Redis | None = None  # None: REDIS_URL unset (memory limiter, in-process stream registry)
    index: VectorIndex | None = None  # None: opened without retrieval (maintenance commands)
    embedder: Embedder | None = None
    chat: ChatService | None = None  # only in the server (``open_services(..., chat=True)``)
    limiter: RateLimiter | None = None  # only in the server, like ``chat``
    slots: StreamSlots | None = None
    auth: Authenticator | None = None


@asynccontextmanager
async def open_services(settings: Settings, *, retrieval: bool = False, chat: bool = False) -> AsyncIterator[Services]:
    """Open what ``settings`` configures; the index and embedder with ``retrieval``, the chat pipeline with ``chat``."""
    retrieval = retrieval or chat
    services = Services(settings=settings)
    async with AsyncExitStack() as stack:
        if settings.database_url:
            pool = create_pool(
                settings.database_url,
                timeout_s=settings.db_timeout_s,
                max_size=settings.db_pool_size,
                queue_timeout_s=settings.db_queue_timeout_s,
            )
            store = Store(pool, timeout_s=settings.db_timeout_s)
            await store.open()
            stack.push_async_callback(store.close)
            services.store = store
        if settings.redis_url:
            redis = open_redis(
                settings.redis_url, timeout_s=settings.db_timeout_s, max_connections=settings.redis_max_connections
            )
            stack.push_async_callback(redis.aclose)
            services.redis = redis
        if retrieval:
            index = VectorIndex.from_settings(settings)
            stack.push_async_callback(index.close)
            services.index = index
            embedder = create_embedder(settings)
            stack.push_async_callback(embedder.aclose)
            index.expect_embedder(embedder=embedder.name, model=embedder.model, dim=embedder.dim)
            services.embedder = embedder
        if chat:
            services.chat = await _chat_service(settings, services, stack)
            services.limiter = RateLimiter(settings)
            stack.push_async_callback(services.limiter.aclose)
            services.slots = StreamSlots(settings.max_streams_per_client, services.redis)
            services.auth = Authenticator(settings)
        yield services


async def _chat_service(settings: Settings, services: Services, stack: AsyncExitStack) -> ChatService:
    # Imported here so maintenance commands (ingest, purge) do not load the generation stack.
    from textbook_chat.answer.faq import Faq
    from textbook_chat.answer.generation import create_generator
    from textbook_chat.answer.rewrite import create_rewriter
    from textbook_chat.chat.service import ChatService
    from textbook_chat.search.calibration import stored, stored_thresholds
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.search.second_opinion import SecondOpinion
    from textbook_chat.streams.capabilities import Capabilities
    from textbook_chat.streams.streaming import StreamRegistry

    assert services.index is not None and services.embedder is not None
    relay = None
    if services.redis is not None:
        from textbook_chat.streams.relay import RedisRelay  # only with Redis: a server without it never loads redis-py

        relay = RedisRelay(services.redis, ttl_s=settings.stream_ttl_s)
    registry = StreamRegistry(grace_s=settings.stream_grace_s, ttl_s=settings.stream_ttl_s, relay=relay)
    if relay is not None:
        await relay.start(on_cancel=registry.cancel_here)
        stack.push_async_callback(relay.close)  # after cancel_all below (LIFO): the last events reach Redis
    writer = None
    if services.store is not None:
        from textbook_chat.store.writes import AnswerWriter

        writer = AnswerWriter(services.store, settings.data_dir / "pending-writes")
        await writer.start()
        # Closed after cancel_all below (LIFO), so the answers it interrupts are written or spilled too.
        stack.push_async_callback(writer.close, settings.shutdown_grace_s)
    stack.push_async_callback(registry.cancel_all, "shutdown")
    key = settings.stream_signing_key.reveal().encode() if settings.stream_signing_key else None
    calibration = await stored(services.index, services.embedder)  # the book's own, when ingest derived one
    # The cross-encoder's second opinion where confidence is in doubt; without its files, answers as before.
    second_opinion = SecondOpinion.load(await stored_thresholds(services.index, services.embedder))
    stack.callback(second_opinion.close)
    # One cross-encoder per process: the offline answer orders its sentences with the same session.
    generator = create_generator(settings, cross_encoder=second_opinion.encoder)
    stack.push_async_callback(generator.aclose)
    rewriter = create_rewriter(settings, generator)  # asks through the generator's client, which it closes
    return ChatService(
        store=services.store,
        registry=registry,
        retriever=Retriever(services.index, services.embedder, calibration, second_opinion),
        generator=generator,
        faq=Faq.load(
            settings.faq_path, base_url=settings.book_base_url, own=settings.book_faq_path, book=settings.book_path
        ),
        capabilities=Capabilities(key, ttl_s=settings.stream_ttl_s),
        llm_enabled=settings.llm_enabled,
        daily_tokens=settings.session_daily_tokens,
        writer=writer,
        rewriter=rewriter,
    )


def open_redis(url: str, *, timeout_s: float, max_connections: int = 200) -> Redis:
    from redis.asyncio import Redis

    # from_pool: closing the client closes its pool (with Redis(connection_pool=...) it would not).
    return Redis.from_pool(redis_pool(url, timeout_s=timeout_s, max_connections=max_connections))


def redis_pool(url: str, *, timeout_s: float, max_connections: int) -> BlockingConnectionPool:
    """A pool that, when all ``max_connections`` are busy (a burst of questions), makes the next caller wait
    up to ``timeout_s`` for one to come back instead of failing at once (redis-py's default pool raises,
    and the callers then fall back to per-process counting)."""
    from redis.asyncio import BlockingConnectionPool

    return BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=30,
        retry_on_timeout=False,
    )
