"""The app factory: routes, middleware, error handlers, and the lifespan that owns every client and the drain.

Nothing is built at import time; ``create_app(settings)`` builds one app (tests pass their own).
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import ctypes.util
import gc
import logging
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from types import FrameType
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.core import logs, metrics
from server.core.errors import AppError, MethodNotAllowed, NotFound, PayloadTooLarge
from server.core.settings import Settings
from server.index import ingest
from server.search import calibration
from server.search.retrieval import Retriever
from server.streams.streaming import StreamRegistry
from server.web import admin, api, openapi, webapp
from server.web.services import Services, open_services

log = logging.getLogger(__name__)
access_log = logging.getLogger("server.access")

MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 32 * 1024  # all request headers together; nginx's default refuses a single line over 8 KiB
_PERSIST_WAIT_S = 5.0  # after a drain, for answers that ended but are still being written to Postgres
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def create_app(
    settings: Settings | None = None, *, configure_logging: bool | None = None, handle_sigterm: bool | None = None
) -> Starlette:
    """Both flags default to True when settings come from the environment (the served app, ``serve``).

    ``handle_sigterm``: SIGTERM drains (``Drain``) before the server's own shutdown; tests call
    ``app.state.drain`` themselves instead, since the test runner owns the process's signals.
    """
    served = settings is None
    configure_logging = served if configure_logging is None else configure_logging
    handle_sigterm = served if handle_sigterm is None else handle_sigterm
    settings = settings or Settings.from_env()
    drain = Drain(settings.shutdown_grace_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        if configure_logging:
            logs.configure(settings.log_level, settings.log_format)
        async with open_services(settings, chat=True) as services:
            if settings.book_path is not None:
                await _ingest_at_start(services)
            if services.chat is not None:
                drain.attach(services.chat.registry)
            if served:  # the real server (tests build many apps in one process and skip both)
                if services.chat is not None and services.chat.retriever is not None:
                    await _warm(services.chat.retriever)
                _freeze_heap()
            restore = _drain_on_sigterm(drain) if handle_sigterm else None
            try:
                async with _watching_the_book(services):
                    yield {"services": services, "drain": drain}
            finally:
                if restore is not None:
                    restore()
        if settings.metrics_dir is not None:
            metrics.mark_process_dead(os.getpid(), settings.metrics_dir)  # this worker's open streams are gone

    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/openapi.json", _openapi, methods=["GET"]),
        Route("/api/modules", api.modules, methods=["GET"]),
        Route("/api/faq", api.faq, methods=["GET"]),
        Route("/api/chat", api.chat, methods=["POST"]),
        Route("/api/chat/messages", api.create_message, methods=["POST"]),
        Route("/api/chat/messages/{message_id}/stream", api.message_stream, methods=["GET"]),
        Route("/api/chat/messages/{message_id}", api.cancel_message, methods=["DELETE"]),
        Route("/api/sessions", api.user_sessions, methods=["GET"]),
        Route("/api/sessions/{session_id}/messages", api.session_messages, methods=["GET"]),
        Route("/api/sessions/{session_id}", api.delete_session, methods=["DELETE"]),
        Route("/api/messages/{message_id}/feedback", api.feedback, methods=["POST"]),
        *admin.routes(),  # the authors' report, behind ADMIN_TOKEN
        *webapp.routes(settings),  # the demo page, the book's pages (/docs/...) and the panel's assets
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            AppError: _app_error,
            HTTPException: _http_error,
            Exception: _unhandled_error,
        },
    )
    app.add_middleware(BodyLimitMiddleware, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.allowed_origins),
        # Credentials only make sense (and are only allowed by browsers) for listed origins, never for "*".
        allow_credentials="*" not in settings.allowed_origins,
        allow_methods=["GET", "POST", "DELETE"],
        allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "X-Request-ID", "X-Session-Token"],
        expose_headers=["X-Request-ID", "Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
        max_age=600,
    )
    app.add_middleware(RequestIdMiddleware)
    app.state.drain = drain
    return app


async def _warm(retriever: Retriever) -> None:
    """Load the embedder and the in-process index copy now, not on the first reader's question."""
    started = time.perf_counter()
    try:
        await retriever.warm()
    except Exception as exc:  # the index may be down or empty: questions get the FAQ until it is back
        log.warning("retrieval not warmed at start: %s", type(exc).__name__)
        return
    log.info("retrieval warmed in %.0f ms", (time.perf_counter() - started) * 1000)


