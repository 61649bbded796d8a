"""Schema-driven fuzz of every route in /openapi.json (schemathesis): no response >= 500, every response as described.

The server runs as its own process (real sockets, Postgres, the demo index). Schemathesis draws each
operation's cases from the document; half of them are then pointed at real objects (a real session with
its token, a real message with its capability, a signed-in reader's JWT, the operator's token), so the
fuzz reaches the deep paths (history, feedback, streams, cancel, the report) and not only the early
refusals. Checks: not a server error, status code and content type and body as documented.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import copy_index
from tests.servers import server_process
from textbook_chat.web.openapi import document

CASES_PER_OPERATION = 24
JWT_SECRET = "fuzz-jwt-secret-long-enough-for-hs256-signing"
ADMIN_TOKEN = "fuzz-admin-" + "a" * 24
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _real_objects(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=30) as client:
        started = client.post("/api/chat/messages", json={"question": "What is the Zero Moment Point?"}).json()
        client.get(started["stream_url"])  # let the answer finish
    message_id = started["message_id"]
    return {
        "session_id": started["session_id"],
        "session_token": started["session_token"],
        "message_id": message_id,
        "cap": started["stream_url"].split("cap=", 1)[1],
        "user_jwt": jwt.encode({"sub": "fuzzer", "exp": int(time.time()) + 3600}, JWT_SECRET, algorithm="HS256"),
    }


def _aim(case: Any, real: dict[str, Any], draw: Any) -> None:
    """Point a generated case at real objects (each part with its own coin), so deep paths are reached."""
    if case.path_parameters and draw(st.booleans()):
        for name in case.path_parameters:
            case.path_parameters[name] = real[name]
    headers = dict(case.headers or {})
    if draw(st.booleans()):
        headers["X-Session-Token"] = real["session_token"]
    auth = draw(st.sampled_from([None, "user", "admin"]))
    if auth == "user":
        headers["Authorization"] = f"Bearer {real['user_jwt']}"
    elif auth == "admin":
        headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    case.headers = headers
    if "cap" in (case.query or {}) and draw(st.booleans()):
        case.query = {**case.query, "cap": real["cap"]}
    if isinstance(case.body, dict) and "session_id" in case.body and draw(st.booleans()):
        case.body = {**case.body, "session_id": real["session_id"], "session_token": real["session_token"]}


def _fuzz(url: str, real: dict[str, Any]) -> dict[str, int]:
    schema = schemathesis.openapi.from_dict(document())
    seen: dict[str, int] = {}
    http = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    # Deleting the real session ends the deep paths of every later case: that operation goes last.
    operations.sort(key=lambda op: (op.method.upper(), op.path) == ("DELETE", "/api/sessions/{session_id}"))
    for operation in operations:

        @settings(
            max_examples=CASES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(), data=st.data())
        def run(case: Any, data: st.DataObject) -> None:
            _aim(case, real, data.draw)
            response = case.call(base_url=url, session=http, timeout=30)
            key = f"{case.method.upper()} {case.path} {response.status_code}"
            seen[key] = seen.get(key, 0) + 1
            case.validate_response(response, checks=CHECKS)

        run()
    return seen


@pytest.mark.slow
async def test_every_route_survives_a_schema_driven_fuzz_and_answers_as_documented(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    env = {
        "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")),
        "DATABASE_URL": clean_db,
        "AUTH_JWT_SECRET": JWT_SECRET,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "RATE_LIMIT_ANON": "100000/hour",
        "RATE_LIMIT_USER": "100000/hour",
        "RATE_LIMIT_READ": "100000/hour",
        "MAX_STREAMS_PER_CLIENT": "1000",
        "EMBEDDER": "local",
        "LOG_FORMAT": "text",
        "LOG_LEVEL": "warning",
    }
    async with server_process(env, tmp_path / "server.log") as (_, url):
        real = await asyncio.to_thread(_real_objects, url)
        seen = await asyncio.to_thread(_fuzz, url, real)

    total = sum(seen.values())
    assert total >= 14 * 10, seen  # a few hundred cases over every operation
    assert not [key for key in seen if key.endswith((" 500", " 502", " 503 "))]
    reached = {key for key in seen if key.split()[-1] in ("200", "202", "204")}
    # The deep paths answered for real at least once: history, feedback, a stream, a cancel, the report.
    for operation in (
        "GET /api/sessions/{session_id}/messages",
        "POST /api/messages/{message_id}/feedback",
        "GET /api/chat/messages/{message_id}/stream",
        "DELETE /api/chat/messages/{message_id}",
        "GET /api/admin/report",
    ):
        assert any(key.startswith(operation + " ") for key in reached), (operation, sorted(seen))
