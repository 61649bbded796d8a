"""One event of an answer's stream, and which events end it: shared by the stream, its relay and its replay.

An event has a sequence number (its SSE ``id``), a type and a JSON payload encoded once however many
readers it goes to: the ``data:`` line the web stage sends (``web/sse.py``) and the Redis relay mirrors.
It lives here, not in streaming.py, so the relay can carry events without importing the stream that it is
injected into. Nothing here knows HTTP: the web stage turns events into Server-Sent Events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from server.core.text import scrub

EventType = Literal["meta", "sources", "notice", "token", "done", "error"]
TERMINAL: frozenset[str] = frozenset({"done", "error"})


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    event: EventType
    data: Mapping[str, Any]
    json_line: str = ""  # the payload, encoded once however many readers the event goes to

    def __post_init__(self) -> None:
        if not self.json_line:
            object.__setattr__(self, "json_line", encode_data(self.data))


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
