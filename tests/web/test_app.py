"""The app shell: JSON errors for every failure, request ids, body limits and /health."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import CLOSED_PORT_PG_URL, TEST_REDIS_URL, copy_index, create_database, demo_env, drop_database
from tests.servers import serving
from tests.sse_client import of_type, read_all
from textbook_chat import __version__
from textbook_chat.core.settings import Settings
from textbook_chat.store import migrate
from textbook_chat.web.app import create_app


def _assert_json_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    if code:
        assert body["error"]["code"] == code
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"]


@pytest.fixture
async def client(settings: Settings):
    app = create_app(settings)

    async def boom(request: Request) -> Response:
        raise RuntimeError("secret internals")

    app.add_route("/boom", boom)
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        yield client


async def test_unknown_route_is_a_json_404(client: httpx.AsyncClient) -> None:
    _assert_json_error(await client.get("/nope"), 404, "not_found")


async def test_wrong_method_is_a_json_405(client: httpx.AsyncClient) -> None:
    _assert_json_error(await client.delete("/health"), 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b"[1, 2]", "validation_error"),
        (b'{"rating": 5}', "validation_error"),
        (b'{"rating": "sideways"}', "validation_error"),
        (b'{"rating": "up", "extra": 1}', "validation_error"),
    ],
)
@pytest.mark.slow
async def test_malformed_json_and_wrong_types_are_json_400s(client: httpx.AsyncClient, body: bytes, code: str) -> None:
    response = await client.post(
        "/api/messages/6f1c1a4e-8a7e-4d0e-9a57-0a8d0c9f3c11/feedback",
        content=body,
        headers={"content-type": "application/json"},
    )
    _assert_json_error(response, 400, code)


async def test_a_one_mebibyte_body_is_a_json_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/messages/x/feedback", content=b"x" * (1024 * 1024))
    _assert_json_error(response, 413, "payload_too_large")


async def test_a_chunked_body_over_the_limit_is_a_json_413(client: httpx.AsyncClient) -> None:
    async def chunks():
        for _ in range(100):
            yield b"y" * 1024

    response = await client.post(
        "/api/messages/6f1c1a4e-8a7e-4d0e-9a57-0a8d0c9f3c11/feedback",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    _assert_json_error(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx"],
)
@pytest.mark.slow
async def test_a_post_that_is_not_declared_json_is_a_415_before_anything_is_spent(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/api/chat", "/api/chat/messages", "/api/messages/6f1c1a4e-8a7e-4d0e-9a57-0a8d0c9f3c11/feedback"):
        request = client.build_request("POST", path, content=b'{"question": "What is ZMP?"}', headers=headers)
        assert content_type is not None or "content-type" not in request.headers
        response = await client.send(request)
        _assert_json_error(response, 415, "unsupported_media_type")
        assert "ratelimit-remaining" not in response.headers


async def test_json_with_a_charset_is_still_json(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/api/messages/6f1c1a4e-8a7e-4d0e-9a57-0a8d0c9f3c11/feedback",
        content=b'{"rating": "up"}',
        headers={"Content-Type": "Application/JSON; charset=utf-8"},
    )
    assert response.status_code != 415


async def test_a_one_mebibyte_header_is_a_json_431(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/modules", headers={"X-Padding": "p" * (1024 * 1024)})
    _assert_json_error(response, 431, "request_headers_too_large")
    many = await client.get("/api/modules", headers=[(f"X-Pad-{i}", "p" * 100) for i in range(400)])
    _assert_json_error(many, 431, "request_headers_too_large")


async def test_an_unhandled_error_is_a_500_without_internals_and_logged_with_the_request_id(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        response = await client.get("/boom", headers={"X-Request-ID": "req-abc123"})
    _assert_json_error(response, 500, "internal_error")
    assert "secret internals" not in response.text
    assert response.headers["x-request-id"] == "req-abc123"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].request_id == "req-abc123" and errors[0].exc_info is not None  # type: ignore[attr-defined]


async def test_every_request_gets_an_id_and_one_access_log_line(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="server.access"):
        response = await client.get("/nope", headers={"X-Request-ID": "bad id with spaces"})
    request_id = response.headers["x-request-id"]
    assert request_id != "bad id with spaces" and len(request_id) == 32
    lines = [r for r in caplog.records if r.name == "server.access"]
    assert len(lines) == 1 and lines[0].request_id == request_id and lines[0].status == 404  # type: ignore[attr-defined]
    assert lines[0].exc_info is None


async def test_health_is_ok_with_the_local_postgres_and_redis(database_url: str, tmp_path) -> None:
    settings = Settings.from_env({"DATABASE_URL": database_url, "REDIS_URL": TEST_REDIS_URL, "DATA_DIR": str(tmp_path)})
    async with serving(create_app(settings)) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        response = await client.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["services"]["postgres"] == "ok" and body["services"]["redis"] == "ok"
    assert body["services"]["llm"] == "offline"
    assert body["version"] == __version__  # the one version: the wheel's and the panel's too (test_packaging.py)


async def test_health_is_degraded_but_200_and_fast_when_dependencies_are_down(tmp_path) -> None:
    settings = Settings.from_env(
        {"DATABASE_URL": CLOSED_PORT_PG_URL, "REDIS_URL": "redis://127.0.0.1:1/0", "DATA_DIR": str(tmp_path)}
    )
    async with serving(create_app(settings)) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        started = time.monotonic()
        response = await client.get("/health")
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.json()["status"] == "degraded"
    assert response.json()["services"]["postgres"] == "down"
    assert response.json()["services"]["redis"] == "down"
    assert elapsed < 1.0


@pytest.fixture
def unmigrated_db() -> Iterator[str]:
    url = create_database("textbook_unmigrated")
    yield url
    drop_database(url)


@pytest.mark.slow
async def test_an_unmigrated_database_is_degraded_health_and_questions_are_answered_without_history(
    unmigrated_db: str, demo_index_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {**demo_env(demo_index_dir, tmp_path, unmigrated_db, None), "SHUTDOWN_GRACE_S": "1"}
    with caplog.at_level(logging.WARNING):
        async with serving(create_app(Settings.from_env(env))) as base_url:
            async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
                health = (await client.get("/health")).json()
                stream = await read_all(client, "POST", "/api/chat", json={"question": "What is a humanoid robot?"})
                posted = await client.post("/api/chat/messages", json={"question": "What is a humanoid robot?"})
                migrate.upgrade(unmigrated_db)  # the operator runs `migrate`: health is ok again
                after = (await client.get("/health")).json()
                for _ in range(100):  # and the answers that waited are written (the writer backs off up to 5 s)
                    if _count_messages(unmigrated_db) == 4:
                        break
                    await asyncio.sleep(0.1)
    assert health["status"] == "degraded" and health["services"]["postgres"] == "migrations_pending"
    assert after["services"]["postgres"] == "ok"
    assert stream[-1].event == "done" and "history_unavailable" in [e["code"] for e in of_type(stream, "notice")]
    assert posted.status_code == 202
    assert _count_messages(unmigrated_db) == 4  # two questions, two answers
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def _count_messages(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM chat_messages").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.slow
async def test_the_served_app_warms_retrieval_and_freezes_its_start_up_heap(
    demo_index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first reader does not wait for the model to load, and no garbage collection walks what start-up
    loaded (those walks paused the event loop 90-170 ms under load)."""
    monkeypatch.setenv("DATA_DIR", str(copy_index(demo_index_dir, tmp_path / "data")))
    monkeypatch.setenv("EMBEDDER", "local")
    gc.unfreeze()
    caplog.set_level(logging.INFO, logger="textbook_chat.web.app")
    try:
        async with serving(create_app(configure_logging=False, handle_sigterm=False)):
            assert gc.get_freeze_count() > 10_000
            assert any(r.getMessage().startswith("retrieval warmed in") for r in caplog.records)
    finally:
        gc.unfreeze()


