"""What the model streams is untrusted input: lone surrogates, split UTF-16 pairs, NUL, control characters and a
1 MB token each end with ``done``, are stored exactly as streamed (U+FFFD where UTF-8 cannot go), and leave the
Redis mirror, later answers on another worker and SIGTERM working (issue 25).

The model is tests/fake_openai.py sending the deltas as given, ``\\uXXXX``-escaped as a server's JSON would.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest
import redis

from tests.conftest import TEST_REDIS_URL, Chat, worker_envs
from tests.fake_openai import Behaviour, FakeOpenAI, ok
from tests.servers import server_process, serving
from tests.sse_client import SSEEvent, answer_text, read_all, read_some
from textbook_chat.cli import SHUTDOWN_FLUSH_S
from textbook_chat.streams.relay import events_key

QUESTION = "How does a humanoid keep its balance?"
R = "\ufffd"
LONG_TOKEN = "x" * 200_000  # over the answer bound (100,000 characters), under the line bound (256 KiB)

HOSTILE = {
    "lone-surrogate": (("Balance ", "lone \ud800 [1]", "."), f"Balance lone {R} [1]."),
    "lone-low-surrogate": (("\udfff first", " [1]."), f"{R} first [1]."),
    "split-pair": (("A smile ", "\ud83d", "\ude00", " [1]."), "A smile 😀 [1]."),
    "pair-never-finished": (("Cut ", "\ud83d"), f"Cut {R}"),
    "nul": (("nul\x00byte [1].",), f"nul{R}byte [1]."),
    "control-characters": (
        ("bell\x07 esc\x1b[2J\r\n\x0b\x0c\x7f\x85 [1].",),
        "bell\x07 esc\x1b[2J\r\n\x0b\x0c\x7f\x85 [1].",
    ),
    "a-token-past-the-answer-bound": ((LONG_TOKEN, " [1]."), LONG_TOKEN[:100_000]),
}


@pytest.fixture
def flush_redis() -> None:
    redis.Redis.from_url(TEST_REDIS_URL).flushdb()


def stored_answer(database_url: str, message_id: str) -> tuple[str, str]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT content, status FROM chat_messages WHERE id = %s", (message_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


async def ask(client: httpx.AsyncClient, url: str = "") -> list[SSEEvent]:
    created = await client.post(f"{url}/api/chat/messages", json={"question": QUESTION})
    assert created.status_code == 202, created.text
    return await read_all(client, "GET", url + created.json()["stream_url"])


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
@pytest.mark.slow
async def test_hostile_model_output_ends_with_done_and_is_stored_as_streamed(
    chat_server: Chat, clean_db: str, flush_redis: None, case: str
) -> None:
    pieces, expected = HOSTILE[case]
    async with chat_server(llm=True, REDIS_URL=TEST_REDIS_URL) as (client, fake):
        fake.then(Behaviour(pieces=pieces))
        stream = await ask(client)
        later = await ask(client)  # the next answer of this process is still mirrored to Redis
    assert [e.event for e in stream][-1] == "done", [e.event for e in stream][-3:]
    message_id = stream[0].json()["message_id"]
    assert answer_text(stream) == expected
    assert stored_answer(clean_db, message_id) == (expected, "complete")
    assert [e.event for e in later][-1] == "done"
    mirrored = redis.Redis.from_url(TEST_REDIS_URL)
    for message in (message_id, later[0].json()["message_id"]):
        assert mirrored.xlen(events_key(message)) == len(stream if message == message_id else later)


@pytest.mark.slow
async def test_a_second_worker_resumes_later_answers_and_sigterm_exits_within_the_grace(
    demo_index_dir: Path, tmp_path: Path, clean_db: str, flush_redis: None
) -> None:
    pieces = ("Zero ", "lone \ud800", " smile \ud83d", "\ude00 nul\x00", " [1].")
    expected = f"Zero lone {R} smile 😀 nul{R} [1]."
    later_answer = " ".join(f"w{i}" for i in range(60)) + " [1]."
    fake = FakeOpenAI(default=ok(later_answer, token_delay_s=0.02)).then(Behaviour(pieces=pieces))
    grace_s = 3.0
    async with serving(fake.app()) as llm_url:
        env_a, env_b = worker_envs(
            demo_index_dir,
            tmp_path,
            clean_db,
            llm_url,
            STREAM_SIGNING_KEY="test-signing-key",
            SHUTDOWN_GRACE_S=str(grace_s),
        )
        log_a = tmp_path / "a.log"
        async with (
            server_process(env_a, log_a) as (process_a, url_a),
            server_process(env_b, tmp_path / "b.log") as (_, url_b),
            httpx.AsyncClient(timeout=30) as client,
        ):
            hostile = await ask(client, url_a)
            created = (await client.post(f"{url_a}/api/chat/messages", json={"question": QUESTION})).json()
            first = await read_some(client, url_a + created["stream_url"], tokens=3)
            rest = await read_all(
                client, "GET", url_b + created["stream_url"], headers={"Last-Event-ID": first[-1].id or ""}
            )
            started = time.monotonic()
            process_a.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process_a.wait, grace_s + SHUTDOWN_FLUSH_S + 5)
            stopped_in = time.monotonic() - started
    assert answer_text(hostile) == expected and hostile[-1].event == "done"
    assert stored_answer(clean_db, hostile[0].json()["message_id"]) == (expected, "complete")
    ids = [e.id for e in first + rest]
    assert ids == [str(i) for i in range(1, len(ids) + 1)] and rest[-1].event == "done"
    assert answer_text(first + rest) == later_answer
    assert stopped_in < grace_s + SHUTDOWN_FLUSH_S and process_a.returncode is not None
    output = log_a.read_text()
    assert "Traceback" not in output and "shutdown failed" not in output, output[-3000:]
