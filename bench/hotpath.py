"""Where one question's time to its first token goes, step by step (issue 29): a span profile of the hot path.

    .venv/bin/python -m bench.hotpath [--questions N] [--redis URL] [--json PATH]

One process holds it all: the server's own services (``open_services(..., chat=True)``: Postgres on a scratch
database, the demo book's index, the OpenAI path, Redis when ``--redis`` is given), the fake model
(tests/fake_openai.py, instant) and one reader asking the bench's questions (bench/chat.py), four per
conversation. Each question goes the way ``POST /api/chat`` sends it (admission, ``exchange.start``, the run)
and is timed to its first token. The steps are timed by wrapping the service objects' methods with
``perf_counter_ns`` spans here, in the bench (the server carries no profiling code): each step's span is
measured from the moment the question was admitted, so the table shows what runs before what, and which
waits the first token.
"""

from __future__ import annotations

import argparse
import contextvars
import functools
import os
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.chat import TURNS_PER_CONVERSATION, answer_text, demo_index, question, run_in_data_dir, scratch_database
from bench.chat import server_env as bench_env
from bench.figures import Figure, write
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving
from textbook_chat.answer import prompts
from textbook_chat.chat import exchange
from textbook_chat.chat.question import Asker, Question, SessionRef
from textbook_chat.core.settings import Settings
from textbook_chat.web import ratelimit
from textbook_chat.web.services import open_services

Span = tuple[str, int, int]  # name, start and end in ns since the question was admitted
_spans: contextvars.ContextVar[list[Span] | None] = contextvars.ContextVar("spans", default=None)
_origin: contextvars.ContextVar[int] = contextvars.ContextVar("origin", default=0)


def _record(name: str, start: int, end: int) -> None:
    spans = _spans.get()
    if spans is not None:
        origin = _origin.get()
        spans.append((name, start - origin, end - origin))


def _wrap_async(owner: Any, attribute: str, name: str) -> None:
    original = getattr(owner, attribute)

    @functools.wraps(original)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return await original(*args, **kwargs)
        finally:
            _record(name, start, time.perf_counter_ns())

    setattr(owner, attribute, timed)


def _wrap_sync(owner: Any, attribute: str, name: str) -> None:
    original = getattr(owner, attribute)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            _record(name, start, time.perf_counter_ns())

    setattr(owner, attribute, timed)


def _time_model_request(client: Any) -> None:
    """The generator posts the chat request through the SDK client's ``post`` (answer/generation.py), which
    returns once the response's headers are read: time it (the request made, sent and its response headers read)."""
    _wrap_async(client, "post", "model: request opened (to response headers)")


