"""``serve --book``: keep the index in line with the book while the server answers readers.

The book's folder is checked every BOOK_WATCH_S seconds (the size and modification time of every page, a
cheap ``stat`` each) and on SIGHUP; a change is ingested in the background, one ingest at a time, with the
embedder on one core so readers' streams keep their pace (``bench.reingest`` measures their token gaps).
Unchanged chunks are not embedded again (ingest is incremental), and after a change the book's calibration
is derived again. The embedded index allows one process, so this is how a served embedded book changes;
with a Qdrant server (where every worker would watch) the app does not start it: ``python -m textbook_chat
ingest`` from one place does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from textbook_chat.core.errors import AppError
from textbook_chat.index import ingest
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search import calibration
from textbook_chat.search.retrieval import Retriever

log = logging.getLogger(__name__)

_PAGES = ("*.md", "*.mdx", "_category_.json", "_category_.yml", "_category_.yaml")


Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(book: Path) -> Fingerprint:
    """(path, size, mtime in ns) of every page and category file under ``book``: what a change shows in."""
    found = []
    for pattern in _PAGES:
        for path in book.rglob(pattern):
            if any(part.startswith(".") or part == "node_modules" for part in path.relative_to(book).parts):
                continue
            with contextlib.suppress(OSError):  # removed between the listing and the stat
                info = path.stat()
                found.append((str(path.relative_to(book)), info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


class BookWatcher:
    def __init__(
        self, book: Path, index: VectorIndex, embedder: Embedder, retriever: Retriever, *, base_url: str
    ) -> None:
        self._book = book
        self._index = index
        self._embedder = embedder
        self._retriever = retriever
        self._base_url = base_url
        self._lock = asyncio.Lock()
        self._seen = fingerprint(book)

    async def reingest(self, reason: str, seen: Fingerprint | None = None) -> ingest.IngestReport | None:
        """Bring the index in line with the book now; None when it failed (logged; the old index keeps serving).

        ``seen``: the book's fingerprint already taken by the caller, as the book is before this ingest reads it.
        """
        async with self._lock:
            if seen is None:
                seen = await asyncio.to_thread(fingerprint, self._book)
            try:
                report = await ingest.run(
                    self._book, self._index, self._embedder, base_url=self._base_url, background=True
                )
                if report.changed:
                    await calibration.after_ingest(self._retriever, self._index, book_changed=True)
            except (AppError, OSError, ValueError) as exc:
                log.warning("re-ingest after %s failed (%s); the index keeps the book as it was", reason, exc)
                return None
            finally:
                self._embedder.release_batches()  # the chunks' model copy; questions keep theirs
            self._seen = seen
            log.info("book re-ingested after %s: %s", reason, report.summary())
            return report

    async def _watch(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            now = await asyncio.to_thread(fingerprint, self._book)
            if now != self._seen and not self._lock.locked():
                await self.reingest("a change in the book", now)

    @asynccontextmanager
    async def running(self, every_s: float) -> AsyncIterator[BookWatcher]:
        """Watch every ``every_s`` seconds (0: only on SIGHUP) for as long as the block runs."""
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[object]] = set()

        def on_hangup() -> None:
            task = loop.create_task(self.reingest("SIGHUP"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        watcher = loop.create_task(self._watch(every_s)) if every_s > 0 else None
        hangup = False
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows, thread)
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
            hangup = True
        try:
            yield self
        finally:
            if hangup:
                loop.remove_signal_handler(signal.SIGHUP)
            running = [*tasks, *([watcher] if watcher else [])]
            for task in running:
                task.cancel()
            for task in running:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
