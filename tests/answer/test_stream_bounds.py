"""A model's stream is bounded: a line without end, an answer without end, a stream that never stops.

tests/fake_openai.py sends each on a real socket through the real ``openai`` client; the answer ends as
``length`` (or from the book when nothing was streamed yet) and the connection to the model is closed.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator

import openai
import pytest

from tests.answer.test_generation import REQUEST, collect, text_of
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.servers import serving
from textbook_chat.answer.generation import (
    Bounds,
    ExtractiveGenerator,
    Finished,
    GenNotice,
    OpenAIGenerator,
    _chunks,
)
from textbook_chat.core.tokens import local_counter


async def generate(fake: FakeOpenAI, bounds: Bounds, *, peak: list[int] | None = None) -> list:  # type: ignore[type-arg]
    """The events of one answer; with ``peak``, the most memory Python allocated while it streamed."""
    async with serving(fake.app()) as url:
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{url}/v1", timeout=2, max_retries=0)
        generator = OpenAIGenerator(
            client, model="m", fallback=ExtractiveGenerator(pace_s=0), counter=local_counter(), bounds=bounds
        )
        try:
            if peak is not None:
                tracemalloc.start()
            try:
                events = await collect(generator.stream(REQUEST))
            finally:
                if peak is not None:
                    peak.append(tracemalloc.get_traced_memory()[1])
                    tracemalloc.stop()
            await asyncio.wait_for(fake.closed_early.wait(), 2)  # the model saw its connection closed
            return events
        finally:
            await generator.aclose()


def finished(events: list) -> Finished:  # type: ignore[type-arg]
    last = events[-1]
    assert isinstance(last, Finished)
    return last


async def test_a_line_without_end_is_cut_at_the_line_bound_in_bounded_memory() -> None:
    fake = FakeOpenAI().then(Behaviour(pieces=("The answer", " so far"), endless_line_bytes=10_000_000))
    peak: list[int] = []
    started = time.perf_counter()
    events = await generate(fake, Bounds(), peak=peak)
    elapsed = time.perf_counter() - started
    assert text_of(events) == "The answer so far"
    assert finished(events).finish_reason == "length"
    assert peak[0] < 3_000_000, f"peak {peak[0] / 1e6:.1f} MB while reading a 10 MB line"  # the fake's too
    assert elapsed < 5 and len(fake.requests) == 1


async def test_an_answer_without_end_is_capped_at_its_characters() -> None:
    fake = FakeOpenAI().then(Behaviour(pieces=("y" * 1000,) * 20_000, token_delay_s=0.001))  # a 20 MB answer
    events = await generate(fake, Bounds(max_chars=50_500))
    assert text_of(events) == "y" * 50_500
    assert finished(events).finish_reason == "length"
    assert finished(events).usage.completion_tokens > 0
    assert fake.streams_completed == 0


@pytest.mark.slow
async def test_a_stream_that_never_stops_ends_at_the_time_bound() -> None:
    fake = FakeOpenAI().then(Behaviour(pieces=("Begun",), forever=True, token_delay_s=0.01))
    started = time.perf_counter()
    events = await generate(fake, Bounds(max_s=1.0))
    assert 1.0 <= time.perf_counter() - started < 3
    assert text_of(events).startswith("Begun more more")
    assert finished(events).finish_reason == "length"


async def test_a_bound_passed_before_any_text_answers_from_the_book_without_asking_again() -> None:
    fake = FakeOpenAI().then(Behaviour(pieces=(), endless_line_bytes=1_000_000))
    events = await generate(fake, Bounds())
    assert [e.code for e in events if isinstance(e, GenNotice)] == ["offline_generator"]
    assert finished(events).finish_reason == "fallback" and "support polygon" in text_of(events)
    assert len(fake.requests) == 1


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize("size", [1, 7, 4096])
async def test_lines_split_anywhere_across_reads_parse_the_same(size: int) -> None:
    body = b'data: {"a": 1}\r\n\r\n: comment\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\ndata: {"c": 3}\n\n'
    reads = [body[i : i + size] for i in range(0, len(body), size)]
    found = [c async for c in _chunks(pieces(*reads), Bounds(), time.monotonic() + 60)]
    assert found == [{"a": 1}, {"b": 2}]


async def test_parsing_is_linear_in_the_bytes_received() -> None:
    """A line of 256 KiB arriving 16 bytes at a time: the old parser copied the whole line on every read."""

    async def timed(n: int) -> float:
        """The least CPU time of five parses: the process's own time, so another process on the core (a parallel
        test worker) does not count, and the least of five, so a stray pause does not either."""
        line = b'data: {"c": "' + b"x" * (n - 16) + b'"}\n\n'
        reads = [line[i : i + 16] for i in range(0, len(line), 16)]
        times = []
        for _ in range(5):
            started = time.process_time()
            found = [c async for c in _chunks(pieces(*reads), Bounds(), 1e12)]
            times.append(time.process_time() - started)
            assert found == [{"c": "x" * (n - 16)}]
        return min(times)

    small, large = await timed(64 * 1024), await timed(256 * 1024)
    assert large < small * 8, (small, large)  # 4x the bytes: linear is ~4x, quadratic ~16x
