"""HTTP handlers: identify the caller, spend its budget, validate, call the domain modules, shape the answer.

Only asking costs the question budget; every other route spends the looser read budget. Anything
that is not the caller's (a session, a message, a stream without its capability) is a 404.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from textbook_chat.chat import exchange as chat_pipeline
from textbook_chat.chat import message_events
from textbook_chat.chat.question import Asker, Question, SessionRef
from textbook_chat.chat.service import ChatService, Started
from textbook_chat.core import logs
from textbook_chat.core.errors import (
    BadRequest,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
)
from textbook_chat.store.rows import Citation, MessageRow
from textbook_chat.store.sessions import Store
from textbook_chat.streams.events import Event
from textbook_chat.web import health as health_checks
from textbook_chat.web import ratelimit, schemas, sse
from textbook_chat.web.services import Services

CANCEL_WAIT_S = 2.0  # DELETE answers once the stream has ended, or says it is still ending
DRAIN_RETRY_AFTER_S = 5  # a refused question during shutdown: by then a proxy sends it to another process
HISTORY_PAGE = 50
HISTORY_MAX_PAGE = 200


def services(request: Request) -> Services:
    result: Services = request.state.services
    return result


@dataclass(frozen=True)
class Caller:
    client: str  # the client address (TRUSTED_PROXIES decides whether X-Forwarded-For counts)
    user_id: str | None
    budget_headers: dict[str, str]

    @property
    def key(self) -> str:
        return ratelimit.caller_key(self.client, self.user_id)


async def caller(request: Request, kind: ratelimit.Kind) -> Caller:
    """Who is asking, with one unit of ``kind`` spent (401 for a bad token, 429 when out of budget)."""
    return await spend(request, await identify(request), kind)


async def identify(request: Request) -> Caller:
    """Who is asking (401 for a bad token), with nothing spent yet."""
    svc = services(request)
    user_id = await svc.auth.user_id(request.headers.get("authorization")) if svc.auth else None
    peer = request.client.host if request.client else None
    # Every X-Forwarded-For line, in order: a proxy may append its own line after one the client sent.
    forwarded = ", ".join(request.headers.getlist("x-forwarded-for")) or None
    client = ratelimit.client_address(peer, forwarded, svc.settings.trusted_proxies)
    return Caller(client, user_id, {})


async def spend(request: Request, who: Caller, kind: ratelimit.Kind) -> Caller:
    limiter = services(request).limiter
    if limiter is None:
        return who
    budget = await limiter.hit(kind, client=who.client, user_id=who.user_id)
    return Caller(who.client, who.user_id, budget.headers())


async def health(request: Request) -> JSONResponse:
    """200 while the process can answer; 503 ``draining`` once it is shutting down, so balancers move on."""
    body = await health_checks.check(services(request))
    if _draining(request):
        return JSONResponse({**body, "status": "draining"}, status_code=503)
    return JSONResponse(body)


def _draining(request: Request) -> bool:
    drain = getattr(request.state, "drain", None)
    return bool(drain is not None and drain.draining)


def bind_message(request: Request, message_id: uuid.UUID | str) -> None:
    """Every later log line of this request (and its access line) carries ``message_id``."""
    request.scope["message_id"] = str(message_id)
    logs.bind_message(str(message_id))


async def read_json(request: Request) -> Any:
    """The JSON body; only ``application/json`` is read, so a cross-site form (text/plain, urlencoded, multipart,
    which a browser sends without a CORS preflight) cannot spend a reader's budget: 415 before anything else."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType("Send the body as JSON with Content-Type: application/json.")
    return schemas.decode_json(await request.body())


def parse_uuid(value: str, what: str = "resource") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound(f"No such {what}.") from None


def chat_service(request: Request) -> ChatService:
    chat = services(request).chat
    if chat is None:
        raise ServiceUnavailable("Chat is not available on this server.")
    return chat


def require_store(request: Request) -> Store:
    store = services(request).store
    if store is None:
        raise ServiceUnavailable("Chat history is not enabled on this server.", code="history_disabled")
    return store


# -- asking -------------------------------------------------------------------------------------------


async def _start(request: Request) -> tuple[Started, Caller]:
    if _draining(request):
        raise ServiceUnavailable(
            "The server is restarting; please ask again in a few seconds.",
            code="shutting_down",
            headers={"Retry-After": str(DRAIN_RETRY_AFTER_S)},
        )
    body = schemas.parse_chat_request(await read_json(request))  # a malformed request costs no budget
    who = await identify(request)
    service = chat_service(request)
    question = Question(
        text=body.question,
        asker=Asker(who.key, who.user_id),
        session=SessionRef(body.session_id, body.session_token),
        module=body.module,
        selected_text=body.selected_text,
        client_request_id=body.client_request_id,
    )
    svc = services(request)
    async with ratelimit.admit(svc.limiter, svc.slots, client=who.client, user_id=who.user_id) as admitted:
        started = await chat_pipeline.start(service, question, on_finish=admitted.release)
        if started.created:
            admitted.keep()  # the answer's run gives the slot back when it ends
    bind_message(request, started.message_id)
    return started, Caller(who.client, who.user_id, admitted.headers)


