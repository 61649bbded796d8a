"""The minimal relay benchmarks compare the server with: ``AsyncOpenAI`` streamed straight into sse-starlette.

No retrieval, storage, rate limits or coalescing: one ``token`` event per model chunk, then ``done``. It is
what the issue calls "a minimal relay", served the same way as the server (uvicorn, one worker, uvloop).

    .venv/bin/python -m bench.ceiling --port 8100 --llm http://127.0.0.1:8200/v1   # serve it by hand
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import openai
import uvicorn
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

RELAY_PATH = "/relay"
MAX_CONNECTIONS = 1000


def create_app(llm_url: str | None = None, max_connections: int = MAX_CONNECTIONS) -> Starlette:
    """``POST /relay`` with ``{"question"}`` streams the model's answer; ``GET /health`` says it is up."""
    base_url = llm_url or os.environ["OPENAI_BASE_URL"]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        client = openai.AsyncOpenAI(
            api_key="sk-ceiling",
            base_url=base_url,
            timeout=openai.Timeout(20.0, connect=5.0),
            max_retries=0,
            http_client=openai.DefaultAsyncHttpx2Client(
                limits=_limits(max_connections), timeout=20.0
            ),  # the server's pool size, so both can run as many upstream streams
        )
        yield {"client": client}
        await client.close()

    async def relay(request: Request) -> Response:
        question = (await request.json())["question"]
        client: openai.AsyncOpenAI = request.state.client
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": question}],
            temperature=0.3,
            max_tokens=800,
            stream=True,
        )

        async def events() -> AsyncIterator[ServerSentEvent]:
            n = 0
            try:
                async for chunk in stream:
                    for choice in chunk.choices:
                        if choice.delta.content:
                            n += 1
                            yield ServerSentEvent(json.dumps({"text": choice.delta.content}), event="token", id=str(n))
                yield ServerSentEvent(json.dumps({"finish_reason": "stop"}), event="done", id=str(n + 1))
            finally:
                await stream.close()

        return EventSourceResponse(events(), ping=15, send_timeout=30)

    async def health(request: Request) -> Response:
        return Response("ok")

    return Starlette(
        routes=[Route(RELAY_PATH, relay, methods=["POST"]), Route("/health", health, methods=["GET"])],
        lifespan=lifespan,
    )


def _limits(max_connections: int) -> Any:
    import httpx2

    return httpx2.Limits(max_connections=max_connections, max_keepalive_connections=min(100, max_connections))


@contextmanager
def relay_process(
    port: int, llm_url: str, max_connections: int = MAX_CONNECTIONS, *, cpus: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The relay in its own process (so its CPU can be read from /proc), stopped when the block ends; pinned
    to ``cpus`` (``taskset -c``) when given."""
    pinned = ["taskset", "-c", cpus] if cpus else []
    argv = ["--port", str(port), "--llm", llm_url, "--max-connections", str(max_connections)]
    process = subprocess.Popen(
        [*pinned, sys.executable, "-m", "bench.ceiling", *argv],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--llm", required=True, help="the OpenAI-compatible base URL, e.g. http://127.0.0.1:8200/v1")
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, help="its pool to the model")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.llm, args.max_connections), host=args.host, port=args.port, log_config=None, access_log=False
    )


if __name__ == "__main__":
    main()
