"""Fault drills on a running server: a dependency dies mid-answer, readers are told, nothing is lost, and the
server recovers by itself when the dependency comes back (no restart).

Each drill owns what it breaks: a throwaway Postgres cluster (``initdb`` in a temp dir, its own port) and a
throwaway ``redis-server``, both killed with SIGKILL and started again on the same port and data; the fake
LLM stalls and drops; the Qdrant URL points at a closed port, then at one that accepts and never answers.
test_chat.py covers each single failure on a fresh server; these are about kill-and-recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from alembic import command

from tests.conftest import DEMO_BOOK, alembic_config, copy_index
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import free_port, serving
from tests.sse_client import SSEEvent, answer_text, events, of_type, read_all
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
LONG_ANSWER = " ".join(f"w{i}" for i in range(150)) + " [1]."
DRILL_TIMEOUT_S = 60  # each drill ends within this, pass or fail
RECOVERY_TIMEOUT_S = 20  # how long the server may take to notice a dependency is back
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
REDIS_SERVER = shutil.which("redis-server")


@dataclass
class Daemon:
    """A server process we can SIGKILL (with everything it forked) and start again with the same arguments."""

    argv: list[str]
    ready: Callable[[], bool]
    cwd: Path | None = None
    as_user: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    async def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so kill() takes the children too
            user=self.as_user,
            group=pwd.getpwnam(self.as_user).pw_gid if self.as_user else None,
            extra_groups=[] if self.as_user else None,
        )
        for _ in range(300):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.process.returncode}")
            if await asyncio.to_thread(self.ready):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.argv[0]} did not become ready")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _pg_user() -> str | None:
    """initdb and postgres refuse to run as root: run them as ``postgres`` then."""
    return "postgres" if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
async def throwaway_postgres() -> AsyncIterator[tuple[Daemon, str]]:
    """A Postgres cluster of our own (initdb, another port, migrated), yielded with its DATABASE_URL."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        pytest.skip("PostgreSQL server binaries (initdb) are not installed")
    root = Path(tempfile.mkdtemp(prefix="drill-pg-"))
    user = _pg_user()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    try:
        subprocess.run(
            [
                str(PG_BIN / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            cwd=root,
            user=user,
            group=pwd.getpwnam(user).pw_gid if user else None,
            extra_groups=[] if user else None,
            check=True,
            capture_output=True,
        )
        port = free_port()
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"

        def ready() -> bool:
            try:
                psycopg.connect(admin, connect_timeout=1).close()
            except psycopg.OperationalError:
                return False
            return True

        daemon = Daemon(
            [
                str(PG_BIN / "postgres"),
                "-D",
                str(root / "data"),
                "-p",
                str(port),
                "-k",
                str(root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "shared_buffers=16MB",
            ],
            ready,
            cwd=root,
            as_user=user,
        )
        await daemon.start()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE textbook")
        url = f"postgresql://postgres@127.0.0.1:{port}/textbook"
        command.upgrade(alembic_config(url), "head")
        try:
            yield daemon, url
        finally:
            daemon.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def throwaway_redis() -> AsyncIterator[tuple[Daemon, str]]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def ready() -> bool:
        try:
            return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    daemon = Daemon(argv, ready)
    await daemon.start()
    try:
        yield daemon, url
    finally:
        daemon.kill()


Drill = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, FakeOpenAI]]]


@pytest.fixture
def drill_server(demo_index_dir: Path, tmp_path: Path) -> Drill:
    """``async with drill_server(**env) as (client, fake)``: the app on a real socket with the demo index."""

    @asynccontextmanager
    async def start(**env: str) -> AsyncIterator[tuple[httpx.AsyncClient, FakeOpenAI]]:
        fake = FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.01))
        async with serving(fake.app()) as llm_url:
            values = {
                "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
                "BOOK_FAQ_PATH": str(DEMO_BOOK / "faq.json"),  # what answers while the index is unreachable
                "LOG_FORMAT": "text",
                "EMBEDDER": "local",
                "OPENAI_API_KEY": "sk-test",
                "OPENAI_BASE_URL": f"{llm_url}/v1",
                "LLM_TIMEOUT_S": "1",
                "DB_TIMEOUT_S": "0.5",
                "QDRANT_TIMEOUT_S": "0.5",
                "STREAM_GRACE_S": "5",
                "RATE_LIMIT_ANON": "1000/hour",
                "MAX_STREAMS_PER_CLIENT": "20",
                **env,
            }
            async with (
                serving(create_app(Settings.from_env(values))) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as client,
            ):
                yield client, fake

    return start


async def ask(client: httpx.AsyncClient, question: str = QUESTION, **fields: Any) -> list[SSEEvent]:
    return await read_all(client, "POST", "/api/chat", json={"question": question, **fields})


async def ask_while(
    client: httpx.AsyncClient, after_tokens: int, fault: Callable[[], object], question: str = QUESTION
) -> list[SSEEvent]:
    """Ask, and call ``fault`` once ``after_tokens`` token events have arrived; read the stream to its end."""
    seen: list[SSEEvent] = []
    async with client.stream("POST", "/api/chat", json={"question": question}) as response:
        assert response.status_code == 200
        async for event in events(response):
            seen.append(event)
            if event.event == "token" and sum(e.event == "token" for e in seen) == after_tokens:
                fault()
    return seen


def notices(stream: list[SSEEvent]) -> list[str]:
    return [n["code"] for n in of_type(stream, "notice")]


def ended_well(stream: list[SSEEvent]) -> bool:
    """ids 1..n, and exactly one terminal event, last: a ``done`` or a retryable ``error``."""
    kinds = [e.event for e in stream]
    ids_in_order = [e.id for e in stream] == [str(i) for i in range(1, len(stream) + 1)]
    terminal = kinds.count("done") + kinds.count("error") == 1 and kinds[-1] in ("done", "error")
    retryable = all(e["retryable"] for e in of_type(stream, "error"))
    return ids_in_order and terminal and retryable


async def until(check: Callable[[], Any], what: str) -> None:
    """Poll ``check`` (sync or async) until it is truthy, at most RECOVERY_TIMEOUT_S."""
    try:
        async with asyncio.timeout(RECOVERY_TIMEOUT_S):
            while True:
                result = check()
                if asyncio.iscoroutine(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"{what} (waited {RECOVERY_TIMEOUT_S} s)") from None


async def service_status(client: httpx.AsyncClient, name: str) -> str:
    status: str = (await client.get("/health")).json()["services"][name]
    return status


async def is_ok(client: httpx.AsyncClient, name: str) -> bool:
    return await service_status(client, name) == "ok"


def stored(database_url: str, message_id: str) -> tuple[str, str] | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT content, status FROM chat_messages WHERE id = %s", (message_id,)).fetchone()
    return None if row is None else (row[0], row[1])


# -- Postgres ------------------------------------------------------------------------------------------


async def test_postgres_killed_mid_answer_then_restarted(
    drill_server: Drill, throwaway_postgres: tuple[Daemon, str]
) -> None:
    postgres, database_url = throwaway_postgres
    async with asyncio.timeout(DRILL_TIMEOUT_S), drill_server(DATABASE_URL=database_url) as (client, fake):
        before = await ask(client)
        killed_during = await ask_while(client, 5, postgres.kill)
        during = await ask(client)
        assert await service_status(client, "postgres") == "down"

        await postgres.start()
        await until(lambda: is_ok(client, "postgres"), "postgres never came back")

        async def back_in_history() -> bool:
            return "history_unavailable" not in notices(await ask(client))

        await until(back_in_history, "answers are still not stored after Postgres came back")
        after = await ask(client)
        # The answer that was streaming when Postgres died is stored once it is back.
        interrupted_id = killed_during[0].json()["message_id"]
        await until(lambda: stored(database_url, interrupted_id) == (LONG_ANSWER, "complete"), "answer lost")
        # So is the question asked while it was away, with its answer: nothing a reader wrote is lost.
        asked_during = during[0].json()["message_id"]
        await until(lambda: stored(database_url, asked_during) == (LONG_ANSWER, "complete"), "question lost")

    for stream in (before, killed_during, during, after):
        assert ended_well(stream) and of_type(stream, "done")[0]["finish_reason"] == "stop"
        assert answer_text(stream) == LONG_ANSWER  # the answer itself never depended on Postgres
    # While Postgres was away the reader was told the conversation is not saved; before and after, it is.
    assert "history_unavailable" in notices(during)
    assert "history_unavailable" not in notices(before) + notices(after)
    for stream in (before, after):
        assert stored(database_url, stream[0].json()["message_id"]) == (LONG_ANSWER, "complete")


