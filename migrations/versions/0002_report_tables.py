"""The gap report's tables: question vectors (a cache), and the counts purge keeps after the words go.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # The embedder's vector of each question, filled by the report; it goes with the question.
    op.execute(
        """
        CREATE TABLE question_vectors (
            message_id uuid PRIMARY KEY REFERENCES chat_messages (id) ON DELETE CASCADE,
            model text NOT NULL,
            vector bytea NOT NULL
        )
        """
    )
    # Topics of purged gap questions: a label (a topic's most telling words) and its centre, no question text.
    op.execute(
        """
        CREATE TABLE gap_topics (
            id uuid PRIMARY KEY,
            model text NOT NULL,
            label text NOT NULL,
            centroid bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE gap_topic_days (
            topic_id uuid NOT NULL REFERENCES gap_topics (id) ON DELETE CASCADE,
            day date NOT NULL,
            questions integer NOT NULL CHECK (questions >= 0),
            PRIMARY KEY (topic_id, day)
        )
        """
    )
    # Every purged question, counted per day and module ('' = the whole book), with no ids and no text.
    op.execute(
        """
        CREATE TABLE question_days (
            day date NOT NULL,
            module text NOT NULL DEFAULT '',
            questions integer NOT NULL CHECK (questions >= 0),
            gaps integer NOT NULL CHECK (gaps >= 0),
            selection integer NOT NULL CHECK (selection >= 0),
            PRIMARY KEY (day, module)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS question_days")
    op.execute("DROP TABLE IF EXISTS gap_topic_days")
    op.execute("DROP TABLE IF EXISTS gap_topics")
    op.execute("DROP TABLE IF EXISTS question_vectors")
