"""Chat latency and throughput (issue 10): server-added time to first token, CPU per answer, tokens relayed/s.

    .venv/bin/python -m bench.chat [--json PATH] [--data-dir DIR] [--book DIR] [--questions-file PATH] [--quick]

The server runs as its own process (``python -m textbook_chat serve``: uvicorn, one worker) on a scratch Postgres
database with a book's index (the shared book's by default), asked that book's real questions (``--questions-file``;
the share of them the second opinion read is reported from the server's ``/metrics``); the fake model
(tests/fake_openai.py) and the clients (raw asyncio sockets) share this process. "Server-added" time is the
client's time to the first token minus the model's own (request received to first chunk sent, timed at the fake
model), so it is everything but the model.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from alembic import command

from bench import ceiling
from bench.figures import Figure, percentile, table, write
from tests.conftest import DEMO_BOOK, SHARED_BOOK, alembic_config, create_database, drop_database
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUESTIONS: list[str] = []  # the question set's (``use_questions``), asked in turn
QUESTION_SET = SHARED_BOOK / "questions.jsonl"  # what readers of the shared book ask (every kind but selection)
_SPACES = 3  # each gap between a question's words holds 1..3 spaces: a digit of the case number in base 3
TURNS_PER_CONVERSATION = 4  # then the reader starts a new conversation (a new session)
_META = re.compile(rb"event: meta\r?\ndata: (\{.*?\})\r?\n")
_DONE = re.compile(rb"event: done\r?\ndata: (\{.*?\})\r?\n")


def use_questions(path: Path = QUESTION_SET) -> list[str]:
    """Ask the questions of a question set (``questions.jsonl`` format): every kind but selection, in file order."""
    from textbook_chat.search import evaluate

    QUESTIONS[:] = [q.question for q in evaluate.load_questions(path) if q.kind != "selection"]
    return QUESTIONS


def question(case: int) -> str:
    """The question for ``case``: the case number is spelled in the spaces between its words.

    Neither the embedder nor the keyword terms nor the names rule see spaces, so retrieval is the same for every
    case (letters and capitals are the reader's, as the names rule must see them), while the fake model can
    still tell the requests apart."""
    words = QUESTIONS[case % len(QUESTIONS)].split()
    number = case // len(QUESTIONS)
    text = words[0]
    for word in words[1:]:
        text += " " * (1 + number % _SPACES) + word
        number //= _SPACES
    return text


def case_of(prompt: str) -> int | None:
    """The case number of the question inside ``prompt`` (the inverse of ``question``): the last one asked."""
    last: tuple[int, int, list[int]] | None = None  # (where, which question, its gaps)
    for index, base in enumerate(QUESTIONS):
        pattern = r"( +)".join(re.escape(w) for w in base.split())
        for found in re.finditer(pattern, prompt):
            if last is None or found.start() > last[0]:
                last = (found.start(), index, [len(g) - 1 for g in found.groups()])
    if last is None:
        return None
    _, index, gaps = last
    number: int = sum(g * _SPACES**n for n, g in enumerate(gaps))
    return index + len(QUESTIONS) * number


use_questions()


def answer_text(n_tokens: int) -> str:
    words = "The Zero Moment Point must stay inside the support polygon or the foot tips over [1].".split()
    return " ".join(words[i % len(words)] for i in range(n_tokens))


# -- the fake model, timed ---------------------------------------------------------------------------


class TimedModel:
    """The fake model's ASGI app, recording per question how long the model took to its first chunk."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.app = fake.app()
        self.first_chunk_s: dict[int, float] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        body = bytearray()
        received = time.monotonic()

        async def timed_receive() -> Any:
            nonlocal received
            message = await receive()
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                received = time.monotonic()
            return message

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body") and body:
                case = case_of(json.loads(body)["messages"][-1]["content"])
                if case is not None:
                    self.first_chunk_s.setdefault(case, time.monotonic() - received)
                body.clear()  # only the first chunk counts
            await send(message)

        await self.app(scope, timed_receive, timed_send)


# -- the server process ------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    url: str

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.url.removeprefix("http://").split(":")
        return host, int(port)

    def cpu_s(self) -> float:
        """User + system CPU of the process (all its threads) so far, from /proc/PID/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def open_files_limit(self) -> str:
        for line in Path(f"/proc/{self.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return " / ".join(line.split()[3:5])
        return "?"


Measure = Callable[[argparse.Namespace, Path], Coroutine[Any, Any, list[Figure]]]


def run_in_data_dir(measure: Measure, args: argparse.Namespace, prefix: str) -> list[Figure]:
    """``measure(args, data_dir)`` on uvloop, in ``args.data_dir`` or else a scratch folder removed afterwards."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if args.data_dir is not None:
            return runner.run(measure(args, args.data_dir))
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            return runner.run(measure(args, Path(tmp)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running(
    argv: list[str], env: dict[str, str], *, health: str = "/health", cwd: Path = ROOT
) -> AsyncIterator[ServerProcess]:
    """Start ``argv`` (which must bind the port in ``env['PORT']``) in ``cwd``, wait until ``health`` answers,
    stop it after."""
    port = int(env["PORT"])
    process = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    server = ServerProcess(process, f"http://127.0.0.1:{port}")
    try:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(process.stderr.read().decode() if process.stderr else "server died")
            try:
                status, _ = await get(server.address, health)
                if status == 200:
                    break
            except OSError:
                pass
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"{argv} did not answer {health} within 60 s")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def server_env(database_url: str, data_dir: Path, llm_url: str, port: int, **extra: str) -> dict[str, str]:
    """One worker with everything real but the model; limits raised so the bench measures work, not refusals."""
    return {
        "PORT": str(port),
        "DATABASE_URL": database_url,
        "DATA_DIR": str(data_dir),
        "EMBEDDER": "local",
        "OPENAI_API_KEY": "sk-bench",
        "OPENAI_BASE_URL": llm_url,
        "STREAM_SIGNING_KEY": "bench-signing-key",
        "RATE_LIMIT_ANON": "1000000/hour",
        "RATE_LIMIT_READ": "1000000/minute",
        "MAX_STREAMS_PER_CLIENT": "100000",
        "SESSION_DAILY_TOKENS": "1000000000",
        "SHUTDOWN_GRACE_S": "1",
        "LOG_LEVEL": "warning",
        **extra,
    }


def serve_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "textbook_chat", "serve", "--port", str(port)]


@contextmanager
def scratch_database() -> Iterator[str]:
    url = create_database("textbook_bench")
    try:
        command.upgrade(alembic_config(url), "head")
        yield url
    finally:
        drop_database(url)


async def demo_index(data_dir: Path, book: Path = DEMO_BOOK) -> None:
    """The embedded index of ``book`` (the demo book's by default) in ``data_dir``, ingested and self-calibrated as
    the ``ingest`` command does, unless it is already there."""
    from textbook_chat.core.settings import Settings
    from textbook_chat.index import ingest
    from textbook_chat.search import calibration
    from textbook_chat.search.retrieval import Retriever
    from textbook_chat.search.second_opinion import SecondOpinion
    from textbook_chat.web.services import open_services

    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        if not await services.index.exists():
            report = await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)
            opinion = SecondOpinion.load()
            try:
                retriever = Retriever(services.index, services.embedder, second_opinion=opinion)
                await calibration.after_ingest(retriever, services.index, book_changed=report.changed)
            finally:
                opinion.close()


