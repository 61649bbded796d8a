"""Answer generation: the chat model through ``AsyncOpenAI`` (streamed), or the offline extractive generator.

Both yield ``Token``, ``GenNotice`` and one final ``Finished``. Third-party errors stop here: the OpenAI
generator retries once on timeout/5xx, backs off on 429 honouring ``Retry-After``, then falls back to
extraction with a notice (DESIGN.md "Generation"); callers never see an ``openai`` exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from server.answer import extract, prompts
from server.answer.prompts import PromptSource, Turn
from server.core.crossencoder import CrossEncoder, CrossEncoderUnavailable, available
from server.core.tokens import TokenCounter, counter_for_model
from server.index import sparse

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

    from server.core.settings import Settings
    from server.search.retrieval import Source

__all__ = [
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
]

log = logging.getLogger(__name__)

TEMPERATURE = 0.3
MAX_TOKENS = 800
MAX_RETRY_AFTER_S = 10.0  # a longer Retry-After is not worth a reader's wait: answer offline instead

# Keyword overlap decides what may be quoted; the cross-encoder reads the best few of those and decides their
# order, so what fits the answer's budget is what answers best. Four short units (a heading and 20 words, about
# 40 word pieces with the question) take 25-50 ms on one core of this machine, several times that under load;
# past CROSS_ENCODER_WAIT_S the answer goes out in keyword order rather than keep the reader waiting (README).
CROSS_ENCODER_UNITS = 4
CROSS_ENCODER_WAIT_S = 0.25
ANSWERS_LOGIT = 0.0  # with no keyword in common, a unit is quoted only when the cross-encoder says it answers

FinishReason = Literal["stop", "length", "declined", "fallback", "cancelled"]


@dataclass(frozen=True)
class Token:
    text: str


@dataclass(frozen=True)
class GenNotice:
    code: str
    message: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    model: str


GenEvent = Token | GenNotice | Finished


@dataclass(frozen=True)
class GenerationRequest:
    question: str
    sources: Sequence[Source]
    history: Sequence[Turn]
    mode: str
    selected_text: str | None = None
    low_confidence: bool = False


class Generator(Protocol):
    name: str

    def stream(self, request: GenerationRequest) -> AsyncIterator[GenEvent]: ...

    def warm_up(self) -> None: ...

    async def aclose(self) -> None: ...


def offline_generator(
    cross_encoder: CrossEncoder | None = None, *, wait_s: float = CROSS_ENCODER_WAIT_S
) -> ExtractiveGenerator:
    """The offline generator as the server builds it: ranking with ``cross_encoder`` (a new one when none is
    given and its weights are installed), by keyword overlap when they are not. ``eval`` waits for the
    cross-encoder however long it takes (``wait_s=math.inf``), so its figures do not follow the machine's load."""
    if cross_encoder is None:
        cross_encoder = _process_cross_encoder()
    return ExtractiveGenerator(cross_encoder=cross_encoder, cross_encoder_wait_s=wait_s)


@functools.cache
def _process_cross_encoder() -> CrossEncoder | None:
    """One cross-encoder per process (its session is ~22 MB): every app a process builds shares it."""
    return CrossEncoder() if available() else None


def create_generator(settings: Settings, *, cross_encoder: CrossEncoder | None = None) -> Generator:
    extractive = offline_generator(cross_encoder)
    if settings.openai_api_key is None:
        return extractive
    import openai

    client = openai.AsyncOpenAI(
        api_key=settings.openai_api_key.reveal(),
        base_url=settings.openai_base_url,
        # Explicit everywhere: the SDK's own default is 600 s (DESIGN.md "Settings"). Between two streamed
        # chunks the read timeout applies, so a stalled stream fails after LLM_TIMEOUT_S too.
        timeout=openai.Timeout(settings.llm_timeout_s, connect=min(5.0, settings.llm_timeout_s)),
        max_retries=0,  # our own policy below: one retry, Retry-After, then the offline generator
        # aiohttp under the SDK (its `aiohttp` extra): reading a streamed chunk costs a fraction of httpx2's
        # anyio read path, which was the largest share of server CPU per relayed token (bench/chat.py).
        http_client=openai.DefaultAioHttpClient(
            limits=_limits(settings.llm_max_connections), timeout=settings.llm_timeout_s
        ),
    )
    return OpenAIGenerator(client, model=settings.chat_model, fallback=extractive)


def _limits(max_connections: int) -> Any:
    import httpx2

    return httpx2.Limits(max_connections=max_connections, max_keepalive_connections=min(100, max_connections))


_MARKER = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")


