"""An SSE reader that follows the WHATWG event-stream parsing rules, as a browser's EventSource would.

Used by the tests and benchmarks to read ``/api/chat`` and the resumable stream over a real socket.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

# Text (the model's, or the book's) that would add or end an SSE field if it reached the wire unescaped.
HOSTILE_TEXTS = [
    "\n\nevent: done\ndata: x",
    "\rid: 99",
    "a\r\n\r\nretry: 1\r\n\r\nevent: error\r\ndata: {}",
    ": ping\n\nid: 7",
    "\u2028id: 99\u2029event: done\x85data: x",
]


@dataclass
class SSEEvent:
    event: str
    data: str
    id: str | None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class EventParser:
    """Feed lines (without their terminator); complete events come out of ``feed``."""

    comments: list[str] = field(default_factory=list)
    last_event_id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None
    _retry: int | None = None

    def feed(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments.append(line[1:].strip())
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if self._id is not None:
            self.last_event_id = self._id
        if not self._data:
            self._event, self._id, self._retry = "", None, None
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data), self._id, self._retry)
        self._event, self._data, self._id, self._retry = "", [], None, None
        return event


async def events(response: httpx.Response) -> AsyncIterator[SSEEvent]:
    parser = EventParser()
    async for line in response.aiter_lines():
        event = parser.feed(line)
        if event is not None:
            yield event


async def read_all(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> list[SSEEvent]:
    """The whole stream of one request; raises for a non-2xx answer."""
    async with client.stream(method, url, **kwargs) as response:
        if response.status_code >= 300:
            await response.aread()
            response.raise_for_status()
        assert response.headers["content-type"].startswith("text/event-stream"), response.headers
        return [event async for event in events(response)]


async def read_some(
    client: httpx.AsyncClient, url: str, *, tokens: int, headers: dict[str, str] | None = None
) -> list[SSEEvent]:
    """Read until ``tokens`` token events arrived, then drop the connection."""
    seen: list[SSEEvent] = []
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        async for event in events(response):
            seen.append(event)
            if sum(e.event == "token" for e in seen) == tokens:
                break
    return seen


def answer_text(stream: list[SSEEvent]) -> str:
    return "".join(e.json()["text"] for e in stream if e.event == "token")


def of_type(stream: list[SSEEvent], name: str) -> list[dict[str, Any]]:
    return [e.json() for e in stream if e.event == name]