def _freeze_heap() -> None:
    """Exempt what start-up loaded (model, index copy, libraries) from every later garbage collection.

    Without this, each full collection walked that whole heap and paused the event loop 90-170 ms
    (measured with gc.callbacks under bench/chat.py): the slowest first tokens were those pauses.
    """
    gc.collect()
    gc.freeze()
    _return_free_memory()


def _return_free_memory() -> None:
    """Hand the heap that loading left free (the model file's parse, an ingest's batches) back to the OS.

    glibc keeps freed memory for reuse; after start-up it stays unused and counts in RSS (~15-30 MB here).
    """
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        pass


async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(openapi.document())


async def _metrics(request: Request) -> Response:
    # Not rate limited: a scraper polls it on a schedule (restrict who reaches it at the proxy).
    body, content_type = metrics.render(api.services(request).settings.metrics_dir)
    return Response(body, media_type=content_type)


class Drain:
    """Shutdown in three steps: refuse new questions, let running answers finish for ``grace_s``, stop the rest.

    Stopped answers end with a retryable ``error`` event and are stored as ``interrupted`` with their text
    (chat.py); the readers' questions were stored before generation began, so nothing they wrote is lost.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.started_at: float | None = None
        self._registry: StreamRegistry | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def attach(self, registry: StreamRegistry) -> None:
        self._registry = registry

    def begin(self) -> None:
        """Refuse new questions from now on (503 with Retry-After; /health says ``draining``)."""
        if self.started_at is None:
            self.started_at = time.monotonic()
            metrics.DRAINING.set(1)

    def start(self, then: Callable[[], None] | None = None) -> asyncio.Task[None]:
        """``begin``, then ``finish`` in a task of its own, then call ``then`` (the server's own shutdown)."""
        self.begin()
        if self._task is None:
            self._task = asyncio.create_task(self._run(then), name="drain")
        return self._task

    async def finish(self) -> None:
        """Wait until no answer is being generated or ``grace_s`` has passed; then stop what is left."""
        registry = self._registry
        if registry is None:
            return
        assert self.started_at is not None, "begin() first"
        deadline = self.started_at + self.grace_s
        seen: set[asyncio.Task[None]] = set()
        log.info("shutting down: no new questions; %d answer(s) in progress", len(registry.live()))
        while True:
            running = [s.task for s in registry.live() if s.task is not None and not s.task.done()]
            seen.update(running)
            left = deadline - time.monotonic()
            if not running or left <= 0:
                break
            await asyncio.wait(running, timeout=min(left, 0.5))
        if running:
            log.warning(
                "shutting down: stopping %d answer(s) still in progress after %.0f s", len(running), self.grace_s
            )
        await registry.cancel_all("shutdown")
        # Finished answers may still be writing to Postgres: the pool closes only after this.
        pending = [task for task in seen if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=_PERSIST_WAIT_S)

    async def _run(self, then: Callable[[], None] | None) -> None:
        try:
            await self.finish()
        except Exception:
            log.exception("drain failed; shutting down anyway")
        finally:
            if then is not None:
                then()


def _drain_on_sigterm(drain: Drain) -> Callable[[], None] | None:
    """Route SIGTERM through ``drain`` before the server's handler; returns how to undo it (None: not possible).

    The server (uvicorn) installs its handler before the lifespan starts; a second SIGTERM goes straight to it.
    """
    from sse_starlette.sse import AppStatus

    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        return None  # no server handler to hand over to once drained
    server_exit: Callable[[int, FrameType | None], Any] = previous
    loop = asyncio.get_running_loop()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if drain.draining:
            server_exit(signum, frame)
            return
        # A fresh context: the handler interrupts whichever request happens to run, whose ids it would inherit.
        loop.call_soon_threadsafe(drain.start, lambda: server_exit(signum, frame), context=contextvars.Context())

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        return None
    # sse-starlette would otherwise end every open stream the moment the server starts exiting, before the
    # final events of interrupted answers are sent; our streams end by themselves once drained.
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)

    return restore


