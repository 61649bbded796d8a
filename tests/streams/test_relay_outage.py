"""A reader following, through Redis, an answer another process generates when that Redis dies mid-answer.

Two apps on real sockets share Postgres and a Redis of the test's own (``redis-server`` on a free port, killed
for real: the shared Redis other tests use is never touched). The stream still ends with exactly one terminal
event, and one log line says why.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import demo_env
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import free_port, serving
from tests.sse_client import SSEEvent, answer_text, events, of_type
from textbook_chat.chat import message_events
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server program")

QUESTION = "How does a humanoid keep its balance?"
ANSWER = " ".join(f"w{i}" for i in range(80)) + " [1]."


@contextmanager
def own_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        process.kill()
        process.wait()


async def two_apps(
    stack: AsyncExitStack, demo_index_dir: Path, tmp_path: Path, clean_db: str, redis_url: str, llm_url: str
) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    clients = []
    for _ in range(2):
        env = {
            **demo_env(demo_index_dir, tmp_path, clean_db, llm_url),
            "REDIS_URL": redis_url,
            "STREAM_SIGNING_KEY": "test-signing-key",
            "DB_TIMEOUT_S": "0.5",
        }
        url = await stack.enter_async_context(serving(create_app(Settings.from_env(env))))
        clients.append(await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=60)))
    return clients[0], clients[1]


async def read_while(client: httpx.AsyncClient, url: str, after_tokens: int, then: asyncio.Event) -> list[SSEEvent]:
    """The whole stream; ``then`` is set once ``after_tokens`` tokens arrived."""
    seen: list[SSEEvent] = []
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        async for event in events(response):
            seen.append(event)
            if sum(e.event == "token" for e in seen) == after_tokens:
                then.set()
    return seen


@pytest.mark.slow
async def test_redis_dying_mid_answer_ends_the_relayed_stream_with_the_stored_answer(
    demo_index_dir: Path, tmp_path: Path, clean_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.04))
    with own_redis() as (redis_url, redis_process):
        async with AsyncExitStack() as stack:
            llm_url = await stack.enter_async_context(serving(fake.app()))
            owner, other = await two_apps(stack, demo_index_dir, tmp_path, clean_db, redis_url, llm_url)
            created = await owner.post("/api/chat/messages", json={"question": QUESTION})
            assert created.status_code == 202, created.text
            some_read = asyncio.Event()
            reader = asyncio.create_task(read_while(other, created.json()["stream_url"], 5, some_read))
            await asyncio.wait_for(some_read.wait(), 30)
            with caplog.at_level(logging.WARNING, logger=message_events.__name__):
                redis_process.kill()
                stream = await asyncio.wait_for(reader, 60)
    kinds = [e.event for e in stream]
    assert kinds.count("done") + kinds.count("error") == 1 and kinds[-1] == "done", kinds[-5:]
    assert [e.id for e in stream] == [str(i) for i in range(1, len(stream) + 1)]
    assert answer_text(stream) == ANSWER
    assert of_type(stream, "done")[0]["finish_reason"] == "stop"
    outage_lines = [r for r in caplog.records if r.name == message_events.__name__]
    assert len(outage_lines) == 1 and outage_lines[0].exc_info is None


@pytest.mark.slow
async def test_without_redis_or_a_stored_answer_the_relayed_read_ends_with_one_retryable_error(
    demo_index_dir: Path, tmp_path: Path, clean_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(message_events, "OUTAGE_WAIT_S", 1.0)
    fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.5))  # far longer than the wait: not stored in time
    with own_redis() as (redis_url, redis_process):
        async with AsyncExitStack() as stack:
            llm_url = await stack.enter_async_context(serving(fake.app()))
            owner, other = await two_apps(stack, demo_index_dir, tmp_path, clean_db, redis_url, llm_url)
            created = await owner.post("/api/chat/messages", json={"question": QUESTION})
            some_read = asyncio.Event()
            reader = asyncio.create_task(read_while(other, created.json()["stream_url"], 2, some_read))
            await asyncio.wait_for(some_read.wait(), 30)
            redis_process.kill()
            stream = await asyncio.wait_for(reader, 30)
            await owner.delete(created.json()["stream_url"])  # the owner stops generating
    kinds = [e.event for e in stream]
    assert kinds.count("done") + kinds.count("error") == 1 and kinds[-1] == "error", kinds[-5:]
    error = of_type(stream, "error")[0]
    assert error["code"] == "relay_unavailable" and error["retryable"] is True
