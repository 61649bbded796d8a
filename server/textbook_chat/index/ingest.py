"""Incremental ingestion: parse the book, embed only new chunks, replace changed ones, drop deleted ones.

Point ids are derived from each chunk's file and content hash (``chunking.Chunk.chunk_id``), so an
unchanged chunk keeps its id and is skipped without embedding; if only its place in the file or the book's
address (``BOOK_BASE_URL``) changed, its stored payload is rewritten instead. New points are written before stale
ones are deleted: an interrupted run leaves at worst both versions, which the next run tidies up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from textbook_chat.book import chunking, docusaurus
from textbook_chat.book.chunking import Chunk
from textbook_chat.index import sparse
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import IndexedPoint, VectorIndex

log = logging.getLogger(__name__)

# Chunks per embedding call. Ingest hands them over shortest first by the tokens actually embedded, so
# each call's batches pad little (embedding cost is in padded tokens; ordering by the stored text's
# length, which counts whole code listings, padded 12% more on the shared book); 128 keeps the
# progress bar moving every few seconds.
EMBED_BATCH = 128
Progress = Callable[[int], object]


@dataclass(frozen=True)
class IngestReport:
    new: int
    updated: int
    deleted: int
    unchanged: int
    files: int
    chunks: int
    words: int
    skipped: tuple[chunking.Skipped, ...] = ()
    seconds: float = 0.0
    parse_seconds: float = 0.0
    embed_seconds: float = 0.0
    dry_run: bool = False

    @property
    def changed(self) -> bool:
        """Whether the index now holds another book than before (anything added, changed or removed)."""
        return not self.dry_run and (self.new + self.updated + self.deleted) > 0

    def summary(self) -> str:
        line = f"{self.new} new, {self.updated} updated, {self.deleted} deleted, {self.unchanged} unchanged"
        extra = f" ({self.files} files, {self.chunks} chunks, {len(self.skipped)} skipped, {self.seconds:.1f} s)"
        return ("dry run: " if self.dry_run else "") + line + extra


@dataclass
class _Plan:
    to_embed: list[Chunk] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    reindexed: dict[str, dict[str, object]] = field(default_factory=dict)
    new: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0


def docs_root(path: Path) -> Path:
    """Accept either a Docusaurus site folder (with ``docs/``) or the docs folder itself."""
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder")
    return path / "docs" if (path / "docs").is_dir() else path


def read(path: Path, embedder: Embedder, *, base_url: str) -> chunking.Book:
    return chunking.read_book(
        docs_root(path),
        base_url=base_url,
        count_tokens=embedder.counter.count,
        max_tokens=embedder.chunk_tokens,
        overlap_tokens=embedder.chunk_overlap,
    )


async def run(
    path: Path,
    index: VectorIndex,
    embedder: Embedder,
    *,
    base_url: str,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], Progress] | None = None,
    background: bool = False,
) -> IngestReport:
    """Bring the index in line with the book at ``path``; ``progress(total)`` returns an advance callback;
    ``background`` when the server is answering readers meanwhile (the embedder then leaves them cores)."""
    started = time.perf_counter()
    book = await asyncio.to_thread(read, path, embedder, base_url=base_url)
    parse_seconds = time.perf_counter() - started
    existing: list[IndexedPoint] = []
    if not (dry_run and (force or not await index.exists())):
        if not dry_run:
            await index.ensure_collection(
                embedder=embedder.name, model=embedder.model, dim=embedder.dim, recreate=force
            )
        existing = await index.indexed_points()
    plan = _plan(book.chunks, existing)
    embed_seconds = 0.0
    if not dry_run:
        advance = progress(len(plan.to_embed)) if progress else None
        embed_seconds = await _embed_and_write(plan.to_embed, index, embedder, advance, background=background)
        if plan.reindexed:
            await index.set_payloads(plan.reindexed)
        await index.delete(plan.to_delete)
        title = docusaurus.book_title(path.expanduser(), book.documents[0].chapter if book.documents else None)
        if await index.book_title() != title:
            await index.write_metadata(book_title=title)  # the model's instructions name the book (prompts.py)
        await asyncio.to_thread(embedder.prepare_queries)  # with the float32 copy the chunks were embedded by
    report = IngestReport(
        new=plan.new,
        updated=plan.updated,
        deleted=plan.deleted,
        unchanged=plan.unchanged,
        files=len(book.documents),
        chunks=len(book.chunks),
        words=sum(len(c.text.split()) for c in book.chunks),
        skipped=tuple(book.skipped),
        seconds=time.perf_counter() - started,
        parse_seconds=parse_seconds,
        embed_seconds=embed_seconds,
        dry_run=dry_run,
    )
    log.info("ingest finished: %s", report.summary())
    return report


def _plan(chunks: Sequence[Chunk], points: Sequence[IndexedPoint]) -> _Plan:
    by_id = {p.id: p for p in points}
    wanted = {c.chunk_id for c in chunks}
    plan = _Plan()
    added_per_file: Counter[str] = Counter()
    removed_per_file: Counter[str] = Counter()
    for chunk in chunks:
        point = by_id.get(chunk.chunk_id)
        if point is None:
            plan.to_embed.append(chunk)
            added_per_file[chunk.file_path] += 1
            continue
        plan.unchanged += 1
        # Text and citation metadata are the same; only its place in the file moved, or the book's address.
        moved: dict[str, object] = {
            key: new
            for key, old, new in (
                ("chunk_index", point.chunk_index, chunk.chunk_index),
                ("url", point.url, chunk.url),
                ("doc_url", point.doc_url, chunk.doc_url),
            )
            if old != new
        }
        if moved:
            plan.reindexed[chunk.chunk_id] = moved
    for point in points:
        if point.id not in wanted:
            plan.to_delete.append(point.id)
            removed_per_file[point.file_path] += 1
    # A chunk that replaces one of the same file counts as "updated", not as one new and one deleted.
    plan.updated = sum(min(n, removed_per_file[f]) for f, n in added_per_file.items())
    plan.new = len(plan.to_embed) - plan.updated
    plan.deleted = len(plan.to_delete) - plan.updated
    return plan


async def _embed_and_write(
    chunks: Sequence[Chunk], index: VectorIndex, embedder: Embedder, advance: Progress | None, *, background: bool
) -> float:
    """Embed in batches while the previous batch is written (the embedder runs in a worker thread)."""
    embed_seconds = 0.0
    chunks = sorted(chunks, key=lambda c: c.embedding_tokens)
    batches = [chunks[i : i + EMBED_BATCH] for i in range(0, len(chunks), EMBED_BATCH)]

    async def embed(batch: Sequence[Chunk]) -> tuple[list[list[float]], float]:
        t0 = time.perf_counter()
        vectors = await embedder.embed_documents([c.embedding_text for c in batch], background=background)
        return vectors, time.perf_counter() - t0

    pending = asyncio.create_task(embed(batches[0])) if batches else None
    try:
        for n, batch in enumerate(batches):
            assert pending is not None
            vectors, seconds = await pending
            embed_seconds += seconds
            pending = asyncio.create_task(embed(batches[n + 1])) if n + 1 < len(batches) else None
            # Let the next batch reach the embedder's thread first: an embedded-Qdrant write below runs
            # synchronously on the loop (sqlite commits), so without this the two would take turns.
            await asyncio.sleep(0)
            keywords = []
            for n_chunk, chunk in enumerate(batch, start=1):
                keywords.append(sparse.document_vector(chunk.keyword_text))
                if n_chunk % 16 == 0:
                    await asyncio.sleep(0)  # ~1 ms of Python each: a batch of 128 would hold the loop 100+ ms
            await index.upsert([c.chunk_id for c in batch], vectors, keywords, [c.payload() for c in batch])
            if advance:
                advance(len(batch))
    finally:
        if pending is not None and not pending.done():
            # Interrupted (Ctrl-C, a failed write): wait for the batch in flight rather than leave it running.
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
    return embed_seconds