async def chat(request: Request) -> Response:
    """POST /api/chat: the answer as ``text/event-stream`` in the same response."""
    started, who = await _start(request)
    events = await message_events.events(chat_service(request), started.message_id)
    if events is None:  # only when the first request's answer is gone everywhere (no Redis, no Postgres copy)
        raise NotFound("No such message.")
    if started.session_token:  # this response created the session: its meta alone carries the token
        events = _with_session_token(events, started.session_token)
    return sse.response(events, headers=who.budget_headers)


async def _with_session_token(events: AsyncIterator[Event], token: str) -> AsyncIterator[Event]:
    async for event in events:
        if event.event == "meta":
            event = Event(event.id, "meta", {**event.data, "session_token": token})
        yield event


async def create_message(request: Request) -> JSONResponse:
    """POST /api/chat/messages: start generating; the answer is read from ``stream_url`` (EventSource)."""
    started, who = await _start(request)
    payload = {
        "message_id": str(started.message_id),
        "session_id": str(started.session_id),
        "stream_url": started.stream_url,
        "created": started.created,
    }
    if started.session_token:
        payload["session_token"] = started.session_token
    return JSONResponse(payload, status_code=202, headers=who.budget_headers)


async def message_stream(request: Request) -> Response:
    """GET /api/chat/messages/{id}/stream: live or replayed events after ``Last-Event-ID``; 204 after ``done``."""
    who = await caller(request, "read")
    service = chat_service(request)
    message_id = _capability(request, service)
    after = _last_event_id(request)
    last = await message_events.last_event(service, message_id, seen=after)
    if last is None:
        raise NotFound("No such message.")
    last_id, ended = last
    if ended and after >= last_id:
        return Response(status_code=204, headers=who.budget_headers)  # the EventSource spec's "stop reconnecting"
    events = await message_events.events(service, message_id, after)
    if events is None:
        raise NotFound("No such message.")
    return sse.response(events, headers=who.budget_headers)


async def cancel_message(request: Request) -> JSONResponse:
    """DELETE /api/chat/messages/{id}: stop the generation; its stream ends with ``done``/``cancelled``."""
    who = await caller(request, "read")
    service = chat_service(request)
    message_id = _capability(request, service)
    last = await message_events.last_event(service, message_id)
    if last is None:
        raise NotFound("No such message.")
    if last[1]:
        return JSONResponse(
            {"message_id": str(message_id), "status": "finished"}, status_code=202, headers=who.budget_headers
        )
    await service.registry.cancel(str(message_id), "client")
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        last = await message_events.last_event(service, message_id)
        if last is None or last[1]:
            return JSONResponse(
                {"message_id": str(message_id), "status": "cancelled"}, status_code=202, headers=who.budget_headers
            )
    return JSONResponse(
        {"message_id": str(message_id), "status": "cancelling"}, status_code=202, headers=who.budget_headers
    )


def _capability(request: Request, service: ChatService) -> uuid.UUID:
    """The message id of a request carrying a valid capability; 404 for anything else (nothing leaks)."""
    message_id = parse_uuid(request.path_params["message_id"], "message")
    if not service.capabilities.verify(str(message_id), request.query_params.get("cap")):
        raise NotFound("No such message.")
    bind_message(request, message_id)
    return message_id


