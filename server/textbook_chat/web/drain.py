"""Shutting down without dropping answers: SIGTERM refuses new questions, lets running ones finish, then exits.

``Drain`` is created by the app (``create_app``) and attached to the stream registry once services are
open; ``drain_on_sigterm`` routes the server's SIGTERM through it before uvicorn's own shutdown.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from textbook_chat.core import metrics
from textbook_chat.streams.streaming import StreamRegistry

log = logging.getLogger(__name__)

_PERSIST_WAIT_S = 5.0  # after a drain, for answers that ended but are still being written to Postgres


class Drain:
    """Shutdown in three steps: refuse new questions, let running answers finish for ``grace_s``, stop the rest.

    Stopped answers end with a retryable ``error`` event and are stored as ``interrupted`` with their text
    (chat/run.py); the readers' questions were stored before generation began, so nothing they wrote is lost.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.started_at: float | None = None
        self._registry: StreamRegistry | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def attach(self, registry: StreamRegistry) -> None:
        self._registry = registry

    def begin(self) -> None:
        """Refuse new questions from now on (503 with Retry-After; /health says ``draining``)."""
        if self.started_at is None:
            self.started_at = time.monotonic()
            metrics.DRAINING.set(1)

    def start(self, then: Callable[[], None] | None = None) -> asyncio.Task[None]:
        """``begin``, then ``finish`` in a task of its own, then call ``then`` (the server's own shutdown)."""
        self.begin()
        if self._task is None:
            self._task = asyncio.create_task(self._run(then), name="drain")
        return self._task

    async def finish(self) -> None:
        """Wait until no answer is being generated or ``grace_s`` has passed; then stop what is left."""
        registry = self._registry
        if registry is None:
            return
        assert self.started_at is not None, "begin() first"
        deadline = self.started_at + self.grace_s
        seen: set[asyncio.Task[None]] = set()
        log.info("shutting down: no new questions; %d answer(s) in progress", len(registry.live()))
        while True:
            running = [s.task for s in registry.live() if s.task is not None and not s.task.done()]
            seen.update(running)
            left = deadline - time.monotonic()
            if not running or left <= 0:
                break
            await asyncio.wait(running, timeout=min(left, 0.5))
        if running:
            log.warning(
                "shutting down: stopping %d answer(s) still in progress after %.0f s", len(running), self.grace_s
            )
        await registry.cancel_all("shutdown")
        # Finished answers may still be writing to Postgres: the pool closes only after this.
        pending = [task for task in seen if not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=_PERSIST_WAIT_S)

    async def _run(self, then: Callable[[], None] | None) -> None:
        try:
            await self.finish()
        except Exception:
            log.exception("drain failed; shutting down anyway")
        finally:
            if then is not None:
                then()


def drain_on_sigterm(drain: Drain) -> Callable[[], None] | None:
    """Route SIGTERM through ``drain`` before the server's handler; returns how to undo it (None: not possible).

    The server (uvicorn) installs its handler before the lifespan starts; a second SIGTERM goes straight to it.
    """
    from sse_starlette.sse import AppStatus

    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        return None  # no server handler to hand over to once drained
    server_exit: Callable[[int, FrameType | None], Any] = previous
    loop = asyncio.get_running_loop()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if drain.draining:
            server_exit(signum, frame)
            return
        # A fresh context: the handler interrupts whichever request happens to run, whose ids it would inherit.
        loop.call_soon_threadsafe(drain.start, lambda: server_exit(signum, frame), context=contextvars.Context())

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        return None
    # sse-starlette would otherwise end every open stream the moment the server starts exiting, before the
    # final events of interrupted answers are sent; our streams end by themselves once drained.
    AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)

    return restore
