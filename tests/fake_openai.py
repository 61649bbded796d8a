"""A fake OpenAI-compatible HTTP server for tests and benchmarks: real sockets, scripted faults.

``/v1/chat/completions`` streams ``chat.completion.chunk`` lines then ``data: [DONE]``;
``/v1/embeddings`` answers deterministic unit vectors. Each request takes the next scripted
``Behaviour`` (or the default): paced tokens, a stall, a 5xx, a 429 with ``Retry-After``, a dropped
connection mid-stream, exact deltas (lone surrogates, a UTF-16 pair split across two chunks, NUL), a stream
without end or a line without end. The server records every request and every stream the client closed early.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_ANSWER = "Physical AI puts intelligence in a body [1]. Feedback control keeps a humanoid balanced [2]."


@dataclass(frozen=True)
class Behaviour:
    """What one request gets. ``status`` answers an error instead of a stream."""

    text: str = DEFAULT_ANSWER
    token_delay_s: float = 0.0  # between chunks (a real model: ~0.02)
    stall_s: float = 0.0  # before the response starts
    stall_after_tokens: int | None = None  # then hang for stall_s mid-stream
    status: int | None = None
    retry_after: str | None = None
    drop_after_tokens: int | None = None  # close the connection abruptly after this many chunks
    finish_reason: str = "stop"
    pieces: tuple[str, ...] | None = None  # the content deltas exactly as sent (default: ``text`` split in words)
    forever: bool = False  # after the pieces, " more" every token_delay_s until the client goes away
    endless_line_bytes: int = 0  # after the pieces, one `data:` line of this many bytes with no newline, then hang
    body: Any = None  # a request that is not streamed gets this JSON, whatever its shape, instead of a completion


def ok(text: str = DEFAULT_ANSWER, *, token_delay_s: float = 0.0) -> Behaviour:
    return Behaviour(text=text, token_delay_s=token_delay_s)


def tokens_of(text: str) -> list[str]:
    """Split like a model would stream: words with their leading space."""
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


@dataclass
class FakeOpenAI:
    default: Behaviour = field(default_factory=Behaviour)
    script: deque[Behaviour] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each request's Authorization header
    streams_started: int = 0
    streams_completed: int = 0
    streams_closed_early: int = 0
    closed_early: asyncio.Event = field(default_factory=asyncio.Event)

    def then(self, *behaviours: Behaviour) -> FakeOpenAI:
        self.script.extend(behaviours)
        return self

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            ]
        )

    def _next(self) -> Behaviour:
        return self.script.popleft() if self.script else self.default

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.authorizations.append(request.headers.get("authorization"))
        behaviour = self._next()
        if behaviour.stall_s and behaviour.stall_after_tokens is None:
            await asyncio.sleep(behaviour.stall_s)
        if behaviour.status is not None:
            headers = {"retry-after": behaviour.retry_after} if behaviour.retry_after else None
            error = {"error": {"message": "scripted failure", "type": "server_error", "code": None}}
            return JSONResponse(error, status_code=behaviour.status, headers=headers)
        if not body.get("stream"):
            return JSONResponse(_completion(body, behaviour.text) if behaviour.body is None else behaviour.body)
        return StreamingResponse(self._stream(body, behaviour), media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], behaviour: Behaviour) -> AsyncIterator[bytes]:
        self.streams_started += 1
        finished = False
        created = int(time.time())
        pieces = list(behaviour.pieces) if behaviour.pieces is not None else tokens_of(behaviour.text)
        try:
            for i, piece in enumerate(pieces):
                if behaviour.drop_after_tokens is not None and i == behaviour.drop_after_tokens:
                    raise ConnectionAbortedError("scripted drop")  # uvicorn aborts the chunked body
                if behaviour.stall_after_tokens is not None and i == behaviour.stall_after_tokens:
                    await asyncio.sleep(behaviour.stall_s)
                yield _sse(_chunk(body, created, {"content": piece} if i else {"role": "assistant", "content": piece}))
                if behaviour.token_delay_s:
                    await asyncio.sleep(behaviour.token_delay_s)
            while behaviour.forever:
                yield _sse(_chunk(body, created, {"content": " more"}))
                await asyncio.sleep(behaviour.token_delay_s)
            if behaviour.endless_line_bytes:
                yield b'data: {"choices": [{"index": 0, "delta": {"content": "'
                for sent in range(0, behaviour.endless_line_bytes, 65536):
                    yield b"x" * min(65536, behaviour.endless_line_bytes - sent)
                await asyncio.sleep(3600)  # no newline, ever: until the client closes the connection
            yield _sse(_chunk(body, created, {}, finish_reason=behaviour.finish_reason))
            if (body.get("stream_options") or {}).get("include_usage"):
                prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(pieces),
                    "total_tokens": prompt_tokens + len(pieces),
                }
                yield _sse({**_chunk(body, created, None), "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"
            finished = True
            self.streams_completed += 1
        finally:
            if not finished:
                self.streams_closed_early += 1
                self.closed_early.set()

    async def _embeddings(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        behaviour = self._next()
        if behaviour.stall_s:
            await asyncio.sleep(behaviour.stall_s)
        if behaviour.status is not None:
            headers = {"retry-after": behaviour.retry_after} if behaviour.retry_after else None
            return JSONResponse(
                {"error": {"message": "scripted failure"}}, status_code=behaviour.status, headers=headers
            )
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        dim = int(body.get("dimensions") or 1536)
        data = [{"object": "embedding", "index": i, "embedding": embed(text, dim)} for i, text in enumerate(inputs)]
        usage = {"prompt_tokens": sum(len(t.split()) for t in inputs), "total_tokens": 0}
        return JSONResponse({"object": "list", "data": data, "model": body.get("model"), "usage": usage})


def embed(text: str, dim: int) -> list[float]:
    """A deterministic bag-of-words unit vector: texts sharing words are similar, as real embeddings are."""
    vector = [0.0] * dim
    for word in text.lower().split():
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        vector[int.from_bytes(digest[:4], "big") % dim] += 1.0 if digest[4] % 2 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def _chunk(
    body: dict[str, Any], created: int, delta: dict[str, Any] | None, finish_reason: str | None = None
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": created,
        "model": body.get("model", "fake"),
        "choices": choices,
    }


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(text.split()), "total_tokens": 1},
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()
