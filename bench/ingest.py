"""Ingestion speed on the shared book with the local embedder: full ingest, no-op re-ingest, embedding alone.

    .venv/bin/python -m bench.ingest [--book ../shared/corpora/rizsheik-humanoid-course] [--json PATH]

Everything runs on a fresh embedded index in a temporary DATA_DIR; the ONNX graph is built (or copied
from ./data/models) and loaded before any timing. "Embedding only" embeds the same chunk texts in one
call, the embedder's best case, so ingest / embedding-only is everything else ingest costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench import figures
from bench.figures import Figure
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest
from textbook_chat.index.embeddings import Embedder
from textbook_chat.web.services import open_services

ROOT = Path(__file__).resolve().parents[1]
SHARED_BOOK = ROOT.parent / "shared" / "corpora" / "rizsheik-humanoid-course"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--book", type=Path, default=SHARED_BOOK)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        results = asyncio.run(_run(args.book, Path(tmp)))
    print()
    print(figures.table(results))
    figures.write(results, args.json)


async def _run(book: Path, data_dir: Path) -> list[Figure]:
    if (ROOT / "data" / "models").is_dir():
        shutil.copytree(ROOT / "data" / "models", data_dir / "models")
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_LEVEL": "warning"})
    async with open_services(settings, retrieval=True) as services:
        index, embedder = services.index, services.embedder
        assert index is not None and embedder is not None
        started = time.perf_counter()
        await embedder.embed_query("warm up")  # builds the ONNX graph if needed and loads the session
        print(f"embedder load: {time.perf_counter() - started:.1f} s")

        texts = [c.embedding_text for c in ingest.read(book, embedder, base_url=settings.book_base_url).chunks]
        # Other work on the machine comes and goes: measuring the embedder on both sides of the ingest
        # and taking the mean cancels a steady drift in load.
        embed_before = await _embed_only(embedder, texts)
        first = await ingest.run(book, index, embedder, base_url=settings.book_base_url)
        print(f"first ingest:  {first.summary()}  [load {os.getloadavg()[0]:.1f}]")
        print(
            f"               parse {first.parse_seconds:.1f} s, embedding calls {first.embed_seconds:.1f} s, "
            f"the rest {first.seconds - first.parse_seconds - first.embed_seconds:.1f} s (writes overlap embedding)"
        )
        again = await ingest.run(book, index, embedder, base_url=settings.book_base_url)
        print(f"no-op ingest:  {again.summary()}")
        embed_after = await _embed_only(embedder, texts)
        embed_only = (embed_before + embed_after) / 2

    return [
        Figure("ingest: whole shared book, local embedder", first.seconds, "s", target=60.0, ceiling=embed_only),
        Figure("ingest: words per second", first.words / first.seconds, "words/s", better="higher"),
        Figure("ingest: chunks per second", first.chunks / first.seconds, "chunks/s", better="higher"),
        Figure("embedding only: the same chunks, one call (mean of 2)", embed_only, "s"),
        Figure("ingest / embedding-only", first.seconds / embed_only, "ratio", target=1.3),
        Figure("no-op re-ingest (nothing changed)", again.seconds, "s"),
        Figure("no-op re-ingest / first ingest", again.seconds / first.seconds, "ratio"),
    ]


async def _embed_only(embedder: Embedder, texts: list[str]) -> float:
    started = time.perf_counter()
    await embedder.embed_documents(texts)
    seconds = time.perf_counter() - started
    print(f"embedding only: {len(texts)} chunks in {seconds:.1f} s  [load {os.getloadavg()[0]:.1f}]")
    return seconds


if __name__ == "__main__":
    main()
