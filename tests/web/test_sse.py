"""The SSE response (``web/sse.py``): the stream stage's events on a real socket, as readers parse them.

The body is split into lines exactly as the WHATWG parser does (CR, LF or CRLF), then also as
``str.splitlines`` clients do, which break on more. The events themselves (numbering, coalescing, grace)
are in test_streaming.py; the whole chat pipeline over HTTP in test_chat.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.servers import serving
from tests.sse_client import HOSTILE_TEXTS, EventParser, SSEEvent
from textbook_chat.streams.streaming import MessageStream
from textbook_chat.web import sse


def finish(stream: MessageStream) -> None:
    stream.publish("done", {"message_id": stream.message_id})


# -- the wire format ----------------------------------------------------------------------------------


@asynccontextmanager
async def serve_stream(stream: MessageStream, *, ping_s: float = sse.PING_S) -> AsyncIterator[str]:
    """``GET /`` serves ``stream`` after the ``Last-Event-ID`` header, as the real route does."""

    async def endpoint(request: Request) -> Response:
        after = int(request.headers.get("last-event-id", "0"))
        return sse.response(stream.subscribe(after), ping_s=ping_s)

    async with serving(Starlette(routes=[Route("/", endpoint)])) as url:
        yield url


def whatwg_lines(body: str) -> list[str]:
    return re.split(r"\r\n|\r|\n", body)


def parse(body: str, split: Callable[[str], list[str]] = whatwg_lines) -> tuple[list[SSEEvent], EventParser]:
    parser = EventParser()
    events = [e for line in split(body) if (e := parser.feed(line)) is not None]
    return events, parser


async def fetch(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url, headers=headers)


def ended_stream(token: str, excerpt: str = "") -> MessageStream:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {"message_id": "m1"})
    stream.publish("sources", {"sources": [{"n": 1, "excerpt": excerpt}]})
    stream.add_token(token)
    finish(stream)
    return stream


@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=["lf-event", "cr-id", "crlf-retry", "comment", "unicode-breaks"])
@pytest.mark.slow
async def test_model_or_book_text_cannot_forge_an_sse_field(hostile: str) -> None:
    stream = ended_stream(hostile, excerpt=hostile)  # the model's token and a book excerpt alike
    async with serve_stream(stream) as url:
        body = (await fetch(url)).text
    for split in (whatwg_lines, str.splitlines):
        events, parser = parse(body, split)
        assert [(e.id, e.event) for e in events] == [("1", "meta"), ("2", "sources"), ("3", "token"), ("4", "done")]
        assert events[2].json() == {"text": hostile}
        assert events[1].json()["sources"][0]["excerpt"] == hostile
        assert [e.retry for e in events] == [sse.RETRY_MS, None, None, None]
        assert parser.last_event_id == "4"


async def test_the_response_tells_proxies_and_caches_not_to_hold_tokens_back() -> None:
    async with serve_stream(ended_stream("hi")) as url:
        response = await fetch(url)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["cache-control"] == "no-cache"


async def test_each_response_asks_for_a_reconnect_delay_once_on_its_first_event() -> None:
    stream = ended_stream("hi")
    async with serve_stream(stream) as url:
        whole = (await fetch(url)).text
        resumed = (await fetch(url, {"Last-Event-ID": "2"})).text
    assert whole.count("retry:") == resumed.count("retry:") == 1
    events, _ = parse(resumed)
    assert [(e.id, e.retry) for e in events] == [("3", sse.RETRY_MS), ("4", None)]


async def test_an_idle_stream_sends_a_ping_comment_every_interval() -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {})
    seen: list[str] = []
    async with serve_stream(stream, ping_s=0.1) as url, httpx.AsyncClient(timeout=10) as client:
        async with asyncio.timeout(10), client.stream("GET", url) as response:
            async for line in response.aiter_lines():
                seen.append(line)
                if sum(line.startswith(": ping") for line in seen) == 3:
                    break
    events, parser = parse("\n".join(seen))
    assert [e.id for e in events] == ["1"]  # pings are comments: no event, no id, nothing a reader sees
    assert [c.split(" ")[0] for c in parser.comments] == ["ping"] * 3  # sse-starlette appends a timestamp
