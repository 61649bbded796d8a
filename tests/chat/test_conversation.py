"""A follow-up is understood in the context of the questions before it, through the API (the demo book's index,
the real Postgres session): its sources, its decline or not, the model's sources, and what is stored."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import Chat
from tests.fake_openai import Behaviour, ok
from tests.sse_client import SSEEvent, answer_text, of_type, read_all
from textbook_chat.chat.run import earlier_questions
from textbook_chat.search.context import Earlier
from textbook_chat.store.rows import TurnRow

GAZEBO = "What is Gazebo?"
CONNECT = "How do I connect it to ROS 2?"
CONNECTING = "Connecting Gazebo to ROS 2"  # the demo book's section that answers CONNECT about Gazebo


async def ask(client: httpx.AsyncClient, question: str, **session: str) -> list[SSEEvent]:
    return await read_all(client, "POST", "/api/chat", json={"question": question, **session})


async def follow_up(client: httpx.AsyncClient, first: str, second: str) -> tuple[list[SSEEvent], list[SSEEvent]]:
    """``first`` in a new session, then ``second`` in the same one."""
    opened = await ask(client, first)
    meta = opened[0].json()
    return opened, await ask(client, second, session_id=meta["session_id"], session_token=meta["session_token"])


def headings(stream: list[SSEEvent]) -> list[str]:
    return [s["heading_path"][-1] for s in of_type(stream, "sources")[0]["sources"]]


def finish(stream: list[SSEEvent]) -> str:
    return str(of_type(stream, "done")[0]["finish_reason"])


def questions(database_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(
            "SELECT content, standalone FROM chat_messages WHERE role = 'user' ORDER BY created_at"
        ).fetchall()


@pytest.mark.slow
async def test_a_follow_up_is_answered_from_the_sections_of_what_it_refers_to(chat_server: Chat, clean_db: str) -> None:
    async with chat_server() as (client, _):
        _, second = await follow_up(client, GAZEBO, CONNECT)
        alone = await ask(client, CONNECT)  # the same words in a fresh session
    assert headings(second)[0] == CONNECTING
    assert headings(alone)[0] != CONNECTING  # alone, "it" could be anything: the book's ROS 2 install comes first
    assert "gz" in answer_text(second) or "ros_gz" in answer_text(second)
    stored = questions(clean_db)
    assert [(q["content"], q["standalone"]) for q in stored] == [
        (GAZEBO, None),  # a first question takes no context
        (CONNECT, f"{CONNECT} (Gazebo)"),  # the question as asked stays the question; its standalone form beside it
        (CONNECT, None),
    ]
    with psycopg.connect(clean_db) as conn:  # what the next question reads of what each answer cited
        paths = [row[0] for row in conn.execute("SELECT heading_path FROM source_citations").fetchall()]
    assert paths and all(paths)


def test_the_earlier_questions_carry_their_answers_and_the_headings_those_cited() -> None:
    turns = [
        TurnRow(uuid.uuid4(), "user", GAZEBO),
        TurnRow(uuid.uuid4(), "assistant", "A simulator [1].", sections=(("Gazebo", ("What is Gazebo",)),)),
        TurnRow(uuid.uuid4(), "user", CONNECT, standalone=f"{CONNECT} (Gazebo)"),
        TurnRow(uuid.uuid4(), "user", "And how do I install it?"),  # this question's own row, read beside its write
    ]
    assert earlier_questions(turns, "And how do I install it?") == [
        Earlier(GAZEBO, None, "A simulator [1].", "Gazebo › What is Gazebo"),
        Earlier(CONNECT, f"{CONNECT} (Gazebo)"),  # unanswered (failed, or still streaming): no answer, no headings
    ]


@pytest.mark.slow
async def test_a_follow_up_the_book_answers_in_context_is_not_declined_for_its_vague_words(chat_server: Chat) -> None:
    async with chat_server() as (client, _):
        _, second = await follow_up(client, GAZEBO, "How do I install it?")
        alone = await ask(client, "How do I install it?")
    assert finish(alone) == "declined"
    assert finish(second) == "stop" and "Gazebo" in " ".join(headings(second))


@pytest.mark.slow
async def test_an_out_of_scope_follow_up_is_still_declined(chat_server: Chat) -> None:
    async with chat_server() as (client, _):
        _, second = await follow_up(client, GAZEBO, "And how do I cook pasta?")
    assert finish(second) == "declined"


@pytest.mark.slow
async def test_a_topic_switch_is_retrieved_as_if_it_were_asked_first(chat_server: Chat, clean_db: str) -> None:
    switch = "What safety standards apply to humanoid robots?"
    async with chat_server() as (client, _):
        _, second = await follow_up(client, GAZEBO, switch)
        alone = await ask(client, switch)
    assert of_type(second, "sources") == of_type(alone, "sources")
    assert [q["standalone"] for q in questions(clean_db)] == [None, None, None]


@pytest.mark.slow
async def test_the_model_gets_the_history_and_the_sources_retrieved_in_context(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        await follow_up(client, GAZEBO, CONNECT)
    messages = fake.requests[-1]["messages"]  # the follow-up's (a slow first attempt may have been retried)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    prompt = messages[-1]["content"]
    assert CONNECT in prompt and f"{CONNECT} (Gazebo)" not in prompt  # the model reads the question as asked
    first_source = prompt[prompt.index('<source n="1"') :].split("</source>")[0]
    assert CONNECTING in first_source


@pytest.mark.slow
async def test_a_question_about_a_selection_takes_its_context_from_the_selection_not_the_session(
    chat_server: Chat, clean_db: str
) -> None:
    selection = "Gazebo runs comfortably on a laptop CPU and integrates tightly with ROS 2 through ros_gz."
    async with chat_server() as (client, _):
        opened = await ask(client, "What is a ROS 2 service?")
        meta = opened[0].json()
        session = {"session_id": meta["session_id"], "session_token": meta["session_token"]}
        stream = await read_all(
            client, "POST", "/api/chat", json={"question": "What does it need?", "selected_text": selection, **session}
        )
    assert stream[0].json()["mode"] == "selection"
    assert [q["standalone"] for q in questions(clean_db)] == [None, None]


def rewrites(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model requests that asked for a rewrite (not streamed; answers are)."""
    return [r for r in requests if not r.get("stream")]


