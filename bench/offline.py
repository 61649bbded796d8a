"""The offline answer through the public API (issue 30): the facts it holds, its faults, its time to first token.

    .venv/bin/python -m bench.offline [--shared-dir DIR] [--demo-dir DIR] [--rounds N] [--quick] [--json PATH]

Serves each book with the default offline settings (``python -m textbook_chat serve``, no model key, one worker, a
scratch Postgres database) and asks every question of its sets that lists ``answer_facts`` (the shared book's
questions.jsonl and the held-out set; the demo book's questions.jsonl) through ``POST /api/chat``, one at a
time, as one reader would: module-filter questions with their module, selection questions with their selection.
Prints the strict fact figures (``answer/facts.py``) per set from the streamed text, and the server's
own ``done.timings_ms.first_token`` (question accepted to first token) p50 / p90 over all answers and rounds, and
the same when BURST readers ask one question at once (a panel's suggestion clicked by a class), for the first
BURST_QUESTIONS questions of each book.
Indexes are built in the given DATA_DIRs when they hold none (the shared book takes a few minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.chat import free_port, running, scratch_database, serve_argv
from bench.figures import Figure, percentile, table, write
from tests.conftest import DEMO_BOOK, ROOT, SHARED_BOOK
from textbook_chat.answer import facts
from textbook_chat.search import evaluate

BURST = 50
BURST_QUESTIONS = 10
SETS = {
    "shared": (SHARED_BOOK, [SHARED_BOOK / "questions.jsonl", ROOT / "tests" / "data" / "heldout_questions.jsonl"]),
    "demo": (DEMO_BOOK, [DEMO_BOOK / "questions.jsonl"]),
}


@dataclass
class Reply:
    text: str
    first_token_ms: float | None
    finish: str | None


async def ask(address: tuple[str, int], question: evaluate.Question) -> Reply:
    """One question through ``POST /api/chat``; the whole SSE answer read and parsed."""
    payload: dict[str, Any] = {"question": question.question}
    if question.kind == "module_filter" and question.module:
        payload["module"] = question.module
    if question.kind == "selection" and question.selected_text:
        payload["selected_text"] = question.selected_text
    body = json.dumps(payload).encode()
    head = (
        "POST /api/chat HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(head + body)
        raw = await reader.read(-1)
    finally:
        writer.close()
    text: list[str] = []
    first_token: float | None = None
    finish: str | None = None
    for event, data in _events(_dechunk(raw.partition(b"\r\n\r\n")[2]).decode("utf-8")):
        if event == "token":
            text.append(data["text"])
        elif event in ("done", "error"):
            finish = data.get("finish_reason", event)
            first_token = (data.get("timings_ms") or {}).get("first_token")
    return Reply("".join(text), first_token, finish)


def _dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body, joined."""
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


def _events(stream: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in stream.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            events.append((name, json.loads("\n".join(data))))
    return events


async def ensure_index(book: Path, data_dir: Path) -> None:
    from textbook_chat.core.settings import Settings
    from textbook_chat.index import ingest
    from textbook_chat.web.services import open_services

    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        if not await services.index.exists():
            await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)


async def measure_book(
    name: str, data_dir: Path, rounds: int, database_url: str
) -> tuple[dict[str, facts.AnswerFigures], list[float], list[float]]:
    book, paths = SETS[name]
    await ensure_index(book, data_dir)
    port = free_port()
    env = {
        "PORT": str(port),
        "DATABASE_URL": database_url,
        "DATA_DIR": str(data_dir),
        "EMBEDDER": "local",
        "RATE_LIMIT_ANON": "1000000/hour",
        "MAX_STREAMS_PER_CLIENT": "100000",
        "LOG_LEVEL": "warning",
    }
    by_set: dict[str, facts.AnswerFigures] = {}
    first_tokens: list[float] = []
    async with running(serve_argv(port), env) as server:
        for path in paths:
            questions = [q for q in evaluate.load_questions(path) if q.answer_facts]
            outcomes = []
            for round_ in range(rounds):
                for question in questions:
                    reply = await ask(server.address, question)
                    if reply.first_token_ms is not None and reply.finish != "declined":
                        first_tokens.append(reply.first_token_ms)
                    if round_ == 0:
                        outcomes.append(facts.score(question.id, question.kind, reply.text, question.answer_facts))
            by_set[f"{name}: {path.name}"] = facts.figures(outcomes)
        # Each burst question is one the server has not seen: a second space after its first word, which neither
        # the embedder nor the keyword terms see, keeps it out of the query cache the sets filled.
        burst: list[float] = []
        for question in [q for q in evaluate.load_questions(paths[0]) if q.kind == "answerable"][:BURST_QUESTIONS]:
            unseen = replace(question, question=question.question.replace(" ", "  ", 1))
            replies = await asyncio.gather(*(ask(server.address, unseen) for _ in range(BURST)))
            burst += [r.first_token_ms for r in replies if r.first_token_ms is not None]
    return by_set, first_tokens, burst


async def measure(shared_dir: Path, demo_dir: Path, rounds: int) -> list[Figure]:
    result: list[Figure] = []
    first_tokens: list[float] = []
    bursts: list[float] = []
    with scratch_database() as database_url:
        for name, data_dir in (("shared", shared_dir), ("demo", demo_dir)):
            by_set, timings, burst = await measure_book(name, data_dir, rounds, database_url)
            first_tokens += timings
            bursts += burst
            for label, f in by_set.items():
                print(f"{label}\n{facts.table(f)}\n")
                result += [
                    Figure(f"{label}: fact recall", f.fact_recall, "share", 0.55, "higher"),
                    Figure(f"{label}: answers with none of the facts", f.no_facts, "share", 0.25),
                    Figure(f"{label}: answers quoting a dangling lead-in", f.dangling_lead_ins, "answers", 0),
                    Figure(f"{label}: answers repeating a sentence", f.repeated_sentences, "answers", 0),
                    Figure(f"{label}: answers quoting navigation", f.navigation, "answers", 0),
                ]
    result += [
        Figure("offline first token (done.timings_ms) p50", round(percentile(first_tokens, 50), 1), "ms", 150),
        Figure("offline first token (done.timings_ms) p90", round(percentile(first_tokens, 90), 1), "ms", 400),
        Figure(
            f"offline first token, {BURST} readers asking one question at once, p50",
            round(percentile(bursts, 50), 1),
            "ms",
        ),
        Figure(
            f"offline first token, {BURST} readers asking one question at once, p90",
            round(percentile(bursts, 90), 1),
            "ms",
        ),
    ]
    print(f"first token over {len(first_tokens)} answers")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the shared book")
    parser.add_argument("--demo-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the demo book")
    parser.add_argument("--rounds", type=int, default=2, help="times each question is asked (timings only)")
    parser.add_argument("--quick", action="store_true", help="each question once (a smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here (bench/figures.py)")
    args = parser.parse_args()
    if not SHARED_BOOK.is_dir():
        sys.exit(f"the shared book is not at {SHARED_BOOK}")
    with tempfile.TemporaryDirectory(prefix="bench-offline-") as scratch:
        shared = args.shared_dir or Path(scratch) / "shared"
        demo = args.demo_dir or Path(scratch) / "demo"
        figures = asyncio.run(measure(shared, demo, 1 if args.quick else args.rounds))
    print(table(figures))
    if args.json is not None:
        write(figures, args.json)


if __name__ == "__main__":
    main()
