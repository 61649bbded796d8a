"""The run of one answer: retrieval's outcome in, events published and the reply stored out.

``AnswerRun.run`` is the task ``exchange.start`` hands an accepted question to: it answers from the book (or the FAQ
when search is down, or declines), publishes into the ``MessageStream`` whatever happens to the
connection, and writes the answer to Postgres once, at the end (no per-token writes). Every failure here
becomes a notice, a fallback answer or an ``error`` event, never an HTTP error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from textbook_chat.answer.generation import (
    Finished,
    GenerationRequest,
    GenNotice,
    Token,
    Turn,
    Usage,
    cited_numbers,
    invalid_markers,
)
from textbook_chat.chat.question import Question
from textbook_chat.chat.service import ChatService
from textbook_chat.core import logs, metrics
from textbook_chat.core.errors import DatabaseUnavailable, LLMUnavailable, RetrievalUnavailable, ServiceUnavailable
from textbook_chat.search import context
from textbook_chat.search.context import Earlier
from textbook_chat.search.retrieval import Retrieval, Source
from textbook_chat.store.rows import Citation, Completion, Exchange, LateQuestion, TurnRow
from textbook_chat.store.writes import AnswerWriter
from textbook_chat.streams.streaming import MessageStream

log = logging.getLogger(__name__)

HISTORY_MESSAGES = 12  # the prompt builder keeps the newest that fit its budget


_NOTICE_OFFLINE = "No AI model is configured, so this answer quotes the most relevant passages of the book."
_NOTICE_UNCITED = "This answer does not cite the book, so check it against the sections listed below."
_NOTICE_BAD_MARKERS = "This answer cites a source number that was not among its sources; those markers are not links."
_NOTICE_FAQ = "The textbook search is unavailable right now, so here are the closest FAQ entries."


@dataclass
class _RunState:
    status: str = "complete"
    sources: tuple[Source, ...] = ()
    cited: tuple[int, ...] = ()
    invalid_markers: tuple[int, ...] = ()
    confidence: float | None = None
    model: str | None = None
    usage: Usage | None = None
    standalone: str | None = None  # the question with the context its retrieval took, stored with it


@dataclass(frozen=True)
class Target:
    """Where the answer is written: into the exchange stored as the question was asked, or with the question itself
    (``late``: the database could not take it in time); neither when there is no store."""

    exchange: Exchange | None = None
    late: LateQuestion | None = None

    @property
    def stored(self) -> bool:
        return self.exchange is not None or self.late is not None

    @property
    def question_id(self) -> uuid.UUID | None:
        """The stored question's id: the exchange's, or the late question's (written with its answer)."""
        if self.exchange is not None:
            return self.exchange.user_message_id
        return self.late.user_message_id if self.late is not None else None


@dataclass(frozen=True)
class Opening:
    """What was settled as the question was accepted: what every ``meta`` event carries (ids, stream_url, mode),
    the bookkeeping's notices (history off or down), published with ``meta``, and when the timings start."""

    meta: dict[str, Any]
    notices: list[tuple[str, str]]
    started: float  # ``time.perf_counter()`` when the question was accepted


