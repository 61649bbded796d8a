"""web/sockets.py: sockets that trickle their headers or body are closed at their deadline while normal questions
are answered, one peer's unfinished requests are capped (its open streams are not), and what uvicorn answers
itself has the JSON error shape (issue 25). Real sockets against the app with the demo index; short deadlines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import pytest

from tests.conftest import demo_env
from tests.servers import serving
from tests.sse_client import read_all
from textbook_chat.core import metrics
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app
from textbook_chat.web.sockets import MAX_HEAD_BYTES, MAX_QUEUED, SocketGuard

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
DEADLINE_S = 0.6


Served = Callable[[SocketGuard], AbstractAsyncContextManager[str]]


@pytest.fixture
def served(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> Served:
    """``async with served(guard) as url``: the chat app (offline generator) behind ``guard``."""

    def start(guard: SocketGuard) -> AbstractAsyncContextManager[str]:
        env = {**demo_env(demo_index_dir, tmp_path, clean_db, None), "RATE_LIMIT_ANON": "1000/hour"}
        return serving(create_app(Settings.from_env(env)), guard=guard)

    return start


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parsed = httpx.URL(url)
    return await asyncio.open_connection(parsed.host, parsed.port)


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed. A close that finds a drip still unread in the server's socket goes out
    as a reset, which ``reader.read()`` would raise with the answer already received: kept, as a client keeps it."""
    received = bytearray()
    try:
        while chunk := await reader.read(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return bytes(received)


async def _trickle(url: str, head: bytes, drip: bytes, *, every_s: float = 0.1) -> tuple[float, bytes]:
    """Send ``head``, then ``drip`` every ``every_s`` until the server closes; (seconds open, what it answered)."""
    reader, writer = await _connect(url)
    started = time.monotonic()
    writer.write(head)
    answer = asyncio.create_task(_read_until_closed(reader))
    try:
        while not answer.done() and time.monotonic() - started < 10:
            await asyncio.sleep(every_s)
            if not writer.is_closing():
                writer.write(drip)
                try:
                    await writer.drain()
                except ConnectionError:
                    break
        received = await asyncio.wait_for(answer, timeout=10)
    finally:
        writer.close()
    return time.monotonic() - started, received


def _closed(reason: str) -> float:
    return metrics.SOCKETS_CLOSED.labels(reason)._value.get()  # type: ignore[no-any-return]


@pytest.mark.slow
async def test_slow_headers_and_slow_bodies_are_closed_at_their_deadline_while_a_question_is_answered(
    served: Served,
) -> None:
    guard = SocketGuard(header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S)
    before = (_closed("header_timeout"), _closed("body_timeout"))
    async with served(guard) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        slow_head = [_trickle(url, b"GET /api/modules HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n") for _ in range(60)]
        body_head = (
            b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
        )
        slow_body = [_trickle(url, body_head + b'{"question": "', b"a") for _ in range(30)]
        drill = asyncio.gather(*slow_head, *slow_body)
        await asyncio.sleep(0.1)
        answer = await read_all(client, "POST", "/api/chat", json={"question": QUESTION})
        results = await drill
        assert (await client.get("/health")).status_code == 200  # the server is fine afterwards
    assert answer[-1].event == "done"
    heads, bodies = results[:60], results[60:]
    assert max(seconds for seconds, _ in results) < DEADLINE_S + 1.0
    for _, received in heads:
        status, _, payload = received.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408") and json.loads(payload)["error"]["code"] == "request_timeout"
    assert all(b"HTTP/1.1 5" not in received for _, received in bodies)
    assert (_closed("header_timeout") - before[0], _closed("body_timeout") - before[1]) == (60, 30)
    assert guard.pending == {}  # nothing counted for a socket that is gone


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(served: Served) -> None:
    async with served(SocketGuard(header_timeout_s=DEADLINE_S)) as url:
        reader, writer = await _connect(url)
        started = time.monotonic()
        received = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
    assert received.startswith(b"HTTP/1.1 408") and time.monotonic() - started < DEADLINE_S + 0.5


@pytest.mark.slow
async def test_a_kept_alive_connection_serves_requests_slower_than_the_deadline_apart(served: Served) -> None:
    guard = SocketGuard(header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S)
    async with served(guard) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            first = await client.get("/api/modules")
            await asyncio.sleep(DEADLINE_S + 0.4)  # idle between requests: uvicorn's keep-alive, not a deadline
            second = await client.post("/api/chat/messages", json={"question": QUESTION})
            third = await client.get("/api/modules")
    assert (first.status_code, second.status_code, third.status_code) == (200, 202, 200)
    assert first.extensions["network_stream"] is third.extensions["network_stream"]  # one connection throughout
    assert guard.pending == {}  # every request whole, none counted any more


@pytest.mark.slow
async def test_one_peers_unfinished_requests_are_capped_but_its_open_streams_are_not(served: Served) -> None:
    cap = 5
    async with served(SocketGuard(header_timeout_s=60, max_pending_per_peer=cap)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            created = [(await client.post("/api/chat/messages", json={"question": QUESTION})).json() for _ in range(3)]
            streams = [client.stream("GET", c["stream_url"]) for c in created * 4]  # 12 streams > cap
            opened = [await s.__aenter__() for s in streams]
            assert all(r.status_code == 200 for r in opened)
            idle = [await _connect(url) for _ in range(cap)]
            await asyncio.sleep(0.1)
            refused_reader, refused_writer = await _connect(url)
            refused = await asyncio.wait_for(refused_reader.read(), timeout=5)
            refused_writer.close()
            for _, writer in idle:
                writer.close()
            await asyncio.sleep(0.1)
            after = await client.get("/api/modules")  # a new connection once the unfinished ones are gone
            for stream in streams:
                await stream.__aexit__(None, None, None)
    head, _, payload = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429") and b"retry-after: 5" in head
    assert json.loads(payload)["error"]["code"] == "too_many_connections" and after.status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /api/modules HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET /api/modules?" + b"&".join(b"p%d=1" % i for i in range(10_000)) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["malformed-request-line", "malformed-header", "10000-query-parameters"],
)
@pytest.mark.slow
async def test_what_uvicorn_refuses_itself_has_the_json_error_shape(served: Served, request_bytes: bytes) -> None:
    async with served(SocketGuard()) as url:
        reader, writer = await _connect(url)
        writer.write(request_bytes)
        received = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] in (b"400", b"414", b"431"), head
    assert b"content-type: application/json" in head.lower() and set(json.loads(payload)["error"]) == {
        "code",
        "message",
    }


