"""The app factory: routes, middleware, error handlers, and the lifespan that owns every client and the drain.

Nothing is built at import time; ``create_app(settings)`` builds one app (tests pass their own).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from textbook_chat.core import logs, memory, metrics
from textbook_chat.core.errors import AppError, MethodNotAllowed, NotFound, PayloadTooLarge
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest
from textbook_chat.search import calibration
from textbook_chat.search.retrieval import Retriever
from textbook_chat.web import admin, api, openapi, webapp
from textbook_chat.web.drain import Drain, drain_on_sigterm
from textbook_chat.web.services import Services, open_services

log = logging.getLogger(__name__)
access_log = logging.getLogger("server.access")

MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 32 * 1024  # all request headers together; nginx's default refuses a single line over 8 KiB
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
                await services.chat.faq.refresh(services.index)  # for an outage of the index before any reader
            if served:  # the real server (tests build many apps in one process and skip both)
                if services.chat is not None and services.chat.retriever is not None:
                    await _warm(services.chat.retriever)
                    # The offline answer's cross-encoder, loaded now rather than on the first reader's question.
                    await asyncio.to_thread(services.chat.generator.warm_up)
                _freeze_heap()
            restore = drain_on_sigterm(drain) if handle_sigterm else None
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
            ClientDisconnect: _client_gone,
            Exception: _unhandled_error,
        },
    )
    # Starlette's own trailing-slash redirect writes the Host header into Location (an open redirect through a
    # forged Host, issue 25): the 404 handler redirects instead, relatively (_slash_redirect).
    app.router.redirect_slashes = False
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
    memory.return_free_heap()  # what loading left free (~15-30 MB here)


async def _openapi(request: Request) -> JSONResponse:
    return JSONResponse(openapi.document())


async def _metrics(request: Request) -> Response:
    # Not rate limited: a scraper polls it on a schedule (restrict who reaches it at the proxy).
    body, content_type = metrics.render(api.services(request).settings.metrics_dir)
    return Response(body, media_type=content_type)


async def _ingest_at_start(services: Services) -> None:
    """``serve --book PATH``: bring the index up to date before taking requests (a no-op run is fast)."""
    settings = services.settings
    assert settings.book_path is not None and services.index is not None and services.embedder is not None
    report = await ingest.run(settings.book_path, services.index, services.embedder, base_url=settings.book_base_url)
    log.info("book ingested at start-up: %s", report.summary())
    serving = services.chat.retriever if services.chat is not None else None
    retriever = serving or Retriever(services.index, services.embedder)
    await calibration.after_ingest(retriever, services.index, book_changed=report.changed)
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
    from textbook_chat.search.bookwatch import BookWatcher

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
        return _slash_redirect(request) or error_response(404, NotFound.code, "No such resource.")
    if exc.status_code == 405:
        return error_response(405, MethodNotAllowed.code, f"{request.method} is not allowed here.", exc.headers)
    return error_response(exc.status_code, "http_error", str(exc.detail), exc.headers)


def _slash_redirect(request: Request) -> Response | None:
    """What Starlette's ``redirect_slashes`` does (``/admin/report/`` -> ``/admin/report`` and the reverse), but
    with a relative ``Location`` that no Host header can point elsewhere; None when no route matches either way."""
    path = request.scope["path"]
    if path == "/":
        return None
    other = path.rstrip("/") if path.endswith("/") else path + "/"
    other = "/" + other.lstrip("/")  # never "//host": a protocol-relative Location leaves the site
    scope = {**request.scope, "path": other}
    if not any(route.matches(scope)[0] is not Match.NONE for route in request.app.router.routes):
        return None
    query = request.scope.get("query_string", b"").decode("latin-1")
    return RedirectResponse(quote(other) + (f"?{query}" if query else ""), status_code=307)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client went away before its body was whole: not a server error, so no traceback and no 5xx in the
    metrics (issue 25). 499 is nginx's "client closed request"; nobody reads it, the access log and metrics do."""
    return Response(status_code=CLIENT_CLOSED_REQUEST)


CLIENT_CLOSED_REQUEST = 499


async def _unhandled_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this for anything unhandled; only here is a traceback logged.
    request_id = request.scope.get("request_id")  # our middleware has already reset the context variable
    if _out_of_files(exc):
        # The process is at its open-file limit (web/sockets.py keeps a reserve; this is past it): busy, not broken.
        log.warning("out of open files on %s %s: answered 503", request.method, request.url.path)
        response = error_response(
            503, "server_busy", "The server is at its limit of open connections; try again in a few seconds."
        )
        response.headers["Retry-After"] = "5"
    else:
        log.error(
            "unhandled error on %s %s",
            request.method,
            request.url.path,
            exc_info=exc,
            extra={"request_id": request_id},
        )
        response = error_response(500, "internal_error", "Something went wrong on our side. Please try again.")
    if request_id:
        # ServerErrorMiddleware sits outside our middleware, so the header has to be set here too.
        response.headers["X-Request-ID"] = request_id
    return response


def _out_of_files(exc: BaseException | None) -> bool:
    """``exc``, or what caused it, is EMFILE/ENFILE ("Too many open files", for this process or the system)."""
    for _ in range(10):
        if exc is None:
            return False
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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
            route = route_template(scope)
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


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/api/sessions/{session_id}``), never the raw path: a metric label."""
    route = scope.get("route")
    if isinstance(route, Route):
        return route.path
    if isinstance(route, Mount):
        return route.path + "/{path}"
    return metrics.UNMATCHED_ROUTE


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
