"""Cross-book evaluation: each book's question sets on its own index, before and after the second opinion.

    .venv/bin/python -m bench.crossbook [--shared-dir DIR] [--demo-dir DIR] [--json PATH]

Books: the shared real textbook (its questions.jsonl, the held-out set, the near-domain out-of-scope set, the
questions naming commands it explains) and the demo book (its questions.jsonl, the near-domain set, its command
questions). Indexes are built in the given DATA_DIRs when they hold none (the shared book takes about a minute
or two). Every set is asked three ways, with the calibration (and second-opinion thresholds) kept with the index:

- ``before``: the rules as they were before issue 26 (no command rule, no second opinion);
- ``+ commands``: with the rule that a two-piece word spelled from a fragment is a specific term
  (``sparse.FRAGMENT_CHARS``);
- ``+ second opinion``: and the cross-encoder where confidence is in doubt (what ``serve`` does).

For each it prints hit@1 / hit@5 / MRR, out-of-scope declined, answerable wrongly declined, how many decisions
the second opinion changed, and retrieval time (``timings_ms.retrieval``) p50 / p90, for the questions it was
asked on and the rest. Then, for each direction, the calibration ``eval --calibrate``'s rule derives from one
book's questions applied to the other book's (declines only). A rule that only helps one book shows up here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.figures import Figure, percentile, table, write
from tests.conftest import DEMO_BOOK, ROOT, SHARED_BOOK
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest, sparse
from textbook_chat.search import calibration, evaluate
from textbook_chat.search.retrieval import Retriever
from textbook_chat.search.second_opinion import SecondOpinion
from textbook_chat.web.services import open_services

DATA = ROOT / "tests" / "data"
SETS = {
    "shared": [
        SHARED_BOOK / "questions.jsonl",
        DATA / "heldout_questions.jsonl",
        DATA / "near_domain_out_of_scope.jsonl",
        DATA / "commands_shared.jsonl",
    ],
    "demo": [DEMO_BOOK / "questions.jsonl", DATA / "near_domain_out_of_scope.jsonl", DATA / "commands_demo.jsonl"],
}
WAYS = ("before", "+ commands", "+ second opinion")
Outcomes = dict[str, dict[str, list[evaluate.Outcome]]]  # way -> question set -> outcomes


@contextlib.contextmanager
def _command_rule(on: bool) -> Iterator[None]:
    """The command rule on or off (off: as before issue 26); a bench-only switch, restored afterwards."""
    kept = sparse.FRAGMENT_CHARS
    sparse.FRAGMENT_CHARS = kept if on else 0
    try:
        yield
    finally:
        sparse.FRAGMENT_CHARS = kept


async def outcomes_for(book: Path, data_dir: Path, sets: list[Path]) -> Outcomes:
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        index, embedder = services.index, services.embedder
        assert index is not None and embedder is not None
        if not await index.exists():
            await ingest.run(book, index, embedder, base_url=settings.book_base_url)
        stored = await calibration.stored(index, embedder)
        opinion = SecondOpinion.load(await calibration.stored_thresholds(index, embedder))
        result: Outcomes = {}
        try:
            for way in WAYS:
                retriever = Retriever(index, embedder, stored, opinion if way == "+ second opinion" else None)
                await retriever.warm()
                with _command_rule(way != "before"):
                    result[way] = {p.name: await evaluate.run(retriever, evaluate.load_questions(p)) for p in sets}
        finally:
            opinion.close()
        return result


async def measure(shared_dir: Path, demo_dir: Path) -> list[Figure]:
    books = {
        "shared": await outcomes_for(SHARED_BOOK, shared_dir, SETS["shared"]),
        "demo": await outcomes_for(DEMO_BOOK, demo_dir, SETS["demo"]),
    }
    result: list[Figure] = []
    print(
        f"{'book':<7} {'questions':<32} {'way':<17} {'hit@1':>6} {'hit@5':>6} {'MRR':>6} {'OOS decl':>9} "
        f"{'wrongly':>8} {'asked':>6} {'changed':>8} {'ms p50/p90 asked':>17} {'ms p50/p90 rest':>16}"
    )
    for book, by_way in books.items():
        for name in by_way["before"]:
            for way in WAYS:
                outcomes = by_way[way][name]
                f = evaluate.figures(outcomes)
                cells = [f"{v:.3f}" if n else "-" for v, n in ((f.hit_at_1, f.answerable), (f.hit_at_5, f.answerable),
                         (f.mrr, f.answerable), (f.out_of_scope_declined, f.out_of_scope),
                         (f.wrongly_declined, f.answerable))]  # fmt: skip
                changed = f"-{f.second_opinion_declined}/+{f.second_opinion_answered}"
                asked = [o.retrieval_ms for o in outcomes if o.second_opinion is not None]
                rest = [o.retrieval_ms for o in outcomes if o.second_opinion is None and o.kind != "selection"]
                print(
                    f"{book:<7} {name:<32} {way:<17} {cells[0]:>6} {cells[1]:>6} {cells[2]:>6} {cells[3]:>9} "
                    f"{cells[4]:>8} {f.second_opinion_asked:>6} {changed:>8} {_p50_p90(asked):>17} {_p50_p90(rest):>16}"
                )
                label = f"{book} {name} ({way})"
                if f.out_of_scope:
                    result.append(Figure(f"{label}: out of scope declined", f.out_of_scope_declined, "share"))
                if f.answerable:
                    result.append(Figure(f"{label}: MRR", f.mrr, "score", better="higher"))
                    result.append(Figure(f"{label}: wrongly declined", f.wrongly_declined, "share"))
    after = {book: by_way["+ second opinion"] for book, by_way in books.items()}
    for book, by_set in after.items():
        everything = [o for outcomes in by_set.values() for o in outcomes if o.kind != "selection"]
        timings = [o.retrieval_ms for o in everything]
        asked_count = sum(o.second_opinion is not None for o in everything)
        print(
            f"{book}: retrieval over all {len(timings)} questions p50 {percentile(timings, 50):.1f} ms, "
            f"p90 {percentile(timings, 90):.1f} ms; second opinion asked on {asked_count}"
        )
        result.append(Figure(f"{book}: retrieval p90, all sets, second opinion on", percentile(timings, 90), "ms", 400))
    own = {book: next(iter(by_set.values())) for book, by_set in after.items()}  # each book's questions.jsonl
    print("\ncalibration derived from one book's questions, applied to the other's (no second opinion)")
    for source, target in (("shared", "demo"), ("demo", "shared")):
        derived = evaluate.calibrate(own[source])
        oos, wrong = evaluate.declines(own[target], derived)
        print(
            f"  {source} -> {target}: decline {derived.decline:.3f} low {derived.low:.3f} "
            f"high {derived.high:.3f}: out of scope declined {oos:.3f}, answerable wrongly declined {wrong:.3f}"
        )
        result.append(Figure(f"calibrated on {source}, {target}: out of scope declined", oos, "share"))
        result.append(Figure(f"calibrated on {source}, {target}: wrongly declined", wrong, "share"))
    return result


def _p50_p90(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f}/{percentile(values, 90):.0f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shared-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the shared index")
    parser.add_argument("--demo-dir", type=Path, default=None, help="DATA_DIR holding (or to hold) the demo index")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-crossbook-") as tmp:
        shared = args.shared_dir or Path(tmp) / "shared"
        demo = args.demo_dir or Path(tmp) / "demo"
        figures = asyncio.run(measure(shared, demo))
    print()
    print(table(figures))
    write(figures, args.json)


if __name__ == "__main__":
    main()
