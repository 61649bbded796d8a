"""Soak: mixed questions, EventSource-style reconnects and history reads at a steady rate, for minutes.

    .venv/bin/python -m bench.soak [--minutes 2] [--rate 3] [--quick] [--json PATH]

The server is its own process (uvicorn, one worker, scratch Postgres database, local Redis DB 11, the
demo book's index, the fake model in this process). It reports RSS over time, open descriptors, asyncio
tasks and pool connections at a baseline (after a warm-up, idle) and at the end (idle again), and the p99
time to first token of the first fifth of the run against the last fifth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.chat import ServerProcess, demo_index, free_port, running, scratch_database, server_env
from bench.figures import Figure, percentile, table, write
from tests.conftest import DEMO_BOOK
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving
from tests.sse_client import SSEEvent, events

SOAK_REDIS_URL = "redis://127.0.0.1:6379/11"
STATS_PATH = "/_soak/stats"
WARM_UP_S = 15.0
STREAM_TTL_S = 15  # finished answers stay replayable this long; the end snapshot waits it out
ANSWER = " ".join(f"word{i}" for i in range(80)) + " [1]."
MIX = (("ask", 0.45), ("reconnect", 0.35), ("history", 0.20))
OFF_TOPIC = "What is the best recipe for sourdough bread with a crispy crust?"


# -- the server side: the real app plus one read-only route for what /metrics does not show -----------


def stats_app() -> Any:
    """The served app (settings from the environment) with ``GET /_soak/stats``: asyncio tasks and pools."""
    from starlette.responses import JSONResponse

    from textbook_chat.web.app import create_app

    app = create_app()

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            services = scope["state"]["services"]
            body: dict[str, Any] = {"tasks": len(asyncio.all_tasks())}
            if services.store is not None:
                # psycopg_pool's own counters; the Store keeps its pool private, a benchmark may look.
                stats = services.store._pool.get_stats()
                body["pg_pool_size"], body["pg_pool_available"] = stats["pool_size"], stats["pool_available"]
            if services.redis is not None:
                pool = services.redis.connection_pool
                body["redis_connections"] = len(pool._available_connections) + len(pool._in_use_connections)
            await JSONResponse(body)(scope, receive, send)
            return
        await app(scope, receive, send)

    return wrapped


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(stats_app(), host="127.0.0.1", port=port, log_config=None, proxy_headers=False)


# -- the client side ----------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    rss_mb: float
    fds: int
    stats: dict[str, int]


@dataclass
class Load:
    client: httpx.AsyncClient
    questions: list[str]
    started: float
    first_token_s: list[tuple[float, float]] = field(default_factory=list)  # (start offset, seconds)
    history_s: list[tuple[float, float]] = field(default_factory=list)
    sessions: list[tuple[str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def payload(self, rng: random.Random) -> dict[str, Any]:
        question = OFF_TOPIC if rng.random() < 0.1 else rng.choice(self.questions)
        payload: dict[str, Any] = {"question": question}
        if self.sessions and rng.random() < 0.3:  # a follow-up in an earlier conversation
            session_id, token = rng.choice(self.sessions)
            payload |= {"session_id": session_id, "session_token": token}
        return payload

    def remember(self, meta: dict[str, Any]) -> None:
        if "session_token" in meta:
            self.sessions.append((meta["session_id"], meta["session_token"]))
            del self.sessions[:-200]

    async def ask(self, rng: random.Random) -> None:
        t0 = time.monotonic()
        seen = await self._read("POST", "/api/chat", json=self.payload(rng), first_token_at=t0)
        self._check(seen)

    async def reconnect(self, rng: random.Random) -> None:
        t0 = time.monotonic()
        created = await self.client.post("/api/chat/messages", json=self.payload(rng))
        created.raise_for_status()
        url = created.json()["stream_url"]
        first = await self._read("GET", url, first_token_at=t0, stop_after_tokens=3)
        rest = await self._read("GET", url, headers={"Last-Event-ID": first[-1].id or "0"})
        self._check(first + rest)

    async def history(self, rng: random.Random) -> None:
        if not self.sessions:
            return
        session_id, token = rng.choice(self.sessions)
        t0 = time.monotonic()
        response = await self.client.get(f"/api/sessions/{session_id}/messages", headers={"X-Session-Token": token})
        response.raise_for_status()
        self.history_s.append((t0 - self.started, time.monotonic() - t0))

    async def _read(
        self,
        method: str,
        url: str,
        *,
        first_token_at: float | None = None,
        stop_after_tokens: int | None = None,
        **kwargs: Any,
    ) -> list[SSEEvent]:
        seen: list[SSEEvent] = []
        async with self.client.stream(method, url, **kwargs) as response:
            response.raise_for_status()
            async for event in events(response):
                seen.append(event)
                if event.event == "meta":
                    self.remember(event.json())
                if first_token_at is not None and event.event in ("token", "done"):
                    self.first_token_s.append((first_token_at - self.started, time.monotonic() - first_token_at))
                    first_token_at = None
                if stop_after_tokens is not None and sum(e.event == "token" for e in seen) >= stop_after_tokens:
                    break
        return seen

    def _check(self, stream: list[SSEEvent]) -> None:
        ids = [e.id for e in stream]
        if ids != [str(i) for i in range(1, len(ids) + 1)] or stream[-1].event != "done":
            self.failures.append(f"bad stream: {[e.event for e in stream][-3:]} ids {ids[:3]}…{ids[-3:]}")


async def steady(load: Load, rate: float, seconds: float, rng: random.Random) -> None:
    """Start one action every 1/rate seconds (open loop) for ``seconds``; then wait for all of them."""
    actions: dict[str, Callable[[random.Random], Awaitable[None]]] = {
        "ask": load.ask,
        "reconnect": load.reconnect,
        "history": load.history,
    }
    names = [name for name, _ in MIX]
    weights = [weight for _, weight in MIX]
    running_tasks: set[asyncio.Task[None]] = set()

    async def one(name: str) -> None:
        try:
            await actions[name](rng)
            load.count(name)
        except Exception as exc:  # noqa: BLE001 -- a failure is a finding to report, not a reason to stop
            load.failures.append(f"{name}: {type(exc).__name__}: {exc}"[:200])

    end = time.monotonic() + seconds
    next_at = time.monotonic()
    while next_at < end:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        task = asyncio.create_task(one(rng.choices(names, weights)[0]))
        running_tasks.add(task)
        task.add_done_callback(running_tasks.discard)
        next_at += 1.0 / rate
    await asyncio.gather(*running_tasks)


async def sample(server: ServerProcess, client: httpx.AsyncClient, started: float) -> Sample:
    stats = (await client.get(STATS_PATH)).json()
    fds = len(os.listdir(f"/proc/{server.pid}/fd"))
    return Sample(time.monotonic() - started, server.rss_bytes() / 2**20, fds, stats)


async def sampler(server: ServerProcess, client: httpx.AsyncClient, started: float, out: list[Sample]) -> None:
    while True:
        out.append(await sample(server, client, started))
        await asyncio.sleep(10)


async def settled(
    server: ServerProcess, probe: httpx.AsyncClient, load: Load, rng: random.Random, started: float
) -> Sample:
    """A snapshot once the server is idle and finished answers are past their replay window."""
    await asyncio.sleep(STREAM_TTL_S + 2)
    load.client = probe
    await load.ask(rng)  # the registry drops expired streams when the next question arrives
    await asyncio.sleep(2)
    return await sample(server, probe, started)


def p99(values: list[tuple[float, float]], lo: float, hi: float) -> float:
    window = [v for t, v in values if lo <= t < hi]
    return percentile(window, 99) * 1000 if window else float("nan")


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await demo_index(data_dir)
    lines = (DEMO_BOOK / "questions.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()]
    redis.Redis.from_url(SOAK_REDIS_URL).flushdb()
    fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.005))
    rng = random.Random(7)
    with scratch_database() as database_url:
        async with serving(fake.app()) as llm_url:
            port = free_port()
            env = server_env(
                database_url,
                data_dir,
                f"{llm_url}/v1",
                port,
                REDIS_URL=SOAK_REDIS_URL,
                STREAM_TTL_S=str(STREAM_TTL_S),
                STREAM_GRACE_S="2",
            )
            argv = [sys.executable, "-m", "bench.soak", "--serve", str(port)]
            async with running(argv, env) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as probe:
                # The load's own keep-alive connections are server descriptors too: each phase closes its
                # client before a snapshot, and snapshots go through ``probe`` (one connection, always open).
                started = time.monotonic()
                load = Load(probe, questions, started)
                print(f"warm-up: {WARM_UP_S:.0f} s at {args.rate}/s")
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as load.client:
                    await steady(load, args.rate, WARM_UP_S, rng)
                baseline = await settled(server, probe, load, rng, started)
                soak_s = args.minutes * 60 - WARM_UP_S
                print(f"soak: {soak_s:.0f} s at {args.rate}/s; baseline {_describe(baseline)}")
                samples: list[Sample] = []
                watcher = asyncio.create_task(sampler(server, probe, started, samples))
                soak_started = time.monotonic() - started
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as load.client:
                    await steady(load, args.rate, soak_s, rng)
                watcher.cancel()
                soak_ended = time.monotonic() - started
                end = await settled(server, probe, load, rng, started)

    print("\n  t (s)   RSS (MB)   fds   tasks")
    for s in [baseline, *samples, end]:
        print(f"  {s.t:5.0f}   {s.rss_mb:8.1f}   {s.fds:3d}   {s.stats['tasks']:5d}")
    print(f"\nbaseline: {_describe(baseline)}\nend:      {_describe(end)}")
    print(f"actions: {load.counts}; failures: {len(load.failures)}")
    for failure in load.failures[:10]:
        print(f"  {failure}")
    fifth = (soak_ended - soak_started) / 5
    p99_start = p99(load.first_token_s, soak_started, soak_started + fifth)
    p99_end = p99(load.first_token_s, soak_ended - fifth, soak_ended)
    history_start = p99(load.history_s, soak_started, soak_started + fifth)
    history_end = p99(load.history_s, soak_ended - fifth, soak_ended)
    return [
        Figure("soak: RSS at the end / baseline", end.rss_mb / baseline.rss_mb, "ratio", 1.10, "lower"),
        Figure("soak: RSS at the end", end.rss_mb, "MB"),
        Figure("soak: open descriptors, end minus baseline", end.fds - baseline.fds, "fds", 2, "lower"),
        Figure("soak: asyncio tasks, end minus baseline", end.stats["tasks"] - baseline.stats["tasks"], "tasks", 0),
        Figure("soak: Postgres pool connections at the end", end.stats.get("pg_pool_size", 0), "conns", 10),
        Figure("soak: Redis connections at the end", end.stats.get("redis_connections", 0), "conns"),
        Figure("soak: first token p99, first fifth", p99_start, "ms"),
        Figure("soak: first token p99, last fifth", p99_end, "ms"),
        Figure("soak: first token p99 drift (last / first fifth)", p99_end / p99_start, "ratio", 1.20, "lower"),
        # Reported only: conversations grow during the run, so later history reads return more messages.
        Figure("soak: history read p99 drift (last / first fifth)", history_end / history_start, "ratio"),
        Figure("soak: failed actions", len(load.failures), "count", 0, "lower"),
    ]


def _describe(s: Sample) -> str:
    pools = ", ".join(f"{k} {v}" for k, v in s.stats.items() if k != "tasks")
    return f"RSS {s.rss_mb:.1f} MB, {s.fds} fds, {s.stats['tasks']} tasks, {pools}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="load time including a 15 s warm-up (default 2)")
    parser.add_argument("--rate", type=float, default=3.0, help="actions started per second (default 3)")
    parser.add_argument("--quick", action="store_true", help="one minute (a smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server subprocess
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    if args.quick:
        args.minutes = 1.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        figures = asyncio.run(measure(args, Path(tmp)))
    print()
    print(table(figures))
    elapsed = time.monotonic() - started
    print(f"\n(one worker; {os.cpu_count()} cores shared with the clients and the fake model; {elapsed:.0f} s)")
    write(figures, args.json)


if __name__ == "__main__":
    main()
