"""A real browser's ``EventSource`` keeps the whole answer when the connection is cut mid-answer (issue 6).

Chromium reaches the server through a TCP proxy in this test that aborts the first two answer streams after
a few token events, as a dropped mobile connection or a restarted load balancer would. The browser
reconnects on its own with ``Last-Event-ID``; the scenario is ``tests/e2e/eventsource.mjs``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.conftest import copy_index
from tests.e2e.test_e2e import _require_browser, run_scenario
from tests.fake_openai import FakeOpenAI, ok, tokens_of
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app

ANSWER = " ".join(f"Step {i}: the Zero Moment Point stays inside the support polygon [{1 + i % 2}]." for i in range(20))
CUT_AFTER_TOKENS = 3  # token events each cut stream delivers before the proxy aborts it
CUTS = 2


@dataclass
class StreamRequest:
    """One ``GET …/stream`` the browser sent through the proxy, and what became of it."""

    last_event_id: str | None
    tokens: int = 0
    saw_done: bool = False
    cut: bool = False
    status: int | None = None


@dataclass
class CuttingProxy:
    """Forwards TCP to ``upstream``; aborts both sides of the first ``cuts`` answer streams mid-answer."""

    upstream: tuple[str, int]
    cuts: int
    streams: list[StreamRequest] = field(default_factory=list)

    async def handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        current: list[StreamRequest | None] = [None]  # the stream request this connection is answering now

        async def to_server() -> None:
            while data := await client_reader.read(65536):
                if data.startswith(b"GET /api/chat/messages/") and b"/stream" in data.split(b"\r\n", 1)[0]:
                    request = StreamRequest(last_event_id=_header(data, b"last-event-id"))
                    self.streams.append(request)
                    current[0] = request
                else:
                    current[0] = None
                server_writer.write(data)
                await server_writer.drain()

        async def to_client() -> None:
            while data := await server_reader.read(65536):
                stream = current[0]
                if stream is not None:
                    if stream.status is None and data.startswith(b"HTTP/1.1 "):
                        stream.status = int(data[9:12])
                    stream.tokens += data.count(b"\nevent: token\r")
                    stream.saw_done = stream.saw_done or b"\nevent: done\r" in data
                client_writer.write(data)
                await client_writer.drain()
                if stream is not None and self._should_cut(stream):
                    stream.cut = True
                    client_writer.transport.abort()  # the browser sees the connection die mid-answer
                    server_writer.transport.abort()
                    return

        tasks = [asyncio.create_task(to_server()), asyncio.create_task(to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_writer, server_writer):
                writer.close()

    def _should_cut(self, stream: StreamRequest) -> bool:
        cut_so_far = sum(s.cut for s in self.streams)
        return cut_so_far < self.cuts and stream.tokens >= CUT_AFTER_TOKENS and not stream.saw_done


def _header(request: bytes, name: bytes) -> str | None:
    for line in request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode()
    return None


@asynccontextmanager
async def proxied(upstream_url: str, *, cuts: int) -> AsyncIterator[tuple[str, CuttingProxy]]:
    host, port = upstream_url.removeprefix("http://").split(":")
    proxy = CuttingProxy((host, int(port)), cuts)
    listener = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}", proxy
    finally:
        listener.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(listener.wait_closed(), timeout=5)


def stored_answer(database_url: str, message_id: str) -> tuple[str, str]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT content, status FROM chat_messages WHERE id = %s", (message_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


async def test_eventsource_survives_the_connection_being_cut_mid_answer_without_losing_or_repeating_text(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    _require_browser()
    fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.03))  # ~6 s: both reconnects land mid-answer
    async with serving(fake.app()) as llm_url:
        settings = Settings.from_env(
            {
                "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
                "DATABASE_URL": clean_db,
                "LOG_FORMAT": "text",
                "LOG_LEVEL": "warning",
                "EMBEDDER": "local",
                "OPENAI_API_KEY": "sk-test",
                "OPENAI_BASE_URL": f"{llm_url}/v1",
                "STREAM_GRACE_S": "10",  # long enough for EventSource's reconnect delay (retry: 2000)
            }
        )
        async with serving(create_app(settings)) as server_url, proxied(server_url, cuts=CUTS) as (url, proxy):
            report = await run_scenario("eventsource", url)

    assert report["text"] == ANSWER == "".join(tokens_of(ANSWER))
    assert report["ids"] == list(range(1, len(report["ids"]) + 1))
    assert report["types"][:2] == ["meta", "sources"] and report["types"][-1] == "done"
    assert stored_answer(clean_db, report["messageId"]) == (ANSWER, "complete")
    assert len(fake.requests) == 1 and fake.streams_completed == 1  # reconnects never start a second generation

    cut, resumed, after_done = proxy.streams[:CUTS], proxy.streams[CUTS:-1], proxy.streams[-1]
    assert [s.cut and not s.saw_done for s in cut] == [True] * CUTS  # both cuts fell mid-answer
    assert resumed and all(s.status == 200 and not s.cut for s in resumed) and resumed[-1].saw_done
    assert (after_done.status, after_done.last_event_id) == (204, str(report["ids"][-1]))
    resumed_from = [int(s.last_event_id or 0) for s in proxy.streams[1:]]
    assert proxy.streams[0].last_event_id is None and resumed_from == sorted(resumed_from) and resumed_from[0] > 2
    assert report["opens"] == CUTS + 1  # the first connection and one per cut; the 204 opens nothing
