"""Chat sessions, messages and source citations (docs/schema.md).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE chat_sessions (
            id uuid PRIMARY KEY,
            user_id text NULL,
            token_hash text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            last_activity_at timestamptz NOT NULL DEFAULT now(),
            metadata jsonb NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    op.execute("CREATE INDEX ix_chat_sessions_last_activity_at ON chat_sessions (last_activity_at)")
    op.execute("CREATE INDEX ix_chat_sessions_user_id ON chat_sessions (user_id, last_activity_at DESC)")
    op.execute(
        """
        CREATE TABLE chat_messages (
            id uuid PRIMARY KEY,
            session_id uuid NOT NULL REFERENCES chat_sessions (id) ON DELETE CASCADE,
            role text NOT NULL CHECK (role IN ('user', 'assistant')),
            content text NOT NULL DEFAULT '',
            status text NOT NULL DEFAULT 'complete'
                CHECK (status IN ('streaming', 'complete', 'interrupted', 'failed')),
            mode text NOT NULL DEFAULT 'textbook' CHECK (mode IN ('textbook', 'selection')),
            module_filter text NULL,
            selected_text text NULL,
            confidence real NULL CHECK (confidence IS NULL OR (confidence >= 0 AND confidence <= 1)),
            model text NULL,
            prompt_tokens integer NULL CHECK (prompt_tokens IS NULL OR prompt_tokens >= 0),
            completion_tokens integer NULL CHECK (completion_tokens IS NULL OR completion_tokens >= 0),
            latency_ms integer NULL CHECK (latency_ms IS NULL OR latency_ms >= 0),
            feedback text NULL CHECK (feedback IS NULL OR feedback IN ('up', 'down')),
            feedback_comment text NULL,
            client_request_id uuid NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp()
        )
        """
    )
    op.execute("CREATE INDEX ix_chat_messages_session_created ON chat_messages (session_id, created_at)")
    # A repeated POST with the same client_request_id attaches to the first question (docs/http-api.md, ChatRequest).
    op.execute(
        "CREATE UNIQUE INDEX ux_chat_messages_client_request ON chat_messages (client_request_id) "
        "WHERE client_request_id IS NOT NULL AND role = 'user'"
    )
    op.execute(
        """
        CREATE TABLE source_citations (
            id uuid PRIMARY KEY,
            message_id uuid NOT NULL REFERENCES chat_messages (id) ON DELETE CASCADE,
            position integer NOT NULL CHECK (position >= 1),
            chunk_id text NOT NULL,
            module text NULL,
            chapter text NULL,
            title text NULL,
            url text NOT NULL,
            relevance_score real NULL,
            excerpt text NULL,
            CONSTRAINT uq_source_citations_message_position UNIQUE (message_id, position)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS source_citations")
    op.execute("DROP TABLE IF EXISTS chat_messages")
    op.execute("DROP TABLE IF EXISTS chat_sessions")
