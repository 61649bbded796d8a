"""A flood of hostile model streams against ordinary ones (issue 34): answers/s, CPU and memory per answer, /health.

    .venv/bin/python -m bench.hostile_model [--answers N] [--concurrency C] [--json PATH] [--data-dir DIR]

One server process (``serve``, one worker) over the demo index and a scratch database; the fake model
(tests/fake_openai.py) shares this process. Ordinary: an 80-word answer at 10 ms a token. Hostile, in turn: one
10 MB line without a newline, a stream without end (``LLM_MAX_ANSWER_S`` is 5 s here, so the run stays short),
a 20 MB answer. /health is polled every 50 ms throughout, from a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.chat import (
    ServerProcess,
    demo_index,
    free_port,
    post_stream,
    run_in_data_dir,
    running,
    scratch_database,
    serve_argv,
    server_env,
)
from bench.figures import Figure, table, write
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import serving

ORDINARY = " ".join(f"word{i}" for i in range(80)) + " [1]."
HOSTILE = {
    "line": Behaviour(pieces=("Balance", " is"), endless_line_bytes=10_000_000, token_delay_s=0.001),
    "forever": Behaviour(pieces=("Balance",), forever=True, token_delay_s=0.002),
    "big": Behaviour(pieces=("z" * 1000,) * 20_000, token_delay_s=0.0005),
}
QUESTION = "What does the Zero Moment Point tell a walking humanoid?"


# /health is polled from a process of its own: the fake model shares this one's event loop, and sending a 10 MB
# line from it would be counted as the server's delay.
_POLLER = """
import json, signal, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
seen = []
def report(*_):
    print(json.dumps(seen)); sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\\r\\nHost: bench\\r\\nConnection: close\\r\\n\\r\\n")
            ok = s.recv(12).endswith(b"200")
            while s.recv(65536):
                pass
    except OSError:
        ok = False
    seen.append(time.monotonic() - started if ok else 1e9)
    time.sleep(0.05)
"""


async def flood(server: ServerProcess, answers: int, concurrency: int) -> dict[str, float]:
    """``answers`` questions, ``concurrency`` at a time, /health polled meanwhile: what it took."""
    gate = asyncio.Semaphore(concurrency)
    peak_rss = server.rss_bytes()

    async def one(i: int) -> str | None:
        nonlocal peak_rss
        async with gate:
            answer = await post_stream(server.address, "/api/chat", {"question": f"{QUESTION} ({i})"})
            peak_rss = max(peak_rss, server.rss_bytes())
            return answer.finish

    host, port = server.address
    poller = subprocess.Popen([sys.executable, "-c", _POLLER, host, str(port)], stdout=subprocess.PIPE, text=True)
    rss_before, cpu_before, started = server.rss_bytes(), server.cpu_s(), time.monotonic()
    ends = await asyncio.gather(*(one(i) for i in range(answers)))
    elapsed = time.monotonic() - started
    cpu = server.cpu_s() - cpu_before
    poller.terminate()
    health = json.loads(poller.communicate(timeout=30)[0])
    return {
        "answers_per_s": answers / elapsed,
        "cpu_ms_per_answer": cpu * 1000 / answers,
        "rss_growth_mb": (peak_rss - rss_before) / 1e6,
        "health_p50_ms": statistics.median(health) * 1000,
        "health_max_ms": max(health) * 1000,
        "terminal_events": sum(e in ("done", "error") for e in ends) / answers,
        "elapsed_s": elapsed,
    }


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    await demo_index(data_dir)
    figures: list[Figure] = []
    with scratch_database() as database_url:
        for kind in ("ordinary", "hostile"):
            fake = FakeOpenAI(default=ok(ORDINARY, token_delay_s=0.01))
            if kind == "hostile":
                hostile = [HOSTILE[name] for name in args.kinds.split(",")]
                fake.then(*itertools.islice(itertools.cycle(hostile), args.answers))
            async with serving(fake.app()) as llm_url:
                port = free_port()
                env = server_env(database_url, data_dir, f"{llm_url}/v1", port, LLM_MAX_ANSWER_S="5")
                async with running(serve_argv(port), env) as server:
                    result = await flood(server, args.answers, args.concurrency)
            print(f"{kind}: " + ", ".join(f"{k} {v:.3g}" for k, v in result.items()))
            figures += [
                Figure(f"{kind} model: answers/s", result["answers_per_s"], "1/s", better="higher"),
                Figure(f"{kind} model: server CPU per answer", result["cpu_ms_per_answer"], "ms"),
                Figure(f"{kind} model: server RSS growth", result["rss_growth_mb"], "MB"),
                Figure(f"{kind} model: /health p50", result["health_p50_ms"], "ms"),
                Figure(f"{kind} model: /health max", result["health_max_ms"], "ms", target=1000.0),
                Figure(
                    f"{kind} model: streams ended with done/error", result["terminal_events"], "share", 1.0, "higher"
                ),
            ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=15)
    parser.add_argument("--kinds", default="line,forever,big", help="hostile streams, in turn: line, forever, big")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    figures = run_in_data_dir(measure, args, "bench-hostile-")
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
