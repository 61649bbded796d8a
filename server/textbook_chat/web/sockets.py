"""What a socket may hold before its request is whole: deadlines for headers and body, and a cap per peer.

uvicorn (0.54) has no header or body read deadline and no per-client cap (its ``limit_concurrency`` is global
and answers 503), so 1,500 sockets trickling partial headers were never closed (issue 25). ``GuardedProtocol``
is uvicorn's httptools protocol with three additions, as nginx's ``client_header_timeout`` /
``client_body_timeout`` and Node's ``headersTimeout`` do:

- a request's headers must be whole ``header_timeout_s`` after its first byte (or after the connection opened),
  else a JSON 408 and the socket is closed; more than ``MAX_HEAD_BYTES`` of unfinished head is a JSON 431
  (counted in slices of ``SLICE_BYTES``, so pipelined requests in one read do not add up); at most about
  ``MAX_QUEUED`` pipelined requests wait per connection, the rest of what it sent is parsed as they are answered;
- its body must be whole ``body_timeout_s`` after the headers, else the socket is closed (the app sees the
  client gone, web/app.py answers 499);
- one peer address may have ``max_pending_per_peer`` connections whose request is not whole yet; more get a
  JSON 429 and are closed at once. A request that is whole (an open stream) no longer counts, so the
  benchmarks' 5,000 streams from one address fit, and behind a proxy (one address for everyone) the cap is a
  setting;
- past ``max_connections`` open sockets (what the open-file limit leaves, ``for_this_process``) a new one gets a
  JSON 503 and is closed, so the process keeps the files it needs to answer the others.

Errors uvicorn answers itself (a malformed request line) get the JSON error shape too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import uuid
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from textbook_chat.core.settings import Settings
from textbook_chat.web import protocol_shape

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; the app refuses more than 32 KiB of headers itself (431)
SLICE_BYTES = 1024  # what is parsed at once: the error of the head count, and of the queue cap (~55 tiny GETs)
MAX_QUEUED = 100  # pipelined requests waiting for their turn on one connection
DEFAULT_MAX_PENDING = 1000  # HTTP_MAX_PENDING_PER_CLIENT unset, when the open-file limit leaves room for it
FILES_KEPT = 256  # open files not for client sockets: the index, logs, libraries, Postgres's and the model's spare


@dataclass
class SocketGuard:
    """The limits, and the count of unfinished requests per peer address (one per worker process)."""

    header_timeout_s: float = Settings.http_header_timeout_s
    body_timeout_s: float = Settings.http_body_timeout_s
    max_pending_per_peer: int = DEFAULT_MAX_PENDING  # 0: no cap
    pending: Counter[str] = field(default_factory=Counter)
    max_connections: int = 0  # open sockets of all peers (0: no cap)

    @classmethod
    def from_settings(cls, settings: Settings) -> SocketGuard:
        pending = settings.http_max_pending_per_client
        return cls(
            settings.http_header_timeout_s,
            settings.http_body_timeout_s,
            DEFAULT_MAX_PENDING if pending is None else pending,
        )

    @classmethod
    def for_this_process(cls, settings: Settings) -> SocketGuard:
        """``from_settings`` sized to the open-file limit, once its soft value is raised to the hard one: client
        sockets get what the process's own files and pools leave, one address at most a quarter of that by
        default; one log line says so (a server under the usual 1,024 files was taken by one address, issue 34)."""
        soft, hard, was = raise_open_file_limit()
        pools = settings.db_pool_size + (settings.redis_max_connections if settings.redis_url else 0)
        left = max(64, soft - FILES_KEPT - pools)
        sockets = left // 2 if settings.llm_enabled else left  # an answer may hold a connection to the model too
        guard = cls.from_settings(settings)
        guard.max_connections = sockets
        if settings.http_max_pending_per_client is None:
            guard.max_pending_per_peer = min(DEFAULT_MAX_PENDING, max(8, sockets // 4))
        log.info(
            "open files: %d allowed (soft limit %s, hard %d); %d for client connections, at most %d unfinished "
            "requests per address%s",
            soft,
            f"raised from {was}" if was != soft else "at the hard limit",
            hard,
            sockets,
            guard.max_pending_per_peer,
            "" if settings.http_max_pending_per_client is None else " (HTTP_MAX_PENDING_PER_CLIENT)",
        )
        return guard

    def protocol(self) -> Any:
        """What uvicorn's ``http=`` takes: a factory of ``GuardedProtocol`` bound to this guard; raises if uvicorn's
        protocol has changed shape (``protocol_shape``), as a server without its deadlines must not start."""
        protocol_shape.require_shape()
        return partial(GuardedProtocol, guard=self)

    def __getstate__(self) -> dict[str, Any]:  # `serve --workers N` sends it to each worker: counts start at 0
        return {**self.__dict__, "pending": Counter()}


def raise_open_file_limit() -> tuple[int, int, int]:
    """The soft RLIMIT_NOFILE raised to the hard one (as far as the system lets): (soft, hard, soft before)."""
    was, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(was, 1 << 20)
    if target > was:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # macOS caps it below "unlimited": keep what there is
            return was, hard, was
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, was


class GuardedProtocol(HttpToolsProtocol):
    # Slots, not the instance dict: four more keys there turn uvicorn's key-sharing dict (~300 bytes) into a
    # dict of its own (~1,600 bytes), on every connection, however long it stays open (bench/idle.py).
    __slots__ = ("_guard", "_peer", "_deadline", "_head_bytes", "_held")

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        guard: SocketGuard,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._guard = guard
        self._peer: str | None = None  # counted in guard.pending while set
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None  # bytes of the unfinished head; None once the headers are whole
        self._held = b""  # received, not parsed yet: MAX_QUEUED requests already wait (reading is paused)

    # -- the connection ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self._guard.max_connections
        if cap and len(self.server_state.connections) > cap:
            _count_closed("busy")
            self._refuse(503, "server_busy", "The server is at its limit of open connections; try again shortly.")
            return
        if not self._begin_request():
            _count_closed("pending_cap")
            message = "Too many unfinished requests from your address; try again in a few seconds."
            self._refuse(429, "too_many_connections", message)
            return
        self._head_bytes = 0
        self._arm(self._guard.header_timeout_s, "header_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_request()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():  # refused (cap, deadline, too large): what follows is not read
            return
        if self._held:  # a read already under way when reading was paused: after what waits, in order
            self._held += data
            self.flow.pause_reading()
            return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        """``data`` through uvicorn's parser a slice at a time: only the slices ending inside a head count as head
        bytes, and once ``MAX_QUEUED`` requests wait, the rest is held until one is answered."""
        for start in range(0, len(data), SLICE_BYTES):
            if len(self.pipeline) >= MAX_QUEUED:
                self._held = data[start:]
                self.flow.pause_reading()
                return
            piece = data[start : start + SLICE_BYTES]
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if self._head_bytes is not None:
                self._head_bytes += len(piece)
                if self._head_bytes > MAX_HEAD_BYTES:
                    _count_closed("too_large")
                    message = f"The request head is larger than {MAX_HEAD_BYTES // 1024} KiB."
                    self._refuse(431, "request_headers_too_large", message)
                    return

    def on_response_complete(self) -> None:
        super().on_response_complete()  # resumes reading
        if not self._held or self.transport.is_closing():
            return
        if len(self.pipeline) < MAX_QUEUED:
            held, self._held = self._held, b""
            self._parse(held)  # holds (and pauses) again if the queue fills up
        else:
            self.flow.pause_reading()

    # -- parser callbacks ----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._head_bytes is None:
            # A further request on a kept-alive (or pipelining) connection: its head has the same deadline, from
            # its first byte; the connection is already there, so the per-peer cap does not refuse it.
            self._begin_request(capped=False)
            self._head_bytes = 0
            self._arm(self._guard.header_timeout_s, "header_timeout")
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._arm(self._guard.body_timeout_s, "body_timeout")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._end_request()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self._refuse(400, "bad_request", "The request is not valid HTTP/1.1.")

    # -- deadlines and the per-peer count ----------------------------------------------------------------------

    def _begin_request(self, *, capped: bool = True) -> bool:
        if self._peer is not None:
            return True
        peer = self.client[0] if self.client else ""
        cap = self._guard.max_pending_per_peer
        if capped and cap and self._guard.pending[peer] >= cap:
            return False
        self._guard.pending[peer] += 1
        self._peer = peer
        return True

    def _end_request(self) -> None:
        if self._peer is None:
            return
        pending = self._guard.pending
        pending[self._peer] -= 1
        if pending[self._peer] <= 0:
            del pending[self._peer]
        self._peer = None

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, reason: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        _count_closed(reason)
        log.debug("connection closed: %s", reason.replace("_", " "))
        if reason == "header_timeout" and (self.cycle is None or self.cycle.response_complete):
            self._refuse(408, "request_timeout", "The request headers did not arrive in time.")
        else:
            # The app already has this request: it sees the client gone (no response of ours may cross its own).
            self.transport.close()

    def _refuse(self, status: int, code: str, message: str) -> None:
        """A JSON error in the API's shape, then close: the connection is in no state to carry on."""
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        reason = {
            400: b"Bad Request",
            408: b"Request Timeout",
            429: b"Too Many Requests",
            431: b"Request Header Fields Too Large",
            503: b"Service Unavailable",
        }[status]
        head = [
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            *([b"retry-after: 5\r\n"] if status in (429, 503) else []),
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"x-request-id: " + uuid.uuid4().hex.encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _count_closed(reason: str) -> None:
    # Imported here, in the worker: `serve` (and its supervisor of N workers) imports this module before the
    # metrics directory is set up, and a process that imports the metrics writes files there (cli._metrics_dir).
    from textbook_chat.core import metrics

    metrics.SOCKETS_CLOSED.labels(reason).inc()