async def test_a_sigterm_while_postgres_is_down_keeps_the_answer_for_the_next_start(
    throwaway_postgres: tuple[Daemon, str], demo_index_dir: Path, tmp_path: Path
) -> None:
    from tests.servers import server_process

    postgres, database_url = throwaway_postgres
    fake = FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.01))
    data = copy_index(demo_index_dir, tmp_path / "data")
    async with asyncio.timeout(DRILL_TIMEOUT_S), serving(fake.app()) as llm_url:
        env = {
            "DATA_DIR": str(data),
            "DATABASE_URL": database_url,
            "EMBEDDER": "local",
            "LOG_FORMAT": "text",
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": f"{llm_url}/v1",
            "SHUTDOWN_GRACE_S": "1",
        }
        async with server_process(env, tmp_path / "a.log") as (process, url):
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                stream = await ask_while(client, 5, postgres.kill)  # the question is stored; the answer cannot be
            process.terminate()  # SIGTERM with the answer waiting for Postgres
            await asyncio.to_thread(process.wait, 30)
        spilled = [path.read_text() for path in (data / "pending-writes").glob("*.jsonl")]
        message_id = stream[0].json()["message_id"]

        await postgres.start()
        assert stored(database_url, message_id) == ("", "streaming")
        async with server_process(env, tmp_path / "b.log"):
            await until(lambda: stored(database_url, message_id) == (LONG_ANSWER, "complete"), "spilled answer lost")
        leftover = list((data / "pending-writes").glob("*.jsonl"))

    assert answer_text(stream) == LONG_ANSWER and of_type(stream, "done")
    assert len(spilled) == 1 and message_id in spilled[0]
    assert "kept in" in (tmp_path / "a.log").read_text()
    assert leftover == []


# -- Redis ---------------------------------------------------------------------------------------------


async def test_redis_killed_mid_answer_then_restarted(
    drill_server: Drill, throwaway_redis: tuple[Daemon, str], clean_db: str
) -> None:
    daemon, redis_url = throwaway_redis
    async with (
        asyncio.timeout(DRILL_TIMEOUT_S),
        drill_server(DATABASE_URL=clean_db, REDIS_URL=redis_url) as (client, fake),
    ):
        killed_during = await ask_while(client, 5, daemon.kill)
        during = await ask(client)  # rate limits and stream slots fall back to this process
        assert await service_status(client, "redis") == "down"

        await daemon.start()  # empty: --save '' keeps nothing
        await until(lambda: is_ok(client, "redis"), "redis never came back")
        after = await ask(client)
        after_id = after[0].json()["message_id"]
        mirrored = redis.Redis.from_url(redis_url)
        # The relay writes to Redis again: another worker could resume this answer from there.
        await until(lambda: mirrored.xlen(f"tc:events:{after_id}") == len(after), "events are not mirrored again")
        resumed = await read_all(client, "GET", after[0].json()["stream_url"], headers={"Last-Event-ID": "2"})

    for stream in (killed_during, during, after):
        assert ended_well(stream) and of_type(stream, "done")[0]["finish_reason"] == "stop"
        assert answer_text(stream) == LONG_ANSWER
        assert stored(clean_db, stream[0].json()["message_id"]) == (LONG_ANSWER, "complete")
    assert [e.id for e in resumed] == [str(i) for i in range(3, len(after) + 1)]


# -- the LLM -------------------------------------------------------------------------------------------


async def test_the_llm_stalls_and_drops_mid_answer_then_recovers(drill_server: Drill, clean_db: str) -> None:
    async with asyncio.timeout(DRILL_TIMEOUT_S), drill_server(DATABASE_URL=clean_db) as (client, fake):
        fake.then(
            Behaviour(text=LONG_ANSWER, stall_after_tokens=10, stall_s=5),  # hangs past LLM_TIMEOUT_S
            Behaviour(text=LONG_ANSWER, drop_after_tokens=10),  # the connection breaks
        )
        stalled = await ask(client)
        dropped = await ask(client)
        after = await ask(client)

    for stream in (stalled, dropped):
        assert ended_well(stream)
        # The reader keeps what the model said and is told the rest comes from the book.
        assert answer_text(stream).startswith(" ".join(f"w{i}" for i in range(10)))
        assert "offline_generator" in notices(stream) or of_type(stream, "error")
    assert ended_well(after) and notices(after) == [] and answer_text(after) == LONG_ANSWER
    for stream in (stalled, dropped, after):
        content, status = stored(clean_db, stream[0].json()["message_id"]) or ("", "missing")
        assert content == answer_text(stream) and status in ("complete", "failed")
    assert fake.streams_closed_early >= 2 and fake.streams_completed == 1


