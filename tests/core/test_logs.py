"""Structured logs: one JSON object per line, request and message ids on every line, questions only at debug."""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import copy_index
from tests.servers import serving
from tests.sse_client import read_all
from textbook_chat.core import logs
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def chat_once(demo_index_dir: Path, tmp_path: Path, clean_db: str, request_id: str) -> str:
    """One offline-generator answer through a real socket; returns its message id."""
    env = {
        "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
        "DATABASE_URL": clean_db,
        "EMBEDDER": "local",
    }
    async with serving(create_app(Settings.from_env(env))) as url, httpx.AsyncClient(base_url=url) as client:
        stream = await read_all(
            client, "POST", "/api/chat", json={"question": QUESTION}, headers={"X-Request-ID": request_id}
        )
    message_id: str = stream[0].json()["message_id"]
    return message_id


@pytest.mark.slow
async def test_every_line_of_a_chat_is_json_with_its_request_id_and_message_id(
    demo_index_dir: Path, tmp_path: Path, clean_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", "json")
    message_id = await chat_once(demo_index_dir, tmp_path, clean_db, "req-logs-1")
    lines = json_lines(capsys.readouterr().err)  # every line parses, or json.loads raises here
    mine = [line for line in lines if line.get("request_id") == "req-logs-1"]
    assert {line["msg"] for line in mine} >= {"question received", "answer finished", "POST /api/chat 200"}
    assert all(line["message_id"] == message_id for line in mine)
    access = next(line for line in mine if line["logger"] == "server.access")
    assert access["route"] == "/api/chat" and access["status"] == 200
    finished = next(line for line in mine if line["msg"] == "answer finished")
    assert finished["status"] == "complete" and finished["outcome"] == "stop"
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)


@pytest.mark.parametrize(("level", "logged"), [("info", False), ("debug", True)])
@pytest.mark.slow
async def test_the_question_text_is_logged_only_at_debug(
    demo_index_dir: Path,
    tmp_path: Path,
    clean_db: str,
    capsys: pytest.CaptureFixture[str],
    level: str,
    logged: bool,
) -> None:
    logs.configure(level, "json")
    message_id = await chat_once(demo_index_dir, tmp_path, clean_db, f"req-{level}")
    output = capsys.readouterr().err
    assert (QUESTION in output) is logged
    if logged:
        (line,) = [line for line in json_lines(output) if line.get("question") == QUESTION]
        assert line["level"] == "debug" and line["message_id"] == message_id and line["request_id"] == f"req-{level}"


def test_the_text_format_shows_the_request_id_and_the_message_id(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "text")
    request_token = logs.request_id_var.set("req-text")
    message_token = logs.message_id_var.set("msg-text")
    try:
        logging.getLogger("server.test").info("hello")
    finally:
        logs.request_id_var.reset(request_token)
        logs.message_id_var.reset(message_token)
    logging.getLogger("server.test").info("outside")
    first, second = capsys.readouterr().err.splitlines()
    assert "[req-text] hello (message msg-text)" in first
    assert "[-] outside" in second and "message" not in second


def test_configuring_again_replaces_our_handler_and_keeps_everyone_elses() -> None:
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    logs.configure("info", "json")
    logs.configure("warning", "text")
    handlers = logging.getLogger().handlers
    assert other in handlers
    assert sum(isinstance(h.formatter, logs.JsonFormatter | logs.TextFormatter) for h in handlers) == 1
    assert logging.getLogger().level == logging.WARNING


def test_a_closed_stderr_is_never_written_to_after_it_was_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a test runner does between tests: the stream a handler saw at configure time is closed and replaced.
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure("info", "json")
    logging.getLogger("server.test").warning("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("server.test").warning("two")
    output = second.getvalue()
    assert "Logging error" not in output and "closed file" not in output
    assert json_lines(output)[0]["msg"] == "two"
