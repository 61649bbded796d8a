"""Finished answers are written in batches, waited for while Postgres is away, and spilled to disk on shutdown."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import psycopg

from server.store.database import create_pool
from server.store.rows import Citation, Completion
from server.store.sessions import Store
from server.store.writes import AnswerWriter
from tests.conftest import CLOSED_PORT_PG_URL


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
