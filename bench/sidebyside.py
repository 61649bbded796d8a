"""The server beside the minimal relay (bench/ceiling.py) in one run, pinned as issue 29 asks.

    .venv/bin/python -m bench.sidebyside [--rounds N] [--redis URL] [--server-root DIR] [--json PATH]

Both servers run on CPU 0 (``taskset -c 0``), one after the other; the fake model (tests/fake_openai.py) and
the clients (raw sockets) run in this process on CPU 1. The same fake model answers both, instantly, with
``--tokens`` tokens (200, as bench/chat.py's throughput figure). Per round and per server: RSS once up
(before any question), first token (client-observed) over ``--questions`` questions from one client and the share
of them the second opinion read (the server's ``/metrics``), then answers per second and server CPU per answer over
``--seconds`` with 50 clients. The questions are a book's real question set (``--questions-file``, the shared
book's ``questions.jsonl`` by default: what readers ask reaches the second opinion, a fixed list did not); the
server runs on that book's index (``--book``; ingested and self-calibrated into ``--data-dir`` when it holds none),
with Postgres (a scratch database), the OpenAI path, and Redis when ``--redis`` is given. ``--server-root``
serves another checkout of the project (a before/after comparison: the relay is always this one's).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench import ceiling
from bench.chat import (
    QUESTION_SET,
    ROOT,
    Cases,
    ServerProcess,
    TimedModel,
    _wait_until_up,
    answer_text,
    conversations,
    demo_index,
    free_port,
    run_in_data_dir,
    running,
    scratch_database,
    second_opinions,
    serve_argv,
    server_env,
    use_questions,
)
from bench.figures import Figure, percentile, table, write
from tests.conftest import SHARED_BOOK
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving

SERVER_CPU = "0"
CLIENT_CPU = 1


def _quiet_harness(fake: FakeOpenAI) -> None:
    """Forget what the fake model recorded, and keep the harness's heap out of its garbage collections: it
    runs on the clients' core, and a full collection over a round's recorded prompts paused the fake model
    ~80 ms (every round after the first had a first-token p99 near 90 ms and half the answers per second)."""
    fake.requests.clear()
    gc.collect()
    gc.freeze()


async def _figures(server: ServerProcess, path: str, cases: Cases, args: argparse.Namespace) -> dict[str, float]:
    rss = server.rss_bytes() / 2**20
    await conversations(server, cases, clients=2, turns=5, seconds=None, path=path)  # warm-up
    read_before = await second_opinions(server)
    one = await conversations(server, cases, clients=1, turns=args.questions, seconds=None, path=path)
    read = await second_opinions(server) - read_before
    ttft = [a.ttft_s * 1000 for _, a in one.answers if a.ttft_s is not None]
    inside = [a.timings_ms["first_token"] for _, a in one.answers if "first_token" in a.timings_ms]
    many = await conversations(server, cases, clients=50, turns=None, seconds=args.seconds, path=path)
    figures = {
        "rss_start_mb": round(rss, 1),
        "ttft_p50_ms": round(percentile(ttft, 50), 2),
        "ttft_p99_ms": round(percentile(ttft, 99), 2),
        "answers_per_s_50": round(many.completed / many.elapsed_s, 1),
        "cpu_ms_per_answer_50": round(many.cpu_s / max(1, many.completed) * 1000, 1),
        "second_opinion_share": round(read / max(1, len(one.answers)), 3),  # the relay has none: 0
    }
    if inside:  # the server's own timing (question accepted to first token published), not the relay's
        print(f"  {path}: accepted to first token inside the server p50 {percentile(inside, 50):.1f} ms")
    return figures


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    os.sched_setaffinity(0, {CLIENT_CPU})
    asked = use_questions(args.questions_file)
    print(f"{len(asked)} questions from {args.questions_file}, on the index of {args.book}")
    await demo_index(data_dir, args.book)
    fake = FakeOpenAI()
    fake.default = ok(answer_text(args.tokens))
    model = TimedModel(fake)
    cases = Cases()
    rounds: list[dict[str, dict[str, float]]] = []
    root = args.server_root or ROOT
    with scratch_database() as database_url:
        async with serving(model) as llm_base:
            llm_url = f"{llm_base}/v1"
            for n in range(args.rounds):
                port = free_port()
                extra = {"REDIS_URL": args.redis} if args.redis else {}
                if args.server_root is not None:  # else an inherited PYTHONPATH serves this checkout's code
                    extra["PYTHONPATH"] = os.pathsep.join([str(root / "server"), str(root)])
                env = server_env(database_url, data_dir, llm_url, port, **extra)
                argv = ["taskset", "-c", SERVER_CPU, *serve_argv(port)]
                _quiet_harness(fake)
                async with running(argv, env, cwd=root) as server:
                    ours = await _figures(server, "/api/chat", cases, args)
                _quiet_harness(fake)
                relay_port = free_port()
                with ceiling.relay_process(relay_port, llm_url, cpus=SERVER_CPU) as relay_process:
                    relay = ServerProcess(relay_process, f"http://127.0.0.1:{relay_port}")
                    await _wait_until_up(relay)
                    theirs = await _figures(relay, ceiling.RELAY_PATH, cases, args)
                rounds.append({"server": ours, "relay": theirs})
                _print_round(n, ours, theirs)
    _print_summary(rounds)
    if args.rounds_json is not None:
        args.rounds_json.write_text(json.dumps(rounds, indent=2) + "\n")
    return _as_figures(rounds)


def _as_figures(rounds: list[dict[str, dict[str, float]]]) -> list[Figure]:
    """The medians over the rounds, the relay's as each figure's ceiling, with issue 29's targets."""

    def median(side: str, key: str) -> float:
        return statistics.median(r[side][key] for r in rounds)

    def pair(key: str) -> tuple[float, float]:
        return median("server", key), median("relay", key)

    first, first_relay = pair("ttft_p50_ms")
    p99, p99_relay = pair("ttft_p99_ms")
    rate, rate_relay = pair("answers_per_s_50")
    rss, rss_relay = pair("rss_start_mb")
    cpu, cpu_relay = pair("cpu_ms_per_answer_50")
    share = median("server", "second_opinion_share")
    return [
        Figure("side by side: server CPU per answer, 50 clients", cpu, "ms", round(cpu_relay, 1), ceiling=cpu_relay),
        Figure("side by side: questions the second opinion read, 1 client", share, "share"),
        Figure(
            "side by side: first token p50, 1 client", first, "ms", round(2.0 * first_relay, 2), ceiling=first_relay
        ),
        Figure("side by side: first token p99, 1 client", p99, "ms", ceiling=p99_relay),
        Figure(
            "side by side: answers/s, 50 clients", rate, "answers/s", round(2.2 * rate_relay, 1), "higher", rate_relay
        ),
        Figure("side by side: RSS at start", rss, "MB", 250.0, ceiling=rss_relay),
    ]