# -- Qdrant --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def black_hole(port: int) -> Iterator[None]:
    """A listener that accepts connections and never answers (a hung Qdrant)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        yield


async def test_qdrant_unreachable_or_hung_answers_from_the_faq_and_keeps_history(
    drill_server: Drill, clean_db: str
) -> None:
    port = free_port()  # closed: nothing listens there
    async with (
        asyncio.timeout(DRILL_TIMEOUT_S),
        drill_server(DATABASE_URL=clean_db, QDRANT_URL=f"http://127.0.0.1:{port}") as (client, fake),
    ):
        closed = [await ask(client, "How do I install ROS 2?") for _ in range(3)]
        health_closed = (await client.get("/health")).json()
        with black_hole(port):
            hung = await ask(client, "How do I install ROS 2?")
            health_hung = await client.get("/health")
            started = time.monotonic()
            faq = await client.get("/api/faq")  # the panel's suggestions: never waiting on the hung index
            faq_s = time.monotonic() - started

    for stream in [*closed, hung]:
        assert ended_well(stream) and notices(stream) == ["fallback_faq"]
        assert of_type(stream, "done")[0]["finish_reason"] == "fallback" and "ROS 2" in answer_text(stream)
        assert stored(clean_db, stream[0].json()["message_id"]) == (answer_text(stream), "complete")
    assert fake.requests == []  # no paid generation without sources
    assert health_closed["status"] == "degraded" and health_closed["services"]["qdrant"] == "down"
    assert health_hung.status_code == 200 and health_hung.json()["services"]["qdrant"] == "down"
    assert faq.status_code == 200 and faq_s < 0.5  # under QDRANT_TIMEOUT_S: it did not wait for the index
    assert "How do I install ROS 2?" in [e["question"] for e in faq.json()["entries"]]


# -- a burst of questions on a small database pool -----------------------------------------------------


async def test_a_burst_on_a_small_pool_stores_every_question_and_answer(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    from tests.servers import server_process

    burst = 300
    fake = FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.005))  # the answers end close together
    env = {
        "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")),
        "DATABASE_URL": clean_db,
        # The queue is the point: 300 questions and 300 answers through 2 connections, with queries
        # allowed 1 s each (a query on a core another test worker shares can take a few tenths); waiting for a
        # connection, which takes far longer here, is not a query timing out.
        "DB_POOL_SIZE": "2",
        "DB_TIMEOUT_S": "1",
        "RATE_LIMIT_ANON": "100000/hour",
        "MAX_STREAMS_PER_CLIENT": "100000",
        "EMBEDDER": "local",
        "LOG_FORMAT": "text",
        "OPENAI_API_KEY": "sk-test",
    }
    async with (
        serving(fake.app()) as llm_url,
        server_process({**env, "OPENAI_BASE_URL": f"{llm_url}/v1"}, tmp_path / "server.log") as (_, url),
    ):
        limits = httpx.Limits(max_connections=burst)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            streams = await asyncio.gather(
                *(read_all(client, "POST", "/api/chat", json={"question": QUESTION}) for _ in range(burst))
            )
    answers_seen = sum(1 for s in streams if of_type(s, "done"))
    with psycopg.connect(clean_db) as conn:
        questions = conn.execute("SELECT count(*) FROM chat_messages WHERE role = 'user'").fetchone()
        answers = conn.execute(
            "SELECT count(*) FROM chat_messages WHERE role = 'assistant' AND status = 'complete' AND content <> ''"
        ).fetchone()
    assert answers_seen == burst
    assert questions == (burst,) and answers == (burst,)  # rows in Postgres = questions asked = answers seen
    assert not [n for s in streams for n in of_type(s, "notice") if n["code"] == "history_unavailable"]
