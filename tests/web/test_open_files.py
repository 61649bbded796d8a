"""Under the usual 1,024 open files, one address holding 1,000 half-sent requests cannot take the server: the
per-address cap is sized from what the limit leaves, so a reader at another address is still answered, and what
is refused is refused cleanly (issue 34). A real server process under ``ulimit -n 1024``."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request

from tests.conftest import TEST_REDIS_URL, demo_env
from tests.servers import server_process
from tests.sse_client import of_type, read_all
from textbook_chat.web import app

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
HALF_SENT = b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def hold_half_sent(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(HALF_SENT)
        held.append(sock)
    return held


def answers_of(held: list[socket.socket]) -> list[bytes]:
    """The first bytes each socket received (b"" for one still waiting or closed without a word)."""
    found = []
    for sock in held:
        sock.settimeout(0.01)
        try:
            found.append(sock.recv(64))
        except (TimeoutError, OSError):
            found.append(b"")
    return found


@pytest.mark.slow
async def test_1000_half_sent_requests_from_one_address_leave_a_reader_at_another_answered(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    env = {
        **demo_env(demo_index_dir, tmp_path, clean_db, None),
        "REDIS_URL": TEST_REDIS_URL,  # as deployed: its pool's connections are open files too
        "RATE_LIMIT_ANON": "1000/hour",
        "LOG_FORMAT": "text",
    }
    log = tmp_path / "server.log"
    async with server_process(env, log, open_files=1024) as (process, url):
        port = httpx.URL(url).port
        assert port is not None
        async with httpx.AsyncClient(base_url=url, timeout=30) as first:  # Postgres and Redis connections opened
            assert of_type(await read_all(first, "POST", "/api/chat", json={"question": QUESTION}), "done")
        held = await asyncio.to_thread(hold_half_sent, port, 1000)
        try:
            await asyncio.sleep(1.0)  # the server has taken them all in
            open_now = len(list(Path(f"/proc/{process.pid}/fd").iterdir()))
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(base_url=url, transport=other, timeout=30) as client:
                assert (await client.get("/health")).status_code == 200
                stream = await read_all(client, "POST", "/api/chat", json={"question": QUESTION})
                page = await client.get("/")
            refused = answers_of(held)
        finally:
            for sock in held:
                sock.close()
    assert open_now < 1000, open_now
    assert of_type(stream, "done")[0]["finish_reason"] == "stop"
    assert page.status_code == 200
    said = log.read_text()
    assert "open files: 1024 allowed" in said and "Too many open files" not in said
    assert not any(a.startswith(b"HTTP/1.1 5") for a in refused)
    assert sum(a.startswith(b"HTTP/1.1 429") for a in refused) >= 500  # the rest were refused, cleanly


async def test_a_request_that_meets_too_many_open_files_is_a_503_not_a_500() -> None:
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""})
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as exc:
            raise RuntimeError("opening the page failed") from exc
    except RuntimeError as wrapped:
        response = await app._unhandled_error(request, wrapped)
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert json.loads(bytes(response.body))["error"]["code"] == "server_busy"
    other = await app._unhandled_error(request, ValueError("a bug"))
    assert other.status_code == 500
