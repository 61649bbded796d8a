"""Run an ASGI app on a real uvicorn server (127.0.0.1, port 0) inside the test's event loop.

httpx's ASGITransport buffers whole responses and skips the lifespan, so streaming, disconnect and
lifespan tests need real sockets (DESIGN.md, "Dependency facts").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.types import ASGIApp


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the test runner owns the signals
        pass


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL."""
    # proxy_headers=False as in `serve`: client addresses come from TRUSTED_PROXIES, not from uvicorn.
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_config=None, lifespan="on", timeout_graceful_shutdown=2, proxy_headers=False
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # start-up failed: raise its error here
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
