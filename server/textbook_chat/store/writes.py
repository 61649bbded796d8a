"""Finished answers written to Postgres in batches, off the answer's path, and never dropped.

When an answer ends, its text, usage and citations are queued here (the reader already has them), with
its question too when the store could not take the question as it was asked (``LateQuestion``). One
writer task takes whatever is queued, up to ``BATCH`` answers, and writes them in one transaction, so a
burst of 2,000 answers ending together costs a few dozen transactions, not 2,000 connections queued on a
small pool. If Postgres is away, the batch waits and is tried again (backing off to every 5 s) for as
long as the server runs. On shutdown the queue gets ``drain_s`` to empty; whatever is still unwritten is
spilled to ``DATA_DIR/pending-writes/`` as JSON lines, and the next start writes it (then deletes the
file), so a SIGTERM during an outage loses nothing. An answer Postgres refuses for what it holds (not for
being away) is set aside in a ``rejected-*.jsonl`` file there, for an operator, and the others go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from textbook_chat.core import private
from textbook_chat.core.errors import DatabaseUnavailable
from textbook_chat.core.text import scrub
from textbook_chat.store import citations as cited
from textbook_chat.store.rows import Completion, LateQuestion
from textbook_chat.store.sessions import Store

log = logging.getLogger(__name__)

BATCH = 100
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class _Item:
    message_id: uuid.UUID
    completion: Completion
    late: LateQuestion | None = None  # its question, when that could not be stored as it was asked
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
        spilled = sorted(self._spill_dir.glob("*.jsonl")) if self._spill_dir.is_dir() else []
        for path in (p for p in spilled if not p.name.startswith("rejected-")):  # those are for an operator
            items = _read_spill(path)
            for item in items:
                self._queue.put_nowait(item)
            self._replayed.append(path)  # deleted once written (writing twice is harmless: updates by id)
            log.info("answers from an earlier shutdown queued for writing: %d (%s)", len(items), path.name)
        self._task = asyncio.create_task(self._run(), name="answer-writer")

    def submit(
        self, message_id: uuid.UUID, completion: Completion, late: LateQuestion | None = None
    ) -> asyncio.Future[None]:
        """Queue an answer (with its question, if that is not stored yet); the future resolves when it is
        written (it may never, before a shutdown spills it)."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(message_id, _storable(completion), late, written))
        return written

    async def close(self, drain_s: float) -> None:
        """Give the queue ``drain_s`` to empty, then stop and spill the rest to disk. In an outage there is
        nothing to wait for: what is queued is spilled at once, and the next start writes it."""
        deadline = time.monotonic() + drain_s
        while self.pending and time.monotonic() < deadline and self._task is not None and not self._task.done():
            if self._outage_since is not None:
                break
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # the writer had died: what it held is spilled below, and shutdown goes on
                log.exception("the answer writer had stopped")
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
                    await self._write(self._in_hand)
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

    async def _write(self, items: list[_Item]) -> None:
        """One batch in one transaction. A batch Postgres refuses for what it holds (not for being away) is
        written one answer at a time, and an answer refused on its own is set aside in a ``rejected-`` spill
        file, logged, and not tried again: one bad answer never stops the others from being stored."""
        try:
            await self._store.finish_messages(*_rows(items))
        except DatabaseUnavailable:
            raise
        except Exception:
            if len(items) == 1:
                await self._set_aside(items[0])
                return
            for item in items:
                await self._write([item])

    async def _set_aside(self, item: _Item) -> None:
        """An answer refused on its own: spilled for an operator, and its message ended as ``failed``, so it never
        stays ``streaming`` (whose history would offer a stream that no worker serves, issue 25)."""
        try:
            path = self._spill([item], prefix="rejected-")
            log.exception("an answer Postgres refused is set aside in %s: %s", path, item.message_id)
        except OSError as exc:  # a full disk must not stop the writer either: the refused answer alone is lost
            log.exception("an answer Postgres refused could not be set aside (%s): %s", exc.strerror, item.message_id)
        try:
            await self._store.end_streaming(item.message_id, "failed")
        except Exception as exc:
            log.error("a refused answer could not be marked failed (%s): %s", type(exc).__name__, item.message_id)

    def _forget_replayed(self) -> None:
        for path in self._replayed:
            path.unlink(missing_ok=True)
        self._replayed = []

    def _spill(self, items: list[_Item], prefix: str = "") -> Path:
        private.own_dir(self._spill_dir)  # readers' questions, answers and session tokens: the owner's alone
        path = self._spill_dir / f"{prefix}{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}.jsonl"
        tmp = path.with_suffix(".tmp")
        with private.open_private(tmp) as out:
            for item in items:
                record = {"message_id": str(item.message_id), "completion": asdict(item.completion)}
                if item.late is not None:
                    record["late"] = asdict(item.late)
                out.write(json.dumps(record, default=_json_value) + "\n")
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)  # whole or absent: a crash mid-spill leaves no half file to replay
        return path


def _storable(completion: Completion) -> Completion:
    """``completion`` with what Postgres text cannot hold (a lone surrogate, NUL) replaced by U+FFFD."""
    content, model = scrub(completion.content), None if completion.model is None else scrub(completion.model)
    if content is completion.content and model is completion.model:
        return completion
    return replace(completion, content=content, model=model)


def _rows(items: list[_Item]) -> tuple[list[tuple[uuid.UUID, Completion]], list[tuple[uuid.UUID, LateQuestion]]]:
    answers = [(i.message_id, i.completion) for i in items]
    return answers, [(i.message_id, i.late) for i in items if i.late is not None]


def _json_value(value: object) -> str:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _read_spill(path: Path) -> list[_Item]:
    items: list[_Item] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record: dict[str, Any] = json.loads(line)
            fields = dict(record["completion"])
            fields["citations"] = tuple(cited.read(c) for c in fields.get("citations", ()))
            items.append(_Item(uuid.UUID(record["message_id"]), Completion(**fields), _late(record.get("late"))))
        except (ValueError, KeyError, TypeError) as exc:
            log.error("skipping an unreadable spilled answer (%s line %d): %s", path.name, number, exc)
    return items


def _late(fields: dict[str, Any] | None) -> LateQuestion | None:
    if fields is None:
        return None
    parsed: dict[str, Any] = dict(fields)
    for key in ("session_id", "user_message_id", "client_request_id"):
        parsed[key] = None if fields[key] is None else uuid.UUID(fields[key])
    parsed["asked_at"] = datetime.fromisoformat(fields["asked_at"])
    return LateQuestion(**parsed)
