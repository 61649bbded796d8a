"""One event of an answer's stream, and which events end it: shared by the stream, its relay and its replay.

An event has a sequence number (its SSE ``id``), a type and a JSON payload encoded once however many
readers it goes to: the ``data:`` line the web stage sends (``web/sse.py``) and the Redis relay mirrors.
It lives here, not in streaming.py, so the relay can carry events without importing the stream that it is
injected into. Nothing here knows HTTP: the web stage turns events into Server-Sent Events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from textbook_chat.core.text import scrub

# No event for this long from a stream still marked streaming: the worker generating it is gone (a remote
# reader stops waiting, relay.py; a reader is no longer sent to wait for it, chat/message_events.py).
STALL_LIMIT_S = 90.0

EventType = Literal["meta", "sources", "notice", "token", "done", "error"]
TERMINAL: frozenset[str] = frozenset({"done", "error"})


class RelayUnavailable(Exception):
    """Redis failed a relayed read (relay.py) twice in a row; the message says how (no traceback is worth logging).
    Here, not in relay.py, so that a server without Redis never imports the Redis client to catch it."""


class Event:
    """``Event(id, event, data)``: ``data`` is encoded at once and only its line is kept.

    The encoded line is all a reader (``web/sse.py``) or the relay needs, and a stream keeps its events for
    replay: keeping the payload a second time as Python objects (the ``sources`` event's dicts, a dict per
    token) would double what every open answer holds. ``data`` decodes the line when asked (the end of an
    answer, a ``meta`` given its session token), so it reads back exactly what readers were sent.
    """

    __slots__ = ("id", "event", "json_line")

    id: int
    event: EventType
    json_line: str  # the payload, encoded once however many readers the event goes to

    def __init__(self, id: int, event: EventType, data: Mapping[str, Any] | None = None, json_line: str = "") -> None:
        if not json_line:
            if data is None:
                raise TypeError("an Event needs its data or its encoded line")
            json_line = encode_data(data)
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "event", event)
        object.__setattr__(self, "json_line", json_line)

    @property
    def data(self) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(self.json_line)
        return decoded

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an Event is immutable; {name} cannot be set")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return (self.id, self.event, self.json_line) == (other.id, other.event, other.json_line)

    def __hash__(self) -> int:
        return hash((self.id, self.event, self.json_line))

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, event={self.event!r}, json_line={self.json_line!r})"


# JSON leaves these raw, and clients that split lines like str.splitlines (httpx's aiter_lines among them)
# would read a line break there, letting text after it pose as a field: escape them as JSON does others.
# A lone surrogate would also stay raw and make the UTF-8 encoding of the response fail mid-stream, so it
# becomes U+FFFD (core/text.py; the model's text is scrubbed where it arrives, this is the last line).
def encode_data(data: Mapping[str, Any]) -> str:
    """``data`` as one line of JSON that no client splits and UTF-8 can always encode: an event's ``data:``."""
    return scrub(
        json.dumps(data, ensure_ascii=False)
        .replace("\u0085", "\\u0085")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
