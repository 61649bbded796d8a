"""One event of an answer's stream, and which events end it: shared by the stream, its relay and its replay.

An event has a sequence number (its SSE ``id``), a type and a JSON payload encoded once however many
readers it goes to. It lives here, not in streaming.py, so the Redis relay can carry events without
importing the stream that it is injected into.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sse_starlette import ServerSentEvent

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
            object.__setattr__(self, "json_line", _json_line(self.data))

    def sse(self, *, retry: int | None = None) -> ServerSentEvent:
        return ServerSentEvent(data=self.json_line, event=self.event, id=str(self.id), retry=retry)


# JSON leaves these raw, and clients that split lines like str.splitlines (httpx's aiter_lines among them)
# would read a line break there, letting text after it pose as a field: escape them as JSON does others.
# A lone surrogate would also stay raw and make the UTF-8 encoding of the response fail mid-stream, so it
# becomes U+FFFD (core/text.py; the model's text is scrubbed where it arrives, this is the last line).
def _json_line(data: Mapping[str, Any]) -> str:
    return scrub(
        json.dumps(data, ensure_ascii=False)
        .replace("\u0085", "\\u0085")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
