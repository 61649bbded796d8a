"""EventSource clients: POST /api/chat/messages, the capability-guarded stream, resume, stop, replay.

The last test runs two real server processes sharing Redis and Postgres and moves a reader from one
to the other mid-answer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from tests.conftest import TEST_REDIS_URL, copy_index, worker_envs
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import server_process, serving
from tests.sse_client import answer_text, of_type, read_all, read_some
from textbook_chat.core.settings import Settings
from textbook_chat.streams.capabilities import Capabilities
from textbook_chat.web.app import create_app

QUESTION = "How does a humanoid keep its balance?"
LONG_ANSWER = " ".join(f"w{i}" for i in range(120)) + " [1]."
KEY = "test-signing-key"

Server = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, FakeOpenAI]]]


@pytest.fixture
def flush_redis() -> None:
    redis.Redis.from_url(TEST_REDIS_URL).flushdb()


@pytest.fixture
def server(demo_index_dir: Path, tmp_path: Path, clean_db: str, flush_redis: None) -> Server:
    @asynccontextmanager
    async def start(
        *, fake: FakeOpenAI | None = None, **env: str
    ) -> AsyncIterator[tuple[httpx.AsyncClient, FakeOpenAI]]:
        fake = fake or FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.01))
        async with serving(fake.app()) as llm_url:
            values = {
                "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
                "DATABASE_URL": clean_db,
                "LOG_FORMAT": "text",
                "OPENAI_API_KEY": "sk-test",
                "OPENAI_BASE_URL": f"{llm_url}/v1",
                "EMBEDDER": "local",
                "STREAM_SIGNING_KEY": KEY,
                **env,
            }
            async with (
                serving(create_app(Settings.from_env(values))) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as c,
            ):
                yield c, fake

    return start


async def post_message(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await client.post("/api/chat/messages", json={"question": QUESTION, **fields})
    assert response.status_code == 202, response.text
    created: dict[str, Any] = response.json()
    return created


def stored_answer(database_url: str, message_id: str) -> tuple[str, str]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT content, status FROM chat_messages WHERE id = %s", (message_id,)).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.slow
async def test_a_posted_message_streams_from_its_capability_url(server: Server, clean_db: str) -> None:
    async with server() as (client, fake):
        created = await post_message(client)
        assert set(created) >= {"message_id", "session_id", "session_token", "stream_url"}
        stream = await read_all(client, "GET", created["stream_url"])
    assert [e.id for e in stream] == [str(i) for i in range(1, len(stream) + 1)]
    assert stream[0].json()["stream_url"] == created["stream_url"] and stream[0].retry == 2000
    assert of_type(stream, "done")[0]["finish_reason"] == "stop"
    assert answer_text(stream) == stored_answer(clean_db, created["message_id"])[0] == LONG_ANSWER
    assert len(fake.requests) == 1


@pytest.mark.slow
async def test_a_reconnect_resumes_after_last_event_id_without_duplicates(server: Server, clean_db: str) -> None:
    async with server() as (client, _):
        created = await post_message(client)
        first = await read_some(client, created["stream_url"], tokens=3)
        rest = await read_all(client, "GET", created["stream_url"], headers={"Last-Event-ID": first[-1].id or ""})
        # Clients that cannot set headers pass it in the query instead.
        by_query = await read_all(client, "GET", f"{created['stream_url']}&last_event_id={first[-1].id}")
    ids = [e.id for e in first + rest]
    assert ids == [str(i) for i in range(1, len(ids) + 1)]
    assert answer_text(first + rest) == stored_answer(clean_db, created["message_id"])[0] == LONG_ANSWER
    assert [e.id for e in by_query] == [e.id for e in rest]


@pytest.mark.slow
async def test_a_reconnect_after_done_gets_204_and_a_new_reader_gets_the_whole_replay(server: Server) -> None:
    async with server() as (client, _):
        created = await post_message(client)
        stream = await read_all(client, "GET", created["stream_url"])
        after_done = await client.get(created["stream_url"], headers={"Last-Event-ID": stream[-1].id or ""})
        replay = await read_all(client, "GET", created["stream_url"])
    assert after_done.status_code == 204
    assert [(e.id, e.event, e.data) for e in replay] == [(e.id, e.event, e.data) for e in stream]


@pytest.mark.slow
async def test_a_finished_answer_replays_from_postgres_once_live_events_are_gone(server: Server) -> None:
    async with server() as (client, _):
        created = await post_message(client)
        original = await read_all(client, "GET", created["stream_url"])
    async with server() as (client, _):  # a fresh process state: only Postgres remembers the answer
        replay = await read_all(client, "GET", created["stream_url"])
        after_done = await client.get(created["stream_url"], headers={"Last-Event-ID": replay[-1].id or ""})
    assert [e.event for e in replay] == ["meta", "sources", "token", "done"]
    assert answer_text(replay) == answer_text(original)
    assert of_type(replay, "done")[0]["cited"] == of_type(original, "done")[0]["cited"]
    assert after_done.status_code == 204


@pytest.mark.slow
async def test_a_reader_cut_off_mid_answer_resumes_after_a_restart_with_exactly_the_rest(server: Server) -> None:
    """The live events are gone (a restart; no Redis): the stored answer's stream marks say what the reader's
    last event had brought, so the reconnect gets the rest of the text, once, and its end."""
    async with server() as (client, _):
        created = await post_message(client)
        cut_off = await read_some(client, created["stream_url"], tokens=3)
        await read_all(client, "GET", created["stream_url"])  # the answer finishes and is stored
    async with server() as (client, _):  # a fresh process state: only Postgres remembers the answer
        headers = {"Last-Event-ID": cut_off[-1].id or ""}
        rest = await read_all(client, "GET", created["stream_url"], headers=headers)
        again = await client.get(created["stream_url"], headers={"Last-Event-ID": rest[-1].id or ""})
    assert answer_text(cut_off + rest) == LONG_ANSWER
    assert [e.event for e in rest] == ["token", "done"]
    ids = [int(e.id or 0) for e in cut_off + rest]
    assert ids == sorted(set(ids))  # numbered on from where the reader was, nothing twice
    assert again.status_code == 204


@pytest.mark.slow
async def test_history_hands_a_reader_who_reloaded_mid_answer_the_stream_to_follow(server: Server) -> None:
    async with server() as (client, _):
        created = await post_message(client)
        first = await read_some(client, created["stream_url"], tokens=2)  # the reader is there, then reloads
        history_url = f"/api/sessions/{created['session_id']}/messages"
        headers = {"X-Session-Token": created["session_token"]}
        during = (await client.get(history_url, headers=headers)).json()["messages"]
        answer = next(m for m in during if m["role"] == "assistant")
        assert answer["status"] == "streaming" and answer["stream_url"]
        resumed = await read_all(client, "GET", answer["stream_url"])  # from the start: the page kept nothing
        after = (await client.get(history_url, headers=headers)).json()["messages"]
    assert answer_text(resumed) == LONG_ANSWER and answer_text(first) in LONG_ANSWER
    assert all(m["stream_url"] is None for m in after)  # finished: nothing left to follow


@pytest.mark.parametrize("mangle", ["wrong", "missing", "other-message", "expired"])
@pytest.mark.slow
async def test_a_wrong_or_expired_capability_is_a_404(server: Server, mangle: str) -> None:
    async with server(STREAM_TTL_S="1") as (client, _):
        created = await post_message(client)
        url: str = created["stream_url"]
        if mangle == "wrong":
            url = url[:-4] + "AAAA"
        elif mangle == "missing":
            url = url.split("?")[0]
        elif mangle == "other-message":
            url = url.replace(created["message_id"], str(uuid.uuid4()))
        else:
            await asyncio.sleep(2.1)
        get = await client.get(url)
        delete = await client.delete(url.replace("/stream", ""))
    assert (get.status_code, delete.status_code) == (404, 404)
    assert get.json()["error"]["code"] == "not_found"


@pytest.mark.slow
async def test_a_double_submitted_client_request_id_runs_one_generation(server: Server) -> None:
    async with server() as (client, fake):
        first = await post_message(client, client_request_id="6f1c1d7e-5a43-4c1e-9d7a-0b7f3b0f4a11")
        session = {"session_id": first["session_id"], "session_token": first["session_token"]}
        again = await post_message(client, client_request_id="6f1c1d7e-5a43-4c1e-9d7a-0b7f3b0f4a11", **session)
        via_chat = await read_all(
            client,
            "POST",
            "/api/chat",
            json={"question": QUESTION, "client_request_id": "6f1c1d7e-5a43-4c1e-9d7a-0b7f3b0f4a11", **session},
        )
    assert again["message_id"] == first["message_id"] and again["created"] is False
    assert via_chat[0].json()["message_id"] == first["message_id"] and answer_text(via_chat) == LONG_ANSWER
    assert len(fake.requests) == 1


async def test_a_repeated_first_question_creates_no_second_session(server: Server, clean_db: str) -> None:
    request_id = str(uuid.uuid4())
    async with server() as (client, _):
        first = await post_message(client, client_request_id=request_id)
        again = await post_message(client, client_request_id=request_id)  # a retry before the answer came back
    assert again["message_id"] == first["message_id"] and again["session_id"] == first["session_id"]
    assert "session_token" not in again  # only its hash is stored: it goes out once
    with psycopg.connect(clean_db) as conn:
        sessions = conn.execute("SELECT count(*) FROM chat_sessions").fetchone()
        answers = conn.execute("SELECT count(*) FROM chat_messages WHERE role = 'assistant'").fetchone()
    assert sessions == (1,) and answers == (1,)


async def test_a_client_request_id_from_another_conversation_is_a_409(server: Server, clean_db: str) -> None:
    request_id = str(uuid.uuid4())
    async with server() as (client, _):
        await post_message(client, client_request_id=request_id)
        other = await post_message(client)
        session = {"session_id": other["session_id"], "session_token": other["session_token"]}
        clash = await client.post(
            "/api/chat/messages", json={"question": QUESTION, "client_request_id": request_id, **session}
        )
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "conflict"
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM chat_messages WHERE role = 'user'").fetchone() == (2,)


@pytest.mark.slow
async def test_delete_stops_the_generation_within_a_second(server: Server, clean_db: str) -> None:
    slow = FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.05))
    async with server(fake=slow, STREAM_GRACE_S="30") as (client, fake):
        created = await post_message(client)
        first = await read_some(client, created["stream_url"], tokens=2)
        started = time.perf_counter()
        stopped = await client.delete(created["stream_url"].replace("/stream", ""))
        elapsed = time.perf_counter() - started
        rest = await read_all(client, "GET", created["stream_url"], headers={"Last-Event-ID": first[-1].id or ""})
        again = await client.delete(created["stream_url"].replace("/stream", ""))
    assert stopped.status_code == 202 and stopped.json()["status"] == "cancelled" and elapsed < 1.0
    assert of_type(rest, "done")[0]["finish_reason"] == "cancelled"
    assert fake.streams_closed_early == 1
    content, status = stored_answer(clean_db, created["message_id"])
    assert status == "interrupted" and content == answer_text(first + rest) and content != LONG_ANSWER
    assert again.status_code == 202 and again.json()["status"] == "finished"


def _orphan(database_url: str, session_id: str) -> uuid.UUID:
    """An answer as a worker killed mid-answer leaves it: ``streaming`` in Postgres, ten minutes old, live nowhere."""
    answer = uuid.uuid4()
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO chat_messages (id, session_id, role, content, status, created_at) VALUES "
            "(%s, %s, 'user', 'A question', 'complete', now() - interval '10 minutes'), "
            "(%s, %s, 'assistant', '', 'streaming', now() - interval '10 minutes')",
            (uuid.uuid4(), session_id, answer, session_id),
        )
    return answer


@pytest.mark.slow
async def test_an_answer_left_streaming_by_a_dead_worker_ends_interrupted_not_streaming_for_good(
    server: Server, clean_db: str
) -> None:
    async with server() as (client, _):
        created = await post_message(client)
        await read_all(client, "GET", created["stream_url"])
        in_history, streamed = _orphan(clean_db, created["session_id"]), _orphan(clean_db, created["session_id"])
        capabilities = Capabilities(KEY.encode(), ttl_s=Settings().stream_ttl_s)
        replayed = await read_all(client, "GET", capabilities.stream_url(str(streamed)))
        history = await client.get(
            f"/api/sessions/{created['session_id']}/messages", headers={"X-Session-Token": created["session_token"]}
        )
    (row,) = [m for m in history.json()["messages"] if m["id"] == str(in_history)]
    assert (row["status"], row["stream_url"]) == ("interrupted", None)  # the panel has nothing to retry
    assert of_type(replayed, "done")[0]["finish_reason"] == "cancelled" and replayed[-1].event == "done"
    assert stored_answer(clean_db, str(in_history))[1] == stored_answer(clean_db, str(streamed))[1] == "interrupted"


# -- two processes -----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_reader_moves_to_another_worker_mid_answer_and_gets_every_event_once(
    demo_index_dir: Path, tmp_path: Path, clean_db: str, flush_redis: None
) -> None:
    fake = FakeOpenAI(default=ok(LONG_ANSWER, token_delay_s=0.02))
    async with serving(fake.app()) as llm_url:
        env_a, env_b = worker_envs(demo_index_dir, tmp_path, clean_db, llm_url, STREAM_SIGNING_KEY=KEY)
        async with (
            server_process(env_a, tmp_path / "a.log") as (_, url_a),
            server_process(env_b, tmp_path / "b.log") as (_, url_b),
            httpx.AsyncClient(timeout=30) as client,
        ):
            created = (await client.post(f"{url_a}/api/chat/messages", json={"question": QUESTION})).json()
            first = await read_some(client, url_a + created["stream_url"], tokens=5)
            rest = await read_all(
                client, "GET", url_b + created["stream_url"], headers={"Last-Event-ID": first[-1].id or ""}
            )
            after_done = await client.get(url_b + created["stream_url"], headers={"Last-Event-ID": rest[-1].id or ""})
    ids = [e.id for e in first + rest]
    assert ids == [str(i) for i in range(1, len(ids) + 1)]
    assert answer_text(first + rest) == stored_answer(clean_db, created["message_id"])[0] == LONG_ANSWER
    assert len(fake.requests) == 1 and fake.streams_completed == 1
    assert after_done.status_code == 204
