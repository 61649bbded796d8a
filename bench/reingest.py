"""Token gaps of live streams while ``serve --book`` re-ingests the book it serves (issue 18, item 4).

    .venv/bin/python -m bench.reingest [--book ../shared/corpora/rizsheik-humanoid-course] [--streams 8]
        [--idle-seconds 20] [--json PATH]

A copy of the book is indexed into a scratch DATA_DIR, then served by ``python -m textbook_chat serve --book COPY``
(one worker, the embedded Qdrant Edge index, no history, BOOK_WATCH_S=0) with the fake model streaming a
long answer at 20 ms per token. ``--streams`` readers ask one question after another and note when each
token arrives. First for ``--idle-seconds`` with nothing else going on; then every page is edited (" the "
becomes " this ", so nearly every chunk changes) and the server gets SIGHUP, and the readers go on until
its log says the re-ingest is done. Printed: the gap between consecutive tokens (p50, p99, max) in both
phases, and how long the re-ingest took. Target: the p99 gap during the re-ingest at most 1.5x the idle p99.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import uvloop

from bench.chat import free_port, running, serve_argv
from bench.figures import Figure, table, write
from tests.conftest import SHARED_BOOK
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest
from textbook_chat.web.services import open_services

ANSWER = " ".join(f"word{i}" for i in range(300))  # 300 tokens, 6 s at 20 ms each
QUESTIONS = ("What is the Zero Moment Point?", "How do ROS 2 nodes talk?", "What is domain randomisation?")


async def _reader(address: tuple[str, int], n: int, stop: asyncio.Event, gaps: list[float]) -> None:
    """Ask, read the stream, note the gap before each chunk of tokens; again until ``stop``."""
    body = f'{{"question": "{QUESTIONS[n % len(QUESTIONS)]} ({n})"}}'.encode()
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(head + body)
            last: float | None = None
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if b"event: token" in data:
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                if b"event: done" in data or b"event: error" in data:
                    break
        finally:
            writer.close()


def _follow_log(stream: object, done: threading.Event, lines: list[str]) -> None:
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode(errors="replace")
        lines.append(line)
        if "book re-ingested" in line or "re-ingest after" in line:
            done.set()


def _edit_every_page(book: Path) -> int:
    pages = [p for p in book.rglob("*.md*") if p.suffix in (".md", ".mdx")]
    for page in pages:
        page.write_text(re.sub(r" the ", " this ", page.read_text()))
    return len(pages)


async def _phase(address: tuple[str, int], streams: int, until: asyncio.Event | float) -> list[float]:
    gaps: list[float] = []
    stop = asyncio.Event()
    readers = [asyncio.create_task(_reader(address, n, stop, gaps)) for n in range(streams)]
    if isinstance(until, float):
        await asyncio.sleep(until)
    else:
        await until.wait()
    stop.set()
    await asyncio.gather(*readers)
    return gaps


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[round(q * 100) - 1] if len(values) > 1 else float("nan")


async def measure(args: argparse.Namespace, tmp: Path) -> list[Figure]:
    book = Path(shutil.copytree(args.book, tmp / "book", ignore=shutil.ignore_patterns("node_modules", ".*")))
    data_dir = tmp / "data"
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)
    fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.02))
    async with serving(fake.app()) as llm_url:
        port = free_port()
        env = {
            "PORT": str(port),
            "DATA_DIR": str(data_dir),
            "EMBEDDER": "local",
            "EMBEDDED_POSTGRES": "off",
            "OPENAI_API_KEY": "sk-bench",
            "OPENAI_BASE_URL": f"{llm_url}/v1",
            "RATE_LIMIT_ANON": "1000000/hour",
            "MAX_STREAMS_PER_CLIENT": "100000",
            "SESSION_DAILY_TOKENS": "1000000000",
            "LLM_TIMEOUT_S": "60",
            "BOOK_WATCH_S": "0",
            "LOG_LEVEL": "info",
            "LOG_FORMAT": "text",
        }
        async with running([*serve_argv(port), "--book", str(book)], env) as server:
            done, lines = threading.Event(), list[str]()
            threading.Thread(target=_follow_log, args=(server.process.stderr, done, lines), daemon=True).start()
            idle = await _phase(server.address, args.streams, float(args.idle_seconds))
            pages = _edit_every_page(book)
            finished = asyncio.Event()
            loop = asyncio.get_running_loop()
            threading.Thread(target=lambda: (done.wait(), loop.call_soon_threadsafe(finished.set)), daemon=True).start()
            started = time.monotonic()
            os.kill(server.pid, signal.SIGHUP)
            during = await _phase(server.address, args.streams, finished)
            seconds = time.monotonic() - started
            summary = next((line.strip() for line in lines if "re-ingest" in line), "?")
    print(f"edited {pages} pages; {summary}")
    figures = []
    for label, gaps in (("idle", idle), ("during the re-ingest", during)):
        ms = [g * 1000 for g in gaps]
        print(
            f"{label}: {len(ms)} gaps, p50 {_quantile(ms, 0.5):.1f} ms, p99 {_quantile(ms, 0.99):.1f} ms, "
            f"max {max(ms):.1f} ms"
        )
        figures += [
            Figure(f"reingest: token gap p50, {label}", _quantile(ms, 0.5), "ms"),
            Figure(f"reingest: token gap p99, {label}", _quantile(ms, 0.99), "ms"),
        ]
    ratio = _quantile(during, 0.99) / _quantile(idle, 0.99)
    figures += [
        Figure("reingest: p99 gap during / idle", ratio, "ratio", 1.5),
        Figure("reingest: re-ingest of the edited book", seconds, "s"),
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--book", type=Path, default=SHARED_BOOK)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--idle-seconds", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner, tempfile.TemporaryDirectory() as tmp:
        figures = runner.run(measure(args, Path(tmp)))
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
