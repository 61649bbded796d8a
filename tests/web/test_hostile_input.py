"""Every input the attack run crashed a request with is now a 4xx with the JSON error shape, and writes nothing.

Real sockets, Postgres and the demo index; each case is one request the hand-made part of the run sent.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import jwt
import psycopg
import pytest

from tests.conftest import copy_index
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

SECRET = "hostile-input-secret-long-enough-for-hs256"
NO_MESSAGE = "/api/chat/messages/00000000-0000-0000-0000-000000000000"


@pytest.fixture
async def client(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings.from_env(
        {
            "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")),
            "DATABASE_URL": clean_db,
            "AUTH_JWT_SECRET": SECRET,
            "LOG_FORMAT": "text",
            "RATE_LIMIT_ANON": "1000/hour",
        }
    )
    async with serving(create_app(settings)) as url, httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


def _rows(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        sessions = conn.execute("SELECT count(*) FROM chat_sessions").fetchone()
        messages = conn.execute("SELECT count(*) FROM chat_messages").fetchone()
    assert sessions is not None and messages is not None
    return sessions[0], messages[0]


def _refused(response: httpx.Response, *statuses: int) -> None:
    assert response.status_code in (statuses or (400,)), (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["code"] and error["message"]
    assert response.headers.get("connection", "").lower() != "close"  # a 4xx keeps the connection


LONE_SURROGATE = '"\\ud800"'


@pytest.mark.parametrize("field", ["question", "selected_text", "module"])
@pytest.mark.slow
async def test_a_lone_surrogate_in_a_chat_field_is_a_400_and_stores_nothing(
    client: httpx.AsyncClient, clean_db: str, field: str
) -> None:
    fields = {"question": '"What is ZMP?"', field: LONE_SURROGATE}
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    for path in ("/api/chat", "/api/chat/messages"):
        response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
        _refused(response)
        assert response.json()["error"]["code"] == "validation_error"
    assert _rows(clean_db) == (0, 0)


@pytest.mark.slow
async def test_a_lone_surrogate_in_a_feedback_comment_is_a_400(client: httpx.AsyncClient) -> None:
    started = (await client.post("/api/chat/messages", json={"question": "What is ZMP?"})).json()
    stream = await client.get(started["stream_url"])
    assert stream.status_code == 200
    response = await client.post(
        f"/api/messages/{started['message_id']}/feedback",
        content='{"rating": "down", "comment": "\\udfff"}',
        headers={"Content-Type": "application/json", "X-Session-Token": started["session_token"]},
    )
    _refused(response)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 30_000 + "]" * 30_000,
        '{"question": ' + "[" * 30_000 + "]" * 30_000 + "}",
        '{"question": "What is ZMP?", "limit": ' + "9" * 5_000 + "}",
    ],
    ids=["nested-30000", "nested-in-a-field", "integer-5000-digits"],
)
@pytest.mark.slow
async def test_json_too_deep_or_a_number_too_long_is_a_400(client: httpx.AsyncClient, body: str) -> None:
    for path in ("/api/chat", "/api/chat/messages"):
        response = await client.post(path, content=body, headers={"Content-Type": "application/json"})
        _refused(response, 400, 413)


@pytest.mark.slow
async def test_non_ascii_digits_are_not_numbers(client: httpx.AsyncClient) -> None:
    started = (await client.post("/api/chat/messages", json={"question": "What is ZMP?"})).json()
    history = f"/api/sessions/{started['session_id']}/messages"
    token = {"X-Session-Token": started["session_token"]}

    _refused(await client.get(history, params={"limit": "²"}, headers=token))
    _refused(await client.get(history, params={"limit": "٣"}, headers=token))
    # A resume point that is not a number starts from the beginning rather than failing.
    header = await client.get(started["stream_url"], headers={b"Last-Event-ID": "²".encode("latin-1")})
    query = await client.get(started["stream_url"] + "&last_event_id=%C2%B2")
    for response in (header, query):
        assert response.status_code == 200 and response.text.startswith("id: 1")


@pytest.mark.parametrize("cap", ["%C2%B2.x", "9" * 5_000 + ".x", "²²²²." + "A" * 32])
@pytest.mark.slow
async def test_a_mangled_capability_is_a_404_on_get_and_delete(client: httpx.AsyncClient, cap: str) -> None:
    _refused(await client.get(f"{NO_MESSAGE}/stream?cap={cap}"), 404)
    _refused(await client.delete(f"{NO_MESSAGE}?cap={cap}"), 404)


async def test_a_nul_in_a_validly_signed_jwt_subject_is_a_401(client: httpx.AsyncClient, clean_db: str) -> None:
    for subject in ("ada\x00admin", "line\nbreak", "\x7f"):
        signed = jwt.encode({"sub": subject, "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")
        headers = {"Authorization": f"Bearer {signed}"}
        _refused(await client.post("/api/chat/messages", json={"question": "What is ZMP?"}, headers=headers), 401)
        _refused(await client.get("/api/sessions", headers=headers), 401)
    assert _rows(clean_db) == (0, 0)


async def test_an_unknown_session_with_odd_ids_is_still_a_clean_404(client: httpx.AsyncClient) -> None:
    odd = str(uuid.uuid4()).replace("-", "")
    _refused(await client.get(f"/api/sessions/{odd}/messages", headers={"X-Session-Token": "t" * 40}), 404)


async def test_a_module_the_index_does_not_have_is_a_400_listing_the_valid_ids(
    client: httpx.AsyncClient, clean_db: str
) -> None:
    valid = [m["id"] for m in (await client.get("/api/modules")).json()["modules"]]
    assert valid
    for path in ("/api/chat", "/api/chat/messages"):
        response = await client.post(path, json={"question": "What is ZMP?", "module": "no-such-module\x1b[2J"})
        _refused(response)
        error = response.json()["error"]
        assert error["code"] == "unknown_module" and all(module in error["message"] for module in valid)
    assert _rows(clean_db) == (0, 0)
    known = await client.post("/api/chat/messages", json={"question": "What is ZMP?", "module": valid[0]})
    assert known.status_code == 202
