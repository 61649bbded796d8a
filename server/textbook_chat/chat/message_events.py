"""A message's events for a reader: live on this worker, relayed from another (Redis), or replayed from Postgres.

The writing side is chat.py (a generation task publishes into a ``MessageStream``); this is every way of
reading one back, for ``POST /api/chat``'s own response, a reconnect, and the 204 rule after ``done``. A relayed
read whose Redis fails waits for Redis or the stored answer, else ends with a retryable ``error``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from textbook_chat.chat.service import ChatService
from textbook_chat.core.errors import DatabaseUnavailable
from textbook_chat.store.rows import MessageRow
from textbook_chat.streams import replay
from textbook_chat.streams.events import STALL_LIMIT_S, TERMINAL, Event, RelayUnavailable

log = logging.getLogger(__name__)

MIRROR_WAIT_S = 2.0  # how long a reconnect waits for Redis to hold an event its reader already has
MIRROR_POLL_S = 0.05


async def events(chat: ChatService, message_id: uuid.UUID, after: int = 0) -> AsyncIterator[Event] | None:
    """A message's events after ``after``: live (this worker or, with Redis, another), else replayed from Postgres."""
    live = await chat.registry.events(str(message_id), after)
    if live is not None:
        relayed = chat.registry.relay is not None and chat.registry.get(str(message_id)) is None
        return _outlasting_redis(chat, message_id, after, live) if relayed else live
    stored = await _stored_events(chat, message_id, after)
    if stored == "starting":
        assert chat.registry.relay is not None
        return _outlasting_redis(chat, message_id, after, chat.registry.relay.read(str(message_id), after))
    return None if stored is None else _iterate(stored)


async def last_event(chat: ChatService, message_id: uuid.UUID, *, seen: int = 0) -> tuple[int, bool] | None:
    """``(newest event id, ended)`` for the 204 rule of a reconnect after ``done``; None: unknown message.

    ``seen``: the newest event the reader has. A reader who had it from the generating worker may reconnect to
    another before Redis holds it (events are mirrored a moment after they go out): the answer then waits up to
    ``MIRROR_WAIT_S`` for Redis to catch up, rather than serve a stream that would wait for an event it never gets.
    """
    deadline = time.monotonic() + MIRROR_WAIT_S
    while True:
        last = await _last_event(chat, message_id)
        behind = last is not None and not last[1] and last[0] < seen
        if not behind or chat.registry.relay is None or time.monotonic() > deadline:
            return last
        await asyncio.sleep(MIRROR_POLL_S)


async def _last_event(chat: ChatService, message_id: uuid.UUID) -> tuple[int, bool] | None:
    live = await chat.registry.last_event(str(message_id))
    if live is not None:
        return live
    stored = await _stored_events(chat, message_id)
    if stored == "starting":
        return 0, False
    return None if stored is None else (stored[-1].id, True)


async def _stored_events(
    chat: ChatService, message_id: uuid.UUID, after: int = 0
) -> list[Event] | Literal["starting"] | None:
    """The stored answer replayed as events after ``after``; ``"starting"`` while another worker has yet to mirror it
    to Redis."""
    if chat.store is None:
        return None
    message = await chat.store.get_message(message_id)
    if message is None or message.role != "assistant":
        return None
    if chat.registry.relay is not None and _may_be_starting(message):
        return "starting"
    message = await _settle_orphan(chat, message, live=False)
    return replay.events(message, stream_url=chat.capabilities.stream_url(str(message_id)), after=after)


async def settled(chat: ChatService, messages: list[MessageRow]) -> list[MessageRow]:
    """History as it stands: an answer left ``streaming`` by a worker that died is ended as ``interrupted``
    (stored so), so its history offers no stream that nobody will ever serve (issue 25)."""
    result = []
    for message in messages:
        if message.role == "assistant" and message.status == "streaming" and not _may_be_starting(message):
            live = await chat.registry.last_event(str(message.id)) is not None
            message = await _settle_orphan(chat, message, live=live)
        result.append(message)
    return result


async def _settle_orphan(chat: ChatService, message: MessageRow, *, live: bool) -> MessageRow:
    """``message`` ended as ``interrupted`` when it is ``streaming`` but no worker has it (``live``) any more."""
    if live or message.status != "streaming" or chat.store is None:
        return message
    if chat.registry.relay is not None and _may_be_starting(message):
        return message
    try:
        await chat.store.end_streaming(message.id, "interrupted")
    except DatabaseUnavailable:
        return message  # replayed as lost this time; settled on a later read
    log.info("an answer left streaming by a process that is gone is ended as interrupted: %s", message.id)
    return replace(message, status="interrupted")


