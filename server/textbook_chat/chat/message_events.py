"""A message's events for a reader: live on this worker, relayed from another (Redis), or replayed from Postgres.

The writing side is chat.py (a generation task publishes into a ``MessageStream``); this is every way of
reading one back, for ``POST /api/chat``'s own response, a reconnect, and the 204 rule after ``done``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from textbook_chat.chat.service import ChatService
from textbook_chat.core.errors import DatabaseUnavailable
from textbook_chat.store.rows import MessageRow
from textbook_chat.streams import replay
from textbook_chat.streams.events import STALL_LIMIT_S, Event

log = logging.getLogger(__name__)


async def events(chat: ChatService, message_id: uuid.UUID, after: int = 0) -> AsyncIterator[Event] | None:
    """A message's events after ``after``: live (this worker or, with Redis, another), else replayed from Postgres."""
    live = await chat.registry.events(str(message_id), after)
    if live is not None:
        return live
    stored = await _stored_events(chat, message_id)
    if stored == "starting":
        assert chat.registry.relay is not None
        return chat.registry.relay.read(str(message_id), after)
    return None if stored is None else _iterate([e for e in stored if e.id > after])


async def last_event(chat: ChatService, message_id: uuid.UUID) -> tuple[int, bool] | None:
    """``(newest event id, ended)`` for the 204 rule of a reconnect after ``done``; None: unknown message."""
    live = await chat.registry.last_event(str(message_id))
    if live is not None:
        return live
    stored = await _stored_events(chat, message_id)
    if stored == "starting":
        return 0, False
    return None if stored is None else (len(stored), True)


async def _stored_events(chat: ChatService, message_id: uuid.UUID) -> list[Event] | Literal["starting"] | None:
    """The stored answer replayed as events; ``"starting"`` while another worker has yet to mirror it to Redis."""
    if chat.store is None:
        return None
    message = await chat.store.get_message(message_id)
    if message is None or message.role != "assistant":
        return None
    if chat.registry.relay is not None and _may_be_starting(message):
        return "starting"
    message = await _settle_orphan(chat, message, live=False)
    return replay.events(message, stream_url=chat.capabilities.stream_url(str(message_id)))


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


async def _iterate(items: list[Event]) -> AsyncIterator[Event]:
    for item in items:
        yield item
