"""What reading a follow-up in its conversation adds to retrieval: p50 / p99 of first questions and of later turns.

    .venv/bin/python -m bench.conversation --data-dir DIR [--set tests/data/conversations_shared.jsonl]
        [--rounds 3] [--json PATH]

DIR holds the book's index (``python -m textbook_chat ingest BOOK`` with DATA_DIR=DIR). Each round asks every
conversation of the set in order, each later turn with the earlier ones as its session's (``Retriever.retrieve``
with ``earlier``), first questions and later turns interleaved so the machine's load falls on both alike. The
embedder's query cache is emptied as each conversation starts: every question is embedded afresh, and a later
turn finds the earlier questions' vectors where the server does, in the cache since they were asked. The
session's turns are read from Postgres beside the session's check (one round trip), which this does not count.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from bench import figures
from bench.figures import Figure
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import LocalEmbedder
from textbook_chat.search import calibration, conversations
from textbook_chat.search.context import Earlier, section_headings
from textbook_chat.search.retrieval import Retriever
from textbook_chat.search.second_opinion import SecondOpinion
from textbook_chat.web.services import open_services

ROOT = Path(__file__).resolve().parents[1]
TARGET_ADDED_MS = 15.0  # the issue's: a follow-up's retrieval adds at most this much p50 over a first question's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="DATA_DIR holding the book's index")
    parser.add_argument("--set", type=Path, default=ROOT / "tests" / "data" / "conversations_shared.jsonl")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the conversation set (default: 3)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures")
    args = parser.parse_args()
    timings = asyncio.run(_run(args.data_dir, args.set, args.rounds))
    figures.write(_figures(timings), args.json)


def _figures(timings: dict[str, list[float]]) -> list[Figure]:
    first, later = figures.percentile(timings["first"], 50), figures.percentile(timings["later"], 50)
    result = [
        Figure("retrieval p50, first questions", round(first, 2), "ms"),
        Figure("retrieval p50, later turns in context", round(later, 2), "ms"),
        Figure("retrieval p50 added by the conversation", round(later - first, 2), "ms", TARGET_ADDED_MS),
    ]
    if timings["took context"]:
        took = figures.percentile(timings["took context"], 50)
        result.append(Figure("retrieval p50, later turns that took context", round(took, 2), "ms"))
    return result


async def _run(data_dir: Path, path: Path, rounds: int) -> dict[str, list[float]]:
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    sets = conversations.load(path)
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None
        index = services.index
        embedder = LocalEmbedder(settings.data_dir)
        opinion = SecondOpinion.load(await calibration.stored_thresholds(index, embedder))
        retriever = Retriever(index, embedder, await calibration.stored(index, embedder), opinion)
        await retriever.warm()
        timings: dict[str, list[float]] = {"first": [], "later": [], "took context": []}
        try:
            for _ in range(rounds):
                for conversation in sets:
                    embedder.forget_queries()  # its questions are embedded afresh, as asked for the first time
                    earlier: list[Earlier] = []
                    for number, turn in enumerate(conversation.turns, start=1):
                        started = time.perf_counter()
                        result = await retriever.retrieve(turn.question, module=turn.module, earlier=earlier)
                        ms = (time.perf_counter() - started) * 1000
                        timings["first" if number == 1 else "later"].append(ms)
                        if result.standalone is not None:
                            timings["took context"].append(ms)
                        # No answer is written here: the headings of every source stand for those it would cite,
                        # so a follow-up's vector is focused as the server's is (``context._focus``).
                        sections = ((source.title, source.heading_path) for source in result.sources)
                        earlier.append(Earlier(turn.question, result.standalone, headings=section_headings(sections)))
        finally:
            opinion.close()
            await embedder.aclose()
    print(f"{path.name}: {len(sets)} conversations x {rounds} rounds, local embedder, each question embedded afresh")
    print(f"{'turns':<32} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in timings.items():
        if values:
            p50, p99 = figures.percentile(values, 50), figures.percentile(values, 99)
            print(f"{name:<32} {len(values):>5} {p50:>8.2f} {p99:>8.2f}")
    added = figures.percentile(timings["later"], 50) - figures.percentile(timings["first"], 50)
    print(f"p50 added by the conversation: {added:.2f} ms (target {TARGET_ADDED_MS:g} ms)")
    return timings


if __name__ == "__main__":
    main()