async def second_opinions(server: ServerProcess) -> float:
    """How many questions the server's cross-encoder has read so far (its ``/metrics``)."""
    status, body = await get(server.address, "/metrics")
    if status != 200:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("textbook_second_opinions_total{")
    )


# -- the client: raw sockets, no HTTP library in the measured path ------------------------------------


async def get(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        data = await reader.read()
    finally:
        writer.close()
    return int(data[9:12]), data


@dataclass
class Answer:
    sent: float
    first_token: float | None = None
    ended: float | None = None
    finish: str | None = None  # the terminal event's type: "done" or "error"
    meta: dict[str, Any] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)  # the server's own, from ``done``

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent


async def post_stream(address: tuple[str, int], path: str, payload: dict[str, Any]) -> Answer:
    """POST ``payload``; read the SSE answer until its terminal event, noting when the first token arrived."""
    body = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(*address)
    answer = Answer(sent=time.monotonic())
    try:
        writer.write(head + body)
        seen = last = b""
        while answer.finish is None:
            data = await reader.read(65536)
            if not data:
                break
            window = seen[-32:] + data
            if not answer.meta and b"event: meta" in (seen + data):
                match = _META.search(seen + data)
                if match:
                    answer.meta = json.loads(match.group(1))
            if answer.first_token is None and b"event: token" in window:
                answer.first_token = time.monotonic()
            for terminal in ("done", "error"):
                if f"event: {terminal}".encode() in window:
                    answer.finish, answer.ended = terminal, time.monotonic()
                    last = window
            seen = (seen + data)[-4096:] if not answer.meta else data[-64:]
        if answer.finish == "done":  # the rest of the response: the server's own timings
            tail = last + await reader.read()
            match = _DONE.search(tail)
            if match:
                answer.timings_ms = json.loads(match.group(1)).get("timings_ms", {})
    finally:
        writer.close()
    return answer


