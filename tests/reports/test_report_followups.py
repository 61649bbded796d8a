"""The gap report groups a follow-up under what it was about: its standalone form, not its vague own words."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.report_data import BREAD, FOOTBALL
from textbook_chat.index.embeddings import LocalEmbedder
from textbook_chat.reports import report
from textbook_chat.store.sessions import Store

FOLLOW_UP = "How do I install it?"
# Declined first questions on two subjects the demo book never covers, and the follow-up asked after some of them.
SUBJECTS = {
    "sourdough bread starter": BREAD[:6],
    "football World Cup": FOOTBALL[:6],
}


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    return LocalEmbedder(tmp_path_factory.mktemp("embedder"))


def _seed(url: str, *, with_standalone: bool) -> None:
    """Six sessions per subject asking about it; in two of each, the declined follow-up "How do I install it?"."""
    now = datetime.now(UTC)
    with psycopg.connect(url) as conn:
        for n, (subject, asked) in enumerate(SUBJECTS.items()):
            for i, question in enumerate(asked):
                sid, at = uuid.uuid4(), now - timedelta(hours=n * 10 + i)
                conn.execute(
                    "INSERT INTO chat_sessions (id, token_hash, created_at, last_activity_at) VALUES (%s, 'h', %s, %s)",
                    (sid, at, at),
                )
                turns: list[tuple[str, str | None]] = [(question, None)]
                if i < 2:
                    turns.append((FOLLOW_UP, f"{FOLLOW_UP} ({subject})" if with_standalone else None))
                for t, (text, standalone) in enumerate(turns):
                    asked_at = at + timedelta(minutes=t)
                    conn.execute(
                        "INSERT INTO chat_messages (id, session_id, role, content, standalone, created_at) "
                        "VALUES (%s, %s, 'user', %s, %s, %s)",
                        (uuid.uuid4(), sid, text, standalone, asked_at),
                    )
                    conn.execute(
                        "INSERT INTO chat_messages (id, session_id, role, content, model, confidence, created_at) "
                        "VALUES (%s, %s, 'assistant', 'The book does not cover this.', 'decline', 0.1, %s)",
                        (uuid.uuid4(), sid, asked_at + timedelta(seconds=2)),
                    )


async def _topics(store: Store, embedder: LocalEmbedder) -> list[report.Topic]:
    async with store.connection(timeout_s=120) as conn:
        return (await report.build(conn, embedder)).topics


@pytest.mark.slow
async def test_a_follow_up_is_counted_in_the_topic_of_what_it_was_about(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    _seed(clean_db, with_standalone=True)
    topics = await _topics(store, embedder)
    assert sorted(t.questions for t in topics) == [8, 8]
    assert all(any(e != f"{FOLLOW_UP}" for e in t.examples) for t in topics)


async def test_without_a_standalone_form_the_follow_ups_stand_apart_as_asked(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    """Questions stored before the standalone form existed (or that took no context) read as they were asked:
    the four "How do I install it?" are a topic of their own, about nothing."""
    _seed(clean_db, with_standalone=False)
    topics = await _topics(store, embedder)
    assert sorted(t.questions for t in topics) == [4, 6, 6]
    assert any(set(t.examples) == {FOLLOW_UP} for t in topics)
