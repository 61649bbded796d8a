"""Finished answers are written in batches, waited for while Postgres is away, and spilled to disk on shutdown;
a question the store could not take when it was asked is written with its answer, into a session its asker owns."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from tests.conftest import CLOSED_PORT_PG_URL
from textbook_chat.store.database import create_pool
from textbook_chat.store.rows import Citation, Completion, LateQuestion, hash_token
from textbook_chat.store.sessions import Store
from textbook_chat.store.writes import AnswerWriter


async def _exchanges(store: Store, count: int) -> list[uuid.UUID]:
    session = await store.create_session()
    ids = []
    for i in range(count):
        exchange = await store.start_exchange(session.id, question=f"question {i}")
        ids.append(exchange.assistant_message_id)
    return ids


def _answer(i: int) -> Completion:
    cite = Citation(1, f"c{i}", "m", "ch", "Title", f"https://book/{i}", 0.5, "excerpt")
    return Completion(content=f"answer {i} [1]", status="complete", confidence=0.8, model="m", citations=(cite,))


def _stored(url: str, ids: list[uuid.UUID]) -> list[tuple[str, str, int]]:
    with psycopg.connect(url) as conn:
        return [
            conn.execute(
                "SELECT content, status, (SELECT count(*) FROM source_citations WHERE message_id = m.id) "
                "FROM chat_messages m WHERE id = %s",
                (i,),
            ).fetchone()  # type: ignore[misc]
            for i in ids
        ]


async def test_a_burst_of_answers_is_written_in_a_few_batches(store: Store, clean_db: str, tmp_path: Path) -> None:
    ids = await _exchanges(store, 300)
    writer = AnswerWriter(store, tmp_path / "spill")
    await writer.start()
    written = [writer.submit(message_id, _answer(i)) for i, message_id in enumerate(ids)]
    await asyncio.wait_for(asyncio.gather(*written), timeout=30)
    await writer.close(drain_s=1)
    assert _stored(clean_db, ids) == [(f"answer {i} [1]", "complete", 1) for i in range(300)]
    assert not (tmp_path / "spill").exists() or not list((tmp_path / "spill").iterdir())


async def test_answers_unwritten_at_shutdown_are_spilled_and_written_at_the_next_start(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    ids = await _exchanges(store, 3)
    spill = tmp_path / "spill"
    away = Store(create_pool(CLOSED_PORT_PG_URL, timeout_s=0.3), timeout_s=0.3)  # Postgres unreachable
    await away.open()
    try:
        down = AnswerWriter(away, spill)
        await down.start()
        for i, message_id in enumerate(ids):
            down.submit(message_id, _answer(i))
        await down.close(drain_s=0.5)
    finally:
        await away.close()
    (spilled,) = spill.glob("*.jsonl")
    records = [json.loads(line) for line in spilled.read_text().splitlines()]
    assert [r["message_id"] for r in records] == [str(i) for i in ids]
    assert _stored(clean_db, ids) == [("", "streaming", 0)] * 3

    back = AnswerWriter(store, spill)
    await back.start()
    for _ in range(100):
        if _stored(clean_db, ids)[-1][1] == "complete" and not list(spill.glob("*.jsonl")):
            break
        await asyncio.sleep(0.05)
    await back.close(drain_s=1)
    assert _stored(clean_db, ids) == [(f"answer {i} [1]", "complete", 1) for i in range(3)]
    assert not list(spill.glob("*"))


async def test_a_spill_file_cut_short_loses_only_its_unreadable_line(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    ids = await _exchanges(store, 2)
    spill = tmp_path / "spill"
    spill.mkdir()
    good = {"message_id": str(ids[0]), "completion": {"content": "kept", "status": "complete", "citations": []}}
    (spill / "old.jsonl").write_text(json.dumps(good) + '\n{"message_id": "' + str(ids[1]) + '", "compl')
    writer = AnswerWriter(store, spill)
    await writer.start()
    for _ in range(100):
        if _stored(clean_db, ids[:1]) == [("kept", "complete", 0)]:
            break
        await asyncio.sleep(0.05)
    await writer.close(drain_s=1)
    assert _stored(clean_db, ids) == [("kept", "complete", 0), ("", "streaming", 0)]


def _late(session_id: uuid.UUID, *, new: bool, token: str | None, question: str = "What is a ZMP?") -> LateQuestion:
    return LateQuestion(
        session_id=session_id,
        new_session=new,
        token_hash=None if token is None else hash_token(token),
        user_id=None,
        user_message_id=uuid.uuid4(),
        asked_at=datetime.now(UTC),
        question=question,
        module_filter="01-foundations",
        client_request_id=uuid.uuid4(),
    )


def _conversation(url: str, session_id: uuid.UUID) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT role, content, status FROM chat_messages WHERE session_id = %s ORDER BY created_at, role DESC",
            (session_id,),
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_a_question_the_store_missed_is_written_with_its_answer_into_a_new_session(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    writer = AnswerWriter(store, tmp_path / "spill")
    await writer.start()
    session_id, answer_id = uuid.uuid4(), uuid.uuid4()
    late = _late(session_id, new=True, token="nobody-holds-this")
    await asyncio.wait_for(writer.submit(answer_id, _answer(0), late), timeout=10)
    # The same request retried: written once.
    again = replace(_late(session_id, new=True, token="nobody-holds-this"), client_request_id=late.client_request_id)
    await asyncio.wait_for(writer.submit(uuid.uuid4(), _answer(1), again), timeout=10)
    await writer.close(drain_s=1)
    assert _conversation(clean_db, session_id) == [
        ("user", "What is a ZMP?", "complete"),
        ("assistant", "answer 0 [1]", "complete"),
    ]
    assert _stored(clean_db, [answer_id]) == [("answer 0 [1]", "complete", 1)]


async def test_a_missed_question_goes_only_into_a_session_its_asker_owns(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    owned = await store.create_session()
    writer = AnswerWriter(store, tmp_path / "spill")
    await writer.start()
    mine = writer.submit(uuid.uuid4(), _answer(0), _late(owned.id, new=False, token=owned.token, question="mine"))
    forged = writer.submit(uuid.uuid4(), _answer(1), _late(owned.id, new=False, token="a guess", question="forged"))
    tokenless = writer.submit(uuid.uuid4(), _answer(2), _late(owned.id, new=False, token=None, question="none"))
    gone = writer.submit(uuid.uuid4(), _answer(3), _late(uuid.uuid4(), new=False, token=owned.token, question="gone"))
    await asyncio.wait_for(asyncio.gather(mine, forged, tokenless, gone), timeout=10)
    await writer.close(drain_s=1)
    assert _conversation(clean_db, owned.id) == [
        ("user", "mine", "complete"),
        ("assistant", "answer 0 [1]", "complete"),
    ]
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM chat_messages").fetchone() == (2,)


async def test_a_missed_question_unwritten_at_shutdown_is_spilled_with_its_answer_and_written_at_the_next_start(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    session_id, answer_id = uuid.uuid4(), uuid.uuid4()
    away = Store(create_pool(CLOSED_PORT_PG_URL, timeout_s=0.3), timeout_s=0.3)
    await away.open()
    try:
        down = AnswerWriter(away, spill)
        await down.start()
        down.submit(answer_id, _answer(0), _late(session_id, new=True, token="t"))
        await asyncio.sleep(0.5)  # its first write fails: the writer knows the database is away
        loop = asyncio.get_running_loop()
        started = loop.time()
        await down.close(drain_s=30)
        assert loop.time() - started < 5  # nothing to wait for in an outage: spilled at once
    finally:
        await away.close()
    assert _conversation(clean_db, session_id) == []
    back = AnswerWriter(store, spill)
    await back.start()
    for _ in range(100):
        if _conversation(clean_db, session_id) and not list(spill.glob("*.jsonl")):
            break
        await asyncio.sleep(0.05)
    await back.close(drain_s=1)
    assert _conversation(clean_db, session_id) == [
        ("user", "What is a ZMP?", "complete"),
        ("assistant", "answer 0 [1]", "complete"),
    ]
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT module_filter FROM chat_messages WHERE role = 'user'").fetchone() == (
            "01-foundations",
        )


async def test_text_postgres_cannot_hold_is_stored_with_replacement_characters(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    ids = await _exchanges(store, 2)
    writer = AnswerWriter(store, tmp_path / "spill")
    await writer.start()
    hostile = Completion(content="a NUL \x00 and a lone \ud800 [1]", status="complete", model="m\udfff")
    await asyncio.wait_for(asyncio.gather(writer.submit(ids[0], hostile), writer.submit(ids[1], _answer(1))), 10)
    await writer.close(drain_s=1)
    assert _stored(clean_db, ids) == [
        ("a NUL \ufffd and a lone \ufffd [1]", "complete", 0),
        ("answer 1 [1]", "complete", 1),
    ]
    assert not (tmp_path / "spill").exists()


async def test_an_answer_postgres_refuses_is_set_aside_ended_as_failed_and_the_rest_of_its_batch_is_written(
    store: Store, clean_db: str, tmp_path: Path
) -> None:
    ids = await _exchanges(store, 4)
    spill = tmp_path / "spill"
    writer = AnswerWriter(store, spill)
    await writer.start()
    bad = Completion(content="a count no integer column holds", status="complete", prompt_tokens=2**40)
    batch = [writer.submit(ids[0], _answer(0)), writer.submit(ids[1], bad), writer.submit(ids[2], _answer(2))]
    await asyncio.wait_for(asyncio.gather(*batch), timeout=10)
    await asyncio.wait_for(writer.submit(ids[3], _answer(3)), timeout=10)  # the writer goes on
    await writer.close(drain_s=1)
    assert _stored(clean_db, ids) == [
        ("answer 0 [1]", "complete", 1),
        ("", "failed", 0),  # never left `streaming`: its history would offer a stream nobody serves
        ("answer 2 [1]", "complete", 1),
        ("answer 3 [1]", "complete", 1),
    ]
    (rejected,) = spill.glob("rejected-*.jsonl")
    assert json.loads(rejected.read_text())["message_id"] == str(ids[1])
    again = AnswerWriter(store, spill)  # a restart does not try it again
    await again.start()
    await again.close(drain_s=0.2)
    assert list(spill.glob("*.jsonl")) == [rejected]
