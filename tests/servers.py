"""Real servers for tests: an ASGI app on uvicorn inside the test's event loop, or ``python -m textbook_chat serve``.

httpx's ASGITransport buffers whole responses and skips the lifespan, so streaming, disconnect and
lifespan tests need real sockets. Tests that need several processes,
signals or ``--workers`` start the real command with ``server_process``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import uvicorn
from starlette.types import ASGIApp

from textbook_chat.web.sockets import SocketGuard


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the test runner owns the signals
        pass


@asynccontextmanager
async def serving(app: ASGIApp, port: int = 0, *, guard: SocketGuard | None = None) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends (on ``port``, or any free one); yields its base URL."""
    # proxy_headers=False as in `serve`: client addresses come from TRUSTED_PROXIES, not from uvicorn; and
    # `serve`'s socket deadlines (web/sockets.py), its defaults unless ``guard`` says otherwise.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=2,
        proxy_headers=False,
        http=(guard or SocketGuard()).protocol(),
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


ROOT = Path(__file__).resolve().parents[1]
# Connection settings of the environment the tests run in never leak into a server: each test says its own.
_NOT_INHERITED = ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")


def _limit_open_files(count: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def free_port() -> int:
    """A port nothing listens on now (for programs that cannot take port 0: nginx, a second Postgres)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def server_process(
    env: dict[str, str], log: Path, *args: str, open_files: int | None = None
) -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m textbook_chat serve`` on a free port, answering /health, its output in ``log``; yields it and
    its URL.

    At the end a server still running gets SIGTERM and is waited for in a thread, so this loop (and a fake
    LLM on it) keeps serving the answers it drains; one that does not stop within 30 s fails the test.
    """
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "textbook_chat", "serve", "--port", str(port), *args],
            cwd=ROOT,
            env={**base, **env},
            stdout=sink,
            stderr=subprocess.STDOUT,
            # ``open_files``: its soft and hard RLIMIT_NOFILE (``ulimit -n``), which it cannot raise.
            preexec_fn=None if open_files is None else partial(_limit_open_files, open_files),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2) as probe:
            for _ in range(600):
                if process.poll() is not None:
                    raise AssertionError(f"server exited at start:\n{log.read_text()[-3000:]}")
                try:
                    if (await probe.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"server did not answer within 60 s:\n{log.read_text()[-3000:]}")
        yield process, url
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, 30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(f"server did not stop on SIGTERM:\n{log.read_text()[-3000:]}") from None