@dataclass
class Conversation:
    """One reader asking questions in a session, a new session every ``TURNS_PER_CONVERSATION`` turns."""

    address: tuple[str, int]
    path: str = "/api/chat"
    session: dict[str, str] = field(default_factory=dict)
    turns: int = 0

    async def ask(self, case: int) -> Answer:
        answer = await post_stream(self.address, self.path, {"question": question(case), **self.session})
        self.turns += 1
        if self.turns % TURNS_PER_CONVERSATION == 0:
            self.session = {}
        elif not self.session and "session_token" in answer.meta:
            self.session = {"session_id": answer.meta["session_id"], "session_token": answer.meta["session_token"]}
        return answer


class Cases:
    """Unique question numbers, so the fake model's timing can be matched to the client's."""

    def __init__(self) -> None:
        self._next = 0

    def take(self) -> int:
        self._next += 1
        return self._next


# -- the measurements --------------------------------------------------------------------------------


@dataclass
class Run:
    answers: list[tuple[int, Answer]]
    elapsed_s: float
    cpu_s: float
    harness_cpu_s: float = 0.0  # this process: the clients and the fake model

    def server_added_ms(self, model: TimedModel) -> list[float]:
        return [
            (a.ttft_s - model.first_chunk_s[case]) * 1000
            for case, a in self.answers
            if a.ttft_s is not None and case in model.first_chunk_s
        ]

    def server_timing_ms(self, key: str, model: TimedModel | None = None) -> list[float]:
        """The server's own ``timings_ms[key]`` from each ``done`` (less the model's share, given ``model``)."""
        return [
            a.timings_ms[key] - (model.first_chunk_s.get(case, 0.0) * 1000 if model else 0.0)
            for case, a in self.answers
            if key in a.timings_ms
        ]

    def outside_ms(self) -> list[float]:
        """Client-observed time to first token that the server's own ``first_token`` timing does not see:
        the HTTP request up to accepting the question, the token's way out, the clients' own delays."""
        return [a.ttft_s * 1000 - a.timings_ms["first_token"] for _, a in self.answers if a.ttft_s and a.timings_ms]

    @property
    def completed(self) -> int:
        return sum(a.finish == "done" and a.first_token is not None for _, a in self.answers)


async def conversations(
    server: ServerProcess,
    cases: Cases,
    *,
    clients: int,
    turns: int | None,
    seconds: float | None,
    path: str,
    stagger_s: float = 0.0,
) -> Run:
    """``clients`` concurrent readers, each asking ``turns`` questions (or asking until ``seconds`` are up).

    With ``stagger_s``, each reader starts at a random moment within that span, as independent readers do;
    without it every reader asks at the same instant (a burst, and with equal answers, a burst every answer).
    """
    answers: list[tuple[int, Answer]] = []
    deadline = time.monotonic() + (seconds or 1e9)
    rng = random.Random(17)

    async def reader() -> None:
        await asyncio.sleep(rng.uniform(0, stagger_s))
        conversation = Conversation(server.address, path)
        done = 0
        while (turns is None or done < turns) and time.monotonic() < deadline:
            case = cases.take()
            answers.append((case, await conversation.ask(case)))
            done += 1

    # The clients and the fake model are not the server: keep this process's own full collections (which
    # walk every answer recorded so far) out of the server's figures.
    gc.collect()
    gc.freeze()
    cpu, harness, started = server.cpu_s(), time.process_time(), time.monotonic()
    await asyncio.gather(*(reader() for _ in range(clients)))
    return Run(answers, time.monotonic() - started, server.cpu_s() - cpu, time.process_time() - harness)


