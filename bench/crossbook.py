"""Cross-book evaluation: each book's question set on its own index, and each calibration tried on the other book.

    .venv/bin/python -m bench.crossbook [--shared-dir DIR] [--demo-dir DIR] [--json PATH]

Books: the shared real textbook (its questions.jsonl, the held-out set, the near-domain out-of-scope set)
and the demo book (its questions.jsonl, the near-domain set). Indexes are built in the given DATA_DIRs when
they hold none (the shared book takes about a minute). For every question set it prints hit@1 / hit@5 /
MRR, out-of-scope declined and answerable wrongly declined under the embedder's calibration in force; then,
for each direction, the calibration ``eval --calibrate``'s rule derives from one book's questions applied
to the other book's (declines only: ranking does not depend on calibration). A rule that only helps one
book shows up here.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.figures import Figure, table, write
from server.core.settings import Settings
from server.index import ingest
from server.search import evaluate
from server.search.retrieval import Retriever
from server.web.services import open_services
from tests.conftest import DEMO_BOOK, ROOT, SHARED_BOOK

SETS = {
    "shared": [
        SHARED_BOOK / "questions.jsonl",
        ROOT / "tests" / "data" / "heldout_questions.jsonl",
        ROOT / "tests" / "data" / "near_domain_out_of_scope.jsonl",
    ],
    "demo": [DEMO_BOOK / "questions.jsonl", ROOT / "tests" / "data" / "near_domain_out_of_scope.jsonl"],
}


async def outcomes_for(book: Path, data_dir: Path, sets: list[Path]) -> dict[str, list[evaluate.Outcome]]:
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        if not await services.index.exists():
            await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)
        retriever = Retriever(services.index, services.embedder)
        return {path.name: await evaluate.run(retriever, evaluate.load_questions(path)) for path in sets}


async def measure(shared_dir: Path, demo_dir: Path) -> list[Figure]:
    books = {
        "shared": await outcomes_for(SHARED_BOOK, shared_dir, SETS["shared"]),
        "demo": await outcomes_for(DEMO_BOOK, demo_dir, SETS["demo"]),
    }
    result: list[Figure] = []
    print(f"{'book':<7} {'questions':<34} {'hit@1':>6} {'hit@5':>6} {'MRR':>6} {'OOS decl':>9} {'wrongly':>8}")
    for book, by_set in books.items():
        for name, outcomes in by_set.items():
            f = evaluate.figures(outcomes)
            cells = [f"{v:.3f}" if n else "-" for v, n in ((f.hit_at_1, f.answerable), (f.hit_at_5, f.answerable),
                     (f.mrr, f.answerable), (f.out_of_scope_declined, f.out_of_scope),
                     (f.wrongly_declined, f.answerable))]  # fmt: skip
            print(f"{book:<7} {name:<34} {cells[0]:>6} {cells[1]:>6} {cells[2]:>6} {cells[3]:>9} {cells[4]:>8}")
            if f.out_of_scope:
                result.append(Figure(f"{book} {name}: out of scope declined", f.out_of_scope_declined, "share"))
            if f.answerable:
                result.append(Figure(f"{book} {name}: MRR", f.mrr, "score", better="higher"))
                result.append(Figure(f"{book} {name}: wrongly declined", f.wrongly_declined, "share"))
    own = {book: next(iter(by_set.values())) for book, by_set in books.items()}  # each book's questions.jsonl
    print("\ncalibration derived from one book's questions, applied to the other's")
    for source, target in (("shared", "demo"), ("demo", "shared")):
        calibration = evaluate.calibrate(own[source])
        oos, wrong = evaluate.declines(own[target], calibration)
        print(
            f"  {source} -> {target}: decline {calibration.decline:.3f} low {calibration.low:.3f} "
            f"high {calibration.high:.3f}: out of scope declined {oos:.3f}, answerable wrongly declined {wrong:.3f}"
        )
        result.append(Figure(f"calibrated on {source}, {target}: out of scope declined", oos, "share"))
        result.append(Figure(f"calibrated on {source}, {target}: wrongly declined", wrong, "share"))
    return result


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
