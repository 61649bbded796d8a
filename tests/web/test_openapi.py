"""/openapi.json describes exactly the app's routes, and 2,000 generated requests never break the server.

The fuzz run reads the document itself: every described operation gets hypothesis-generated paths,
query strings, headers and bodies (valid-looking and hostile), against a real socket.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from tests.conftest import copy_index
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app
from textbook_chat.web.openapi import document

FUZZ_REQUESTS = 2000


def test_every_route_of_the_app_is_in_the_document_and_nothing_else() -> None:
    app = create_app(Settings.from_env({"LOG_FORMAT": "text"}))
    served = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route)
        and (route.path.startswith("/api/") or route.path in ("/health", "/metrics", "/openapi.json"))
        for method in (route.methods or ())
        if method != "HEAD"
    }
    described = {(path, method) for path, operations in document()["paths"].items() for method in operations}
    assert served == described


def test_the_document_is_openapi_3_1_with_resolvable_references() -> None:
    doc = document()
    assert doc["openapi"] == "3.1.0"
    text = json.dumps(doc)
    for ref in {part.split('"')[0] for part in text.split('"$ref": "')[1:]}:
        node: Any = doc
        for key in ref.removeprefix("#/").split("/"):
            node = node[key]
        assert isinstance(node, dict)


def _operations() -> list[tuple[str, str]]:
    return [(path, method) for path, ops in document()["paths"].items() for method in ops]


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_chat_body = st.fixed_dictionaries(
    {"question": st.one_of(_text, st.integers(), st.none())},
    optional={
        "session_id": st.one_of(st.uuids().map(str), _text),
        "session_token": _text,
        "module": st.one_of(_text, st.just("02-ros2")),
        "selected_text": _text,
        "client_request_id": st.one_of(st.uuids().map(str), _text),
        "extra": _json_value,
    },
)
_body = st.one_of(
    _chat_body.map(lambda b: json.dumps(b).encode()),
    st.fixed_dictionaries({"rating": st.one_of(st.sampled_from(["up", "down"]), _text)}).map(
        lambda b: json.dumps(b).encode()
    ),
    _json_value.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)
_path_value = st.one_of(
    st.uuids().map(str), st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=20)
)
_headers = st.fixed_dictionaries(
    {},
    optional={
        "X-Session-Token": st.text(st.characters(codec="ascii", min_codepoint=33, max_codepoint=126), max_size=40),
        "Authorization": st.sampled_from(["Bearer x", "Bearer a.b.c", "Basic zz", "Bearer"]),
        "Last-Event-ID": st.sampled_from(["1", "999999", "-1", "abc", ""]),
        "X-Forwarded-For": st.sampled_from(["1.2.3.4", "garbage", "::1, 10.0.0.1"]),
        "Content-Type": st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
    },
)


@pytest.fixture
async def fuzz_client(demo_index_dir: Path, tmp_path: Path, clean_db: str):
    env = {
        "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")),
        "DATABASE_URL": clean_db,
        "AUTH_JWT_SECRET": "fuzz-secret-long-enough-for-hs256-signing",
        "RATE_LIMIT_ANON": "20/hour",
        "RATE_LIMIT_READ": "100000/hour",
        "LOG_FORMAT": "text",
        "LOG_LEVEL": "error",
    }
    async with (
        serving(create_app(Settings.from_env(env))) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield client


@pytest.mark.slow
async def test_generated_requests_never_get_a_5xx_or_a_traceback(fuzz_client: httpx.AsyncClient) -> None:
    import random

    rng = random.Random(20261122)
    operations = _operations()
    statuses: dict[int, int] = {}
    request_strategy = st.tuples(st.sampled_from(operations), _path_value, _body, _headers, _text)

    @settings(
        max_examples=FUZZ_REQUESTS,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request_strategy)
    def generate(example: tuple[tuple[str, str], str, bytes, dict[str, str], str]) -> None:
        examples.append(example)

    examples: list[tuple[tuple[str, str], str, bytes, dict[str, str], str]] = []
    generate()
    assert len(examples) >= FUZZ_REQUESTS
    for (path, method), value, body, headers, query in examples:
        url = path.replace("{message_id}", value).replace("{session_id}", value)
        if "{" in url:
            url = path.format(message_id=uuid.uuid4(), session_id=uuid.uuid4())
        params = {"cap": query, "limit": query, "after": query} if rng.random() < 0.5 else None
        response = await fuzz_client.request(
            method.upper(), url, content=body if method == "post" else None, headers=headers, params=params
        )
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (method, url, response.status_code, response.text[:300])
        assert "Traceback" not in response.text and 'File "' not in response.text
        if response.status_code >= 400:
            assert set(response.json()) == {"error"}
    health = await fuzz_client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert statuses.get(200, 0) + statuses.get(202, 0) > 0 and statuses.get(400, 0) > 0  # both sides were reached