@pytest.mark.slow
async def test_with_the_rewrite_on_a_follow_up_needing_context_is_searched_as_the_models_standalone_question(
    chat_server: Chat, clean_db: str
) -> None:
    rewritten = "How do I connect Gazebo to ROS 2?"
    async with chat_server(llm=True, FOLLOW_UP_REWRITE="on") as (client, fake):
        opened = await ask(client, GAZEBO)
        assert rewrites(fake.requests) == []  # a first question waits for no rewrite
        meta = opened[0].json()
        session = {"session_id": meta["session_id"], "session_token": meta["session_token"]}
        fake.then(ok(rewritten))
        second = await ask(client, CONNECT, **session)
        switch = await ask(client, "What safety standards apply to humanoid robots?", **session)
    (rewrite,) = rewrites(fake.requests)  # the topic switch names its own subject: never sent
    prompt = rewrite["messages"][-1]["content"]
    assert GAZEBO in prompt and CONNECT in prompt
    assert headings(second)[0] == CONNECTING and finish(switch) == "stop"
    answer_prompt = fake.requests[-2]["messages"][-1]["content"]  # the follow-up's answer: as asked, as before
    assert CONNECT in answer_prompt and rewritten not in answer_prompt
    assert [q["standalone"] for q in questions(clean_db)] == [None, rewritten, None]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reply", "timeout_s"),
    [
        (Behaviour(text="How do I connect Gazebo to ROS 2?", stall_s=2.0), "0.2"),
        (Behaviour(body={"choices": [{"index": 0, "message": None, "finish_reason": "stop"}]}), "1.5"),
        (Behaviour(body={"choices": [{"index": 0, "message": {"role": "assistant", "content": ["x"]}}]}), "1.5"),
        (Behaviour(body={"choices": "none"}), "1.5"),
        (Behaviour(body=[]), "1.5"),
    ],
    ids=["slower than its timeout", "no message", "a list for content", "no choices", "a list"],
)
async def test_a_rewrite_too_slow_or_of_any_other_shape_falls_back_to_the_offline_reading(
    chat_server: Chat, clean_db: str, reply: Behaviour, timeout_s: str
) -> None:
    async with chat_server(llm=True, FOLLOW_UP_REWRITE="on", FOLLOW_UP_REWRITE_S=timeout_s) as (client, fake):
        opened = await ask(client, GAZEBO)
        meta = opened[0].json()
        fake.then(reply)
        second = await ask(client, CONNECT, session_id=meta["session_id"], session_token=meta["session_token"])
    assert len(rewrites(fake.requests)) == 1
    assert headings(second)[0] == CONNECTING and finish(second) == "stop"
    assert [q["standalone"] for q in questions(clean_db)] == [None, f"{CONNECT} (Gazebo)"]
