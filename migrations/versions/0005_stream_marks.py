"""Keep with an answer where each of its live events ended in its text, so a reader who resumes from the stored
answer (the live events gone: a restart, another process without Redis) gets the rest of the text, not all of it
again or none of it.

``stream_marks[i]`` is how many characters of ``content`` had been streamed once event ``i + 1`` was out, for every
event before the terminal one. Null for an answer that failed (its replay is an error) and for every answer stored
before.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # A nullable column without a default is a catalogue change, no rewrite; the check is added NOT VALID (no
    # scan under the table's lock: every existing row holds it, null) and validated under a lighter lock.
    op.execute("ALTER TABLE chat_messages ADD COLUMN stream_marks integer[]")
    op.execute(
        "ALTER TABLE chat_messages ADD CONSTRAINT ck_chat_messages_stream_marks_answer "
        "CHECK (stream_marks IS NULL OR role = 'assistant') NOT VALID"
    )
    op.execute("ALTER TABLE chat_messages VALIDATE CONSTRAINT ck_chat_messages_stream_marks_answer")


def downgrade() -> None:
    op.execute("ALTER TABLE chat_messages DROP COLUMN stream_marks")  # its check goes with it