def _last_event_id(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id") or "0"
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else 0  # "²".isdigit() is true


# -- history ------------------------------------------------------------------------------------------


async def session_messages(request: Request) -> JSONResponse:
    """GET /api/sessions/{id}/messages?limit=&after=: oldest first, with citations; ``next`` pages on."""
    who = await caller(request, "read")
    store = require_store(request)
    session_id = await _own_session(request, store, who)
    limit = _int_param(request, "limit", HISTORY_PAGE, 1, HISTORY_MAX_PAGE)
    after = _time_param(request, "after")
    messages = await store.history(session_id, limit=limit + 1, after=after)
    page, more = messages[:limit], len(messages) > limit
    chat = services(request).chat
    if chat is not None:
        page = await message_events.settled(chat, page)
    body = {
        "session_id": str(session_id),
        "messages": [_message_json(m, chat) for m in page],
        "next": page[-1].created_at.isoformat() if more and page else None,
    }
    return JSONResponse(body, headers=who.budget_headers)


async def delete_session(request: Request) -> Response:
    """DELETE /api/sessions/{id}: the session, its messages and their citations."""
    who = await caller(request, "read")
    store = require_store(request)
    session_id = await _own_session(request, store, who)
    await store.delete_session(session_id)
    return Response(status_code=204, headers=who.budget_headers)


async def user_sessions(request: Request) -> JSONResponse:
    """GET /api/sessions: a signed-in reader's sessions, newest activity first."""
    who = await caller(request, "read")
    if who.user_id is None:
        raise Unauthorized("Sign in to list your conversations.", code="sign_in_required")
    store = require_store(request)
    limit = _int_param(request, "limit", HISTORY_PAGE, 1, HISTORY_MAX_PAGE)
    sessions = await store.list_user_sessions(who.user_id, limit=limit)
    body = {
        "sessions": [
            {
                "id": str(s.id),
                "title": s.title,
                "message_count": s.message_count,
                "created_at": s.created_at.isoformat(),
                "last_activity_at": s.last_activity_at.isoformat(),
            }
            for s in sessions
        ]
    }
    return JSONResponse(body, headers=who.budget_headers)


async def feedback(request: Request) -> JSONResponse:
    """POST /api/messages/{id}/feedback: up or down, optional comment; the last rating wins."""
    who = await caller(request, "read")
    message_id = parse_uuid(request.path_params["message_id"], "message")
    bind_message(request, message_id)
    body = schemas.parse_feedback(await read_json(request))
    store = require_store(request)
    message = await store.get_message(message_id)
    token = request.headers.get("x-session-token")
    if message is None or await store.authorize_session(message.session_id, token=token, user_id=who.user_id) is None:
        raise NotFound("No such message.")
    if not await store.set_feedback(message_id, message.session_id, body.rating, body.comment):  # type: ignore[arg-type]
        raise NotFound("No such message.")
    result = {"message_id": str(message_id), "rating": body.rating, "comment": body.comment}
    return JSONResponse(result, headers=who.budget_headers)


async def _own_session(request: Request, store: Store, who: Caller) -> uuid.UUID:
    session_id = parse_uuid(request.path_params["session_id"], "session")
    token = request.headers.get("x-session-token")
    if await store.authorize_session(session_id, token=token, user_id=who.user_id) is None:
        raise NotFound("No such session.", code="session_not_found")
    return session_id


def _message_json(message: MessageRow, chat: ChatService | None) -> dict[str, Any]:
    # An answer still being written gets its stream: a reader who reloaded mid-answer follows it from the start.
    live = message.role == "assistant" and message.status == "streaming"
    stream_url = chat.capabilities.stream_url(str(message.id)) if live and chat is not None else None
    return {
        "id": str(message.id),
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "mode": message.mode,
        "module_filter": message.module_filter,
        "selected_text": message.selected_text,
        "confidence": message.confidence,
        "feedback": message.feedback,
        "created_at": message.created_at.isoformat(),
        "citations": [_citation_json(c) for c in message.citations],
        "stream_url": stream_url,
    }


def _citation_json(citation: Citation) -> dict[str, Any]:
    return {
        "n": citation.position,
        "chunk_id": citation.chunk_id,
        "module": citation.module,
        "chapter": citation.chapter,
        "title": citation.title,
        "url": citation.url,
        "score": citation.relevance_score,
        "excerpt": citation.excerpt,
    }


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}.", code="validation_error")
    return int(raw)


def _time_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an ISO 8601 timestamp (the 'next' of a previous page).") from None
    if value.tzinfo is None:
        raise BadRequest(f"{name} must include a time zone.", code="validation_error")
    return value


# -- the book -----------------------------------------------------------------------------------------


async def modules(request: Request) -> JSONResponse:
    who = await caller(request, "read")
    index = services(request).index
    if index is None or not await index.exists():
        return JSONResponse({"modules": []}, headers=who.budget_headers)
    body = {
        "modules": [
            {
                "id": m.id,
                "title": m.title,
                "url": m.url,
                "chapters": [{"id": c.id, "title": c.title, "url": c.url} for c in m.chapters],
            }
            for m in await index.modules()
        ]
    }
    return JSONResponse(body, headers=who.budget_headers)


async def faq(request: Request) -> JSONResponse:
    who = await caller(request, "read")
    service = chat_service(request)
    service.faq.refresh_soon(services(request).index)  # the book's modules as the index has them, for the next
    return JSONResponse({"entries": [e.public() for e in service.faq.entries]}, headers=who.budget_headers)