async def _cut_off(base_url: str, path: str, body: bytes = b"{") -> None:
    """A request whose body stops short of its Content-Length, then the socket closes."""
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()


def _requests_by_status(metrics_text: str, route: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "textbook_http_requests_total" and sample.labels["route"] == route:
                counts[sample.labels["status"]] = counts.get(sample.labels["status"], 0) + sample.value
    return counts


async def test_a_body_cut_off_mid_way_is_no_server_error_in_the_metrics_or_the_log(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    before = _requests_by_status((await client.get("/metrics")).text, "/api/chat")
    with caplog.at_level(logging.INFO):
        await asyncio.gather(*[_cut_off(str(client.base_url), "/api/chat") for _ in range(20)])
        for _ in range(100):
            after = _requests_by_status((await client.get("/metrics")).text, "/api/chat")
            if sum(after.values()) - sum(before.values()) >= 20:
                break
            await asyncio.sleep(0.05)
    assert after.get("499", 0) - before.get("499", 0) == 20
    assert {s for s in after if s.startswith("5") and after[s] != before.get(s, 0)} == set()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


@pytest.mark.slow
def test_a_server_without_redis_never_loads_the_redis_client(demo_index_dir: Path, tmp_path: Path) -> None:
    # redis-py costs ~6 MB of a server's memory at start; one that has no REDIS_URL has no use for it.
    code = (
        "import asyncio, os, sys\n"
        "from textbook_chat.core.settings import Settings\n"
        "from textbook_chat.web.app import create_app\n"
        "from textbook_chat.web.services import open_services\n"
        "async def main():\n"
        "    async with open_services(Settings.from_env(), chat=True) as services:\n"
        "        assert services.chat is not None and services.limiter is not None\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))\n"
    )
    data_dir = copy_index(demo_index_dir, tmp_path / "data")
    env = {"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "error", "REDIS_URL": "", "DATABASE_URL": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
