"""The SSE protocol: numbered events per message, kept for replay, delivered to any number of listeners.

Generation runs as its own task and publishes into a ``MessageStream``; HTTP responses only subscribe. When the last
listener leaves, generation goes on for ``STREAM_GRACE_S`` so a reconnect can catch up, then is cancelled
(docs/architecture.md, "The path of one question"). Readers get typed ``Event``s (events.py), each payload already
one line of JSON, so nothing the model or the book says can add a field; the web stage (``web/sse.py``) writes them
as Server-Sent Events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from textbook_chat.core.text import scrub
from textbook_chat.streams.events import TERMINAL, Event, EventType

if TYPE_CHECKING:
    from textbook_chat.streams.relay import RedisRelay

log = logging.getLogger(__name__)

COALESCE_S = 0.01  # tokens published within this window go out as one event


class _Archive(Sequence[Event]):
    """A finished stream's events, kept STREAM_TTL_S for readers who reconnect, as plain
    ``(id, event, json_line)`` tuples.

    The garbage collector stops tracking tuples of strings and numbers, so the streams kept for an hour no
    longer lengthen every full collection: as live ``Event`` objects they made it walk every event of
    every recent answer, pausing the event loop for 100 ms and more (bench/chat.py). An event is rebuilt
    when a late reader asks for it.
    """

    __slots__ = ("_rows",)

    def __init__(self, events: Sequence[Event]) -> None:
        self._rows = [(e.id, e.event, e.json_line) for e in events]

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        if isinstance(index, slice):
            return [_revive(row) for row in self._rows[index]]
        return _revive(self._rows[index])


def _revive(row: tuple[int, EventType, str]) -> Event:
    event_id, event, line = row
    return Event(event_id, event, json_line=line)


@dataclass(slots=True)  # one per open answer: no instance dict beside its fields
class MessageStream:
    """One message's events, in order; ``finished`` once ``done`` or ``error`` is published."""

    message_id: str
    grace_s: float
    events: Sequence[Event] = field(default_factory=list)  # a list while live, then an _Archive
    task: asyncio.Task[None] | None = None
    created_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    _listeners: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _pending_tokens: list[str] = field(default_factory=list)
    _flush_handle: asyncio.TimerHandle | None = None
    _quiet_until: float = 0.0  # loop time until which new tokens wait to be coalesced
    _grace_handle: asyncio.TimerHandle | None = None
    _cancel_reason: str | None = None
    on_event: Callable[[str, Event], None] | None = None  # mirrors every event (relay.py, with Redis)
    remote_listener: Callable[[str], Awaitable[bool]] | None = None  # someone reads this on another worker
    _probe: asyncio.Task[None] | None = None
    # While set, ``done``/``error`` waits in ``_held`` until ``release()``: chat.py stores the answer first, so
    # a reader who sees ``done`` and reads the history (or asks a follow-up) finds the answer there.
    hold_terminal: bool = False
    _held: Event | None = None

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def ended(self) -> bool:
        """Generation is over: the terminal event is out, or held until the answer is stored."""
        return self.finished_at is not None or self._held is not None

    @property
    def terminal(self) -> Event | None:
        """The ``done``/``error`` event, published or held."""
        if self._held is not None:
            return self._held
        return self.events[-1] if self.finished and self.events else None

    def release(self) -> None:
        """Publish the held terminal event (if any); from now on terminal events go out at once."""
        self.hold_terminal = False
        held, self._held = self._held, None
        if held is not None:
            self._append(held)

    @property
    def listeners(self) -> int:
        return self._listeners

    @property
    def cancel_reason(self) -> str | None:
        """Why generation was cancelled: ``"client"`` (DELETE), ``"abandoned"`` (no listener), ``"shutdown"``."""
        return self._cancel_reason

    def publish(self, event: EventType, data: Mapping[str, Any]) -> Event:
        if self.ended:
            raise RuntimeError(f"stream {self.message_id} already ended")
        self._flush_tokens()
        if event in TERMINAL and self.hold_terminal:
            self._held = Event(id=len(self.events) + 1, event=event, data=data)
            self._stop_grace()
            return self._held
        return self._append(Event(id=len(self.events) + 1, event=event, data=data))

    def add_token(self, text: str) -> None:
        """Queue model output: at most one ``token`` event per COALESCE_S; a token after a quiet spell goes at once."""
        if not text or self.ended:
            return
        self._pending_tokens.append(scrub(text))  # as sent, so stored: the stored answer is what was streamed
        if self._flush_handle is not None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._quiet_until:
            self._flush_tokens()  # the first token above all: waiting for company would only delay it
        else:
            self._flush_handle = loop.call_at(self._quiet_until, self._flush_tokens)

    def cancel(self, reason: str) -> bool:
        """Stop generation now; False when it had already ended."""
        if self.ended or self.task is None or self.task.done():
            return False
        self._cancel_reason = reason
        self.task.cancel()
        return True

    async def subscribe(self, after: int = 0) -> AsyncGenerator[Event, None]:
        """Events with id > ``after``: the stored ones at once, then live ones until the stream ends."""
        self._listeners += 1
        self._stop_grace()
        try:
            position = after
            while True:
                while position < len(self.events):
                    event = self.events[position]
                    position += 1
                    yield event
                if self.finished:
                    return
                self._changed.clear()
                if position < len(self.events):
                    continue
                await self._changed.wait()
        finally:
            self._listeners -= 1
            if self._listeners == 0 and not self.ended:
                self._start_grace()

    def text(self) -> str:
        """Every token published so far (including ones still being coalesced)."""
        return "".join(str(e.data.get("text", "")) for e in self.events if e.event == "token") + "".join(
            self._pending_tokens
        )

    def marks(self) -> list[int]:
        """How many characters of ``text()`` were out once each published event before the terminal one was (the
        i-th for event i + 1): kept with the stored answer, so a reader who resumes from it after event N gets the
        text after mark N."""
        marks, streamed = [], 0
        for event in self.events:
            if event.event in TERMINAL:
                break
            if event.event == "token":
                streamed += len(str(event.data.get("text", "")))
            marks.append(streamed)
        return marks

    def _append(self, entry: Event) -> Event:
        assert isinstance(self.events, list), "a finished stream takes no events"
        assert entry.id == len(self.events) + 1, "events are numbered in the order they are published"
        self.events.append(entry)
        if self.on_event is not None:
            self.on_event(self.message_id, entry)
        if entry.event in TERMINAL:
            self.finished_at = time.monotonic()
            self._stop_grace()
            self.events = _Archive(self.events)
        self._changed.set()
        return entry

    def _flush_tokens(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._pending_tokens and not self.ended:
            text = "".join(self._pending_tokens)
            self._pending_tokens.clear()
            self._quiet_until = asyncio.get_running_loop().time() + COALESCE_S
            self._append(Event(id=len(self.events) + 1, event="token", data={"text": text}))

    def _start_grace(self) -> None:
        if self._grace_handle is not None or self.task is None:
            return
        if self.grace_s <= 0:
            self._abandon()
            return
        self._grace_handle = asyncio.get_running_loop().call_later(self.grace_s, self._abandon)

    def _stop_grace(self) -> None:
        if self._grace_handle is not None:
            self._grace_handle.cancel()
            self._grace_handle = None

    def _abandon(self) -> None:
        self._grace_handle = None
        if self._listeners or self.ended:
            return
        if self.remote_listener is None:
            self._cancel_abandoned()
        elif self._probe is None:
            self._probe = asyncio.create_task(self._abandon_unless_read_elsewhere())

    async def _abandon_unless_read_elsewhere(self) -> None:
        assert self.remote_listener is not None
        try:
            elsewhere = await self.remote_listener(self.message_id)
        finally:
            self._probe = None
        if self._listeners or self.ended:
            return
        if elsewhere:
            # A reader on another worker: look again later (at least every second, even with a zero grace).
            self._grace_handle = asyncio.get_running_loop().call_later(max(self.grace_s, 1.0), self._abandon)
        else:
            self._cancel_abandoned()

    def _cancel_abandoned(self) -> None:
        if self.cancel("abandoned"):
            log.info(
                "generation cancelled: no listener for %.1f s", self.grace_s, extra={"message_id": self.message_id}
            )


class StreamRegistry:
    """Live and recently finished streams of this process, by message id; finished ones expire after ``ttl_s``.

    With a ``relay`` (Redis), every event is mirrored so other workers can serve, resume and cancel it.
    """

    def __init__(self, *, grace_s: float, ttl_s: float, relay: RedisRelay | None = None) -> None:
        self.grace_s = grace_s
        self.ttl_s = ttl_s
        self.relay = relay
        self._streams: dict[str, MessageStream] = {}

    def create(self, message_id: str) -> MessageStream:
        self._expire()
        stream = MessageStream(message_id=message_id, grace_s=self.grace_s)
        if self.relay is not None:
            stream.on_event = self.relay.mirror
            stream.remote_listener = self.relay.has_listener
        self._streams[message_id] = stream
        return stream

    async def events(self, message_id: str, after: int = 0) -> AsyncIterator[Event] | None:
        """Events after ``after`` from this process or, with Redis, from the worker that generates it."""
        stream = self.get(message_id)
        if stream is not None:
            return stream.subscribe(after)
        if self.relay is not None and await self.relay.exists(message_id):
            return self.relay.read(message_id, after)
        return None

    async def last_event(self, message_id: str) -> tuple[int, bool] | None:
        """``(id of the newest event, whether it ended the stream)``, or None when no live copy is known."""
        stream = self.get(message_id)
        if stream is not None:
            return len(stream.events), stream.finished
        if self.relay is not None:
            return await self.relay.last_id(message_id)
        return None

    async def cancel(self, message_id: str, reason: str) -> bool:
        """Stop generation here, or ask the owning worker; False when no live generation is known."""
        stream = self.get(message_id)
        if stream is not None:
            return stream.cancel(reason)
        if self.relay is not None and await self.relay.exists(message_id):
            return await self.relay.request_cancel(message_id)
        return False

    def cancel_here(self, message_id: str) -> None:
        """A cancel request from another worker (relay.py); ignored unless this process generates it."""
        stream = self._streams.get(message_id)
        if stream is not None:
            stream.cancel("client")

    def get(self, message_id: str) -> MessageStream | None:
        self._expire()
        return self._streams.get(message_id)

    def live(self) -> list[MessageStream]:
        return [s for s in self._streams.values() if not s.finished]

    async def cancel_all(self, reason: str) -> None:
        tasks = [s.task for s in self._streams.values() if s.cancel(reason) and s.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [k for k, s in self._streams.items() if s.finished_at is not None and now - s.finished_at > self.ttl_s]
        for key in stale:
            del self._streams[key]
