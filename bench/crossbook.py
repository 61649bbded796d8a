"""Cross-book evaluation: each book's question sets on its own self-calibrated index, the second opinion off and on.

    .venv/bin/python -m bench.crossbook [--shared-dir DIR] [--demo-dir DIR]
        [--book NAME=BOOK_DIR=QUESTIONS[,QUESTIONS...] [--book-dir NAME=DIR]] [--clients 2] [--json PATH]

Books: the shared real textbook (its questions.jsonl, the held-out set, the near-domain out-of-scope set, the
questions naming commands it explains), the demo book (its questions.jsonl, the near-domain set, its command
questions), and any book given with ``--book`` (a Docusaurus folder and question sets read from where they are;
nothing is copied). Indexes are built and self-calibrated (``calibration.after_ingest``, as ``ingest`` does) in the
given DATA_DIRs when they hold none. Every set is asked two ways, with the calibration and the second opinion's
thresholds kept with the index:

- ``first stage``: retrieval alone (the second opinion off);
- ``+ second opinion``: and the cross-encoder where the first stage and the term evidence disagree (what ``serve``
  does).

``--clients`` readers ask at once (2 by default: the second opinion's cost is measured with two asking). For each
it prints hit@1 / hit@5 / MRR, out-of-scope declined, answerable wrongly declined, the share of questions the second
opinion read and how many decisions it changed, retrieval time (``timings_ms.retrieval``) p50 / p90 over all
questions, and the second opinion's own time p50 / p90 where it was asked.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.chat import demo_index
from bench.figures import Figure, percentile, table, write
from tests.conftest import DEMO_BOOK, ROOT, SHARED_BOOK
from textbook_chat.core.settings import Settings
from textbook_chat.search import calibration, evaluate
from textbook_chat.search.retrieval import Retriever
from textbook_chat.search.second_opinion import SecondOpinion
from textbook_chat.web.services import open_services

DATA = ROOT / "tests" / "data"
WAYS = ("first stage", "+ second opinion")
Outcomes = dict[str, dict[str, list[evaluate.Outcome]]]  # way -> question set -> outcomes


@dataclass(frozen=True)
class Book:
    name: str
    path: Path
    sets: tuple[Path, ...]


BOOKS = (
    Book(
        "shared",
        SHARED_BOOK,
        (
            SHARED_BOOK / "questions.jsonl",
            DATA / "heldout_questions.jsonl",
            DATA / "near_domain_out_of_scope.jsonl",
            DATA / "commands_shared.jsonl",
        ),
    ),
    Book(
        "demo",
        DEMO_BOOK,
        (DEMO_BOOK / "questions.jsonl", DATA / "near_domain_out_of_scope.jsonl", DATA / "commands_demo.jsonl"),
    ),
)


async def outcomes_for(book: Book, data_dir: Path, clients: int) -> Outcomes:
    await demo_index(data_dir, book.path)
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    result: Outcomes = {}
    for way in WAYS:
        # Each way opens its own services: the embedder caches the questions it embedded, and the second way would
        # read them from that cache (its retrieval times without the question's embedding).
        async with open_services(settings, retrieval=True) as services:
            index, embedder = services.index, services.embedder
            assert index is not None and embedder is not None
            stored = await calibration.stored(index, embedder)
            opinion = (
                SecondOpinion.load(await calibration.stored_thresholds(index, embedder)) if way != WAYS[0] else None
            )
            try:
                retriever = Retriever(index, embedder, stored, opinion)
                await retriever.warm()
                result[way] = {
                    p.name: await evaluate.run(retriever, evaluate.load_questions(p), clients=clients)
                    for p in book.sets
                }
            finally:
                if opinion is not None:
                    opinion.close()
    return result


async def measure(books: list[tuple[Book, Path]], clients: int) -> list[Figure]:
    found = {book.name: await outcomes_for(book, data_dir, clients) for book, data_dir in books}
    result: list[Figure] = []
    print(
        f"{'book':<7} {'questions':<32} {'way':<17} {'hit@1':>6} {'hit@5':>6} {'MRR':>6} {'OOS decl':>9} "
        f"{'wrongly':>8} {'read':>6} {'changed':>8} {'retrieval ms p50/p90':>21} {'opinion ms p50/p90':>19}"
    )
    for book, by_way in found.items():
        for name in by_way[WAYS[0]]:
            for way in WAYS:
                outcomes = by_way[way][name]
                f = evaluate.figures(outcomes)
                cells = [f"{v:.3f}" if n else "-" for v, n in ((f.hit_at_1, f.answerable), (f.hit_at_5, f.answerable),
                         (f.mrr, f.answerable), (f.out_of_scope_declined, f.out_of_scope),
                         (f.wrongly_declined, f.answerable))]  # fmt: skip
                changed = f"-{f.second_opinion_declined}/+{f.second_opinion_answered}"
                asked = [o for o in outcomes if o.kind != "selection"]
                read = f"{f.second_opinion_asked / max(1, len(asked)):.2f}"
                spent = _p50_p90([o.retrieval_ms for o in asked])
                judged = _p50_p90([o.opinion_ms for o in asked if o.second_opinion is not None])
                print(
                    f"{book:<7} {name:<32} {way:<17} {cells[0]:>6} {cells[1]:>6} {cells[2]:>6} {cells[3]:>9} "
                    f"{cells[4]:>8} {read:>6} {changed:>8} {spent:>21} {judged:>19}"
                )
                label = f"{book} {name} ({way})"
                if f.out_of_scope:
                    result.append(Figure(f"{label}: out of scope declined", f.out_of_scope_declined, "share"))
                if f.answerable:
                    result.append(Figure(f"{label}: hit@5", f.hit_at_5, "share", better="higher"))
                    result.append(Figure(f"{label}: MRR", f.mrr, "score", better="higher"))
                    result.append(Figure(f"{label}: wrongly declined", f.wrongly_declined, "share"))
    print()
    for book, by_way in found.items():
        for way in WAYS:
            everything = [o for outcomes in by_way[way].values() for o in outcomes if o.kind != "selection"]
            f = evaluate.figures(everything)
            timings = [o.retrieval_ms for o in everything]
            opinion = [o.opinion_ms for o in everything if o.second_opinion is not None]
            share = len(opinion) / max(1, len(everything))
            print(
                f"{book} ({way}), all {len(everything)} questions: "
                f"out of scope declined {f.out_of_scope_declined:.3f}, "
                f"wrongly declined {f.wrongly_declined:.3f}, hit@5 {f.hit_at_5:.3f}, MRR {f.mrr:.3f}; retrieval "
                f"p50 {percentile(timings, 50):.1f} / p90 {percentile(timings, 90):.1f} ms; second opinion read "
                f"{share:.2f} of them ({_p50_p90(opinion)} ms p50/p90)"
            )
            result.append(Figure(f"{book} ({way}): retrieval p50", percentile(timings, 50), "ms", 50))
            result.append(Figure(f"{book} ({way}): retrieval p90", percentile(timings, 90), "ms", 400))
            if opinion:
                result.append(Figure(f"{book} ({way}): second opinion p90", percentile(opinion, 90), "ms", 150))
            result.append(Figure(f"{book} ({way}): share the second opinion read", share, "share"))
    return result


def _p50_p90(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f}/{percentile(values, 90):.0f}" if values else "-"


def _book(spec: str) -> Book:
    try:
        name, path, sets = spec.split("=", 2)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--book wants NAME=BOOK_DIR=QUESTIONS[,QUESTIONS...], not {spec!r}") from None
    return Book(name, Path(path), tuple(Path(s) for s in sets.split(",")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shared-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the shared index")
    parser.add_argument("--demo-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the demo index")
    parser.add_argument("--book", type=_book, action="append", default=[], help="NAME=BOOK_DIR=QUESTIONS[,...]")
    parser.add_argument("--book-dir", action="append", default=[], help="NAME=DIR: DATA_DIR for a --book")
    parser.add_argument("--only", action="append", default=None, help="only these books (by name)")
    parser.add_argument("--clients", type=int, default=2, help="readers asking at once (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    dirs = {"shared": args.shared_dir, "demo": args.demo_dir}
    dirs |= {name: Path(path) for name, path in (spec.split("=", 1) for spec in args.book_dir)}
    with tempfile.TemporaryDirectory(prefix="bench-crossbook-") as tmp:
        books = [
            (book, dirs.get(book.name) or Path(tmp) / book.name)
            for book in (*BOOKS, *args.book)
            if args.only is None or book.name in args.only
        ]
        figures = asyncio.run(measure(books, args.clients))
    print()
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
