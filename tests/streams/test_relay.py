"""The Redis mirror of stream events: one event it cannot write, or a full queue, never stops later answers
from being mirrored, and closing it always returns (issue 25). Real Redis, the test's own DB number."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import TEST_REDIS_URL
from textbook_chat.core import metrics
from textbook_chat.streams.events import Event
from textbook_chat.streams.relay import RedisRelay, events_key


@pytest.fixture
async def redis() -> Redis:
    client = Redis.from_url(TEST_REDIS_URL)
    await client.flushdb()
    return client


def _dropped(reason: str) -> float:
    return metrics.RELAY_DROPPED.labels(reason)._value.get()  # type: ignore[no-any-return]


async def test_an_event_redis_cannot_encode_is_dropped_and_the_writer_goes_on(redis: Redis) -> None:
    relay = RedisRelay(redis, ttl_s=60)
    await relay.start(lambda _: None)
    before = _dropped("bad_event")
    # An event built around the encoder (its line given, not made from its data) holding a lone surrogate.
    relay.mirror("bad", Event(1, "token", {"text": "x"}, json_line='{"text": "\ud800"}'))
    relay.mirror("good", Event(1, "token", {"text": "fine"}))
    await relay.flush()
    relay.mirror("later", Event(1, "token", {"text": "still mirrored"}))
    await relay.flush()
    await relay.close()
    assert [await redis.xlen(events_key(m)) for m in ("bad", "good", "later")] == [0, 1, 1]
    assert _dropped("bad_event") == before + 1
    await redis.aclose()


async def test_a_full_queue_drops_and_counts_instead_of_growing_and_leaves_no_hole_in_a_message(
    redis: Redis,
) -> None:
    relay = RedisRelay(redis, ttl_s=60, queue_max=3)  # not started: nothing takes from the queue
    before = _dropped("queue_full")
    for i in range(1, 6):
        relay.mirror("m", Event(i, "token", {"text": str(i)}))
    assert _dropped("queue_full") == before + 2
    await relay.start(lambda _: None)
    await relay.flush()
    # The queue has room again, but "m" lost event 4: nothing after the hole is mirrored, up to its end.
    relay.mirror("m", Event(6, "token", {"text": "6"}))
    relay.mirror("m", Event(7, "done", {"finish_reason": "stop"}))
    relay.mirror("next", Event(1, "token", {"text": "a later answer"}))
    await relay.flush()
    await relay.close()
    entries: Any = await redis.xrange(events_key("m"))
    assert [_seq(entry) for entry, _ in entries] == [1, 2, 3]
    assert await redis.xlen(events_key("next")) == 1
    await redis.aclose()


def _seq(entry_id: bytes) -> int:
    return int(entry_id.decode().split("-")[1])


async def test_close_returns_at_once_even_when_a_relay_task_had_died(redis: Redis) -> None:
    relay = RedisRelay(redis, ttl_s=60)

    async def crash(_: object) -> None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    await relay.start(lambda _: None)
    assert relay._writer is not None
    relay._writer.cancel()
    relay._writer = asyncio.create_task(crash(None))
    await asyncio.sleep(0.05)  # the cancel listener is waiting for a message now
    started = time.monotonic()
    await asyncio.wait_for(relay.close(), timeout=5)
    # Well under CLOSE_WAIT_S: the listener honours its cancel even when redis-py's read timeout swallows it.
    assert time.monotonic() - started < 0.5
    assert relay._listener is not None and relay._listener.cancelled()
    await redis.aclose()
