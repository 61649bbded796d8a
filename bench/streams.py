"""Open streams one worker holds (issue 6): idle EventSource streams pinging, and events/s to 500 active readers.

    .venv/bin/python -m bench.streams [--idle 5000] [--active 500] [--json PATH] [--data-dir DIR]

The server runs as its own process (``python -m textbook_chat serve``: uvicorn, one worker, in-process stream
registry) on a scratch Postgres database with the demo book's index. Readers are raw asyncio sockets
(one ``asyncio.Protocol`` each) that count bytes, events and ping comments, so one client process can
hold thousands. Idle readers follow answers the fake model has not started (it stalls); active ones
follow answers it streams without pause, several readers per answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any, cast

from bench.chat import (
    QUESTIONS,
    ServerProcess,
    demo_index,
    free_port,
    run_in_data_dir,
    running,
    scratch_database,
    serve_argv,
    server_env,
)
from bench.figures import Figure, table, write
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import serving
from textbook_chat.web import sse

HOLD_PINGS = 2  # idle readers are held until each should have seen this many pings
CONNECT_CONCURRENCY = 200


class Reader(asyncio.Protocol):
    """One EventSource-like reader: counts events and pings; knows when its headers said 200."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.status: int | None = None
        self.events = 0
        self.pings = 0
        self.bytes = 0
        self.closed = asyncio.get_running_loop().create_future()
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.status is None and data.startswith(b"HTTP/1.1 "):
            self.status = int(data[9:12])
        self.bytes += len(data)
        window = self._tail + data
        self.events += window.count(b"\nevent: ") - self._tail.count(b"\nevent: ")
        self.pings += window.count(b"\n: ping") - self._tail.count(b"\n: ping")
        self._tail = data[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_readers(server: ServerProcess, urls: list[str], count: int) -> list[Reader]:
    """``count`` readers spread over ``urls``; returns once every one has its response headers."""
    loop = asyncio.get_running_loop()
    host, port = server.address
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(i: int) -> Reader:
        request = f"GET {urls[i % len(urls)]} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode()
        async with gate:
            _, reader = await loop.create_connection(lambda: Reader(request), host, port)
            for _ in range(3000):
                if reader.status is not None and reader.events >= 2:
                    break
                await asyncio.sleep(0.01)
        return reader

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def post_message(server: ServerProcess, question: str) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection(*server.address)
    body = json.dumps({"question": question}).encode()
    writer.write(
        b"POST /api/chat/messages HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 202"):
        raise RuntimeError(f"POST /api/chat/messages: {head[:40]!r} {payload[:200]!r}")
    created: dict[str, Any] = json.loads(payload)
    return created


async def close_all(readers: list[Reader]) -> None:
    for reader in readers:
        reader.close()
    await asyncio.wait([asyncio.ensure_future(r.closed) for r in readers], timeout=30)


def raise_open_file_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server process inherits it
    return resource.getrlimit(resource.RLIMIT_NOFILE)


async def idle_streams(server: ServerProcess, fake: FakeOpenAI, count: int, messages: int) -> list[Figure]:
    fake.default = Behaviour(stall_s=3600)  # the model never starts: every reader waits, pinged
    urls = [(await post_message(server, QUESTIONS[i % len(QUESTIONS)]))["stream_url"] for i in range(messages)]
    warm = await open_readers(server, urls, messages)  # the first reader of each answer: not part of the count
    await asyncio.sleep(1)
    rss_before, started = server.rss_bytes(), time.monotonic()
    readers = await open_readers(server, urls, count)
    opened_s = time.monotonic() - started
    rss_after, cpu = server.rss_bytes(), server.cpu_s()
    ok_readers = sum(r.status == 200 and r.events >= 2 for r in readers)
    hold_s = sse.PING_S * HOLD_PINGS + 1.5
    print(f"idle: {ok_readers}/{count} streams open in {opened_s:.1f} s; holding them {hold_s:.0f} s for pings")
    await asyncio.sleep(hold_s)
    hold_cpu = server.cpu_s() - cpu
    alive = sum(not r.closed.done() for r in readers)
    pings = [r.pings for r in readers]
    per_stream_kb = (rss_after - rss_before) / max(1, ok_readers) / 1024
    print(
        f"  still open after {hold_s:.0f} s: {alive}; pings per stream min {min(pings)} median "
        f"{statistics.median(pings):.0f} (expected {HOLD_PINGS}); server RSS {rss_before / 2**20:.0f} -> "
        f"{rss_after / 2**20:.0f} MiB = {per_stream_kb:.1f} KiB per stream; server CPU while idle "
        f"{hold_cpu / hold_s:.1%} of a core"
    )
    await close_all(readers + warm)
    held = min(alive, sum(p >= HOLD_PINGS for p in pings))
    return [
        Figure("streams: idle streams held pinging, one worker", held, "streams", 5000, "higher"),
        Figure("streams: RSS per idle stream", per_stream_kb, "KiB"),
        Figure("streams: server CPU with the idle streams", hold_cpu / hold_s * 100, "% core"),
    ]


async def active_readers(
    server: ServerProcess, fake: FakeOpenAI, count: int, messages: int, seconds: float
) -> list[Figure]:
    # Long answers at 100 tokens/s, each token its own event (they are spaced wider than the coalescing window):
    # the server's work is fan-out to the readers, the fake model's is small.
    fake.default = ok(" ".join(f"w{i}" for i in range(20_000)), token_delay_s=0.01)
    urls = [(await post_message(server, QUESTIONS[i % len(QUESTIONS)]))["stream_url"] for i in range(messages)]
    readers = await open_readers(server, urls, count)
    connected = sum(r.status == 200 for r in readers)
    await asyncio.sleep(1)
    events, cpu, started = sum(r.events for r in readers), server.cpu_s(), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    delivered = sum(r.events for r in readers) - events
    used = server.cpu_s() - cpu
    rate = delivered / elapsed
    print(
        f"active: {connected}/{count} readers on {messages} live answers; {rate:,.0f} events/s delivered over "
        f"{elapsed:.0f} s (server CPU {used / elapsed:.0%} of a core, "
        f"{used / max(1, delivered) * 1e6:.1f} µs per event)"
    )
    await close_all(readers)
    return [
        Figure(f"streams: events/s to {count} active readers, one worker", rate, "events/s", better="higher"),
        Figure("streams: server CPU per delivered event", used / max(1, delivered) * 1e6, "µs"),
    ]


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await demo_index(data_dir)
    fake = FakeOpenAI()
    figures: list[Figure] = []
    with scratch_database() as database_url:
        async with serving(fake.app()) as llm_base:
            port = free_port()
            env = server_env(database_url, data_dir, f"{llm_base}/v1", port, LLM_TIMEOUT_S="3600")
            async with running(serve_argv(port), env) as server:
                print(
                    f"settings: ulimit -n {' / '.join(map(str, resource.getrlimit(resource.RLIMIT_NOFILE)))} "
                    f"(server: {server.open_files_limit()}), ping every {sse.PING_S} s, one uvicorn worker "
                    f"(uvloop, httptools), no Redis (in-process registry), {os.cpu_count()} cores shared with the "
                    "clients and the fake model"
                )
                if args.idle:
                    figures += await idle_streams(server, fake, args.idle, args.messages)
                figures += await active_readers(server, fake, args.active, args.messages, args.seconds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=5000, help="idle streams to open (default: %(default)s)")
    parser.add_argument("--active", type=int, default=500, help="active readers (default: %(default)s)")
    parser.add_argument("--messages", type=int, default=10, help="answers the readers share (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10, help="active measurement window (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the demo index")
    args = parser.parse_args()
    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # the fake model's stalled requests, cut at exit
    limit = raise_open_file_limit()
    if limit[0] < args.idle + 200:
        parser.error(f"ulimit -n is {limit[0]}: too low for {args.idle} streams")
    started = time.monotonic()
    figures = run_in_data_dir(measure, args, "bench-streams-")
    print()
    print(table(figures))
    print(f"\n({time.monotonic() - started:.0f} s)")
    write(figures, args.json)


if __name__ == "__main__":
    main()