def summary(values: list[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"p50 {percentile(values, 50):6.1f}  p99 {percentile(values, 99):6.1f}  "
        f"mean {statistics.fmean(values):6.1f}  max {max(values):6.1f}  (n={len(values)})"
    )


async def measure(args: argparse.Namespace, data_dir: Path) -> list[Figure]:
    quick = args.quick
    print(
        f"{len(use_questions(args.questions_file))} questions from {args.questions_file}, on the index of {args.book}"
    )
    await demo_index(data_dir, args.book)
    fake = FakeOpenAI()
    model = TimedModel(fake)
    cases = Cases()
    figures: list[Figure] = []
    with scratch_database() as database_url:
        async with serving(model) as llm_base:
            llm_url = f"{llm_base}/v1"
            port = free_port()
            env = server_env(database_url, data_dir, llm_url, port)
            async with running(serve_argv(port), env) as server, profiling(server, args.profile):
                # Warm-up: the embedder's graph, the pools, the first prompts.
                fake.default = ok(answer_text(100))
                await conversations(server, cases, clients=2, turns=5, seconds=None, path="/api/chat")

                read_before = await second_opinions(server)
                single = await conversations(
                    server, cases, clients=1, turns=30 if quick else 120, seconds=None, path="/api/chat"
                )
                share = (await second_opinions(server) - read_before) / max(1, len(single.answers))
                one = single.server_added_ms(model)
                print(f"server-added time to first token, 1 client, instant model:    {summary(one)} ms")
                print(f"  questions the second opinion read: {share:.1%}")
                figures.append(Figure("chat: questions the second opinion read, 1 client", share, "share"))
                figures.append(Figure("chat: server-added TTFT p50, 1 client", percentile(one, 50), "ms", 40))
                figures.append(Figure("chat: server-added TTFT p99, 1 client", percentile(one, 99), "ms"))

                fake.default = ok(answer_text(100), token_delay_s=0.02)
                burst = await conversations(
                    server, cases, clients=50, turns=2 if quick else 4, seconds=None, path="/api/chat"
                )
                in_step = burst.server_added_ms(model)
                print(f"server-added time to first token, 50 conversations asking in step:  {summary(in_step)} ms")
                figures.append(
                    Figure("chat: server-added TTFT p99, 50 paced, all asking at once", percentile(in_step, 99), "ms")
                )
                # Independent readers: starts spread over one answer's length (100 tokens x 20 ms).
                paced = await conversations(
                    server, cases, clients=50, turns=2 if quick else 5, seconds=None, path="/api/chat", stagger_s=2.0
                )
                fifty = paced.server_added_ms(model)
                print(f"server-added time to first token, 50 conversations, 20 ms/token: {summary(fifty)} ms")
                cpu_paced = paced.cpu_s / max(1, paced.completed) * 1000
                print(
                    f"  {paced.completed}/{len(paced.answers)} answers of 100 tokens in {paced.elapsed_s:.1f} s; "
                    f"server CPU {paced.cpu_s:.2f} s = {cpu_paced:.1f} ms per answer; "
                    f"clients + fake model (this process) {paced.harness_cpu_s / paced.elapsed_s:.0%} of a core, "
                    f"server {paced.cpu_s / paced.elapsed_s:.0%}"
                )
                inside = paced.server_timing_ms("first_token", model)
                print(f"  inside the server (accepted to first token, less the model): {summary(inside)} ms")
                print(f"  retrieval alone: {summary(paced.server_timing_ms('retrieval'))} ms")
                print(f"  outside that (HTTP in, token out, clients): {summary(paced.outside_ms())} ms")
                figures.append(Figure("chat: server-added TTFT p50, 50 paced", percentile(fifty, 50), "ms"))
                figures.append(Figure("chat: server-added TTFT p99, 50 paced", percentile(fifty, 99), "ms", 100))
                figures.append(Figure("chat: server CPU per 100-token answer, paced", cpu_paced, "ms"))

                fake.default = ok(answer_text(200))
                seconds = 5 if quick else 15
                ours = await conversations(server, cases, clients=50, turns=None, seconds=seconds, path="/api/chat")
                declined = [a.meta.get("confidence_level") for _, a in ours.answers].count("none")
            relay_port = free_port()
            with ceiling.relay_process(relay_port, llm_url) as relay_process:
                relay = ServerProcess(relay_process, f"http://127.0.0.1:{relay_port}")
                await _wait_until_up(relay)
                await conversations(relay, cases, clients=2, turns=5, seconds=None, path=ceiling.RELAY_PATH)
                theirs = await conversations(
                    relay, cases, clients=50, turns=None, seconds=seconds, path=ceiling.RELAY_PATH
                )
            relay_added = theirs.server_added_ms(model)
    ours_tps = ours.completed * 200 / ours.elapsed_s
    theirs_tps = theirs.completed * 200 / theirs.elapsed_s
    ours_cpu = ours.cpu_s / max(1, ours.completed) * 1000
    theirs_cpu = theirs.cpu_s / max(1, theirs.completed) * 1000
    print(
        f"tokens relayed/s, 50 clients, instant model, 200-token answers, {seconds} s each:\n"
        f"  server        {ours_tps:8.0f} tokens/s  ({ours.completed} answers, {declined} declined; "
        f"CPU {ours.cpu_s / ours.elapsed_s:.0%} of a core, {ours_cpu:.1f} ms per answer)\n"
        f"  minimal relay {theirs_tps:8.0f} tokens/s  ({theirs.completed} answers; "
        f"CPU {theirs.cpu_s / theirs.elapsed_s:.0%} of a core, {theirs_cpu:.1f} ms per answer)\n"
        f"  ratio {ours_tps / theirs_tps:.2f} (target ≥ 0.70); minimal relay's own added TTFT under that load: "
        f"{summary(relay_added)} ms"
    )
    name = "chat: tokens relayed/s, 50 clients, instant model"
    figures.append(Figure(name, ours_tps, "tokens/s", round(0.7 * theirs_tps), "higher", ceiling=round(theirs_tps)))
    figures.append(Figure("chat: server CPU per 200-token answer, instant", ours_cpu, "ms", ceiling=theirs_cpu))
    return figures


@asynccontextmanager
async def profiling(server: ServerProcess, output: Path | None) -> AsyncIterator[None]:
    """``--profile PATH``: py-spy samples the server (collapsed stacks) while the block runs."""
    if output is None:
        yield
        return
    spy = subprocess.Popen(
        [
            "py-spy",
            "record",
            "--nonblocking",
            "--pid",
            str(server.pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "-o",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(timeout=30)


async def _wait_until_up(server: ServerProcess) -> None:
    for _ in range(300):
        try:
            if (await get(server.address, "/health"))[0] == 200:
                return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError("the minimal relay did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    parser.add_argument("--data-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the book's index")
    parser.add_argument("--book", type=Path, default=SHARED_BOOK, help="the book served (default: the shared book)")
    parser.add_argument(
        "--questions-file", type=Path, default=QUESTION_SET, help="the question set asked (questions.jsonl format)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--profile", type=Path, default=None, help="record the server with py-spy (collapsed stacks)")
    args = parser.parse_args()
    started = time.monotonic()
    figures = run_in_data_dir(measure, args, "bench-chat-")
    print()
    print(table(figures))
    print(f"\n(one worker, uvloop; {os.cpu_count()} cores shared with the clients; {time.monotonic() - started:.0f} s)")
    write(figures, args.json)


if __name__ == "__main__":
    main()
