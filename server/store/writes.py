"""Finished answers written to Postgres in batches, off the answer's path, and never dropped.

When an answer ends, its text, usage and citations are queued here (the reader already has them). One
writer task takes whatever is queued, up to ``BATCH`` answers, and writes them in one transaction, so a
burst of 2,000 answers ending together costs a few dozen transactions, not 2,000 connections queued on a
small pool. If Postgres is away, the batch waits and is tried again (backing off to every 5 s) for as
long as the server runs. On shutdown the queue gets ``drain_s`` to empty; whatever is still unwritten is
spilled to ``DATA_DIR/pending-writes/`` as JSON lines, and the next start writes it (then deletes the
file), so a SIGTERM during an outage loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from server.core.errors import DatabaseUnavailable
from server.store.rows import Citation, Completion
from server.store.sessions import Store

log = logging.getLogger(__name__)

BATCH = 100
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)

Pending = tuple[uuid.UUID, Completion]


@dataclass
class _Item:
    message_id: uuid.UUID
    completion: Completion
    written: asyncio.Future[None] | None = None  # resolved once the answer is in Postgres


class AnswerWriter:
    def __init__(self, store: Store, spill_dir: Path) -> None:
        self._store = store
        self._spill_dir = spill_dir
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._in_hand: list[_Item] = []  # the batch being written, so a shutdown can spill it too
        self._task: asyncio.Task[None] | None = None
        self._outage_since: float | None = None
        self._replayed: list[Path] = []  # spill files whose answers are queued

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._in_hand)

    async def start(self) -> None:
        """Start the writer, and queue what an earlier process spilled (written as soon as Postgres answers)."""
        for path in sorted(self._spill_dir.glob("*.jsonl")) if self._spill_dir.is_dir() else ():
            items = _read_spill(path)
            for message_id, completion in items:
                self._queue.put_nowait(_Item(message_id, completion))
            self._replayed.append(path)  # deleted once written (writing twice is harmless: updates by id)
            log.info("answers from an earlier shutdown queued for writing: %d (%s)", len(items), path.name)
        self._task = asyncio.create_task(self._run(), name="answer-writer")

    def submit(self, message_id: uuid.UUID, completion: Completion) -> asyncio.Future[None]:
        """Queue an answer; the future resolves when it is written (it may never, before a shutdown spills it)."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(message_id, completion, written))
        return written

    async def close(self, drain_s: float) -> None:
        """Give the queue ``drain_s`` to empty, then stop and spill the rest to disk."""
        deadline = time.monotonic() + drain_s
        while self.pending and time.monotonic() < deadline and self._task is not None and not self._task.done():
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        left = self._in_hand + [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        self._in_hand = []
        if left:
            path = self._spill(left)
            log.warning("answers not written before shutdown: %d kept in %s for the next start", len(left), path)
        self._forget_replayed()  # what they held is written, or in the new spill file

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            self._in_hand = [first] + [self._queue.get_nowait() for _ in range(min(self._queue.qsize(), BATCH - 1))]
            attempt = 0
            while True:
                try:
                    await self._store.finish_messages([(i.message_id, i.completion) for i in self._in_hand])
                except DatabaseUnavailable:
                    if self._outage_since is None:
                        self._outage_since = time.monotonic()
                        log.warning("answers not stored yet: database unavailable; retrying until it is back")
                    await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
                    attempt += 1
                    continue
                if self._outage_since is not None:
                    log.info(
                        "answers stored after the database came back (%.0f s)", time.monotonic() - self._outage_since
                    )
                    self._outage_since = None
                break
            for item in self._in_hand:
                if item.written is not None and not item.written.done():
                    item.written.set_result(None)
            self._in_hand = []
            if self._queue.empty():
                self._forget_replayed()

    def _forget_replayed(self) -> None:
        for path in self._replayed:
            path.unlink(missing_ok=True)
        self._replayed = []

    def _spill(self, items: list[_Item]) -> Path:
        self._spill_dir.mkdir(parents=True, exist_ok=True)
        path = self._spill_dir / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl"
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for item in items:
                record = {"message_id": str(item.message_id), "completion": asdict(item.completion)}
                out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)  # whole or absent: a crash mid-spill leaves no half file to replay
        return path


def _read_spill(path: Path) -> list[Pending]:
    items: list[Pending] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record: dict[str, Any] = json.loads(line)
            fields = dict(record["completion"])
            fields["citations"] = tuple(Citation(**c) for c in fields.get("citations", ()))
            items.append((uuid.UUID(record["message_id"]), Completion(**fields)))
        except (ValueError, KeyError, TypeError) as exc:
            log.error("skipping an unreadable spilled answer (%s line %d): %s", path.name, number, exc)
    return items