async def _ingest_at_start(services: Services) -> None:
    """``serve --book PATH``: bring the index up to date before taking requests (a no-op run is fast)."""
    settings = services.settings
    assert settings.book_path is not None and services.index is not None and services.embedder is not None
    report = await ingest.run(settings.book_path, services.index, services.embedder, base_url=settings.book_base_url)
    log.info("book ingested at start-up: %s", report.summary())
    serving = services.chat.retriever if services.chat is not None else None
    retriever = serving or Retriever(services.index, services.embedder)
    retriever.calibration = await calibration.after_ingest(retriever, services.index, book_changed=report.changed)
    services.embedder.release_batches()


def _watching_the_book(services: Services) -> AbstractAsyncContextManager[object]:
    """``serve --book``: re-ingest when the book changes (every BOOK_WATCH_S) or on SIGHUP (bookwatch.py)."""
    settings = services.settings
    chat = services.chat
    if settings.book_path is None or chat is None or chat.retriever is None or services.index is None:
        return nullcontext()
    if not services.index.embedded:  # with a Qdrant server every worker would watch: ingest from one place instead
        return nullcontext()
    assert services.embedder is not None
    from server.search.bookwatch import BookWatcher

    watcher = BookWatcher(
        settings.book_path, services.index, services.embedder, chat.retriever, base_url=settings.book_base_url
    )
    return watcher.running(settings.book_watch_s)


def error_response(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


async def _app_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AppError)
    return error_response(exc.status, exc.code, exc.message, exc.headers or None)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(404, NotFound.code, "No such resource.")
    if exc.status_code == 405:
        return error_response(405, MethodNotAllowed.code, f"{request.method} is not allowed here.", exc.headers)
    return error_response(exc.status_code, "http_error", str(exc.detail), exc.headers)


async def _unhandled_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this for anything unhandled; only here is a traceback logged.
    request_id = request.scope.get("request_id")  # our middleware has already reset the context variable
    log.error(
        "unhandled error on %s %s", request.method, request.url.path, exc_info=exc, extra={"request_id": request_id}
    )
    response = error_response(500, "internal_error", "Something went wrong on our side. Please try again.")
    if request_id:
        # ServerErrorMiddleware sits outside our middleware, so the header has to be set here too.
        response.headers["X-Request-ID"] = request_id
    return response


class RequestIdMiddleware:
    """Gives every request an id (the caller's X-Request-ID when it is sane), logged and echoed back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex
        scope["request_id"] = request_id
        token = logs.request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = metrics.route_template(scope)
            metrics.observe_request(route, scope["method"], status, elapsed)
            access_log.log(
                logging.DEBUG if route in _QUIET_ROUTES else logging.INFO,
                "%s %s %s",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "request_id": request_id,
                    "message_id": scope.get("message_id"),  # set by api.py once the request names a message
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 1),
                },
            )
            logs.request_id_var.reset(token)


_QUIET_ROUTES = frozenset({"/metrics", "/health"})  # polled every few seconds by scrapers and orchestrators


class BodyLimitMiddleware:
    """Refuses bodies over ``max_bytes`` with 413, by Content-Length up front or while reading a chunked body,
    and requests whose headers add up to more than ``MAX_HEADER_BYTES`` with 431."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(name) + len(value) for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            message = f"The request headers are larger than {MAX_HEADER_BYTES // 1024} KiB."
            response = error_response(431, "request_headers_too_large", message, {"Connection": "close"})
            await response(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise PayloadTooLarge(self._message)
            return message

        await self.app(scope, limited_receive, send)

    @property
    def _message(self) -> str:
        return f"The request body is larger than {self.max_bytes // 1024} KiB."

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, PayloadTooLarge.code, self._message, {"Connection": "close"})
        await response(scope, receive, send)