def _ratios(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    return {key: ours[key] / theirs[key] for key in ours if theirs[key]}


def _print_round(n: int, ours: dict[str, float], theirs: dict[str, float]) -> None:
    ratios = _ratios(ours, theirs)
    print(f"round {n + 1}:")
    for key in ours:
        ratio = f"{ratios[key]:5.2f}x" if key in ratios else "    -"
        print(f"  {key:<20} server {ours[key]:8.3f}  relay {theirs[key]:8.3f}  ratio {ratio}")
    sys.stdout.flush()


def _print_summary(rounds: list[dict[str, dict[str, float]]]) -> None:
    print("median over rounds:")
    for key in rounds[0]["server"]:
        ours = statistics.median(r["server"][key] for r in rounds)
        theirs = statistics.median(r["relay"][key] for r in rounds)
        found = [_ratios(r["server"], r["relay"]).get(key) for r in rounds]
        ratio = f"{statistics.median(x for x in found if x is not None):5.2f}x" if None not in found else "    -"
        print(f"  {key:<20} server {ours:8.3f}  relay {theirs:8.3f}  ratio {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=60, help="questions from one client, per round")
    parser.add_argument("--seconds", type=float, default=8.0, help="the 50-client span, per round")
    parser.add_argument("--tokens", type=int, default=200, help="the fake model's answer length")
    parser.add_argument("--redis", default=None, help="REDIS_URL for the server (off when not given)")
    parser.add_argument("--server-root", type=Path, default=None, help="serve this checkout (default: this one)")
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the book's index")
    parser.add_argument("--book", type=Path, default=SHARED_BOOK, help="the book served (default: the shared book)")
    parser.add_argument(
        "--questions-file", type=Path, default=QUESTION_SET, help="the question set asked (questions.jsonl format)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    parser.add_argument("--rounds-json", type=Path, default=None, help="also write every round's figures here")
    args = parser.parse_args()
    started = time.monotonic()
    figures = run_in_data_dir(measure, args, "bench-sidebyside-")
    print()
    print(table(figures))
    write(figures, args.json)
    print(f"({time.monotonic() - started:.0f} s; server and relay on CPU {SERVER_CPU}, clients on CPU {CLIENT_CPU})")


if __name__ == "__main__":
    main()
