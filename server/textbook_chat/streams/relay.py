"""Cross-worker streams over Redis: events mirrored into Redis Streams, remote readers, remote cancel.

The worker that generates keeps the ``MessageStream`` (streaming.py) and mirrors every event, in order,
into ``tc:events:{message_id}`` with the event's own sequence number as the entry id (``0-{seq}``), so
``XREAD`` after ``0-{Last-Event-ID}`` resumes exactly. Readers elsewhere refresh ``tc:listen:{id}`` so
the owner's grace timer knows someone still listens; ``DELETE`` on any worker reaches the owner through
the ``tc:cancel`` channel. Keys expire after ``STREAM_TTL_S``; Postgres replays finished answers after. A read
whose Redis fails raises ``RelayUnavailable`` (chat/message_events.py falls back).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from textbook_chat.core import metrics
from textbook_chat.streams.events import STALL_LIMIT_S, TERMINAL, Event, RelayUnavailable

log = logging.getLogger(__name__)

CANCEL_CHANNEL = "tc:cancel"
LISTEN_TTL_MS = 5000
READ_BLOCK_MS = 1000  # below the client's socket timeout (DB_TIMEOUT_S), so a block never looks like a hang
CLOSE_WAIT_S = 2.0
QUEUE_MAX = 200_000  # events waiting for Redis (5,000 answers of 40 events each); beyond it they are dropped


def events_key(message_id: str) -> str:
    return f"tc:events:{message_id}"


def listen_key(message_id: str) -> str:
    return f"tc:listen:{message_id}"


class RedisRelay:
    def __init__(self, redis: Redis, *, ttl_s: float, queue_max: int = QUEUE_MAX) -> None:
        self.redis = redis
        self.ttl_ms = int(ttl_s * 1000)
        # Bounded: with Redis slow or away, events are dropped (and counted) rather than held without end.
        self._queue: asyncio.Queue[tuple[str, Event]] = asyncio.Queue(maxsize=queue_max)
        self._warned_full_at = -math.inf
        self._gapped: set[str] = set()  # messages an event of which was dropped: the rest is not mirrored either
        self._writer: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None

    async def start(self, on_cancel: Callable[[str], None]) -> None:
        self._writer = asyncio.create_task(self._write_loop(), name="relay-writer")
        self._listener = asyncio.create_task(self._cancel_loop(on_cancel), name="relay-cancel")

    async def close(self) -> None:
        await self.flush()
        tasks = [task for task in (self._writer, self._listener) if task is not None]
        for task in tasks:
            task.cancel()
        # Whatever ended these tasks, and even if one ignores its cancel, shutdown goes on (issue 25).
        if tasks:
            done, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error("relay task had failed: %s", type(task.exception()).__name__)
            if stuck:
                log.error("relay tasks still running at shutdown: %s", ", ".join(t.get_name() for t in stuck))

    def mirror(self, message_id: str, event: Event) -> None:
        """Queue ``event`` for Redis; one writer keeps each message's events in order.

        A full queue drops it, and the rest of that message too: a reader on another worker then stalls and is
        told the answer was lost (``generation_lost``), rather than reading on past a hole in the text.
        """
        if message_id in self._gapped:
            metrics.RELAY_DROPPED.labels("queue_full").inc()
            if event.event in TERMINAL:
                self._gapped.discard(message_id)
            return
        try:
            self._queue.put_nowait((message_id, event))
        except asyncio.QueueFull:
            metrics.RELAY_DROPPED.labels("queue_full").inc()
            if event.event not in TERMINAL:
                self._gapped.add(message_id)
            now = time.monotonic()
            if now - self._warned_full_at > 10.0:
                self._warned_full_at = now
                log.warning("stream events not mirrored to Redis: %d waiting already", self._queue.qsize())

    async def flush(self, timeout_s: float = 2.0) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._queue.join()

    async def exists(self, message_id: str) -> bool:
        try:
            return bool(await self.redis.exists(events_key(message_id)))
        except RedisError:
            return False

    async def last_id(self, message_id: str) -> tuple[int, bool] | None:
        """The newest event's id and whether it ended the stream; None when Redis has no such stream."""
        try:
            entries: Any = await self.redis.xrevrange(events_key(message_id), count=1)
        except RedisError:
            return None
        if not entries:
            return None
        entry_id, fields = entries[0]
        return _seq(entry_id), _field(fields, "e") in TERMINAL

    async def read(self, message_id: str, after: int) -> AsyncIterator[Event]:
        """Events with id > ``after`` until a terminal one; heartbeats ``tc:listen`` meanwhile.

        A command Redis fails is tried once more (after a restart the first goes out on a dead pooled
        connection); a second failure raises ``RelayUnavailable``, after the events read so far.
        """
        key = events_key(message_id)
        last_entry: Any = f"0-{after}"
        quiet_since = time.monotonic()
        while True:
            answer = await self._read_once(message_id, key, last_entry)
            if not answer:
                if time.monotonic() - quiet_since > STALL_LIMIT_S:
                    yield Event(after + 1, "error", _LOST)
                    return
                continue
            quiet_since = time.monotonic()
            for entry_id, fields in answer[0][1]:
                event = Event(_seq(entry_id), _field(fields, "e"), json.loads(_field(fields, "d")))  # type: ignore[arg-type]
                last_entry, after = entry_id, event.id
                yield event
                if event.event in TERMINAL:
                    return

    async def _read_once(self, message_id: str, key: str, last_entry: Any) -> Any:
        try:
            return await self._listen_and_read(message_id, key, last_entry)
        except (RedisError, OSError):
            pass  # once more, on a fresh connection: the pool dropped the one that failed
        try:
            return await self._listen_and_read(message_id, key, last_entry)
        except (RedisError, OSError) as exc:
            raise RelayUnavailable(type(exc).__name__) from None

    async def _listen_and_read(self, message_id: str, key: str, last_entry: Any) -> Any:
        await self.redis.set(listen_key(message_id), "1", px=LISTEN_TTL_MS)
        return await self.redis.xread({key: last_entry}, count=200, block=READ_BLOCK_MS)

    async def has_listener(self, message_id: str) -> bool:
        try:
            return bool(await self.redis.exists(listen_key(message_id)))
        except RedisError:
            return False

    async def request_cancel(self, message_id: str) -> bool:
        """Ask whichever worker owns ``message_id`` to stop it; False when Redis is unreachable."""
        try:
            await self.redis.publish(CANCEL_CHANNEL, message_id)
            return True
        except RedisError:
            return False

    async def _write_loop(self) -> None:
        """Runs as long as the relay: no event, however malformed, and no failure of Redis ends it (issue 25)."""
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and len(batch) < 500:
                batch.append(self._queue.get_nowait())
            try:
                await self._write_batch(batch)
            except Exception as exc:  # a bug of ours must still not stop the mirroring of later answers
                metrics.RELAY_DROPPED.labels("bad_event").inc(len(batch))
                log.error("stream events not mirrored to Redis (%s)", type(exc).__name__)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write_batch(self, batch: list[tuple[str, Event]]) -> None:
        try:
            try:
                await self._write(batch)
            except (RedisError, OSError):
                # After Redis restarts, the first write goes out on a pooled connection to the old server
                # and fails; that connection is dropped, so one more try gets a fresh one
                # (tests/e2e/test_drills.py). Entries already written are refused as duplicates, not doubled.
                await self._write(batch)
        except (RedisError, OSError) as exc:
            # Local listeners are unaffected; remote readers of these events fall back to Postgres.
            metrics.RELAY_DROPPED.labels("redis_error").inc(len(batch))
            log.warning("stream events not mirrored to Redis (%s)", type(exc).__name__)
        except Exception as exc:
            # Not Redis: something in one event (the batch is encoded before anything is sent). Write the
            # events one by one, so only what cannot be written is lost.
            log.error("a stream event could not be mirrored to Redis (%s); writing one by one", type(exc).__name__)
            for item in batch:
                try:
                    await self._write([item])
                except Exception as one:
                    metrics.RELAY_DROPPED.labels("bad_event").inc()
                    log.error("stream event %d not mirrored (%s)", item[1].id, type(one).__name__)

    async def _write(self, batch: list[tuple[str, Event]]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for message_id, event in batch:
                key = events_key(message_id)
                # The line the SSE encoder sends, encoded (and made encodable) once, not the payload again.
                fields: dict[Any, Any] = {"e": event.event, "d": event.json_line}
                pipe.xadd(key, fields, id=f"0-{event.id}")
                pipe.pexpire(key, self.ttl_ms)
            await pipe.execute(raise_on_error=False)

    async def _cancel_loop(self, on_cancel: Callable[[str], None]) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(CANCEL_CHANNEL)
                    while True:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        _raise_if_cancelled()
                        if message is not None:
                            data = message["data"]
                            on_cancel(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                _raise_if_cancelled()
                log.warning("cancel channel lost (%s); resubscribing", type(exc).__name__)
                await asyncio.sleep(1.0)


def _raise_if_cancelled() -> None:
    """redis-py's read timeout can swallow a cancel that lands as it expires (``get_message`` returns None, or a
    TimeoutError comes out): going round again would ignore it, and close() (so shutdown) would wait in vain."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


_LOST = {
    "code": "generation_lost",
    "message": "The server answering this question went away. Please ask again.",
    "retryable": True,
}


def _seq(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[1])


def _field(fields: dict[Any, Any], name: str) -> str:
    value = fields.get(name.encode(), fields.get(name))
    return value.decode() if isinstance(value, bytes) else str(value)
