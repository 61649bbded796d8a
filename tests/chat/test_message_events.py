"""The 204 rule of a reconnect, read on a worker that follows the answer through Redis (real Redis, the test's own
DB number): a reader who already has an event this worker's Redis does not hold yet is answered once Redis catches
up, not with a stream that would wait for an event it never gets."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import cast

import pytest
from redis.asyncio import Redis

from tests.conftest import TEST_REDIS_URL
from textbook_chat.chat import message_events
from textbook_chat.chat.service import ChatService
from textbook_chat.streams.events import Event
from textbook_chat.streams.relay import RedisRelay
from textbook_chat.streams.streaming import StreamRegistry


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(TEST_REDIS_URL)
    await client.flushdb()
    yield client
    await client.aclose()


def other_worker(redis: Redis) -> ChatService:
    """What ``last_event`` reads of a worker that does not generate the answer: its registry (empty, with Redis)
    and no store."""
    registry = StreamRegistry(grace_s=0, ttl_s=60, relay=RedisRelay(redis, ttl_s=60))
    return cast(ChatService, SimpleNamespace(registry=registry, store=None))


async def generating(redis: Redis, message_id: uuid.UUID, tokens: int) -> RedisRelay:
    """The generating worker's mirror, with ``tokens`` events of the answer already in Redis."""
    relay = RedisRelay(redis, ttl_s=60)
    await relay.start(lambda _: None)
    for n in range(1, tokens + 1):
        relay.mirror(str(message_id), Event(n, "token", {"text": f"w{n} "}))
    await relay.flush()
    return relay


async def test_a_reader_ahead_of_redis_is_answered_once_the_done_it_has_is_mirrored(redis: Redis) -> None:
    message_id = uuid.uuid4()
    writer = await generating(redis, message_id, tokens=3)
    try:
        started = time.monotonic()
        asking = asyncio.create_task(message_events.last_event(other_worker(redis), message_id, seen=4))
        await asyncio.sleep(0.3)  # the reader had `done` (4) from the generating worker; Redis has 1-3
        assert not asking.done()
        writer.mirror(str(message_id), Event(4, "done", {"finish_reason": "stop"}))
        assert await asyncio.wait_for(asking, 5) == (4, True)  # so the reconnect gets its 204
        assert time.monotonic() - started >= 0.3
    finally:
        await writer.close()


async def test_a_reader_level_with_redis_is_answered_at_once(redis: Redis) -> None:
    message_id = uuid.uuid4()
    writer = await generating(redis, message_id, tokens=3)
    try:
        started = time.monotonic()
        assert await message_events.last_event(other_worker(redis), message_id, seen=3) == (3, False)
        assert time.monotonic() - started < message_events.MIRROR_WAIT_S / 2
    finally:
        await writer.close()


async def test_a_reader_claiming_an_event_never_mirrored_waits_no_longer_than_the_mirror_wait(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(message_events, "MIRROR_WAIT_S", 0.3)
    message_id = uuid.uuid4()
    writer = await generating(redis, message_id, tokens=3)
    try:
        started = time.monotonic()
        assert await message_events.last_event(other_worker(redis), message_id, seen=99) == (3, False)
        assert 0.3 <= time.monotonic() - started < 2
    finally:
        await writer.close()
