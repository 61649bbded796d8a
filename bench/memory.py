"""Memory of one served book: server RSS fresh, after 100 questions, after a soak, and holding 2,000 streams.

    .venv/bin/python -m bench.memory [--book ../shared/corpora/rizsheik-humanoid-course] [--data-dir DIR]
        [--streams 2000] [--soak-minutes 10] [--quick] [--json PATH]

Three servers, each its own process (``python -m textbook_chat serve``, one worker, the embedded Qdrant Edge index
of the book, a scratch Postgres database), one after the other:

- offline, the default run (local embedder, extractive answers): fresh, after 100 questions, and after a
  soak that asks a question every second;
- ``serve --book`` on the same index (offline): fresh and after 100 questions;
- with a model (the fake OpenAI-compatible server in this process, so the openai client and tiktoken are
  loaded): fresh, after 100 questions, and holding streams that follow answers the model never starts.

The book is ingested into DATA_DIR first when it holds no index. Questions are asked through
``POST /api/chat`` and read to the end. Targets (issue 18): 250 MB after start and questions, flat over the
soak.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import time
from pathlib import Path

from bench.chat import (
    ServerProcess,
    free_port,
    post_stream,
    run_in_data_dir,
    running,
    scratch_database,
    serve_argv,
    server_env,
)
from bench.figures import Figure, table, write
from bench.streams import close_all, open_readers, post_message, raise_open_file_limit
from tests.conftest import SHARED_BOOK
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest
from textbook_chat.web.services import open_services

QUESTIONS = [
    "What does the Zero Moment Point tell a walking humanoid?",
    "How do ROS 2 nodes exchange messages over topics?",
    "What is domain randomisation in simulation?",
    "How does inverse kinematics differ from forward kinematics?",
    "What sensors does a humanoid use to keep its balance?",
    # In the second opinion's band on the shared book (confidence 0.27): the cross-encoder reads its passages.
    "How charged must a humanoid's battery be before switching it on for an operation?",
]
MB = 2**20


async def index_book(book: Path, data_dir: Path) -> None:
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        if not await services.index.exists():
            started = time.perf_counter()
            await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)
            print(f"ingested {book.name} in {time.perf_counter() - started:.0f} s")


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await index_book(args.book, data_dir)
    with scratch_database() as database_url:
        figures = await _offline(args, data_dir, database_url)
        figures += await _serving_the_book(args, data_dir, database_url)
        figures += await _with_model(args, data_dir, database_url)
    return figures


async def _offline(args: argparse.Namespace, data_dir: Path, database_url: str) -> list[Figure]:
    port = free_port()
    env = server_env(database_url, data_dir, "http://127.0.0.1:9/v1", port)
    del env["OPENAI_API_KEY"], env["OPENAI_BASE_URL"]  # the default run: no model
    async with running(serve_argv(port), env) as server:
        fresh, after_questions = await _fresh_and_after_questions(server, "offline")
        soak_start = server.rss_bytes()
        deadline = time.monotonic() + args.soak_minutes * 60
        n = 0
        while time.monotonic() < deadline:
            await post_stream(server.address, "/api/chat", {"question": f"{QUESTIONS[n % len(QUESTIONS)]} [{n}]"})
            n += 1
            await asyncio.sleep(1.0)
        soaked = server.rss_bytes()
        print(f"offline: RSS after a {args.soak_minutes:g}-minute soak ({n} questions) {soaked / MB:.0f} MB")
    return [
        Figure("memory, offline: server RSS fresh", fresh / MB, "MB", 250.0),
        Figure("memory, offline: server RSS after 100 questions", after_questions / MB, "MB", 250.0),
        Figure(f"memory, offline: RSS after a {args.soak_minutes:g}-min soak", soaked / MB, "MB", 250.0),
        Figure("memory, offline: RSS after the soak / at its start", soaked / soak_start, "ratio", 1.1),
    ]


async def _serving_the_book(args: argparse.Namespace, data_dir: Path, database_url: str) -> list[Figure]:
    """``serve --book`` on the pre-ingested index: the start-up ingest finds nothing to embed, the watcher runs."""
    port = free_port()
    env = server_env(database_url, data_dir, "http://127.0.0.1:9/v1", port)
    del env["OPENAI_API_KEY"], env["OPENAI_BASE_URL"]
    async with running([*serve_argv(port), "--book", str(args.book)], env) as server:
        fresh, after_questions = await _fresh_and_after_questions(server, "serve --book")
    return [
        Figure("memory, serve --book: server RSS fresh", fresh / MB, "MB", 250.0),
        Figure("memory, serve --book: server RSS after 100 questions", after_questions / MB, "MB", 250.0),
    ]


async def _with_model(args: argparse.Namespace, data_dir: Path, database_url: str) -> list[Figure]:
    fake = FakeOpenAI(default=ok("The book explains this in the cited section [1]."))
    async with serving(fake.app()) as llm_base:
        port = free_port()
        env = server_env(database_url, data_dir, f"{llm_base}/v1", port, LLM_TIMEOUT_S="3600")
        async with running(serve_argv(port), env) as server:
            fresh, after_questions = await _fresh_and_after_questions(server, "with a model")
            fake.default = Behaviour(stall_s=3600)  # held streams: answers that never start
            urls = [(await post_message(server, QUESTIONS[i % len(QUESTIONS)]))["stream_url"] for i in range(10)]
            readers = await open_readers(server, urls, args.streams)
            await asyncio.sleep(2)
            holding = server.rss_bytes()
            held = sum(r.status == 200 for r in readers)
            print(f"with a model: RSS holding {held} streams {holding / MB:.0f} MB")
            await close_all(readers)
    per_stream_kb = (holding - after_questions) / max(1, held) / 1024
    return [
        Figure("memory, with a model: server RSS fresh", fresh / MB, "MB"),
        Figure("memory, with a model: server RSS after 100 questions", after_questions / MB, "MB"),
        Figure(f"memory, with a model: RSS holding {held} streams", holding / MB, "MB"),
        Figure("memory, with a model: RSS per held stream", per_stream_kb, "KiB"),
    ]


async def _fresh_and_after_questions(server: ServerProcess, label: str) -> tuple[int, int]:
    fresh = server.rss_bytes()
    for i in range(100):
        await post_stream(server.address, "/api/chat", {"question": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"})
    after_questions = server.rss_bytes()
    print(f"{label}: RSS fresh {fresh / MB:.0f} MB; after 100 questions {after_questions / MB:.0f} MB")
    return fresh, after_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--book", type=Path, default=SHARED_BOOK)
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the book's index")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--soak-minutes", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="500 streams, a 1-minute soak")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.streams, args.soak_minutes = 500, 1.0
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the fake model's stalled requests, cut at exit
    raise_open_file_limit()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < args.streams + 200:
        parser.error("ulimit -n is too low for that many streams")
    figures = run_in_data_dir(measure, args, "bench-memory-")
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
