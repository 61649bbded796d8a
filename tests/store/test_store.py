"""The data layer against the real Postgres: sessions, exchanges, citations, history, feedback, purge."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from textbook_chat.core.errors import DatabaseUnavailable
from textbook_chat.store.database import create_pool
from textbook_chat.store.rows import Citation, Completion, SessionToCreate, hash_token
from textbook_chat.store.sessions import Store


def _citation(position: int) -> Citation:
    return Citation(
        position=position,
        chunk_id=f"chunk-{position}",
        module="module-1",
        chapter="Chapter 1",
        title=f"Section {position}",
        url=f"http://localhost:3000/docs/module-1/chapter-1#section-{position}",
        relevance_score=0.5,
        excerpt="An excerpt.",
    )


async def test_only_the_hash_of_a_session_token_is_stored(store: Store, clean_db: str) -> None:
    session = await store.create_session()
    with psycopg.connect(clean_db) as conn:
        stored = conn.execute("SELECT token_hash FROM chat_sessions WHERE id = %s", (session.id,)).fetchone()
    assert stored == (hash_token(session.token),)
    assert session.token not in stored[0]


async def test_a_session_is_authorised_by_its_token_or_its_owner(store: Store) -> None:
    anonymous = await store.create_session()
    owned = await store.create_session(user_id="user-1")
    assert await store.authorize_session(anonymous.id, token=anonymous.token, user_id=None) is not None
    assert await store.authorize_session(anonymous.id, token="wrong", user_id=None) is None
    assert await store.authorize_session(anonymous.id, token=None, user_id=None) is None
    assert await store.authorize_session(owned.id, token=None, user_id="user-1") is not None
    assert await store.authorize_session(owned.id, token=None, user_id="user-2") is None
    assert await store.authorize_session(uuid.uuid4(), token=anonymous.token, user_id=None) is None


async def test_a_later_questions_session_check_gives_its_owner_and_its_tokens_in_one_call(store: Store) -> None:
    session = await store.create_session()
    since = datetime.now(UTC) - timedelta(days=1)
    answered = await store.start_exchange(session.id, question="Q1")
    done = Completion("A1", "complete", prompt_tokens=300, completion_tokens=40)
    await store.finish_message(answered.assistant_message_id, done)
    await store.start_exchange(session.id, question="Q2")  # its answer still streaming
    owned, used = await store.session_for_question(
        session.id, token=session.token, user_id=None, since=since, in_flight_tokens=1000
    )
    assert owned is not None and owned.id == session.id and used == 340 + 1000
    refused, _ = await store.session_for_question(
        session.id, token="wrong", user_id=None, since=since, in_flight_tokens=1000
    )
    assert refused is None
    missing = await store.session_for_question(
        uuid.uuid4(), token=session.token, user_id=None, since=since, in_flight_tokens=1
    )
    assert missing == (None, 0)
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert (
        await store.session_for_question(session.id, token=session.token, user_id=None, since=later, in_flight_tokens=1)
    )[1] == 0


async def test_the_prompts_turns_are_the_newest_questions_and_completed_answers_oldest_first(store: Store) -> None:
    session = await store.create_session()
    for n in range(4):
        exchange = await store.start_exchange(session.id, question=f"Q{n}")
        status = "failed" if n == 2 else "complete"
        await store.finish_message(exchange.assistant_message_id, Completion(f"A{n}", status))  # type: ignore[arg-type]
    await store.start_exchange(session.id, question="Q4")  # asked now: its answer is empty and streaming
    turns = await store.recent_turns(session.id, limit=4)
    assert [(t.role, t.content) for t in turns] == [("user", "Q2"), ("user", "Q3"), ("assistant", "A3"), ("user", "Q4")]
    everything = await store.recent_turns(session.id, limit=100)
    assert [t.content for t in everything] == ["Q0", "A0", "Q1", "A1", "Q2", "Q3", "A3", "Q4"]
    assert await store.recent_turns(uuid.uuid4(), limit=4) == []


async def test_a_questions_standalone_form_is_written_with_its_answer_and_read_with_the_turns(store: Store) -> None:
    session = await store.create_session()
    first = await store.start_exchange(session.id, question="What is Gazebo?")
    await store.finish_message(first.assistant_message_id, Completion("A simulator.", "complete"))
    second = await store.start_exchange(session.id, question="How do I install it?")
    standalone = "How do I install it? (Gazebo)"
    done = Completion("With apt.", "complete", question_id=second.user_message_id, standalone=standalone)
    await store.finish_message(second.assistant_message_id, done)
    turns = await store.recent_turns(session.id, limit=10)
    assert [(t.role, t.content, t.standalone) for t in turns] == [
        ("user", "What is Gazebo?", None),
        ("assistant", "A simulator.", None),
        ("user", "How do I install it?", standalone),
        ("assistant", "With apt.", None),
    ]


async def test_an_answers_cited_headings_are_read_with_the_turns_and_its_citations(store: Store) -> None:
    """The next question of the session reads what the book calls the earlier subject: the page title and heading
    path of each section the answer cited, in citation order; a citation stored before the column has its title."""
    session = await store.create_session()
    exchange = await store.start_exchange(session.id, question="How do I set up a secure domain?")
    cited = [
        replace(_citation(1), title="Secure domain setup", heading_path=("Secure domain setup", "Prosody")),
        replace(_citation(2), title="Jicofo", heading_path=()),
    ]
    done = Completion("Edit the config [1][2].", "complete", citations=cited)
    await store.finish_message(exchange.assistant_message_id, done)
    turns = await store.recent_turns(session.id, limit=10)
    assert [(t.role, t.sections) for t in turns] == [
        ("user", ()),
        ("assistant", (("Secure domain setup", ("Secure domain setup", "Prosody")), ("Jicofo", ()))),
    ]
    history = await store.history(session.id)
    assert [c.heading_path for c in history[1].citations] == [("Secure domain setup", "Prosody"), ()]


async def test_a_first_question_creates_its_session_in_the_same_statement(store: Store, clean_db: str) -> None:
    new = SessionToCreate.new(user_id="user-1", metadata={"caller": "digest"})
    exchange = await store.start_exchange(new.id, question="What is ZMP?", new_session=new)
    assert exchange.session_id == new.id and exchange.created
    assert await store.authorize_session(new.id, token=new.token, user_id=None) is not None
    assert await store.authorize_session(new.id, token=None, user_id="user-1") is not None
    with psycopg.connect(clean_db) as conn:
        stored = conn.execute("SELECT token_hash, metadata FROM chat_sessions WHERE id = %s", (new.id,)).fetchone()
    assert stored == (hash_token(new.token), {"caller": "digest"})
    assert [m.content for m in await store.history(new.id)] == ["What is ZMP?", ""]
    with pytest.raises(ValueError):
        await store.start_exchange(uuid.uuid4(), question="Q", new_session=SessionToCreate.new())


async def test_an_exchange_stores_the_question_first_and_the_answer_with_citations_at_the_end(store: Store) -> None:
    session = await store.create_session()
    exchange = await store.start_exchange(session.id, question="What is ZMP?", module_filter="module-1")
    pending = await store.get_message(exchange.assistant_message_id)
    assert pending is not None and pending.status == "streaming" and pending.content == ""

    await store.finish_message(
        exchange.assistant_message_id,
        Completion(
            content="The zero moment point [1].",
            status="complete",
            confidence=0.62,
            model="extractive",
            prompt_tokens=120,
            completion_tokens=8,
            latency_ms=35,
            citations=[_citation(1), _citation(2)],
        ),
    )
    history = await store.history(session.id)
    assert [(m.role, m.content) for m in history] == [
        ("user", "What is ZMP?"),
        ("assistant", "The zero moment point [1]."),
    ]
    answer = history[1]
    assert answer.status == "complete" and answer.confidence == pytest.approx(0.62)
    assert answer.module_filter == "module-1"
    assert [c.position for c in answer.citations] == [1, 2]
    assert answer.citations[0].url.endswith("#section-1")


async def test_a_repeated_client_request_id_attaches_to_the_first_exchange(store: Store) -> None:
    session = await store.create_session()
    request_id = uuid.uuid4()
    first, second = await asyncio.gather(
        store.start_exchange(session.id, question="Q?", client_request_id=request_id),
        store.start_exchange(session.id, question="Q?", client_request_id=request_id),
    )
    assert first.assistant_message_id == second.assistant_message_id
    assert sorted([first.created, second.created]) == [False, True]
    assert len(await store.history(session.id)) == 2


async def test_history_pages_forward_oldest_first(store: Store) -> None:
    session = await store.create_session()
    for n in range(3):
        exchange = await store.start_exchange(session.id, question=f"Q{n}")
        await store.finish_message(exchange.assistant_message_id, Completion(content=f"A{n}", status="complete"))
    first_page = await store.history(session.id, limit=4)
    assert [m.content for m in first_page] == ["Q0", "A0", "Q1", "A1"]
    rest = await store.history(session.id, limit=4, after=first_page[-1].created_at)
    assert [m.content for m in rest] == ["Q2", "A2"]


async def test_feedback_is_idempotent_and_the_last_rating_wins(store: Store) -> None:
    session = await store.create_session()
    exchange = await store.start_exchange(session.id, question="Q")
    assert await store.set_feedback(exchange.assistant_message_id, session.id, "up", None)
    assert await store.set_feedback(exchange.assistant_message_id, session.id, "down", "wrong chapter")
    message = await store.get_message(exchange.assistant_message_id)
    assert message is not None and (message.feedback, message.feedback_comment) == ("down", "wrong chapter")
    assert not await store.set_feedback(exchange.user_message_id, session.id, "up", None)  # questions are not rated
    assert not await store.set_feedback(exchange.assistant_message_id, uuid.uuid4(), "up", None)


async def test_a_user_lists_their_sessions_newest_first(store: Store) -> None:
    older = await store.create_session(user_id="reader")
    await store.start_exchange(older.id, question="First question")
    newer = await store.create_session(user_id="reader")
    await store.start_exchange(newer.id, question="Second question")
    await store.create_session(user_id="someone-else")
    sessions = await store.list_user_sessions("reader")
    assert [s.id for s in sessions] == [newer.id, older.id]
    assert sessions[0].title == "Second question" and sessions[0].message_count == 2


async def test_deleting_a_session_removes_everything_in_it(store: Store) -> None:
    session = await store.create_session()
    exchange = await store.start_exchange(session.id, question="Q")
    await store.finish_message(exchange.assistant_message_id, Completion("A", "complete", citations=[_citation(1)]))
    assert await store.delete_session(session.id)
    assert await store.get_message(exchange.assistant_message_id) is None
    assert not await store.delete_session(session.id)


async def test_a_closed_port_becomes_database_unavailable_quickly_and_then_fails_fast() -> None:
    store = Store(create_pool("postgresql://postgres@127.0.0.1:1/postgres", timeout_s=0.5), timeout_s=0.5)
    await store.open()
    try:
        with pytest.raises(DatabaseUnavailable):
            await store.create_session()
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable):
            await store.history(uuid.uuid4())
        assert time.monotonic() - started < 0.1  # the breaker answers without waiting for the pool
        assert not await store.ping(0.3)
    finally:
        await store.close()


async def test_a_burst_before_the_first_answer_queues_for_a_connection_instead_of_failing(clean_db: str) -> None:
    # One connection, queries allowed 0.3 s, a fresh store (nothing has worked yet): six callers that each hold
    # the connection 0.15 s arrive together. The last waits about 0.75 s, longer than 0.3 s, yet the database
    # is busy, not down: every call goes through and the breaker stays closed.
    store = Store(create_pool(clean_db, timeout_s=0.3, max_size=1, queue_timeout_s=10), timeout_s=0.3)
    await store.open()

    async def hold() -> None:
        async with store.connection() as conn:
            await conn.execute("SELECT pg_sleep(0.15)")

    try:
        await asyncio.gather(*(hold() for _ in range(6)))
        assert store.available
    finally:
        await store.close()


async def test_one_slow_query_fails_alone_and_three_in_a_row_open_the_breaker(clean_db: str) -> None:
    store = Store(create_pool(clean_db, timeout_s=0.2), timeout_s=0.2)
    await store.open()

    async def slow() -> None:
        async with store.connection() as conn:
            await conn.execute("SELECT pg_sleep(1)")  # over statement_timeout

    try:
        await store.create_session()
        with pytest.raises(DatabaseUnavailable):
            await slow()
        assert store.available  # one failure among working queries: the others still go through
        await store.create_session()  # and a success starts the count again
        for _ in range(2):
            with pytest.raises(DatabaseUnavailable):
                await slow()
        assert store.available
        with pytest.raises(DatabaseUnavailable):
            await slow()
        assert not store.available  # three in a row: fail fast
    finally:
        await store.close()


async def test_purge_deletes_exactly_the_idle_sessions_with_their_messages(store: Store, clean_db: str) -> None:
    # 3,000 sessions spread over 0..59 idle days; the horizon is 30 days.
    with psycopg.connect(clean_db) as conn, conn.cursor() as cur:
        cur.execute(
            """
            INSERT INTO chat_sessions (id, token_hash, last_activity_at)
            SELECT gen_random_uuid(), 'h', now() - make_interval(days => g % 60, hours => 1)
            FROM generate_series(1, 3000) g
            """
        )
        cur.execute(
            """
            INSERT INTO chat_messages (id, session_id, role, content)
            SELECT gen_random_uuid(), id, 'assistant', 'a' FROM chat_sessions
            """
        )
        cur.execute(
            """
            INSERT INTO source_citations (id, message_id, position, chunk_id, url)
            SELECT gen_random_uuid(), id, 1, 'c', 'u' FROM chat_messages
            """
        )
        cur.execute("SELECT count(*) FROM chat_sessions WHERE last_activity_at < now() - interval '30 days'")
        expected_old = cur.fetchone()[0]  # type: ignore[index]
    assert expected_old == 1500  # idle days 30..59, each 50 times

    deleted = await asyncio.gather(
        store.purge(retention_days=30, batch_size=400), store.purge(retention_days=30, batch_size=400)
    )
    assert sum(deleted) == expected_old  # two purges at once never delete twice

    with psycopg.connect(clean_db) as conn:
        remaining = conn.execute("SELECT count(*), max(now() - last_activity_at) FROM chat_sessions").fetchone()
        messages = conn.execute("SELECT count(*) FROM chat_messages").fetchone()
        citations = conn.execute("SELECT count(*) FROM source_citations").fetchone()
    assert remaining is not None and remaining[0] == 3000 - expected_old
    assert remaining[1].days < 30
    assert messages == (3000 - expected_old,) and citations == (3000 - expected_old,)
    assert await store.purge(retention_days=30) == 0
