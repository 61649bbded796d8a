"""What an idle answer costs: RSS holding slow streams, the server beside the minimal relay, in one run.

    .venv/bin/python -m bench.idle [--streams 2000] [--book ../shared/corpora/rizsheik-humanoid-course]
        [--data-dir DIR] [--only server|relay] [--quick] [--json PATH]

A slow stream is one question whose answer the model starts and then holds: the fake OpenAI-compatible model
(in this process) sends the first token and stalls. Each stream is its own question, with its own model
request, ``POST /api/chat`` on the server (one worker, the book's embedded Qdrant Edge index, Postgres, the
OpenAI path) and ``POST /relay`` on the minimal relay (``bench/ceiling.py``). Both are asked a few questions
first, so what is measured is streams, not warm-up; RSS is read from ``/proc`` once every stream has its
first token. Issue 29's target: the server's RSS holding 2,000 slow streams <= 2.5x the relay's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import time
from pathlib import Path
from typing import cast

from bench.ceiling import RELAY_PATH, relay_process
from bench.chat import (
    QUESTIONS,
    ServerProcess,
    free_port,
    get,
    run_in_data_dir,
    running,
    scratch_database,
    serve_argv,
    server_env,
)
from bench.figures import Figure, table, write
from bench.memory import index_book
from bench.streams import raise_open_file_limit
from tests.conftest import SHARED_BOOK
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import serving

MB = 2**20
WARM_QUESTIONS = 20
CONNECT_CONCURRENCY = 50


class SlowReader(asyncio.Protocol):
    """One ``POST`` that reads an SSE answer until its first ``token`` event, then holds the connection."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.status: int | None = None
        self.first_token = asyncio.get_running_loop().create_future()
        self._seen = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.status is None and data.startswith(b"HTTP/1.1 "):
            self.status = int(data[9:12])
        if self.first_token.done():
            return
        self._seen = self._seen[-64:] + data
        if b"event: token" in self._seen:
            self.first_token.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.first_token.done():
            self.first_token.set_exception(ConnectionError(f"closed before the first token (status {self.status})"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def hold(server: ServerProcess, path: str, count: int) -> list[SlowReader]:
    """``count`` slow streams, each its own question; returns once every one has had its first token."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(i: int) -> SlowReader:
        body = json.dumps({"question": f"{QUESTIONS[i % len(QUESTIONS)]} [{i}]"}).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        async with gate:
            _, reader = await loop.create_connection(lambda: SlowReader(request), *server.address)
            await asyncio.wait_for(asyncio.shield(reader.first_token), timeout=120)
        return reader

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def warm(server: ServerProcess, path: str) -> None:
    readers = await hold(server, path, WARM_QUESTIONS)  # the model answers these in full
    for reader in readers:
        reader.close()
    await asyncio.sleep(1)


async def side(label: str, server: ServerProcess, path: str, fake: FakeOpenAI, count: int) -> list[Figure]:
    fake.default = ok("The book explains this in the cited section [1].")
    await warm(server, path)
    start = server.rss_bytes()
    fake.default = Behaviour(
        text="The book explains this in the cited section [1].", stall_after_tokens=1, stall_s=3600
    )
    started = time.monotonic()
    readers = await hold(server, path, count)
    opened_s = time.monotonic() - started
    await asyncio.sleep(3)
    holding = server.rss_bytes()
    per_kb = (holding - start) / count / 1024
    print(
        f"{label}: RSS {start / MB:.0f} MB after warm-up, {holding / MB:.0f} MB holding {count} slow streams "
        f"(opened in {opened_s:.0f} s): {per_kb:.1f} KiB each"
    )
    for reader in readers:
        reader.close()
    await asyncio.sleep(1)
    return [
        Figure(f"idle, {label}: RSS after warm-up", start / MB, "MB"),
        Figure(f"idle, {label}: RSS holding {count} slow streams", holding / MB, "MB"),
        Figure(f"idle, {label}: RSS per slow stream", per_kb, "KiB"),
    ]


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await index_book(args.book, data_dir)
    figures: list[Figure] = []
    fake = FakeOpenAI()
    pool = args.streams + WARM_QUESTIONS  # both: one connection to the model per stream, none waiting for one
    async with serving(fake.app()) as llm_base:
        if args.only in (None, "relay"):
            port = free_port()
            with relay_process(port, f"{llm_base}/v1", pool) as process:
                relay = ServerProcess(process, f"http://127.0.0.1:{port}")
                for _ in range(300):
                    try:
                        if (await get(relay.address, "/health"))[0] == 200:
                            break
                    except OSError:
                        await asyncio.sleep(0.1)
                figures += await side("relay", relay, RELAY_PATH, fake, args.streams)
        if args.only in (None, "server"):
            with scratch_database() as database_url:
                port = free_port()
                env = server_env(
                    database_url, data_dir, f"{llm_base}/v1", port, LLM_TIMEOUT_S="3600", LLM_MAX_CONNECTIONS=str(pool)
                )
                async with running(serve_argv(port), env) as server:
                    figures += await side("server", server, "/api/chat", fake, args.streams)
    by_name = {f.name: f.value for f in figures}
    relay_rss = by_name.get(f"idle, relay: RSS holding {args.streams} slow streams")
    server_rss = by_name.get(f"idle, server: RSS holding {args.streams} slow streams")
    if relay_rss and server_rss:
        figures.append(
            Figure(
                f"idle: server / relay RSS holding {args.streams} slow streams", server_rss / relay_rss, "ratio", 2.5
            )
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--book", type=Path, default=SHARED_BOOK)
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the book's index")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--only", choices=("server", "relay"), default=None)
    parser.add_argument("--quick", action="store_true", help="500 streams")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.streams = 500
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the fake model's stalled requests, cut at exit
    raise_open_file_limit()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 3 * args.streams + 200:
        parser.error("ulimit -n is too low for that many streams")
    figures = run_in_data_dir(measure, args, "bench-idle-")
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
