"""The stream stage on its own, without the web framework: numbering, the terminal event, coalescing, grace,
and each payload encoded as one line of JSON.

The wire format (these events as an SSE response on a real socket) is in test_sse.py; the whole chat
pipeline over HTTP (and the reader who leaves mid-answer) is in test_chat.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import pytest

from tests.sse_client import HOSTILE_TEXTS
from textbook_chat.streams import streaming
from textbook_chat.streams.events import Event
from textbook_chat.streams.streaming import MessageStream


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


# -- the payload ------------------------------------------------------------------------------------


def test_every_payload_is_a_single_json_line() -> None:
    data: dict[str, Any] = {"text": "".join(HOSTILE_TEXTS)}
    line = Event(1, "token", data).json_line  # what web/sse.py sends as ``data:`` and the relay mirrors
    assert json.loads(line) == data
    assert not set(line) & {"\r", "\n", "\x85", "\u2028", "\u2029"}


def test_an_event_keeps_its_payload_once_as_the_line_readers_are_sent() -> None:
    """Every open answer keeps its events for replay: the payload is kept encoded, not also as dicts."""
    event = Event(1, "token", {"text": "a\ud800b", "n": 1})
    assert not hasattr(event, "__dict__") and set(Event.__slots__) == {"id", "event", "json_line"}
    assert event.data == {"text": "a\ufffdb", "n": 1}  # read back as sent: a lone surrogate made U+FFFD
    assert Event(1, "token", json_line=event.json_line) == event
    with pytest.raises(AttributeError):
        event.id = 2


async def test_the_marks_say_how_much_text_each_event_had_brought() -> None:
    stream = MessageStream("m", grace_s=5)
    stream.publish("meta", {})
    stream.publish("sources", {"sources": []})
    stream.add_token("Balance ")  # the first token goes out at once
    stream.publish("notice", {"code": "llm_retry", "message": "..."})  # flushes nothing: no token waits
    stream.add_token("comes ")
    stream.add_token("first.")  # coalesced with the one before it
    stream.publish("done", {})
    assert stream.marks() == [0, 0, 8, 8, 20]  # to the terminal event, not counting it
    assert stream.text() == "Balance comes first."