def markers(text: str) -> list[int]:
    """Every number cited as ``[n]`` / ``[n, m]`` in ``text``, in order of first use, valid or not."""
    seen: list[int] = []
    for match in _MARKER.finditer(text):
        for part in match.group(1).split(","):
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
    ) -> None:
        self._client = client
        self.model = model
        self._fallback = fallback
        self._counter = counter or counter_for_model(model)
        self._retries = retries

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
        )
        emitted: list[str] = []
        for attempt in range(self._retries + 1):
            try:
                async for event in self._attempt(messages, emitted):
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

    async def _attempt(self, messages: list[dict[str, str]], emitted: list[str]) -> AsyncIterator[GenEvent]:
        import openai

        async with contextlib.AsyncExitStack() as stack:
            try:
                # The raw response: the SDK's per-chunk model objects cost ~10x the JSON parse (bench/chat.py);
                # the request, its auth and its error mapping are still the SDK's.
                response = await stack.enter_async_context(
                    self._client.chat.completions.with_streaming_response.create(
                        model=self.model,
                        messages=cast("list[ChatCompletionMessageParam]", messages),
                        temperature=TEMPERATURE,
                        max_tokens=MAX_TOKENS,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
            except openai.RateLimitError as exc:
                raise _Retryable("429", _retry_after(exc.response.headers.get("retry-after"))) from exc
            except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError) as exc:
                raise _Retryable(type(exc).__name__, 0.2) from exc
            except openai.APIError as exc:
                # 400/401/403/404: retrying will not help; the reader still gets the offline answer.
                raise _Retryable(f"{type(exc).__name__}", math.inf) from exc
            finish: FinishReason = "stop"
            usage: Usage | None = None
            try:
                async for chunk in _chunks(response.iter_bytes()):
                    if chunk.get("error"):
                        raise _Retryable("stream broke: error event", 0.2)
                    if chunk.get("usage"):
                        usage = Usage(chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
                    for choice in chunk.get("choices") or ():
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            emitted.append(content)
                            yield Token(content)
                        if choice.get("finish_reason") == "length":
                            finish = "length"
            except _Retryable:
                raise
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
            usage = Usage(prompt, self._counter.count("".join(emitted)))
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


async def _chunks(body: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI event stream, up to ``[DONE]`` (the rest is read, for connection reuse).

    Lines split at LF (a trailing CR dropped), so no character inside the JSON can split one; a body that
    breaks off raises httpx2's error, as with the SDK's own parser.
    """
    pending = b""
    data: list[bytes] = []
    finished = False
    async for piece in body:
        if finished:
            continue
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        for line in lines:
            line = line.removesuffix(b"\r")
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif not line and data:
                payload = b"\n".join(data)
                data = []
                if payload == b"[DONE]":
                    finished = True
                    break
                yield json.loads(payload)


def _retry_after(header: str | None) -> float:
    try:
        return max(0.0, float(header)) if header is not None else 1.0
    except ValueError:
        return 1.0


def _prompt_source(source: Source) -> PromptSource:
    return PromptSource(
        n=source.n, title=source.title, heading=" › ".join(source.heading_path) or source.title, text=source.text
    )


# -- the offline generator -----------------------------------------------------------------------------


class ExtractiveGenerator:
    """Streams the units of the sources that best answer the question (sentences, lead-ins with their lists,
    table rows with their headers), each with its ``[n]`` marker; ``extract.py`` cuts, chooses and renders.

    With a ``CrossEncoder`` the units are ranked by how well they answer the question (it reads the
    ``CROSS_ENCODER_UNITS`` best by keyword overlap); without one, or when it fails, by keyword overlap alone.
    """

    name = "extractive"

    def __init__(
        self,
        *,
        pace_s: float = 0.008,
        words_per_token: int = 3,
        cross_encoder: CrossEncoder | None = None,
        cross_encoder_wait_s: float = CROSS_ENCODER_WAIT_S,
    ) -> None:
        self._pace_s = pace_s  # a readable stream for the demo, ~0.4 s for a whole answer
        self._words_per_token = words_per_token
        self.cross_encoder = cross_encoder
        self.cross_encoder_wait_s = cross_encoder_wait_s

    async def aclose(self) -> None:
        return None

    def warm_up(self) -> None:
        """Load the cross-encoder now (start-up) rather than on a reader's first question."""
        if self.cross_encoder is not None:
            try:
                self.cross_encoder.warm_up()
            except CrossEncoderUnavailable as exc:
                log.warning("offline answers rank by keywords only: %s", exc)
                self.cross_encoder = None

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenEvent]:
        text = await self.answer_async(request)
        words = re.split(r"(?<=\s)(?=\S)", text)
        for i in range(0, len(words), self._words_per_token):
            yield Token("".join(words[i : i + self._words_per_token]))
            await asyncio.sleep(self._pace_s)
        yield Finished("stop", Usage(0, 0), self.name)

    async def answer_async(self, request: GenerationRequest) -> str:
        """The answer, the cross-encoder run off the event loop."""
        plan = self._plan(request)
        if isinstance(plan, str):
            return plan
        scores: list[float] | None = None
        if self.cross_encoder is not None and plan.worth_reading:
            reading = self.cross_encoder.ascore(request.question, [u.scoring_text() for u in plan.to_read])
            try:
                logits = await asyncio.wait_for(reading, self.cross_encoder_wait_s)
                scores = [float(x) for x in logits]
            except TimeoutError:
                log.info("cross-encoder slower than %.2f s; answering in keyword order", self.cross_encoder_wait_s)
            except CrossEncoderUnavailable as exc:
                log.warning("offline answers rank by keywords only: %s", exc)
                self.cross_encoder = None
            except Exception as exc:  # onnxruntime's own errors: this answer goes out in keyword order
                log.warning("cross-encoder failed (%s); answering in keyword order", type(exc).__name__)
        return self._finish(request, plan, scores)

    def answer(self, request: GenerationRequest) -> str:
        """The answer, synchronously (the cross-encoder on this thread)."""
        plan = self._plan(request)
        if isinstance(plan, str):
            return plan
        scores: list[float] | None = None
        if self.cross_encoder is not None and plan.worth_reading:
            logits = self.cross_encoder.score(request.question, [u.scoring_text() for u in plan.to_read])
            scores = [float(x) for x in logits]
        return self._finish(request, plan, scores)

    def _plan(self, request: GenerationRequest) -> _Plan | str:
        """Every unit with its keyword score, and the ones the cross-encoder should read; or a final answer."""
        wanted = frozenset(sparse.terms(request.question))
        if request.selected_text:
            cite = _citing_source(request.selected_text, request.sources)
            candidates = [_lexical(u, wanted) for u in extract.units(request.selected_text, cite)]
        elif not request.sources:
            return "I couldn't find passages in the textbook that answer this."
        else:
            candidates = [
                _lexical(u, wanted, weight=1.0 if source.kind == "teaching" else 0.5)
                for source in request.sources
                for u in extract.units(source.text, source.n, source.kind)
            ]
        ranked = [u for u in sorted(candidates, key=lambda u: u.score, reverse=True) if u.score > 0]
        if ranked:
            return _Plan(ranked, ranked[:CROSS_ENCODER_UNITS], overlap=True)
        # Nothing in common with the question: the cross-encoder may still find an answer among each source's
        # opening units (a paraphrase); keyword overlap alone has nothing to offer.
        firsts = {u.n: u for u in reversed(candidates)}
        return _Plan([], [firsts[n] for n in sorted(firsts, key=lambda n: n or 0)], overlap=False)

    def _finish(self, request: GenerationRequest, plan: _Plan, scores: Sequence[float] | None) -> str:
        budget = extract.BUDGETS[extract.shape(request.question)]
        ranked = plan.eligible
        if scores is not None:
            read = [replace(u, score=s + _source_prior(u.n)) for u, s in zip(plan.to_read, scores, strict=True)]
            if not plan.overlap:
                read = [u for u in read if u.score > ANSWERS_LOGIT]
            by_answer = sorted(read, key=lambda u: u.score, reverse=True)
            ranked = by_answer + [u for u in ranked[len(plan.to_read) :]]
        chosen = extract.choose(ranked, budget)
        if request.selected_text:
            if not chosen:
                return "The selected text does not seem to answer this question; try asking about the whole book."
            return "From the selected text: " + extract.render(extract.order(chosen))
        if not chosen:
            best = request.sources[0]
            return f"The closest passage is in “{' › '.join(best.heading_path) or best.title}” [{best.n}]."
        return extract.render(extract.order(chosen))


@dataclass(frozen=True)
class _Plan:
    eligible: list[extract.Unit]  # the units sharing a keyword with the question, best first
    to_read: list[extract.Unit]  # those the cross-encoder reads (the first of ``eligible``)
    overlap: bool  # False: nothing shares a keyword; ``to_read`` is each source's opening unit

    @property
    def worth_reading(self) -> bool:
        """Whether the cross-encoder's opinion can change the answer: two units to order, or any to judge."""
        return len(self.to_read) > 1 or (not self.overlap and bool(self.to_read))


sentences = extract.sentences  # the prose sentences of a chunk (kept here for callers of the old name)


def _lexical(unit: extract.Unit, wanted: frozenset[str], weight: float = 1.0) -> extract.Unit:
    """Keyword overlap with the question; ``weight`` < 1 for a quiz's or an exercise's own explanations."""
    overlap = len(wanted & unit.terms)
    score = weight * overlap / math.sqrt(len(unit.terms) or 1) if overlap else 0.0
    if score:
        score += 0.15 / (unit.n or 1) + 0.05 / (1 + unit.position)  # earlier sources and opening units break ties
    return replace(unit, score=score)


def _source_prior(n: int | None) -> float:
    """Retrieval's order breaks near-ties of the cross-encoder: the first source a little ahead."""
    return 0.5 / (n or 1)


def _citing_source(selected: str, sources: Sequence[Source]) -> int | None:
    needle = " ".join(re.findall(r"\w+", selected.lower()))[:200]
    for source in sources:
        if needle and needle in " ".join(re.findall(r"\w+", source.text.lower())):
            return source.n
    return sources[0].n if sources else None