async def test_a_head_over_the_limit_is_a_json_431_before_it_is_whole(served: Served) -> None:
    async with served(SocketGuard()) as url:
        reader, writer = await _connect(url)
        writer.write(b"GET /api/modules HTTP/1.1\r\nHost: x\r\n")
        for _ in range(MAX_HEAD_BYTES // 1000 + 2):
            writer.write(b"X-Pad: " + b"p" * 1000 + b"\r\n")
            await writer.drain()
        received = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
    assert received.startswith(b"HTTP/1.1 431") and b"request_headers_too_large" in received


@pytest.mark.slow
async def test_132_kb_of_pipelined_small_requests_in_one_write_are_all_answered_in_order(served: Served) -> None:
    """Each head is small; together they are twice MAX_HEAD_BYTES in one read (once a false 431), and more than
    MAX_QUEUED at once (the rest is parsed as the queue drains, not all at once)."""
    one = b"GET /health?pad=" + b"p" * 280 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    count = 132_000 // len(one) + 1
    async with served(SocketGuard()) as url:
        reader, writer = await _connect(url)
        writer.write(one * (count - 1) + one.replace(b"Host: x", b"Host: x\r\nConnection: close"))
        await writer.drain()
        received = await asyncio.wait_for(reader.read(), timeout=60)
        writer.close()
    assert count * len(one) > 2 * MAX_HEAD_BYTES and count > MAX_QUEUED
    assert received.count(b"HTTP/1.1 200 OK") == count, received[:300]
    assert b"HTTP/1.1 431" not in received


async def test_the_guard_adds_no_instance_dict_of_its_own_to_a_connection() -> None:
    """Each open connection (an idle SSE reader) holds a protocol object: the guard's fields go into slots, so
    uvicorn's key-sharing instance dict stays as small as without the guard."""
    import sys

    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.server import ServerState

    from textbook_chat.web.sockets import GuardedProtocol

    config = Config(app=create_app(Settings.from_env({"LOG_FORMAT": "text"})))
    config.load()
    plain = HttpToolsProtocol(config, ServerState(), {})
    guarded = GuardedProtocol(config, ServerState(), {}, guard=SocketGuard())
    assert guarded.__dict__.keys() == plain.__dict__.keys()
    # Shared keys: a few hundred bytes either way; a dict of its own would be five times that.
    assert sys.getsizeof(guarded.__dict__) < 2 * sys.getsizeof(plain.__dict__)
