"""The SSE protocol module on its own: numbering, the terminal event, coalescing, grace, and the wire format.

The wire tests serve ``streaming.response`` on a real socket and split the body into lines exactly as the
WHATWG parser does (CR, LF or CRLF), then also as ``str.splitlines`` clients do, which break on more.
The whole chat pipeline over HTTP (and the reader who leaves mid-answer) is in test_chat.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.streams import streaming
from server.streams.events import Event
from server.streams.streaming import MessageStream
from tests.servers import serving
from tests.sse_client import EventParser, SSEEvent

HOSTILE_TEXTS = [
    "\n\nevent: done\ndata: x",
    "\rid: 99",
    "a\r\n\r\nretry: 1\r\n\r\nevent: error\r\ndata: {}",
    ": ping\n\nid: 7",
    "\u2028id: 99\u2029event: done\x85data: x",
]


async def read(stream: MessageStream, after: int = 0) -> list[Event]:
    return [event async for event in stream.subscribe(after)]


def finish(stream: MessageStream, kind: str = "done") -> None:
    stream.publish(kind, {"message_id": stream.message_id})  # type: ignore[arg-type]


# -- the event sequence --------------------------------------------------------------------------------


async def test_events_are_numbered_from_one_in_the_order_they_are_published() -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {"message_id": "m1"})
    stream.publish("sources", {"sources": []})
    stream.publish("notice", {"code": "low_confidence", "message": "hm"})
    stream.add_token("Hello")
    stream.publish("notice", {"code": "llm_retry", "message": "again"})  # flushes the pending token first
    stream.add_token(" world")
    finish(stream)
    events = await read(stream)
    assert [(e.id, e.event) for e in events] == [
        (1, "meta"),
        (2, "sources"),
        (3, "notice"),
        (4, "token"),
        (5, "notice"),
        (6, "token"),
        (7, "done"),
    ]
    assert stream.text() == "Hello world"


@pytest.mark.parametrize("terminal", ["done", "error"])
async def test_one_terminal_event_ends_the_stream_and_nothing_follows_it(terminal: str) -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {})
    stream.add_token("partial")
    finish(stream, terminal)
    stream.add_token("late")  # a token racing the end is dropped, not appended after it
    for kind in ("done", "error", "token"):
        with pytest.raises(RuntimeError):
            stream.publish(kind, {})
    events = await read(stream)
    assert [e.event for e in events] == ["meta", "token", terminal]
    assert stream.finished and stream.text() == "partial"


async def test_a_finished_stream_keeps_its_events_where_the_garbage_collector_does_not_walk() -> None:
    """Streams are kept for STREAM_TTL_S after they end; as tracked objects their events made every full
    collection longer (100 ms and more with a few hundred recent answers). Kept, they read back the same."""
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {"message_id": "m1", "scope": {"searched": "all"}})
    for n in range(50):
        stream.publish("token", {"text": f"word {n}\u2028"})
    live = list(stream.events)
    finish(stream)
    gc.collect()
    kept = await read(stream)
    assert [(e.id, e.event, e.data, e.json_line) for e in kept] == [
        *[(e.id, e.event, e.data, e.json_line) for e in live],
        (52, "done", {"message_id": "m1"}, '{"message_id": "m1"}'),
    ]
    (rows,) = [r for r in gc.get_referents(stream.events) if isinstance(r, list)]
    assert len(rows) == 52 and not any(gc.is_tracked(row) for row in rows)


async def test_a_subscriber_waits_for_live_events_and_stops_at_the_terminal_one() -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {})
    reader = asyncio.create_task(read(stream))
    await asyncio.sleep(0)
    stream.publish("sources", {"sources": []})
    stream.add_token("one")
    await asyncio.sleep(streaming.COALESCE_S * 3)
    stream.add_token("two")
    finish(stream)
    events = await asyncio.wait_for(reader, timeout=5)
    assert [(e.id, e.event) for e in events] == [(1, "meta"), (2, "sources"), (3, "token"), (4, "token"), (5, "done")]


async def test_a_held_terminal_event_reaches_readers_only_once_released() -> None:
    stream = MessageStream("m1", grace_s=0, hold_terminal=True)
    stream.publish("meta", {})
    reader = asyncio.create_task(read(stream))
    stream.add_token("answer")
    finish(stream)  # generation is over: the answer is being stored
    await asyncio.sleep(streaming.COALESCE_S * 3)
    assert stream.ended and not stream.finished and not reader.done()
    assert stream.terminal is not None and stream.terminal.id == 3
    with pytest.raises(RuntimeError):
        finish(stream, "error")
    stream.release()
    events = await asyncio.wait_for(reader, timeout=5)
    assert [(e.id, e.event) for e in events] == [(1, "meta"), (2, "token"), (3, "done")]


async def test_a_subscriber_resumes_right_after_its_last_event_id() -> None:
    stream = MessageStream("m1", grace_s=0)
    for kind in ("meta", "sources", "notice"):
        stream.publish(kind, {})
    finish(stream)
    assert [e.id for e in await read(stream, after=2)] == [3, 4]
    assert await read(stream, after=4) == []


# -- coalescing ---------------------------------------------------------------------------------------


async def test_the_first_token_goes_out_at_once_and_the_rest_of_a_burst_as_one_event() -> None:
    stream = MessageStream("m1", grace_s=0)
    pieces = [f" t{i}" for i in range(50)]
    for piece in pieces:
        stream.add_token(piece)  # a fast model: all of them inside one coalescing window
    assert [e.data["text"] for e in stream.events] == [" t0"]  # no wait for the reader's first token
    await asyncio.sleep(streaming.COALESCE_S * 3)
    assert [e.data["text"] for e in stream.events] == [" t0", "".join(pieces[1:])]  # not one write per token


async def test_tokens_spaced_wider_than_the_window_each_go_out_at_once() -> None:
    stream = MessageStream("m1", grace_s=0)
    for piece in ("a", "b", "c"):
        stream.add_token(piece)
        assert stream.events[-1].data == {"text": piece}
        await asyncio.sleep(streaming.COALESCE_S * 2)  # a paced model, slower than the window


async def test_a_terminal_event_flushes_tokens_still_being_coalesced() -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.add_token("first ")
    stream.add_token("last words")
    finish(stream)
    assert [(e.event, dict(e.data)) for e in stream.events[:2]] == [
        ("token", {"text": "first "}),
        ("token", {"text": "last words"}),
    ]
    assert stream.events[-1].event == "done"


# -- listeners and the grace window --------------------------------------------------------------------


async def generating(stream: MessageStream) -> asyncio.Event:
    """Attach a running generation task that waits until cancelled; the returned event is set when it is."""
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def generate() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stream.task = asyncio.create_task(generate())
    await started.wait()
    return cancelled


async def listen_then_leave(stream: MessageStream) -> None:
    """A reader gets the first event, then its connection drops."""
    events = stream.subscribe()
    await anext(events)
    await events.aclose()


async def test_with_no_grace_the_last_listener_leaving_cancels_generation() -> None:
    stream = MessageStream("m1", grace_s=0)
    stream.publish("meta", {})
    cancelled = await generating(stream)
    await listen_then_leave(stream)
    await asyncio.wait_for(cancelled.wait(), timeout=5)
    assert stream.cancel_reason == "abandoned"


async def test_a_reader_back_within_the_grace_window_keeps_generation_going() -> None:
    stream = MessageStream("m1", grace_s=0.3)
    stream.publish("meta", {})
    cancelled = await generating(stream)
    await listen_then_leave(stream)
    back = stream.subscribe(after=1)
    reading = asyncio.ensure_future(anext(back))  # the reconnect is waiting for the next event
    await asyncio.sleep(0.6)  # twice the grace window
    assert not cancelled.is_set() and stream.listeners == 1
    finish(stream)
    assert (await reading).event == "done"
    await back.aclose()
    assert stream.task is not None and not stream.task.done()
    stream.task.cancel()
    await asyncio.gather(stream.task, return_exceptions=True)


async def test_after_the_grace_window_an_abandoned_generation_is_cancelled() -> None:
    stream = MessageStream("m1", grace_s=0.2)
    stream.publish("meta", {})
    cancelled = await generating(stream)
    await listen_then_leave(stream)
    await asyncio.wait_for(cancelled.wait(), timeout=5)
    assert stream.cancel_reason == "abandoned"


# -- the wire format ----------------------------------------------------------------------------------


@asynccontextmanager
async def serve_stream(stream: MessageStream, *, ping_s: float = streaming.PING_S) -> AsyncIterator[str]:
    """``GET /`` serves ``stream`` after the ``Last-Event-ID`` header, as the real route does."""

    async def endpoint(request: Request) -> Response:
        after = int(request.headers.get("last-event-id", "0"))
        return streaming.response(stream.subscribe(after), ping_s=ping_s)

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
async def test_model_or_book_text_cannot_forge_an_sse_field(hostile: str) -> None:
    stream = ended_stream(hostile, excerpt=hostile)  # the model's token and a book excerpt alike
    async with serve_stream(stream) as url:
        body = (await fetch(url)).text
    for split in (whatwg_lines, str.splitlines):
        events, parser = parse(body, split)
        assert [(e.id, e.event) for e in events] == [("1", "meta"), ("2", "sources"), ("3", "token"), ("4", "done")]
        assert events[2].json() == {"text": hostile}
        assert events[1].json()["sources"][0]["excerpt"] == hostile
        assert [e.retry for e in events] == [streaming.RETRY_MS, None, None, None]
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
    assert [(e.id, e.retry) for e in events] == [("3", streaming.RETRY_MS), ("4", None)]


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


def test_every_payload_is_a_single_json_line() -> None:
    data: dict[str, Any] = {"text": "".join(HOSTILE_TEXTS)}
    sse = Event(1, "token", data).sse()
    assert isinstance(sse.data, str) and json.loads(sse.data) == data
    assert not set(sse.data) & {"\r", "\n", "\x85", "\u2028", "\u2029"}