class _ModelTimer:
    """The fake model's ASGI app, timing each chat completion from its request to its first body chunk."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.first_chunk_ns: list[tuple[int, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        received = time.perf_counter_ns()
        sent = False

        async def timed_send(message: Any) -> None:
            nonlocal sent
            if not sent and message["type"] == "http.response.body" and message.get("body"):
                sent = True
                self.first_chunk_ns.append((received, time.perf_counter_ns()))
            await send(message)

        await self.app(scope, receive, timed_send)


def _instrument(services: Any) -> None:
    chat = services.chat
    store, retriever, generator = chat.store, chat.retriever, chat.generator
    for method in ("session_for_question", "start_exchange", "find_exchange"):
        _wrap_async(store, method, f"db: {method}")
    _wrap_async(store, "recent_turns", "db: recent_turns (earlier turns)")
    _wrap_async(retriever, "retrieve", "retrieval (all)")
    _wrap_async(retriever.embedder, "embed_query", "retrieval: embed")
    _wrap_async(retriever.index, "hybrid_search", "retrieval: search")
    if retriever.second_opinion is not None:
        _wrap_async(retriever.second_opinion, "judge", "retrieval: second opinion")
    import textbook_chat.search.retrieval as retrieval_module

    _wrap_sync(retrieval_module, "rank", "retrieval: rerank")
    _wrap_sync(prompts, "build_messages", "prompt: build (token counting)")
    _time_model_request(generator.client)
    if services.limiter is not None:
        _wrap_async(services.limiter, "hit", "admit: ask budget")
    if services.slots is not None:
        _wrap_async(services.slots, "acquire", "admit: stream slot")
    _wrap_sync(chat.registry, "create", "stream: registered")
    from textbook_chat.chat.run import AnswerRun

    _wrap_sync(AnswerRun, "_open", "run: meta and sources published")
    _wrap_async(exchange, "retrieve", "retrieval (as the run awaits it)")
    from textbook_chat.search.retrieval import Source

    _wrap_sync(Source, "event", "run: a source's event")


async def _ask(services: Any, text: str, session: SessionRef, model: _ModelTimer) -> tuple[list[Span], int, Any]:
    spans: list[Span] = []
    origin = time.perf_counter_ns()
    _spans.set(spans)
    _origin.set(origin)
    q = Question(text=text, asker=Asker("ip:10.0.0.1"), session=session, client_request_id=uuid.uuid4())
    async with ratelimit.admit(services.limiter, services.slots, client="10.0.0.1", user_id=None) as admitted:
        start = time.perf_counter_ns()
        started = await exchange.start(services.chat, q, on_finish=admitted.release)
        _record("exchange.start returned", start, time.perf_counter_ns())
        admitted.keep()
    stream = services.chat.registry.get(str(started.message_id))
    first = 0
    async for event in stream.subscribe():
        if event.event == "token" and not first:
            first = time.perf_counter_ns() - origin
        if event.event in ("done", "error"):
            break
    received, sent = model.first_chunk_ns[-1]
    spans.append(("model: request to first chunk (fake model)", received - origin, sent - origin))
    _spans.set(None)
    return spans, first, started


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await demo_index(data_dir)
    fake = FakeOpenAI()
    fake.default = ok(answer_text(100))
    model = _ModelTimer(fake.app())
    rows: list[tuple[list[Span], int]] = []
    judged = 0
    with scratch_database() as database_url:
        async with serving(model) as llm_base:
            env = bench_env(database_url, data_dir, f"{llm_base}/v1", 0)
            if args.redis:
                env["REDIS_URL"] = args.redis
            settings = Settings.from_env({**os.environ, **env})
            async with open_services(settings, chat=True) as services:
                assert services.chat is not None and services.chat.retriever is not None
                await services.chat.retriever.warm()
                _instrument(services)
                session = SessionRef()
                for case in range(args.warmup + args.questions):
                    if case % TURNS_PER_CONVERSATION == 0:
                        session = SessionRef()
                    spans, first, started = await _ask(services, question(case), session, model)
                    if started.session_token:
                        session = SessionRef(started.session_id, started.session_token)
                    if case >= args.warmup:
                        rows.append((spans, first))
                        judged += any(name == "retrieval: second opinion" for name, _, _ in spans)
    return _report(rows, judged)


def _report(rows: list[tuple[list[Span], int]], judged: int) -> list[Figure]:
    firsts = [first / 1e6 for _, first in rows]
    first_p50 = statistics.median(firsts)
    names: list[str] = []
    for spans, _ in rows:
        for name, _, _ in spans:
            if name not in names:
                names.append(name)
    table: list[dict[str, Any]] = []
    for name in names:
        starts = [s / 1e6 for spans, _ in rows for n, s, _ in spans if n == name]
        lengths = [(e - s) / 1e6 for spans, _ in rows for n, s, e in spans if n == name]
        table.append(
            {
                "step": name,
                "seen_in": len(starts) / len(rows),
                "starts_ms_p50": round(statistics.median(starts), 2),
                "takes_ms_p50": round(statistics.median(lengths), 2),
                "share_of_first_token": round(statistics.median(lengths) / first_p50, 3),
            }
        )
    table.sort(key=lambda row: row["starts_ms_p50"])
    print(f"first token (admitted to first token event), {len(rows)} questions: p50 {first_p50:.2f} ms")
    print(f"{'step':<46} {'in':>5} {'starts':>8} {'takes':>8} {'share':>6}")
    for row in table:
        print(
            f"{row['step']:<46} {row['seen_in']:5.0%} {row['starts_ms_p50']:8.2f} {row['takes_ms_p50']:8.2f} "
            f"{row['share_of_first_token']:6.0%}"
        )
    print(f"second opinion (cross-encoder) asked for {judged} of {len(rows)} questions")
    figures = [Figure("hot path: admitted to first token, p50", first_p50, "ms")]
    figures += [Figure(f"hot path: {row['step']}, p50", row["takes_ms_p50"], "ms") for row in table]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--questions", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--redis", default=None, help="REDIS_URL (off when not given)")
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the demo index")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    args = parser.parse_args()
    write(run_in_data_dir(measure, args, "bench-hotpath-"), args.json)


if __name__ == "__main__":
    main()
