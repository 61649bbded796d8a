"""A hostile model cannot take the server: its answer ends at a bound, is stored as such, and others are answered.

The server runs on a real socket with the demo index; the model is tests/fake_openai.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chat.test_chat import QUESTION, ask, assert_protocol, stored_messages
from tests.conftest import Chat
from tests.fake_openai import Behaviour
from tests.sse_client import answer_text, of_type


@pytest.mark.slow
async def test_a_line_without_end_ends_as_length_while_health_answers_within_a_second(
    chat_server: Chat, clean_db: str
) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(Behaviour(pieces=("Balance", " is kept"), endless_line_bytes=10_000_000, token_delay_s=0.001))
        answer = asyncio.create_task(ask(client))
        slowest = 0.0
        while not answer.done():
            started = time.perf_counter()
            assert (await client.get("/health", timeout=5)).status_code == 200
            slowest = max(slowest, time.perf_counter() - started)
            await asyncio.sleep(0.05)
        stream = await answer
    assert slowest < 1.0
    assert_protocol(stream)
    assert of_type(stream, "done")[0]["finish_reason"] == "length"
    assert answer_text(stream) == "Balance is kept"
    assistant = stored_messages(clean_db)[1]
    assert (assistant["content"], assistant["status"]) == ("Balance is kept", "complete")


@pytest.mark.slow
async def test_a_model_that_never_stops_ends_at_the_time_bound(chat_server: Chat, clean_db: str) -> None:
    async with chat_server(llm=True, LLM_MAX_ANSWER_S="1") as (client, fake):
        fake.then(Behaviour(pieces=("Balance",), forever=True, token_delay_s=0.02))
        started = time.perf_counter()
        stream = await ask(client, QUESTION)
        elapsed = time.perf_counter() - started
        await asyncio.wait_for(fake.closed_early.wait(), 2)
    assert elapsed < 4
    assert of_type(stream, "done")[0]["finish_reason"] == "length"
    assert answer_text(stream).startswith("Balance more more")
    assert stored_messages(clean_db)[1]["content"] == answer_text(stream)


@pytest.mark.slow
async def test_a_20_mb_answer_is_capped_and_stored_capped(chat_server: Chat, clean_db: str) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(Behaviour(pieces=("z" * 1000,) * 20_000, token_delay_s=0.0005))
        stream = await ask(client)
        await asyncio.wait_for(fake.closed_early.wait(), 2)
    assert of_type(stream, "done")[0]["finish_reason"] == "length"
    assert answer_text(stream) == "z" * 100_000
    assert stored_messages(clean_db)[1]["content"] == "z" * 100_000
