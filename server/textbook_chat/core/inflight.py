"""One run of a piece of async work for every caller that asks for it while it is under way.

A panel's suggested question is asked word for word by many readers at once; each would embed and search it again
until the first result was kept. ``InFlight`` shares the run: callers asking for the same key while it runs await the
same future, shielded, so one caller cancelled (a refused question) does not cancel it for the others. When the last
caller gives up, the run is cancelled too (``cancel_abandoned``), unless finishing it is worth more: work on another
thread, which goes on regardless, is better kept. A run that fails fails for every caller and is not kept. Nothing
outlives the run: what to keep after is the caller's (``on_result``), so nothing here can go stale.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class InFlight(Generic[K, V]):
    def __init__(self, on_result: Callable[[K, V], None] | None = None, *, cancel_abandoned: bool = True) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}
        self._waiting: dict[asyncio.Future[V], int] = {}  # callers awaiting each run
        self._on_result = on_result  # called on the loop with each run's result (a cache to fill)
        self._cancel_abandoned = cancel_abandoned

    async def __call__(self, key: K, start: Callable[[], Awaitable[V]]) -> V:
        """The result of the run for ``key``: the one under way, or one ``start`` begins now."""
        run = self.running(key, start)
        self._waiting[run] = self._waiting.get(run, 0) + 1
        try:
            return await asyncio.shield(run)
        finally:
            left = self._waiting.pop(run) - 1
            if left:
                self._waiting[run] = left
            elif self._cancel_abandoned and not run.done():
                run.cancel()  # the last caller gave up: nobody reads what it would find

    def running(self, key: K, start: Callable[[], Awaitable[V]]) -> asyncio.Future[V]:
        loop = asyncio.get_running_loop()
        run = self._running.get(key)
        if run is None or run.get_loop() is not loop:  # another loop's run (a loop that ended mid-run) is not shared
            run = asyncio.ensure_future(start())
            self._running[key] = run
            run.add_done_callback(functools.partial(self._ended, key))
        return run

    def __len__(self) -> int:
        return len(self._running)

    def _ended(self, key: K, run: asyncio.Future[V]) -> None:
        if self._running.get(key) is run:
            del self._running[key]
        # The error is read here too: a run whose callers all gave up is not reported as never retrieved.
        if run.cancelled() or run.exception() is not None:
            return
        if self._on_result is not None:
            self._on_result(key, run.result())
