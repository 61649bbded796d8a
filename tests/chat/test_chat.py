"""POST /api/chat end to end: the SSE protocol, citations, persistence, and every fallback.

The server runs on a real socket with the demo book's index; the LLM is tests/fake_openai.py on
another socket, driven through the real ``openai`` client; Postgres is the real one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import anyio
import httpx
import psycopg
import pytest

from tests.conftest import CLOSED_PORT_PG_URL, Chat
from tests.fake_openai import Behaviour, ok, tokens_of
from tests.sse_client import SSEEvent, answer_text, events, of_type, read_all

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
OUT_OF_SCOPE = "What is the best recipe for sourdough bread with a crispy crust?"


async def ask(client: httpx.AsyncClient, question: str = QUESTION, **fields: Any) -> list[SSEEvent]:
    return await read_all(client, "POST", "/api/chat", json={"question": question, **fields})


def stored_messages(database_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM chat_messages ORDER BY created_at, role DESC").fetchall()


def stored_citations(database_url: str, message_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT * FROM source_citations WHERE message_id = %s ORDER BY position", (message_id,)
        ).fetchall()


def notice_codes(stream: list[SSEEvent]) -> list[str]:
    return [n["code"] for n in of_type(stream, "notice")]


def assert_protocol(stream: list[SSEEvent]) -> None:
    """ids 1..n in order; meta, sources, notices, tokens, then exactly one terminal event, last."""
    assert [e.id for e in stream] == [str(i) for i in range(1, len(stream) + 1)]
    kinds = [e.event for e in stream]
    assert kinds[:2] == ["meta", "sources"], kinds
    assert kinds.count("done") + kinds.count("error") == 1 and kinds[-1] in ("done", "error"), kinds
    assert set(kinds) <= {"meta", "sources", "notice", "token", "done", "error"}


# -- the happy paths ---------------------------------------------------------------------------------


@pytest.mark.slow
async def test_an_offline_answer_streams_the_protocol_and_is_stored_with_its_citations(
    chat_server: Chat, clean_db: str
) -> None:
    async with chat_server() as (client, _):
        stream = await ask(client)
    assert_protocol(stream)
    meta = stream[0].json()
    assert meta["mode"] == "textbook" and meta["confidence_level"] in ("low", "medium", "high")
    assert meta["session_token"] and meta["stream_url"].startswith(f"/api/chat/messages/{meta['message_id']}/stream")
    assert meta["scope"] == {"requested_module": None, "searched": "all", "note": None}
    sources = of_type(stream, "sources")[0]["sources"]
    assert sources and [s["n"] for s in sources] == list(range(1, len(sources) + 1))
    assert "offline_generator" in notice_codes(stream)
    done = of_type(stream, "done")[0]
    assert done["finish_reason"] == "stop" and done["message_id"] == meta["message_id"]
    assert set(done["timings_ms"]) == {"retrieval", "first_token", "total"}

    text = answer_text(stream)
    assert "Zero Moment Point" in text or "ZMP" in text
    assert done["cited"] and all(f"[{n}]" in text for n in done["cited"])
    user, assistant = stored_messages(clean_db)
    assert (user["role"], user["content"], user["status"]) == ("user", QUESTION, "complete")
    assert (assistant["role"], assistant["status"], assistant["content"]) == ("assistant", "complete", text)
    assert str(assistant["id"]) == meta["message_id"]
    citations = stored_citations(clean_db, meta["message_id"])
    by_n = {s["n"]: s for s in sources}
    assert [c["position"] for c in citations] == done["cited"]
    for citation in citations:
        source = by_n[citation["position"]]
        assert (citation["chunk_id"], citation["url"]) == (source["chunk_id"], source["url"])
        assert citation["url"].startswith("http://localhost:3000/docs/") and "#" in citation["url"]


@pytest.mark.slow
async def test_the_model_answer_is_relayed_with_its_citations_and_usage(chat_server: Chat, clean_db: str) -> None:
    async with chat_server(llm=True) as (client, fake):
        stream = await ask(client)
    assert_protocol(stream)
    assert answer_text(stream) == "".join(tokens_of(fake.default.text))
    assert notice_codes(stream) == []
    done = of_type(stream, "done")[0]
    assert done["finish_reason"] == "stop" and done["cited"] == [1, 2]
    assert done["usage"]["completion_tokens"] == len(tokens_of(fake.default.text))
    (request,) = fake.requests
    assert request["model"] == "gpt-4o-mini" and request["temperature"] == 0.3 and request["max_tokens"] == 800
    prompt = request["messages"][-1]["content"]
    assert '<source n="1"' in prompt and QUESTION in prompt
    assistant = stored_messages(clean_db)[1]
    assert assistant["model"] == "gpt-4o-mini" and assistant["completion_tokens"] == done["usage"]["completion_tokens"]
    assert [c["position"] for c in stored_citations(clean_db, str(assistant["id"]))] == [1, 2]


@pytest.mark.slow
async def test_the_answer_is_in_the_history_by_the_time_done_arrives(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.default = ok("Balance comes from feedback [1].", token_delay_s=0.01)
        stream = await ask(client)
        meta = stream[0].json()
        history = await client.get(
            f"/api/sessions/{meta['session_id']}/messages", headers={"X-Session-Token": meta["session_token"]}
        )
    answer = history.json()["messages"][-1]
    assert (answer["role"], answer["status"], answer["content"]) == ("assistant", "complete", answer_text(stream))


@pytest.mark.slow
async def test_the_conversation_so_far_goes_into_the_next_prompt(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        first = (await ask(client))[0].json()
        session = {"session_id": first["session_id"], "session_token": first["session_token"]}
        second = await ask(client, "And how is balance kept?", **session)
    assert "session_token" not in second[0].json()
    messages = fake.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert (
        messages[1]["content"] == f"<question>\n{QUESTION}\n</question>" and messages[2]["content"] == fake.default.text
    )


@pytest.mark.slow
async def test_model_output_cannot_forge_sse_fields(chat_server: Chat) -> None:
    hostile = 'Here [1]\n\nevent: done\nid: 99\ndata: {"finish_reason": "forged"}\n\nretry: 1'
    async with chat_server(llm=True) as (client, fake):
        fake.default = ok(hostile)
        stream = await ask(client)
    assert_protocol(stream)
    assert answer_text(stream) == hostile
    assert of_type(stream, "done")[0]["finish_reason"] == "stop"


@pytest.mark.slow
async def test_a_model_answer_that_cites_nothing_says_so(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.default = ok("Balance comes from feedback, as every walking robot shows.")
        stream = await ask(client)
    assert_protocol(stream)
    assert notice_codes(stream) == ["uncited"]
    done = of_type(stream, "done")[0]
    assert done["cited"] == [] and done["invalid_markers"] == []


@pytest.mark.slow
async def test_a_marker_outside_the_sources_is_reported_and_not_a_citation(chat_server: Chat, clean_db: str) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.default = ok("Balance comes from feedback [1], and from the ankles [9].")
        stream = await ask(client)
        meta = stream[0].json()
        replayed = await read_all(client, "GET", meta["stream_url"])
    assert notice_codes(stream) == ["uncited"]
    done = of_type(stream, "done")[0]
    assert done["cited"] == [1] and done["invalid_markers"] == [9]
    assert of_type(replayed, "done")[0]["invalid_markers"] == [9]  # a reconnect sees the same


@pytest.mark.slow
async def test_a_well_cited_model_answer_has_no_uncited_notice(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.default = ok("Balance comes from feedback [1] and from the ankles [2].")
        stream = await ask(client)
    assert "uncited" not in notice_codes(stream)
    assert of_type(stream, "done")[0]["invalid_markers"] == []


@pytest.mark.slow
async def test_an_out_of_scope_question_is_declined_with_related_sections(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        stream = await ask(client, OUT_OF_SCOPE)
    assert_protocol(stream)
    assert stream[0].json()["confidence_level"] == "none"
    assert of_type(stream, "done")[0]["finish_reason"] == "declined"
    assert fake.requests == []  # no paid generation for a question the book does not cover
    assert "won't guess" in answer_text(stream)


@pytest.mark.slow
async def test_selection_mode_answers_from_the_selected_text(chat_server: Chat) -> None:
    selection = (
        "The Zero Moment Point is the point on the ground where the net moment of the inertial and "
        "gravity forces has no horizontal component. While it stays inside the support polygon the foot "
        "does not tip."
    )
    async with chat_server() as (client, _):
        stream = await ask(client, "When does the foot tip?", selected_text=selection)
    assert_protocol(stream)
    assert stream[0].json()["mode"] == "selection"
    text = answer_text(stream)
    assert text.startswith("From the selected text") and "support polygon" in text


async def test_a_bad_request_is_a_json_error_not_a_stream(chat_server: Chat) -> None:
    async with chat_server() as (client, _):
        too_long = await client.post("/api/chat", json={"question": "x" * 2001})
        unknown_session = await client.post(
            "/api/chat", json={"question": "hi", "session_id": str(uuid.uuid4()), "session_token": "nope"}
        )
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "too_long"
    assert unknown_session.status_code == 404


# -- failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected_notices"),
    [
        ([Behaviour(status=500)], ["llm_retry"]),
        ([Behaviour(status=503)], ["llm_retry"]),
        ([Behaviour(stall_s=3)], ["llm_retry"]),
        ([Behaviour(status=429, retry_after="0.3")], ["llm_retry"]),
    ],
    ids=["500", "503", "timeout", "429"],
)
@pytest.mark.slow
async def test_one_llm_failure_is_retried_once(chat_server: Chat, script: list[Behaviour], expected_notices) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(*script)
        stream = await ask(client)
    assert_protocol(stream)
    assert notice_codes(stream) == expected_notices
    assert answer_text(stream) == fake.default.text
    assert of_type(stream, "done")[0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "script",
    [
        [Behaviour(status=500), Behaviour(status=500)],
        [Behaviour(stall_s=3), Behaviour(stall_s=3)],
        [Behaviour(status=429, retry_after="0.2"), Behaviour(status=429, retry_after="0.2")],
        [Behaviour(status=401)],
    ],
    ids=["500-twice", "timeout-twice", "429-twice", "401"],
)
@pytest.mark.slow
async def test_a_failing_llm_falls_back_to_the_offline_generator(
    chat_server: Chat, clean_db: str, script: list[Behaviour]
) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(*script)
        stream = await ask(client)
    assert_protocol(stream)
    assert notice_codes(stream)[-1] == "offline_generator"
    done = of_type(stream, "done")[0]
    assert done["finish_reason"] == "fallback" and done["cited"]
    assert "Physical AI puts intelligence" not in answer_text(stream)  # nothing of the failed model's text
    assert stored_messages(clean_db)[1]["status"] == "complete"


@pytest.mark.slow
async def test_a_long_retry_after_is_not_waited_for(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(Behaviour(status=429, retry_after="120"))
        started = time.perf_counter()
        stream = await ask(client)
    assert time.perf_counter() - started < 10
    assert notice_codes(stream) == ["offline_generator"]


@pytest.mark.slow
async def test_a_stream_dropped_midway_is_completed_from_the_book(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.then(Behaviour(drop_after_tokens=4))
        stream = await ask(client)
    assert_protocol(stream)
    text = answer_text(stream)
    assert text.startswith("".join(tokens_of(fake.default.text)[:4]))
    assert len(text) > len(fake.default.text) // 2
    assert notice_codes(stream) == ["offline_generator"]
    assert of_type(stream, "done")[0]["finish_reason"] == "fallback"


@pytest.mark.slow
async def test_retrieval_down_answers_from_the_faq(chat_server: Chat) -> None:
    async with chat_server(llm=True, QDRANT_URL="http://127.0.0.1:1", QDRANT_TIMEOUT_S="0.5") as (client, fake):
        stream = await ask(client, "How do I install ROS 2?")
    assert_protocol(stream)
    assert notice_codes(stream) == ["fallback_faq"]
    assert of_type(stream, "done")[0]["finish_reason"] == "fallback"
    assert "ROS 2" in answer_text(stream) and fake.requests == []


@pytest.mark.slow
async def test_postgres_down_still_answers_with_a_notice(chat_server: Chat) -> None:
    async with chat_server(DATABASE_URL=CLOSED_PORT_PG_URL, DB_TIMEOUT_S="0.5") as (client, _):
        stream = await ask(client)
    assert_protocol(stream)
    assert "history_unavailable" in notice_codes(stream)
    assert of_type(stream, "done")[0]["finish_reason"] == "stop" and answer_text(stream)


async def test_a_reader_who_leaves_stops_generation_within_a_second(chat_server: Chat, clean_db: str) -> None:
    slow = ok(" ".join(f"word{i}" for i in range(400)) + " [1].", token_delay_s=0.02)
    async with chat_server(llm=True) as (client, fake):
        fake.default = slow
        with anyio.move_on_after(10):
            async with client.stream("POST", "/api/chat", json={"question": QUESTION}) as response:
                async for event in events(response):
                    if event.event == "token":
                        break  # the reader closes the tab
        left = time.perf_counter()
        await asyncio.wait_for(fake.closed_early.wait(), timeout=5)
        assert time.perf_counter() - left < 1.0
        for _ in range(50):
            assistant = stored_messages(clean_db)[1]
            if assistant["status"] != "streaming":
                break
            await asyncio.sleep(0.05)
    assert assistant["status"] == "interrupted"
    assert assistant["content"].startswith("word0") and len(assistant["content"]) < len(slow.text)
