"""serve --book keeps a served embedded index in line with the book: a changed page is re-ingested while the server
answers, on its own (BOOK_WATCH_S) or on SIGHUP."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEMO_BOOK, Chat
from tests.sse_client import of_type, read_all
from textbook_chat.search.bookwatch import fingerprint

QUESTION = "What does the flibbertigibbet protocol negotiate between two robot arms?"
NEW_PAGE = """---
title: The flibbertigibbet protocol
---

# The flibbertigibbet protocol

## What it negotiates

The flibbertigibbet protocol negotiates which of two robot arms holds a shared workpiece: each arm
announces its grip force, and the arm with the firmer grip keeps the workpiece while the other lets go.
"""


def _book(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DEMO_BOOK, tmp_path / "book"))


def _add_page(book: Path) -> Path:
    module = sorted(p for p in (book / "docs").iterdir() if p.is_dir() and not p.name.startswith("."))[0]
    page = module / "flibbertigibbet.md"
    page.write_text(NEW_PAGE)
    return page


async def _cites_the_new_page(client: httpx.AsyncClient) -> bool:
    stream = await read_all(client, "POST", "/api/chat", json={"question": QUESTION})
    (sources,) = of_type(stream, "sources")
    return any("flibbertigibbet" in source["url"] for source in sources["sources"])


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return True
        await asyncio.sleep(0.3)
    return False


def test_the_fingerprint_changes_with_a_page_and_ignores_hidden_folders(tmp_path: Path) -> None:
    book = _book(tmp_path)
    before = fingerprint(book)
    (book / "docs" / ".cache").mkdir()
    (book / "docs" / ".cache" / "draft.md").write_text("# Draft\n")
    (book / "node_modules" / "pkg").mkdir(parents=True)
    (book / "node_modules" / "pkg" / "README.md").write_text("# A package\n")
    assert fingerprint(book) == before
    page = _add_page(book)
    added = fingerprint(book)
    assert added != before
    page.write_text(NEW_PAGE + "\nOne more sentence.\n")
    assert fingerprint(book) != added
    page.unlink()
    assert fingerprint(book) == before


@pytest.mark.slow
async def test_a_page_added_while_serving_is_answered_from_within_seconds(chat_server: Chat, tmp_path: Path) -> None:
    book = _book(tmp_path)
    async with chat_server(BOOK_PATH=str(book), BOOK_WATCH_S="0.2", RATE_LIMIT_ANON="1000/hour") as (client, _):
        assert not await _cites_the_new_page(client)
        _add_page(book)
        assert await _until(lambda: _cites_the_new_page(client), timeout_s=60)


@pytest.mark.slow
async def test_sighup_re_ingests_at_once_when_watching_is_off(chat_server: Chat, tmp_path: Path) -> None:
    book = _book(tmp_path)
    async with chat_server(BOOK_PATH=str(book), BOOK_WATCH_S="0", RATE_LIMIT_ANON="1000/hour") as (client, _):
        _add_page(book)
        await asyncio.sleep(1.0)
        assert not await _cites_the_new_page(client)  # nobody is looking
        os.kill(os.getpid(), signal.SIGHUP)  # the app's handler runs on this loop
        assert await _until(lambda: _cites_the_new_page(client), timeout_s=60)
