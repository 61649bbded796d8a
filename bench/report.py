"""The authors' report over 100,000 stored questions: cold (every gap question embedded) and warm (vectors cached).

    .venv/bin/python -m bench.report [--questions 100000] [--quick] [--json PATH]

Seeds a scratch Postgres database (created and dropped here) with a month of readers' questions in the
shape the chat service stores them (tests/report_data.py, scaled; readers' preambles and afterthoughts
make most gap questions distinct texts, as a
real month's are), then times ``report.build`` with the local embedder and no
index (the closest-section lookups, 12 searches of ~2 ms each, are left out). Target: under 10 s warm.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import replace

import psycopg

from bench import figures
from bench.figures import Figure
from tests.conftest import alembic_config, create_database, drop_database
from tests.report_data import Asked, insert, reader_month
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import LocalEmbedder
from textbook_chat.reports import report
from textbook_chat.web.services import open_services

_AFTERTHOUGHTS = ("", " Thanks!", " I'm new to this.", " Asking for a class project.", " Any tips?", " (UK)")


def _seed(url: str, questions: int) -> int:
    rng = random.Random(42)
    base = reader_month(rng)
    asked: list[Asked] = []
    while len(asked) < questions:
        for a in base:
            tail = rng.choice(_AFTERTHOUGHTS) + (f" (lesson {rng.randint(1, 40)})" if rng.random() < 0.7 else "")
            asked.append(replace(a, question=a.question + tail, days_ago=rng.uniform(0, 29)))
    asked = asked[:questions]
    with psycopg.connect(url) as conn:
        for start in range(0, len(asked), 5000):
            insert(conn, asked[start : start + 5000])
    return len({a.question for a in asked if a.model == "decline" or a.feedback == "down"})


async def _time_report(url: str, embedder: LocalEmbedder) -> tuple[float, report.Report]:
    async with open_services(Settings.from_env({"DATABASE_URL": url})) as services:
        assert services.store is not None
        started = time.perf_counter()
        async with services.store.connection(timeout_s=900) as conn:
            result = await report.build(conn, embedder, days=30)
        return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--questions", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10,000 questions")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    count = 10_000 if args.quick else args.questions
    url = create_database("textbook_bench_report")
    try:
        from alembic import command

        command.upgrade(alembic_config(url), "head")
        started = time.perf_counter()
        distinct = _seed(url, count)
        seeded = time.perf_counter() - started
        embedder = LocalEmbedder(Settings.from_env(dict(os.environ)).data_dir)
        embedder.warm_up()
        cold, result = asyncio.run(_time_report(url, embedder))
        warm, again = asyncio.run(_time_report(url, embedder))
        assert again.questions == result.questions == count
    finally:
        drop_database(url)
    print(f"seeded {count} questions in {seeded:.1f} s; {result.gaps} gaps, {distinct} distinct gap texts")
    print(f"top topics: {[(t.label, t.questions) for t in result.topics[:5]]}")
    results = [
        Figure(f"report over {count} questions, warm (vectors cached)", warm, "s", target=10.0),
        Figure(f"report over {count} questions, cold (embeds {distinct} distinct gap texts)", cold, "s"),
        Figure("gap topics found", float(len(result.topics) + result.more_topics), "topics", better="higher"),
    ]
    print(figures.table(results))
    figures.write(results, args.json)


if __name__ == "__main__":
    main()
