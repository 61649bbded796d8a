"""Keep with a question the standalone form retrieval used: the question with the context it took from the session.

"How do I install it?" asked after "What is Gazebo?" is stored as asked, and beside it "How do I install it?
(Gazebo)": the next follow-up reads it, the authors' report groups the question under what it was about, and
``eval`` can replay it. Null for a question that took no context (and for every question stored before).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # A nullable column without a default is a catalogue change, no rewrite; the check is added NOT VALID (no
    # scan under the table's lock: every existing row holds it, null) and validated under a lighter lock.
    op.execute("ALTER TABLE chat_messages ADD COLUMN standalone text")
    op.execute(
        "ALTER TABLE chat_messages ADD CONSTRAINT ck_chat_messages_standalone_question "
        "CHECK (standalone IS NULL OR role = 'user') NOT VALID"
    )
    op.execute("ALTER TABLE chat_messages VALIDATE CONSTRAINT ck_chat_messages_standalone_question")


def downgrade() -> None:
    op.execute("ALTER TABLE chat_messages DROP COLUMN standalone")  # its check goes with it
