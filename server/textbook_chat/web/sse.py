"""An answer's events as a ``text/event-stream`` response: the stream stage's ``Event``s, written by sse-starlette.

The stream stage (``server/textbook_chat/streams``) hands on typed events whose payload is already one line of JSON
(``events.encode_data``: no line break a client would split on, nothing UTF-8 cannot encode), so nothing
the model or the book says can add a field. Here each becomes an ``id:``/``event:``/``data:`` block,
with a reconnect hint on a response's first event, a ``: ping`` comment while the stream is idle, and a
reader that accepts nothing for ``SEND_TIMEOUT_S`` dropped. On SIGTERM sse-starlette's own early close is
turned off (``drain.py``): a response ends with its answer's last event once the drain has stopped generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from sse_starlette import EventSourceResponse, ServerSentEvent

from textbook_chat.core import metrics
from textbook_chat.streams.events import Event

PING_S = 15
SEND_TIMEOUT_S = 30  # a reader that accepts nothing for this long is dropped
RETRY_MS = 2000  # EventSource reconnect delay we ask browsers for


def server_sent(event: Event, *, retry: int | None = None) -> ServerSentEvent:
    return ServerSentEvent(data=event.json_line, event=event.event, id=str(event.id), retry=retry)


def response(
    events: AsyncIterator[Event], *, headers: Mapping[str, str] | None = None, ping_s: float = PING_S
) -> EventSourceResponse:
    """An SSE response over ``events``: a ``: ping`` every ``ping_s``, no proxy buffering, a reconnect hint first.

    It counts in ``textbook_open_streams`` while it is open.
    """

    async def body() -> AsyncIterator[ServerSentEvent]:
        with metrics.open_stream():
            first = True
            async for event in events:
                yield server_sent(event, retry=RETRY_MS if first else None)
                first = False

    return EventSourceResponse(
        body(),
        ping=ping_s,
        send_timeout=SEND_TIMEOUT_S,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )
