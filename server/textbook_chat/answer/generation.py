"""Answer generation: the chat model through ``AsyncOpenAI`` (streamed), or the offline extractive generator.

Both yield ``Token``, ``GenNotice`` and one final ``Finished``. Third-party errors stop here: the OpenAI
generator retries once on timeout/5xx, backs off on 429 honouring ``Retry-After``, then falls back to
extraction with a notice (docs/sse-protocol.md "Notice codes"); callers never see an ``openai`` exception. The
model's stream is bounded (``Bounds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textbook_chat.answer import prompts
from textbook_chat.answer.generator import (
    Finished,
    FinishReason,
    GenerationRequest,
    Generator,
    GenEvent,
    GenNotice,
    Token,
    Usage,
)
from textbook_chat.answer.offline import ExtractiveGenerator, offline_generator
from textbook_chat.answer.prompts import PromptSource, Turn
from textbook_chat.core.crossencoder import CrossEncoder
from textbook_chat.core.text import ModelText
from textbook_chat.core.tokens import TokenCounter, counter_for_model

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from textbook_chat.core.settings import Settings
    from textbook_chat.search.retrieval import Source

__all__ = [
    "Bounds",
    "ExtractiveGenerator",
    "Finished",
    "GenEvent",
    "GenNotice",
    "GenerationRequest",
    "Generator",
    "OpenAIGenerator",
    "Token",
    "Turn",
    "Usage",
    "cited_numbers",
    "create_generator",
    "offline_generator",
]

log = logging.getLogger(__name__)

TEMPERATURE = 0.3
MAX_TOKENS = 800
MAX_RETRY_AFTER_S = 10.0  # a longer Retry-After is not worth a reader's wait: answer offline instead


def create_generator(settings: Settings, *, cross_encoder: CrossEncoder | None = None) -> Generator:
    extractive = offline_generator(cross_encoder)
    if settings.openai_api_key is None:
        return extractive
    import openai

    client = openai.AsyncOpenAI(
        api_key=settings.openai_api_key.reveal(),
        base_url=settings.openai_base_url,
        # Explicit everywhere: the SDK's own default is 600 s (docs/settings.md "Timeouts"). Between two streamed
        # chunks the read timeout applies, so a stalled stream fails after LLM_TIMEOUT_S too.
        timeout=openai.Timeout(settings.llm_timeout_s, connect=min(5.0, settings.llm_timeout_s)),
        max_retries=0,  # our own policy below: one retry, Retry-After, then the offline generator
        # aiohttp under the SDK (its `aiohttp` extra): reading a streamed chunk costs a fraction of httpx2's
        # anyio read path, which was the largest share of server CPU per relayed token (bench/chat.py).
        http_client=openai.DefaultAioHttpClient(
            limits=_limits(settings.llm_max_connections), timeout=settings.llm_timeout_s
        ),
    )
    bounds = Bounds(max_chars=settings.llm_max_answer_chars, max_s=settings.llm_max_answer_s)
    return OpenAIGenerator(client, model=settings.chat_model, fallback=extractive, bounds=bounds)


def _limits(max_connections: int) -> Any:
    import httpx2

    return httpx2.Limits(max_connections=max_connections, max_keepalive_connections=min(100, max_connections))


_MARKER = re.compile(prompts.CITATION)


def markers(text: str) -> list[int]:
    """Every number cited as ``[n]`` / ``[n, m]`` in ``text``, in order of first use, valid or not."""
    seen: list[int] = []
    for match in _MARKER.finditer(text):
        for part in match.group()[1:-1].split(","):
            n = int(part)
            if n not in seen:
                seen.append(n)
    return seen


def cited_numbers(text: str, n_sources: int) -> list[int]:
    """Source numbers cited in ``text``, in order of first use, within 1..n_sources."""
    return [n for n in markers(text) if 1 <= n <= n_sources]


def invalid_markers(text: str, valid: Collection[int]) -> list[int]:
    """Numbers cited in ``text`` that are not among ``valid`` (a model citing a source it was not given)."""
    return [n for n in markers(text) if n not in valid]


# -- the chat model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """What one streamed answer may take, whatever the model sends (``max_tokens`` is only a request): its
    characters, its time (checked at each chunk; each wait is the client's read timeout), one event-stream line,
    and the bytes of the whole response (a model's chunk is ~50 bytes per character of text; 128 leaves room)."""

    max_chars: int = 100_000
    max_s: float = 300.0
    max_line_bytes: int = 256 * 1024
    bytes_per_char: int = 128

    @property
    def max_bytes(self) -> int:
        return self.max_chars * self.bytes_per_char + self.max_line_bytes


class _Overrun(Exception):
    """The model's stream passed one of its ``Bounds``: ``what`` names it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Retryable(Exception):
    """One failed attempt; ``delay`` seconds before the next, ``notice`` for the reader."""

    def __init__(self, reason: str, delay: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class OpenAIGenerator:
    name = "openai"

    def __init__(
        self,
        client: AsyncOpenAI,
        *,
        model: str,
        fallback: ExtractiveGenerator,
        counter: TokenCounter | None = None,
        retries: int = 1,
        bounds: Bounds | None = None,
    ) -> None:
        self._client = client
        self.model = model
        self._fallback = fallback
        self._counter = counter or counter_for_model(model)
        self._retries = retries
        self._bounds = bounds or Bounds()

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client, with its connection pool (closed by ``aclose``)."""
        return self._client

    async def aclose(self) -> None:
        await self._client.close()

    def warm_up(self) -> None:
        self._fallback.warm_up()

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenEvent]:
        messages = prompts.build_messages(
            question=request.question,
            sources=[_prompt_source(s) for s in request.sources],
            history=request.history,
            selected_text=request.selected_text,
            low_confidence=request.low_confidence,
            counter=self._counter,
            book_title=request.book_title,
        )
        emitted: list[str] = []
        deadline = time.monotonic() + self._bounds.max_s
        for attempt in range(self._retries + 1):
            try:
                async for event in self._attempt(messages, emitted, deadline):
                    yield event
                return
            except _Retryable as failure:
                if emitted:
                    # Tokens already reached the reader; they cannot be taken back, so finish from the book.
                    log.warning("chat model failed mid-answer (%s); completing with extraction", failure.reason)
                    yield GenNotice("offline_generator", _NOTICE_MIDWAY)
                    async for event in self._extract(request, prefix="\n\n"):
                        yield event
                    return
                if attempt == self._retries or failure.delay > MAX_RETRY_AFTER_S:
                    log.warning("chat model unavailable (%s); answering with extraction", failure.reason)
                    break
                log.warning("chat model failed (%s); retrying in %.1f s", failure.reason, failure.delay)
                yield GenNotice("llm_retry", "The AI model did not answer; trying once more.")
                await asyncio.sleep(failure.delay)
        yield GenNotice("offline_generator", _NOTICE_FALLBACK)
        async for event in self._extract(request):
            yield event

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The request's JSON, as ``chat.completions.create(..., stream=True)`` would send it (its keys in order)."""
        return {
            "model": self.model,
            "stream": True,
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            "stream_options": {"include_usage": True},
            "temperature": TEMPERATURE,
        }

    async def _attempt(
        self, messages: list[dict[str, str]], emitted: list[str], deadline: float
    ) -> AsyncIterator[GenEvent]:
        import httpx2
        import openai

        async with contextlib.AsyncExitStack() as stack:
            try:
                # The raw response: the SDK's per-chunk model objects cost ~10x the JSON parse (bench/chat.py);
                # the request, its auth and its error mapping are still the SDK's. The body is posted as it is
                # (``client.post``, the SDK's way to an endpoint as sent): ``create`` first walks every message
                # against the SDK's typed dicts, 0.6 ms for a first question and 0.3 ms more per message of
                # history, on the event loop before the request leaves, and it changes nothing in plain strings.
                response = await self._client.post(
                    "/chat/completions",
                    body=self._body(messages),
                    cast_to=httpx2.Response,
                    stream=True,
                    options={"security": {"bearer_auth": True}},
                )
                stack.push_async_callback(response.aclose)
            except openai.RateLimitError as exc:
                raise _Retryable("429", _retry_after(exc.response.headers.get("retry-after"))) from exc
            except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError) as exc:
                raise _Retryable(type(exc).__name__, 0.2) from exc
            except openai.APIError as exc:
                # 400/401/403/404: retrying will not help; the reader still gets the offline answer.
                raise _Retryable(f"{type(exc).__name__}", math.inf) from exc
            finish: FinishReason = "stop"
            usage: Usage | None = None
            text = ModelText()  # what the model sends is untrusted input too (core/text.py, issue 25)
            room = self._bounds.max_chars - sum(map(len, emitted))
            try:
                async for chunk in _chunks(response.aiter_bytes(), self._bounds, deadline):
                    if chunk.get("error"):
                        raise _Retryable("stream broke: error event", 0.2)
                    if chunk.get("usage"):
                        usage = _usage(chunk["usage"]) or usage
                    for choice in chunk.get("choices") or ():
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            if not isinstance(content, str):
                                raise TypeError(f"content is {type(content).__name__}")
                            piece = text.feed(content)
                            if len(piece) > room:
                                if room:
                                    emitted.append(piece[:room])
                                    yield Token(piece[:room])
                                raise _Overrun("answer length")
                            if piece:
                                room -= len(piece)
                                emitted.append(piece)
                                yield Token(piece)
                        if choice.get("finish_reason") == "length":
                            finish = "length"
                rest = text.end()
                if rest:
                    emitted.append(rest)
                    yield Token(rest)
            except _Retryable:
                raise
            except _Overrun as over:
                if not emitted:  # nothing to end: answer from the book, and do not ask this model again
                    raise _Retryable(f"stream unbounded: {over.what}", math.inf) from over
                log.warning("chat model stream passed its bound (%s); the answer ends as length", over.what)
                finish, usage = "length", None
            except (openai.APIError, ValueError, KeyError, TypeError, AttributeError) as exc:
                # Malformed chunks; timeouts between chunks and dropped connections come as httpx2's errors.
                raise _Retryable(f"stream broke: {type(exc).__name__}", 0.2) from exc
            except Exception as exc:
                if type(exc).__module__.split(".")[0] not in ("httpx2", "httpcore2", "httpx", "httpcore"):
                    raise
                raise _Retryable(f"stream broke: {type(exc).__name__}", 0.2) from exc
            # Leaving the block closes the response: a cancelled generation closes the upstream request at once.
        if usage is None:
            prompt = sum(self._counter.count(m["content"]) for m in messages)
            answer = "".join(emitted)
            # A long answer (one cut at its bound: up to 100,000 characters, 0.1-0.3 s for the tokenizer) is
            # counted off the event loop; the tokenizers let go of the GIL while they work.
            count = self._counter.count
            completion = await asyncio.to_thread(count, answer) if len(answer) > 20_000 else count(answer)
            usage = Usage(prompt, completion)
        yield Finished(finish, usage, self.model)

    async def _extract(self, request: GenerationRequest, prefix: str = "") -> AsyncIterator[GenEvent]:
        first = True
        async for event in self._fallback.stream(request):
            if isinstance(event, Token) and first and prefix:
                event = Token(prefix + event.text)
            if isinstance(event, Token):
                first = False
            if isinstance(event, Finished):
                event = Finished("fallback", event.usage, f"{self.model}+{event.model}")
            yield event


_NOTICE_FALLBACK = (
    "The AI model is unavailable right now, so this answer quotes the most relevant passages of the book."
)
_NOTICE_MIDWAY = "The AI model stopped mid-answer; the rest quotes the most relevant passages of the book."


async def _chunks(body: AsyncIterator[bytes], bounds: Bounds, deadline: float) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI event stream, up to ``[DONE]`` (the rest is read, for connection reuse).

    Lines split at LF (a trailing CR dropped), so no character inside the JSON can split one; a body that
    breaks off raises httpx2's error, as with the SDK's own parser. Linear in the bytes received: each byte is
    searched once and an unfinished line is only appended to; past a bound (a line or an event longer than
    ``max_line_bytes``, a body over ``max_bytes``, the ``deadline``) it raises ``_Overrun``.
    """
    pending = bytearray()  # the unfinished line
    data: list[bytes] = []
    held = 0  # bytes in ``data``
    received = 0
    finished = False
    async for piece in body:
        received += len(piece)
        if received > bounds.max_bytes:
            raise _Overrun("response size")
        if time.monotonic() > deadline:
            raise _Overrun("answer time")
        if finished:
            continue
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            if pending:
                pending += piece[start:end]
                line, pending = bytes(pending), bytearray()
            else:
                line = piece[start:end]
            start = end + 1
            line = line.removesuffix(b"\r")
            if line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
                held += len(value)
                if held > bounds.max_line_bytes:
                    raise _Overrun("event length")
                data.append(value)
            elif not line and data:
                payload = b"\n".join(data)
                data, held = [], 0
                if payload == b"[DONE]":
                    finished = True
                    break
                yield json.loads(payload)
        if not finished:
            if len(pending) + len(piece) - start > bounds.max_line_bytes:
                raise _Overrun("line length")
            pending += piece[start:]


def _usage(value: Any) -> Usage | None:
    """The usage a chunk reports, if it is two counts; anything else is ignored (then it is counted here)."""
    if not isinstance(value, dict):
        return None
    prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or not (0 <= prompt < 2**31 and 0 <= completion < 2**31):
        return None
    return Usage(prompt, completion)


def _retry_after(header: str | None) -> float:
    try:
        return max(0.0, float(header)) if header is not None else 1.0
    except ValueError:
        return 1.0


def _prompt_source(source: Source) -> PromptSource:
    return PromptSource(
        n=source.n, title=source.title, heading=" › ".join(source.heading_path) or source.title, text=source.text
    )