def _may_be_starting(message: MessageRow) -> bool:
    """A fresh ``streaming`` answer that Redis does not know yet: its worker has not mirrored an event so far.

    A browser opens the stream right after the 202, and a load balancer may send it to another worker
    than the one generating; that reader waits in Redis (relay.py gives up after ``STALL_LIMIT_S``)
    instead of being told the answer was lost.
    """
    age = datetime.now(UTC) - message.created_at
    return message.status == "streaming" and age < timedelta(seconds=STALL_LIMIT_S)


OUTAGE_WAIT_S = 15.0  # how long a relayed reader waits for Redis or the stored answer before its `error`
OUTAGE_POLL_S = 0.5


class _OutageLog:
    """One line for an outage, not one per reader: at most every ``every_s``, with the reads not logged."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.logged_at = -math.inf
        self.unlogged = 0

    def note(self, why: str) -> None:
        now = time.monotonic()
        if now - self.logged_at < self.every_s:
            self.unlogged += 1
            return
        log.warning(
            "Redis failed a relayed read (%s; %d more since the last line); waiting for it or the stored answer",
            why,
            self.unlogged,
        )
        self.logged_at, self.unlogged = now, 0


_outages = _OutageLog()


async def _outlasting_redis(
    chat: ChatService, message_id: uuid.UUID, after: int, events: AsyncIterator[Event]
) -> AsyncIterator[Event]:
    """``events`` (relayed through Redis, or this worker's own), ending with exactly one terminal event even when
    Redis fails mid-read: the read goes on once Redis answers again, or the stored answer ends it once its worker
    has written it (the rest of its text, then its ``done``), else a retryable ``error`` after ``OUTAGE_WAIT_S``."""
    relay = chat.registry.relay
    assert relay is not None
    last = after
    sent: list[str] | None = [] if after == 0 else None  # the text the reader has, when this read knows all of it
    while True:
        try:
            async for event in events:
                last = event.id
                if sent is not None and event.event == "token":
                    sent.append(str(event.data.get("text", "")))
                yield event
                if event.event in TERMINAL:
                    return
            return
        except RelayUnavailable as exc:
            _outages.note(str(exc))
        give_up = time.monotonic() + OUTAGE_WAIT_S
        while True:
            ending = await _stored_ending(chat, message_id, last, sent)
            if ending is not None:
                for event in ending:
                    yield event
                return
            if time.monotonic() > give_up:
                yield Event(last + 1, "error", _RELAY_LOST)
                return
            await asyncio.sleep(OUTAGE_POLL_S)
            if await relay.exists(str(message_id)):
                break  # Redis answers again: read on from the last event the reader has
        events = relay.read(str(message_id), last)


async def _stored_ending(
    chat: ChatService, message_id: uuid.UUID, last: int, sent: list[str] | None
) -> list[Event] | None:
    """The rest of a finished stored answer after what the reader has (``sent``, or for a resumed read what event
    ``last`` had brought, by the answer's stream marks), numbered on from ``last``; None while it is not stored
    yet, or when what the reader has is not known (a resumed read of an answer stored without marks)."""
    if chat.store is None:
        return None
    try:
        message = await chat.store.get_message(message_id)
    except DatabaseUnavailable:
        return None
    if message is None or message.status == "streaming":
        return None
    stream_url = chat.capabilities.stream_url(str(message_id))
    if sent is None:
        return replay.events(message, stream_url=stream_url, after=last) if replay.resumable(message) else None
    have = "".join(sent)
    if not message.content.startswith(have):
        return None
    terminal = replay.events(message, stream_url=stream_url)[-1]
    rest = (
        [Event(last + 1, "token", {"text": message.content[len(have) :]})] if len(message.content) > len(have) else []
    )
    return [*rest, Event(last + 1 + len(rest), terminal.event, terminal.data)]


_RELAY_LOST = {
    "code": "relay_unavailable",
    "message": "The answer could not be followed from this server for a moment. Reconnecting continues it.",
    "retryable": True,
}


async def _iterate(items: list[Event]) -> AsyncIterator[Event]:
    for item in items:
        yield item
