"""The schema migrates up from a blank database, down to base and up again, with its cascades."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from alembic import command

from tests.conftest import alembic_config, create_database, drop_database


@pytest.fixture
def scratch_url() -> Iterator[str]:
    url = create_database("textbook_migrate")
    yield url
    drop_database(url)


def _columns(url: str, table: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
        ).fetchall()
    return {row[0] for row in rows}


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {row[0] for row in rows}


def test_upgrade_downgrade_upgrade_round_trip(scratch_url: str) -> None:
    config = alembic_config(scratch_url)
    command.upgrade(config, "head")
    assert {"chat_sessions", "chat_messages", "source_citations"} <= _tables(scratch_url)
    assert _columns(scratch_url, "chat_sessions") == {
        "id", "user_id", "token_hash", "created_at", "last_activity_at", "metadata"
    }  # fmt: skip
    assert {
        "id", "session_id", "role", "content", "status", "mode", "module_filter", "selected_text", "confidence",
        "model", "prompt_tokens", "completion_tokens", "latency_ms", "feedback", "feedback_comment",
        "client_request_id", "created_at", "standalone", "stream_marks",
    } == _columns(scratch_url, "chat_messages")  # fmt: skip
    report_tables = {"question_vectors", "gap_topics", "gap_topic_days", "question_days"}
    assert report_tables <= _tables(scratch_url)
    command.downgrade(config, "0001")
    assert not report_tables & _tables(scratch_url)
    assert {"chat_sessions", "chat_messages", "source_citations"} <= _tables(scratch_url)
    command.downgrade(config, "base")
    assert not {"chat_sessions", "chat_messages", "source_citations"} & _tables(scratch_url)
    command.upgrade(config, "head")
    assert {"chat_sessions", "chat_messages", "source_citations"} <= _tables(scratch_url)


def _a_cited_answer(conn: psycopg.Connection[Any]) -> uuid.UUID:
    """A session holding one answer with one citation, in the columns every revision has; its session's id."""
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    conn.execute("INSERT INTO chat_sessions (id, token_hash) VALUES (%s, 'h')", (session_id,))
    conn.execute(
        "INSERT INTO chat_messages (id, session_id, role, content) VALUES (%s, %s, 'assistant', 'hi')",
        (message_id, session_id),
    )
    conn.execute(
        "INSERT INTO source_citations (id, message_id, position, chunk_id, url) VALUES (%s, %s, 1, 'c', 'u')",
        (uuid.uuid4(), message_id),
    )
    return session_id


def test_deleting_a_session_cascades_to_messages_and_citations(scratch_url: str) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    with psycopg.connect(scratch_url) as conn:
        session_id = _a_cited_answer(conn)
        conn.execute("DELETE FROM chat_sessions WHERE id = %s", (session_id,))
        counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone() for t in ("chat_messages", "source_citations")]
    assert counts == [(0,), (0,)]


@pytest.mark.parametrize(
    ("column", "value"),
    [("role", "system"), ("status", "done"), ("feedback", "meh"), ("mode", "other"), ("confidence", 1.5)],
)
def test_checks_refuse_values_outside_the_contract(scratch_url: str, column: str, value: object) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    session_id = uuid.uuid4()
    row: dict[str, object] = {"id": uuid.uuid4(), "session_id": session_id, "role": "user", column: value}
    insert = psycopg.sql.SQL("INSERT INTO chat_messages ({}) VALUES ({})").format(
        psycopg.sql.SQL(", ").join(map(psycopg.sql.Identifier, row)),
        psycopg.sql.SQL(", ").join(psycopg.sql.Placeholder() * len(row)),
    )
    with psycopg.connect(scratch_url) as conn:
        conn.execute("INSERT INTO chat_sessions (id, token_hash) VALUES (%s, 'h')", (session_id,))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, list(row.values()))


def test_a_repeated_requests_question_and_answer_are_both_found_by_index(scratch_url: str) -> None:
    command.upgrade(alembic_config(scratch_url), "head")
    with psycopg.connect(scratch_url) as conn:
        conn.execute("SET enable_seqscan = off")  # which plan is possible, not which a tiny table prefers
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                """
                EXPLAIN SELECT u.id, a.id FROM chat_messages u
                JOIN chat_messages a ON a.client_request_id = u.client_request_id AND a.role = 'assistant'
                WHERE u.client_request_id = %s AND u.role = 'user'
                """,
                (uuid.uuid4(),),
            ).fetchall()
        )
    assert "Seq Scan" not in plan
    assert "ux_chat_messages_client_request" in plan and "ix_chat_messages_answer_request" in plan


def test_the_standalone_form_is_kept_on_questions_only_and_goes_with_a_downgrade(scratch_url: str) -> None:
    config = alembic_config(scratch_url)
    command.upgrade(config, "0003")
    session_id, before = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(scratch_url) as conn:
        conn.execute("INSERT INTO chat_sessions (id, token_hash) VALUES (%s, 'h')", (session_id,))
        conn.execute(
            "INSERT INTO chat_messages (id, session_id, role, content) VALUES (%s, %s, 'user', 'What is Gazebo?')",
            (before, session_id),
        )
    command.upgrade(config, "head")
    insert = "INSERT INTO chat_messages (id, session_id, role, content, standalone) VALUES (%s, %s, %s, %s, %s)"
    with psycopg.connect(scratch_url) as conn:
        assert conn.execute("SELECT standalone FROM chat_messages WHERE id = %s", (before,)).fetchone() == (None,)
        conn.execute(
            insert, (uuid.uuid4(), session_id, "user", "How do I install it?", "How do I install it? (Gazebo)")
        )
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, (uuid.uuid4(), session_id, "assistant", "Like this.", "How do I install it? (Gazebo)"))
    command.downgrade(config, "0003")
    assert "standalone" not in _columns(scratch_url, "chat_messages")
    assert len(_columns(scratch_url, "chat_messages")) == 17


def test_stream_marks_are_kept_on_answers_only_and_go_with_a_downgrade(scratch_url: str) -> None:
    config = alembic_config(scratch_url)
    command.upgrade(config, "head")
    session_id = uuid.uuid4()
    insert = "INSERT INTO chat_messages (id, session_id, role, content, stream_marks) VALUES (%s, %s, %s, %s, %s)"
    with psycopg.connect(scratch_url) as conn:
        conn.execute("INSERT INTO chat_sessions (id, token_hash) VALUES (%s, 'h')", (session_id,))
        conn.execute(insert, (uuid.uuid4(), session_id, "assistant", "Like this.", [0, 0, 5, 10]))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, (uuid.uuid4(), session_id, "user", "How?", [0, 0, 4]))
    command.downgrade(config, "0004")
    assert "stream_marks" not in _columns(scratch_url, "chat_messages")


def test_a_citations_heading_path_is_null_for_citations_stored_before_and_goes_with_a_downgrade(
    scratch_url: str,
) -> None:
    config = alembic_config(scratch_url)
    command.upgrade(config, "0005")
    with psycopg.connect(scratch_url) as conn:
        _a_cited_answer(conn)
    command.upgrade(config, "head")
    with psycopg.connect(scratch_url) as conn:
        assert conn.execute("SELECT heading_path FROM source_citations").fetchall() == [(None,)]
    command.downgrade(config, "0005")
    assert "heading_path" not in _columns(scratch_url, "source_citations")
