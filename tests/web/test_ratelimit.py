"""Rate limits: a moving window per caller, shared through Redis, and never a 500 when Redis dies mid-run.

Uses a throwaway redis-server on a free port so the test can kill it and bring it back.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis as redis_sync
from redis.asyncio import Redis

from tests.servers import free_port
from textbook_chat.core.errors import RateLimited
from textbook_chat.core.settings import Settings
from textbook_chat.web.ratelimit import RateLimiter, StreamSlots, admit

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


class ThrowawayRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis_sync.Redis(port=self.port, socket_timeout=0.2).ping():
                    return
            except redis_sync.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("throwaway redis did not start")

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis()
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _limiter(redis_url: str | None, rate: str = "3/minute") -> RateLimiter:
    env = {"RATE_LIMIT_ANON": rate, "RATE_LIMIT_USER": "5/minute", "DB_TIMEOUT_S": "0.5"}
    if redis_url:
        env["REDIS_URL"] = redis_url
    return RateLimiter(Settings.from_env(env))


async def test_the_budget_counts_down_and_the_next_question_gets_a_429_with_retry_after() -> None:
    limiter = _limiter(None)
    budgets = [await limiter.hit("ask", client="10.0.0.1", user_id=None) for _ in range(3)]
    assert [b.remaining for b in budgets] == [2, 1, 0]
    assert budgets[0].headers()["RateLimit-Limit"] == "3"
    with pytest.raises(RateLimited) as refused:
        await limiter.hit("ask", client="10.0.0.1", user_id=None)
    assert refused.value.status == 429
    assert 1 <= int(refused.value.headers["Retry-After"]) <= 60
    assert refused.value.headers["RateLimit-Remaining"] == "0"


async def test_callers_have_separate_budgets_and_users_their_own_limit() -> None:
    limiter = _limiter(None)
    for _ in range(3):
        await limiter.hit("ask", client="10.0.0.1", user_id=None)
    assert (await limiter.hit("ask", client="10.0.0.2", user_id=None)).remaining == 2
    signed_in = await limiter.hit("ask", client="10.0.0.1", user_id="alice")
    assert signed_in.limit == 5 and signed_in.remaining == 4


async def test_reads_do_not_spend_the_question_budget() -> None:
    limiter = _limiter(None, rate="1/minute")
    for _ in range(5):
        await limiter.hit("read", client="10.0.0.1", user_id=None)
    assert (await limiter.hit("ask", client="10.0.0.1", user_id=None)).remaining == 0


async def test_a_question_is_admitted_with_a_slot_and_one_unit_of_its_budget_and_a_kept_slot_is_held() -> None:
    limiter, slots = _limiter(None), StreamSlots(1, None)
    async with admit(limiter, slots, client="10.0.0.1", user_id=None) as first:
        assert first.headers["RateLimit-Remaining"] == "2"
        first.keep()  # an answer is generating: its run gives the slot back
    with pytest.raises(RateLimited) as busy:  # a second answer at once: refused before the budget is spent
        async with admit(limiter, slots, client="10.0.0.1", user_id=None):
            pytest.fail("admitted past the slot limit")
    assert busy.value.code == "too_many_streams"
    assert busy.value.headers["RateLimit-Remaining"] == "2"  # the budget as it stands, nothing spent
    assert (await limiter.peek("ask", client="10.0.0.1", user_id=None)).remaining == 2
    async with admit(limiter, slots, client="10.0.0.1", user_id="alice") as other:  # another caller, own slots
        assert other.headers["RateLimit-Limit"] == "5"
    await first.release()
    await first.release()  # once is enough; a second release does nothing
    async with admit(limiter, slots, client="10.0.0.1", user_id=None) as attached:
        pass  # not kept (say, attached to an earlier answer): the slot is given back as the block ends
    async with admit(limiter, slots, client="10.0.0.1", user_id=None) as last:
        assert last.headers["RateLimit-Remaining"] == "0"
    assert attached.headers["RateLimit-Remaining"] == "1"


async def test_a_question_refused_for_its_budget_or_failing_to_start_gives_its_slot_back() -> None:
    limiter, slots = _limiter(None, rate="1/minute"), StreamSlots(1, None)
    async with admit(limiter, slots, client="10.0.0.2", user_id=None):
        pass
    with pytest.raises(RateLimited) as spent:
        async with admit(limiter, slots, client="10.0.0.2", user_id=None):
            pytest.fail("admitted past the budget")
    assert spent.value.code == "rate_limited"
    await slots.acquire("ip:10.0.0.2", "free")  # the refused question holds no slot
    await slots.release("ip:10.0.0.2", "free")
    with pytest.raises(RuntimeError):
        async with admit(None, slots, client="10.0.0.3", user_id=None) as failing:
            assert failing.headers == {}  # no limiter: no budget headers
            raise RuntimeError("the chat stage failed before the run started")
    await slots.acquire("ip:10.0.0.3", "free")


async def test_two_limiters_on_one_redis_share_the_budget(throwaway_redis: ThrowawayRedis) -> None:
    first, second = _limiter(throwaway_redis.url), _limiter(throwaway_redis.url)
    try:
        await first.hit("ask", client="10.0.0.9", user_id=None)
        await second.hit("ask", client="10.0.0.9", user_id=None)
        await first.hit("ask", client="10.0.0.9", user_id=None)
        with pytest.raises(RateLimited):
            await second.hit("ask", client="10.0.0.9", user_id=None)
    finally:
        await first.aclose()
        await second.aclose()


async def test_redis_dying_mid_run_falls_back_to_memory_with_a_warning(
    throwaway_redis: ThrowawayRedis, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = _limiter(throwaway_redis.url)
    await limiter.hit("ask", client="10.0.0.7", user_id=None)
    throwaway_redis.kill()
    try:
        with caplog.at_level(logging.WARNING, logger="textbook_chat.web.ratelimit"):
            budgets = [await limiter.hit("ask", client="10.0.0.7", user_id=None) for _ in range(3)]
            with pytest.raises(RateLimited):  # memory still limits: a dead Redis is not a free pass
                await limiter.hit("ask", client="10.0.0.7", user_id=None)
    finally:
        await limiter.aclose()
    assert [b.remaining for b in budgets] == [2, 1, 0]
    assert any("limiting in memory" in r.getMessage() for r in caplog.records)


async def test_stream_slots_cap_concurrent_answers_across_workers(throwaway_redis: ThrowawayRedis) -> None:
    first_redis, second_redis = Redis.from_url(throwaway_redis.url), Redis.from_url(throwaway_redis.url)
    try:
        first, second = StreamSlots(2, first_redis), StreamSlots(2, second_redis)
        await first.acquire("ip:10.0.0.5", "m1")
        await second.acquire("ip:10.0.0.5", "m2")
        with pytest.raises(RateLimited) as busy:
            await first.acquire("ip:10.0.0.5", "m3")
        assert busy.value.code == "too_many_streams"
        await second.release("ip:10.0.0.5", "m2")
        await first.acquire("ip:10.0.0.5", "m3")
        await first.acquire("ip:10.0.0.6", "m4")  # another caller is not affected
    finally:
        await first_redis.aclose()
        await second_redis.aclose()


async def test_stream_slots_keep_counting_in_process_when_redis_is_down(throwaway_redis: ThrowawayRedis) -> None:
    client = Redis.from_url(throwaway_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    throwaway_redis.kill()
    try:
        slots = StreamSlots(1, client)
        await slots.acquire("ip:10.0.0.5", "m1")
        with pytest.raises(RateLimited):
            await slots.acquire("ip:10.0.0.5", "m2")
        await slots.release("ip:10.0.0.5", "m1")
        await slots.acquire("ip:10.0.0.5", "m2")
    finally:
        await client.aclose()


async def test_a_burst_bigger_than_the_redis_pool_waits_for_connections_instead_of_failing_open(
    throwaway_redis: ThrowawayRedis, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    from textbook_chat.web.services import open_redis

    settings = Settings.from_env(
        {"REDIS_URL": throwaway_redis.url, "RATE_LIMIT_ANON": "1000/hour", "REDIS_MAX_CONNECTIONS": "4"}
    )
    limiter = RateLimiter(settings, prefix="burst")
    client = open_redis(throwaway_redis.url, timeout_s=2.0, max_connections=4)
    slots = StreamSlots(1000, client)
    try:
        with caplog.at_level(logging.WARNING):
            await asyncio.gather(*(limiter.hit("ask", client="203.0.113.5", user_id=None) for _ in range(200)))
            await asyncio.gather(*(slots.acquire("ip:203.0.113.5", f"m{i}") for i in range(200)))
        left = await limiter.peek("ask", client="203.0.113.5", user_id=None)
        counted = await client.zcard("tc:slots:ip:203.0.113.5")
    finally:
        await client.aclose()
        await limiter.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert left.remaining == 800  # all 200 counted in Redis, once each
    assert counted == 200
