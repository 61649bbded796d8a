"""One question's bookkeeping: the session, the stored question, repeats and budgets, then the run is started.

``start`` takes a ``Question`` (question.py), does the parts that can fail as a plain HTTP error (bad session →
404, a reused ``client_request_id`` → 409, a spent token budget → 429) and then hands the rest to an
``AnswerRun`` (run.py), a task of its own that publishes into a ``MessageStream`` whatever happens to the
connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from textbook_chat.answer.prompts import HISTORY_BUDGET_TOKENS
from textbook_chat.chat.question import Question
from textbook_chat.chat.run import AnswerRun, Opening, Target, discard, earlier_turns, retrieve
from textbook_chat.chat.service import ChatService, Session, Started
from textbook_chat.core import metrics
from textbook_chat.core.errors import BadRequest, Conflict, DatabaseUnavailable, NotFound, RateLimited
from textbook_chat.search.retrieval import CONTEXT_BUDGET_TOKENS
from textbook_chat.store.rows import Exchange, LateQuestion, SessionToCreate, hash_token

log = logging.getLogger(__name__)

_NOTICE_HISTORY_OFF = "Chat history is off on this server, so this conversation will not be saved."
_NOTICE_HISTORY_DOWN = "Your conversation can't be saved right now; the answer itself is not affected."


async def start(
    chat: ChatService, question: Question, *, on_finish: Callable[[], Awaitable[None]] | None = None
) -> Started:
    """Store the question and start generating; a repeated ``client_request_id`` attaches to the first answer.
    ``on_finish`` runs when the answer's run ends (not called when nothing new is generated).

    A repeat attaches only for the same asker (``question.asker``): the same session (its token checked), the
    same signed-in user, or, for a first question, the same question from the same client; anyone else gets 409.
    The session token is sent once, in the response that created the session, and never again (replays and
    repeats omit it).
    """
    # Retrieval decides the first token: it starts before anything is written, runs while the session and the
    # question are stored, and is dropped if the request is refused or turns out to be a repeat. A first
    # question needs nothing from the database; a question in a session is retrieved in the context of its
    # earlier questions, so the session's turns are read at once (one round trip, beside the session's check:
    # its owner and its token budget) and dropped, unread, if the check refuses the question.
    started = time.perf_counter()
    history = asyncio.create_task(earlier_turns(chat, question.session.id))
    retrieval = asyncio.create_task(retrieve(chat, question, history))
    try:
        await asyncio.sleep(0)  # one turn of the loop: the question's embedding starts before any query is sent
        if question.module is not None:
            await _check_module(chat, question.module)
        repeated = await _repeated_request(chat, question)
        if repeated is not None:  # a double click or a retry: attach, and create no second session
            discard(retrieval)
            discard(history)
            return Started(
                repeated.assistant_message_id,
                repeated.session_id,
                None,
                chat.capabilities.stream_url(str(repeated.assistant_message_id)),
                created=False,
            )
        notices: list[tuple[str, str]] = []
        asked_at = datetime.now(UTC)
        session = await _session(chat, question, notices)
        session, exchange = await _exchange(chat, session, question, notices)
        if exchange is not None and exchange.session_id != session.id:
            raise Conflict("This client_request_id was already used in another conversation.")
    except BaseException:
        discard(retrieval)
        discard(history)
        raise
    message_id = exchange.assistant_message_id if exchange else uuid.uuid4()
    # The database could not take the question in time: it goes to the answer writer with its answer.
    late = None if chat.store is None or exchange is not None else _late(chat, question, session, asked_at)
    stream_url = chat.capabilities.stream_url(str(message_id))
    if exchange is not None and not exchange.created:
        discard(retrieval)
        discard(history)
        return Started(message_id, exchange.session_id, None, stream_url, created=False)
    _log_question(question, str(message_id))
    stream = chat.registry.create(str(message_id))
    meta = {
        "message_id": str(message_id),
        "session_id": str(session.id),
        "stream_url": stream_url,  # no session_token: these events are replayed to whoever holds stream_url
        "mode": question.mode,
    }
    answer = AnswerRun(
        chat=chat,
        question=question,
        stream=stream,
        target=Target(exchange=exchange, late=late),
        opening=Opening(meta=meta, notices=notices, started=started),
    )
    stream.task = asyncio.create_task(answer.run(retrieval, history, on_finish), name=f"chat-{message_id}")
    return Started(message_id, session.id, session.token, stream_url, created=True)


async def _check_module(chat: ChatService, module: str) -> None:
    """A module the index does not have is a 400 naming the ones it has (not a row of its own in the report);
    when the index cannot say which it has, the question goes on and retrieval widens as it would."""
    known = await chat.retriever.module_ids() if chat.retriever is not None else []
    if known and module not in known:
        shown = module if len(module) <= 60 else module[:57] + "..."
        raise BadRequest(
            f"The book has no module {shown!r}. Valid module ids: {', '.join(known)}.", code="unknown_module"
        )


def _late(chat: ChatService, question: Question, session: Session, asked_at: datetime) -> LateQuestion:
    """The question as the answer writer will store it: into the session it was asked in, proved as then (its
    token, or the signed-in user), or into a new one when this question was to create it. A new session's
    token never reached the reader (the session did not exist yet), so only its owner, if signed in, can
    reopen it; the question is kept all the same, for the conversation's record and the authors' report."""
    new_session = question.session.id is None and session.token is None
    token = secrets.token_urlsafe(32) if new_session else (session.token or question.session.token)
    return LateQuestion(
        session_id=session.id,
        new_session=new_session,
        token_hash=None if token is None else hash_token(token),
        user_id=question.asker.user_id,
        user_message_id=uuid.uuid4(),
        asked_at=asked_at,
        question=question.text,
        mode=question.mode,
        module_filter=question.module,
        selected_text=question.selected_text,
        client_request_id=question.client_request_id,
        session_metadata=_session_metadata(chat, question.asker.key),
    )


def _log_question(question: Question, message_id: str) -> None:
    # The question itself is the reader's words: only at debug (docs/settings.md: LOG_LEVEL).
    facts = {
        "message_id": message_id,
        "mode": question.mode,
        "module_filter": question.module,
        "chars": len(question.text),
    }
    log.info("question received", extra=facts)
    log.debug("question text", extra={**facts, "question": question.text, "selected_text": question.selected_text})


async def _repeated_request(chat: ChatService, question: Question) -> Exchange | None:
    """A repeated first question (no session yet): its exchange, found before a second session is created,
    if the same caller asked it (409 otherwise: a client_request_id is not a key to someone else's answer).

    With a session, the repeat goes the usual way (the session's token is checked) and ``start_exchange``
    finds the earlier exchange itself.
    """
    if chat.store is None or question.client_request_id is None or question.session.id is not None:
        return None
    try:
        found = await chat.store.find_exchange(question.client_request_id)
    except DatabaseUnavailable:
        return None  # the answer goes on without history; start_exchange is not reached either
    if found is None:
        return None
    user_id = question.asker.user_id
    if found.owner_user_id is not None:
        same = user_id == found.owner_user_id
    else:
        same = (
            user_id is None
            and found.question == question.text
            and found.caller_digest is not None
            and hmac.compare_digest(found.caller_digest, chat.capabilities.caller_digest(question.asker.key))
        )
    if not same:
        raise Conflict("This client_request_id was already used for another question.", code="duplicate_request")
    return found


async def _session(chat: ChatService, question: Question, notices: list[tuple[str, str]]) -> Session:
    asked_in, user_id = question.session, question.asker.user_id
    if chat.store is None:
        notices.append(("history_unavailable", _NOTICE_HISTORY_OFF))
        return Session(asked_in.id or uuid.uuid4(), None, persisted=False)
    try:
        if asked_in.id is not None:
            owned, used = await chat.store.session_for_question(
                asked_in.id,
                token=asked_in.token,
                user_id=user_id,
                since=datetime.now(UTC) - timedelta(days=1),
                in_flight_tokens=IN_FLIGHT_TOKENS,
            )
            if owned is None:
                raise NotFound("No such session.", code="session_not_found")
            _check_token_budget(used, chat.daily_tokens)
            return Session(asked_in.id, None, persisted=True)
        # A new session's id and token are made here and the row is written with the question, in one
        # statement (``_exchange``): nothing about a new session can be refused.
        created = SessionToCreate.new(user_id=user_id, metadata=_session_metadata(chat, question.asker.key))
        return Session(created.id, created.token, persisted=True, to_create=created)
    except DatabaseUnavailable:
        notices.append(("history_unavailable", _NOTICE_HISTORY_DOWN))
        return Session(asked_in.id or uuid.uuid4(), None, persisted=False)


def _session_metadata(chat: ChatService, caller: str) -> dict[str, str]:
    """What a new session records of who made it: a digest of the caller, which a repeated first question
    is checked against (never the address itself)."""
    return {"caller": chat.capabilities.caller_digest(caller)}


# What an answer still streaming is counted as against SESSION_DAILY_TOKENS until its real usage is stored:
# a whole prompt (sources and history at their budgets, the rules) and a long answer.
IN_FLIGHT_TOKENS = CONTEXT_BUDGET_TOKENS + HISTORY_BUDGET_TOKENS + 1000


def _check_token_budget(used: int, budget: int) -> None:
    """``used``: the session's tokens of the last day (answers still streaming counted as ``IN_FLIGHT_TOKENS``)."""
    if used >= budget:
        metrics.RATE_LIMITED.labels("token_budget").inc()
        raise RateLimited(
            "This conversation has used its token budget for today. Start a new chat or come back tomorrow.",
            retry_after=3600,
            code="token_budget_exhausted",
        )


async def _exchange(
    chat: ChatService, session: Session, question: Question, notices: list[tuple[str, str]]
) -> tuple[Session, Exchange | None]:
    """The question stored (and a new session with it); the session as it now stands: a new one the database
    could not take is not there (its question goes to the answer writer, ``_late``)."""
    if chat.store is None or not session.persisted:
        return session, None
    try:
        exchange = await chat.store.start_exchange(
            session.id,
            question=question.text,
            mode=question.mode,
            module_filter=question.module,
            selected_text=question.selected_text,
            client_request_id=question.client_request_id,
            new_session=session.to_create,
        )
    except DatabaseUnavailable:
        notices.append(("history_unavailable", _NOTICE_HISTORY_DOWN))
        if session.to_create is not None:
            return Session(session.id, None, persisted=False), None
        return session, None
    return session, exchange
