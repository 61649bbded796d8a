"""Graceful shutdown: new questions are refused, running answers get SHUTDOWN_GRACE_S, the rest end retryably.

The drain is driven directly in-process first (``app.state.drain``), then for real: ``python -m textbook_chat serve``
in a subprocess with 50 live streams gets SIGTERM. The LLM is tests/fake_openai.py pacing its tokens.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from starlette.applications import Starlette

from tests.conftest import copy_index, demo_env
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.servers import server_process, serving
from tests.sse_client import SSEEvent, answer_text, events, of_type
from textbook_chat.cli import SHUTDOWN_FLUSH_S
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
SHORT = " ".join(["balance"] * 12) + " [1]."
LONG = " ".join(["walking"] * 600) + " [1]."
TOKEN_DELAY_S = 0.05
DRILL_STREAMS = 50
DRILL_GRACE_S = 6.0
DRILL_LIMIT_S = 120  # the whole drill, start-up included, or the test fails instead of hanging

Server = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, FakeOpenAI, Starlette]]]


@pytest.fixture
def chat_server(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> Server:
    """``async with chat_server(**env) as (client, fake, app)``: the app with the demo index and the fake LLM."""

    @asynccontextmanager
    async def start(**env: str) -> AsyncIterator[tuple[httpx.AsyncClient, FakeOpenAI, Starlette]]:
        fake = FakeOpenAI()
        async with serving(fake.app()) as llm_url:
            values = {**demo_env(demo_index_dir, tmp_path, clean_db, llm_url), **env}
            app = create_app(Settings.from_env(values))
            async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
                yield client, fake, app

    return start


def stored(database_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT id, role, content, status FROM chat_messages ORDER BY created_at").fetchall()


async def read_until_tokens(client: httpx.AsyncClient, started: asyncio.Event) -> list[SSEEvent]:
    """The whole stream of one question; ``started`` is set once its first token arrives."""
    seen: list[SSEEvent] = []
    async with client.stream("POST", "/api/chat", json={"question": QUESTION}) as response:
        assert response.status_code == 200, await response.aread()
        async for event in events(response):
            seen.append(event)
            if event.event == "token":
                started.set()
    return seen


# -- the drain, driven in-process ---------------------------------------------------------------------


@pytest.mark.slow
async def test_while_draining_questions_get_503_with_retry_after_and_health_says_draining(chat_server: Server) -> None:
    async with chat_server(SHUTDOWN_GRACE_S="5") as (client, _, app):
        assert (await client.get("/health")).status_code == 200
        app.state.drain.begin()
        for path in ("/api/chat", "/api/chat/messages"):
            refused = await client.post(path, json={"question": QUESTION})
            assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
            assert refused.json()["error"]["code"] == "shutting_down"
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert (await client.get("/metrics")).status_code == 200  # scrapers still see the last figures


@pytest.mark.slow
async def test_an_answer_that_ends_within_the_grace_finishes_with_done_and_is_stored_complete(
    chat_server: Server, clean_db: str
) -> None:
    async with chat_server(SHUTDOWN_GRACE_S="30") as (client, fake, app):
        fake.default = Behaviour(text=SHORT, token_delay_s=TOKEN_DELAY_S)
        started = asyncio.Event()
        reader = asyncio.create_task(read_until_tokens(client, started))
        await asyncio.wait_for(started.wait(), timeout=30)
        await app.state.drain.start()
        stream = await reader
    assert [e.event for e in stream][-1] == "done"
    assert answer_text(stream) == SHORT
    user, assistant = stored(clean_db)
    assert (user["role"], user["content"]) == ("user", QUESTION)
    assert (assistant["status"], assistant["content"]) == ("complete", SHORT)


@pytest.mark.slow
async def test_an_answer_still_running_after_the_grace_ends_with_a_retryable_error_and_is_stored_interrupted(
    chat_server: Server, clean_db: str
) -> None:
    async with chat_server(SHUTDOWN_GRACE_S="0.5") as (client, fake, app):
        fake.default = Behaviour(text=LONG, token_delay_s=TOKEN_DELAY_S)
        started = asyncio.Event()
        reader = asyncio.create_task(read_until_tokens(client, started))
        await asyncio.wait_for(started.wait(), timeout=30)
        await app.state.drain.start()
        stream = await reader
        await asyncio.wait_for(fake.closed_early.wait(), timeout=5)  # the upstream request was closed too
    (error,) = of_type(stream, "error")
    assert stream[-1].event == "error" and error["retryable"] is True and error["code"] == "server_restarting"
    partial = answer_text(stream)
    assert partial and LONG.startswith(partial) and partial != LONG
    user, assistant = stored(clean_db)
    assert user["content"] == QUESTION
    assert (assistant["status"], assistant["content"]) == ("interrupted", partial)


# -- the drill: SIGTERM to a real server process with 50 live streams ---------------------------------


@pytest.mark.slow
async def test_sigterm_during_50_live_streams_loses_nothing(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    async with asyncio.timeout(DRILL_LIMIT_S):
        await _drill(demo_index_dir, tmp_path, clean_db)


async def _drill(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> None:
    fake = FakeOpenAI()
    # Half the answers end about a second after they start, well within the grace; half would take 30 s.
    short, long = DRILL_STREAMS // 2, DRILL_STREAMS - DRILL_STREAMS // 2
    fake.then(*[Behaviour(text=SHORT, token_delay_s=TOKEN_DELAY_S)] * short)
    fake.default = Behaviour(text=LONG, token_delay_s=TOKEN_DELAY_S)
    async with serving(fake.app()) as llm_url:
        env = {
            "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")),
            "DATABASE_URL": clean_db,
            "EMBEDDER": "local",
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": f"{llm_url}/v1",
            "SHUTDOWN_GRACE_S": str(DRILL_GRACE_S),
            "RATE_LIMIT_ANON": "1000/hour",
            "MAX_STREAMS_PER_CLIENT": "1000",
            "LOG_LEVEL": "warning",
        }
        log = tmp_path / "server.log"
        async with (
            server_process(env, log) as (process, url),
            httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)) as client,
        ):
            started = [asyncio.Event() for _ in range(DRILL_STREAMS)]
            readers = [asyncio.create_task(read_until_tokens(client, event)) for event in started]
            for event in started:
                await event.wait()  # every answer is streaming before the signal
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            refused = await client.post("/api/chat", json={"question": QUESTION})
            assert refused.status_code == 503 and "retry-after" in refused.headers
            assert (await client.get("/health")).json()["status"] == "draining"
            streams = await asyncio.gather(*readers)
            # Exits within the grace plus the flush uvicorn gets (cli.SHUTDOWN_FLUSH_S), or wait() raises.
            await asyncio.to_thread(process.wait, DRILL_GRACE_S + SHUTDOWN_FLUSH_S + 5)
    output = log.read_text()
    assert "Traceback" not in output, output[-3000:]

    ends = [stream[-1] for stream in streams]
    assert all(sum(e.event in ("done", "error") for e in stream) == 1 for stream in streams)
    finished = [s for s, end in zip(streams, ends, strict=True) if end.event == "done"]
    stopped = [s for s, end in zip(streams, ends, strict=True) if end.event == "error"]
    assert len(finished) == short and len(stopped) == long
    assert all(answer_text(s) == SHORT for s in finished)
    assert all(e.json()["retryable"] and e.json()["code"] == "server_restarting" for e in ends if e.event == "error")

    rows = stored(clean_db)
    assert [r["content"] for r in rows if r["role"] == "user"] == [QUESTION] * DRILL_STREAMS
    by_id = {str(r["id"]): r for r in rows if r["role"] == "assistant"}
    for stream in streams:
        row = by_id[stream[0].json()["message_id"]]
        expected = "complete" if stream[-1].event == "done" else "interrupted"
        assert (row["status"], row["content"]) == (expected, answer_text(stream))
