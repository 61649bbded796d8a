"""Find a repeated request's answer by its client_request_id through an index, not a scan of every message.

A repeat (a double click, a retry) is matched to its first question by the unique index on questions; its
answer, which carries the same client_request_id, had no index, so finding it read the whole table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # CONCURRENTLY: a server keeps writing answers while a large table is indexed (it cannot run in a transaction).
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_chat_messages_answer_request ON chat_messages "
            "(client_request_id) WHERE client_request_id IS NOT NULL AND role = 'assistant'"
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_chat_messages_answer_request")