@dataclass
class AnswerRun:
    """What one answer's run needs, and its steps: everything a step reads is here, so a field added for the
    run is added once (not to every step's signature)."""

    chat: ChatService
    question: Question
    stream: MessageStream
    target: Target
    opening: Opening
    state: _RunState = field(default_factory=_RunState)

    async def run(
        self,
        retrieving: asyncio.Task[Retrieval | None],
        reading: asyncio.Task[list[TurnRow]],
        on_finish: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Answer the question into the stream, then queue the answer for Postgres: into ``exchange`` when the
        question was stored as it was asked, or with ``late`` (the question, written with its answer) when not;
        ``on_finish`` runs last, whatever happened. ``retrieving`` and ``reading`` (the session's earlier
        turns, ``earlier_turns``) were started when the question was accepted and run beside its checks and writes."""
        chat, stream, state = self.chat, self.stream, self.state
        logs.bind_message(stream.message_id)
        metrics.GENERATIONS.inc()
        stream.hold_terminal = self.target.stored and chat.store is not None
        try:
            retrieval = await retrieving
            state.standalone = retrieval.standalone if retrieval is not None else None
            if retrieval is None:
                await self._answer_from_faq()
            elif retrieval.declined:
                self._decline(retrieval)
            else:
                await self._answer(retrieval, reading)
        except asyncio.CancelledError:
            self._end_cancelled()
        except LLMUnavailable as exc:
            metrics.LLM_ERRORS.inc()
            state.status = "failed"
            stream.publish("error", {"code": exc.code, "message": exc.message, "retryable": True})
        except Exception:
            log.exception("chat generation failed")
            state.status = "failed"
            if not stream.ended:
                stream.publish(
                    "error",
                    {
                        "code": "internal_error",
                        "message": "Something went wrong while answering. Please retry.",
                        "retryable": True,
                    },
                )
        finally:
            discard(retrieving)
            discard(reading)
            metrics.GENERATIONS.dec()
            try:
                self._record()
            except Exception:  # counting must never keep an answer from being stored
                log.exception("answer metrics not recorded")
            try:
                if self.target.stored and chat.writer is not None:
                    await self._persist(chat.writer)
            except Exception:
                # Whatever went wrong, the answer is still queued, as failed: it must never stay `streaming`.
                log.exception("answer could not be prepared for writing; stored as failed")
                assert chat.writer is not None
                message_id = uuid.UUID(stream.message_id)
                chat.writer.submit(message_id, Completion(content=stream.text(), status="failed"), self.target.late)
            finally:
                stream.release()  # the terminal event, held until the answer was stored (streaming.py)
            if on_finish is not None:
                await on_finish()

    def _record(self) -> None:
        """One log line and the answer metrics for a finished generation."""
        stream, state = self.stream, self.state
        last = stream.terminal
        if state.status == "interrupted":
            outcome = "interrupted"
            metrics.INTERRUPTED.labels(stream.cancel_reason or "unknown").inc()
        elif last is not None and last.event == "done":
            outcome = str(last.data.get("finish_reason", "stop"))
        else:
            outcome = "error"
        seconds = time.perf_counter() - self.opening.started
        metrics.ANSWERS.labels(outcome).inc()
        metrics.ANSWER_SECONDS.labels(outcome).observe(seconds)
        if state.usage is not None:
            metrics.tokens(state.usage.prompt_tokens, state.usage.completion_tokens)
        log.info(
            "answer finished",
            extra={
                "status": state.status,
                "outcome": outcome,
                "model": state.model,
                "confidence": state.confidence,
                "duration_ms": round(seconds * 1000, 1),
                "events": len(stream.events),
            },
        )

    def _meta(self, confidence: float, level: str, scope: dict[str, Any]) -> dict[str, Any]:
        return {**self.opening.meta, "confidence": round(confidence, 4), "confidence_level": level, "scope": scope}

    def _open(self, meta: dict[str, Any], sources: list[dict[str, Any]], notices: list[tuple[str, str]]) -> None:
        self.stream.publish("meta", meta)
        self.stream.publish("sources", {"sources": sources})
        metrics.CONFIDENCE.labels(meta["confidence_level"]).inc()
        for code, message in notices:
            metrics.notice(code)
            self.stream.publish("notice", {"code": code, "message": message})

    def _check_citations(self, retrieval: Retrieval, text: str) -> None:
        """A model's answer (``text``) that cites no source, or cites a number it was not given, is said to be so."""
        state = self.state
        state.invalid_markers = tuple(invalid_markers(text, range(1, len(retrieval.sources) + 1)))
        uncited = not state.cited and bool(retrieval.sources) and retrieval.mode != "selection"
        if not (uncited or state.invalid_markers):
            return
        message = _NOTICE_UNCITED if uncited else _NOTICE_BAD_MARKERS
        metrics.notice("uncited")
        self.stream.publish("notice", {"code": "uncited", "message": message})

    def _done(self, finish_reason: str, timings: dict[str, float]) -> None:
        state = self.state
        usage = state.usage or Usage(0, 0)
        self.stream.publish(
            "done",
            {
                "message_id": self.stream.message_id,
                "finish_reason": finish_reason,
                "cited": list(state.cited),
                "invalid_markers": list(state.invalid_markers),
                "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                "timings_ms": timings,
            },
        )

    async def _answer_from_faq(self) -> None:
        scope = {"requested_module": self.question.module, "searched": "all", "note": None}
        self._open(self._meta(0.0, "none", scope), [], [*self.opening.notices, ("fallback_faq", _NOTICE_FAQ)])
        self.state.model = "faq"
        self.stream.add_token(self.chat.faq.answer_text(self.question.text))
        self._done("fallback", {"retrieval": 0.0, "first_token": 0.0, "total": 0.0})

    async def _book_title(self) -> str | None:
        """The book's name for the model's instructions (read once per index, then cached); None when the index
        cannot say: the rules then call it "an online textbook"."""
        retriever = self.chat.retriever
        if retriever is None:
            return None
        try:
            return await retriever.index.book_title()
        except RetrievalUnavailable:
            return None

    def _decline(self, retrieval: Retrieval) -> None:
        self.state.confidence = retrieval.confidence
        self.state.model = "decline"
        metrics.DECLINES.inc()
        meta = self._meta(retrieval.confidence, retrieval.level, retrieval.scope.event())
        notices = self.opening.notices + [(n.code, n.message) for n in retrieval.notices]
        self._open(meta, [s.event() for s in retrieval.related], notices)
        lines = ["I couldn't find this in the textbook, so I won't guess."]
        if retrieval.related:
            lines.append("These sections are the closest to your question:\n")
            lines += [f"- [{' › '.join(s.heading_path) or s.title}]({s.url})" for s in retrieval.related]
        self.stream.add_token("\n".join(lines))
        timings = {**retrieval.timings_ms, "first_token": 0.0, "total": retrieval.timings_ms["retrieval"]}
        self._done("declined", timings)

    async def _answer(self, retrieval: Retrieval, reading: asyncio.Task[list[TurnRow]]) -> None:
        chat, stream, state = self.chat, self.stream, self.state
        state.sources = retrieval.sources
        state.confidence = retrieval.confidence
        all_notices = self.opening.notices + [(n.code, n.message) for n in retrieval.notices]
        if not chat.llm_enabled:
            all_notices.append(("offline_generator", _NOTICE_OFFLINE))
        meta = self._meta(retrieval.confidence, retrieval.level, retrieval.scope.event())
        self._open(meta, [s.event() for s in retrieval.sources], all_notices)

        generation = GenerationRequest(
            question=self.question.text,
            sources=retrieval.sources,
            history=self._turns(await reading),
            mode=retrieval.mode,
            selected_text=self.question.selected_text,
            low_confidence=retrieval.level == "low",
            standalone=retrieval.standalone,
            book_title=await self._book_title(),
        )
        first_token_ms: float | None = None
        finish_reason = "stop"
        events = chat.generator.stream(generation)
        try:
            async for event in events:
                if isinstance(event, Token):
                    if first_token_ms is None:
                        first_token_ms = (time.perf_counter() - self.opening.started) * 1000
                        metrics.FIRST_TOKEN_SECONDS.observe(first_token_ms / 1000)
                    stream.add_token(event.text)
                elif isinstance(event, GenNotice):
                    if event.code in ("llm_retry", "offline_generator"):  # the generator says why: a failed attempt
                        metrics.LLM_ERRORS.inc()
                    metrics.notice(event.code)
                    stream.publish("notice", {"code": event.code, "message": event.message})
                elif isinstance(event, Finished):
                    finish_reason = event.finish_reason
                    state.usage = event.usage
                    state.model = event.model
        finally:
            await events.aclose()  # type: ignore[attr-defined]  # closes the upstream HTTP stream at once
        text = stream.text()  # decoded from the token events once, for both citation checks
        state.cited = tuple(cited_numbers(text, len(retrieval.sources)))
        if chat.llm_enabled:
            self._check_citations(retrieval, text)
        total_ms = (time.perf_counter() - self.opening.started) * 1000
        timings = {
            "retrieval": retrieval.timings_ms.get("retrieval", 0.0),
            "first_token": round(first_token_ms or total_ms, 2),
            "total": round(total_ms, 2),
        }
        self._done(finish_reason, timings)

    def _turns(self, stored: list[TurnRow]) -> list[Turn]:
        """The conversation before this question: the stored turns less this exchange's own question (read
        beside its write, the read may or may not see it)."""
        exchange = self.target.exchange
        current = {exchange.user_message_id, exchange.assistant_message_id} if exchange else set()
        turns = [Turn(role=t.role, content=t.content) for t in stored if t.id not in current]
        return turns[-HISTORY_MESSAGES:]

    def _end_cancelled(self) -> None:
        stream = self.stream
        self.state.status = "interrupted"
        if stream.ended:
            return
        if stream.cancel_reason == "shutdown":
            stream.publish(
                "error",
                {
                    "code": "server_restarting",
                    "message": "The server is restarting; please ask again.",
                    "retryable": True,
                },
            )
        else:
            total = round((time.perf_counter() - self.opening.started) * 1000, 2)
            self._done("cancelled", {"retrieval": 0.0, "first_token": 0.0, "total": total})

    async def _persist(self, writer: AnswerWriter) -> None:
        state = self.state
        by_n = {s.n: s for s in state.sources}
        citations = [
            Citation(
                position=n,
                chunk_id=by_n[n].chunk_id,
                module=by_n[n].module,
                chapter=by_n[n].chapter,
                title=by_n[n].title,
                url=by_n[n].url,
                relevance_score=round(by_n[n].score, 4),
                excerpt=by_n[n].excerpt,
                heading_path=by_n[n].heading_path,
            )
            for n in state.cited
            if n in by_n
        ]
        completion = Completion(
            content=self.stream.text(),
            status=state.status,  # type: ignore[arg-type]
            confidence=None if state.confidence is None else max(0.0, min(1.0, state.confidence)),
            model=state.model,
            prompt_tokens=state.usage.prompt_tokens if state.usage else None,
            completion_tokens=state.usage.completion_tokens if state.usage else None,
            latency_ms=int((time.perf_counter() - self.opening.started) * 1000),
            citations=citations,
            question_id=self.target.question_id,
            standalone=state.standalone,
            stream_marks=self.stream.marks(),  # the terminal event is held: every token is out (streaming.py)
        )
        message_id = uuid.UUID(self.stream.message_id)
        written = writer.submit(message_id, completion, self.target.late)
        try:
            # The terminal event waits for the write (history read right after `done` has the answer), but only
            # briefly: in an outage or a burst the writer keeps the answer and the reader is not held up.
            await asyncio.wait_for(asyncio.shield(written), timeout=PERSIST_WAIT_S)
        except TimeoutError:
            log.info("answer queued for writing", extra={"message_id": str(message_id)})


async def earlier_turns(chat: ChatService, session_id: uuid.UUID | None) -> list[TurnRow]:
    """The prompt's history: the newest turns stored in the session the question was asked in; none for a
    first question, and none when the database cannot say (the answer goes on without them)."""
    store = chat.store
    if store is None or session_id is None or not store.available:
        return []
    try:
        # One more than the prompt keeps: this very question may be among them (``_turns`` drops it).
        return await store.recent_turns(session_id, limit=HISTORY_MESSAGES + 1)
    except DatabaseUnavailable:
        return []


def earlier_questions(turns: list[TurnRow], asked: str) -> list[Earlier]:
    """The session's earlier questions, oldest first, each with the standalone form its retrieval used, and the
    answer it got with the headings of the sections that answer cited; this question's own row, read beside its
    write, is left out (the last turn, unanswered, with its words)."""
    if turns and turns[-1].role == "user" and turns[-1].content == asked:
        turns = turns[:-1]
    earlier: list[Earlier] = []
    for turn, after in zip(turns, [*turns[1:], None], strict=True):
        if turn.role == "user":
            if after is not None and after.role == "assistant":
                headings = context.section_headings(after.sections)
                earlier.append(Earlier(turn.content, turn.standalone, after.content, headings))
            else:
                earlier.append(Earlier(turn.content, turn.standalone))
    return earlier


async def retrieve(
    chat: ChatService, question: Question, reading: asyncio.Task[list[TurnRow]] | None = None
) -> Retrieval | None:
    """Retrieval, or None when it is down (the FAQ answers instead). A question asked in a session is read in the
    context of its earlier questions (``reading``: the session's turns); a first question waits for nothing."""
    if chat.retriever is None:
        return None
    started = time.perf_counter()
    try:
        earlier: list[Earlier] = []
        if reading is not None and question.session.id is not None and not question.selected_text:
            # Shielded: this retrieval's cancellation must not cancel the read the prompt's history awaits too.
            earlier = earlier_questions(await _turns_or_none(reading), question.text)
        rewritten = await _rewritten(chat, question.text, earlier)
        if rewritten is not None:  # the model's standalone question, searched as a question of its own
            result = await chat.retriever.retrieve(rewritten, module=question.module)
            return replace(result, standalone=rewritten)
        return await chat.retriever.retrieve(
            question.text, module=question.module, selected_text=question.selected_text, earlier=earlier
        )
    except ServiceUnavailable as exc:
        log.warning("retrieval unavailable (%s); answering from the FAQ", exc.code)
    except Exception:
        log.exception("retrieval failed; answering from the FAQ")
    finally:
        metrics.RETRIEVAL_SECONDS.observe(time.perf_counter() - started)
    return None


async def _rewritten(chat: ChatService, question: str, earlier: list[Earlier]) -> str | None:
    """With ``FOLLOW_UP_REWRITE=on``, the model's standalone form of a follow-up that needs its conversation
    (``context.read``); never asked for a first question, a selection or one that names its own subject."""
    if chat.rewriter is None or not earlier or not context.read(question, earlier).in_context:
        return None
    return await chat.rewriter.rewrite(question, earlier)


async def _turns_or_none(reading: asyncio.Task[list[TurnRow]]) -> list[TurnRow]:
    """The session's turns, or none when they cannot be read: the question is then retrieved as asked."""
    try:
        return await asyncio.shield(reading)
    except Exception:  # earlier_turns already gives none when the database is down; anything else, logged there
        return []


PERSIST_WAIT_S = 2.0  # how long `done` waits for the answer to be in Postgres


def discard(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` if it still runs; an outcome nobody will read is consumed, not logged as unretrieved."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
