"""Keep with each citation the heading path of the section it cites, so that the session's next question can read
what the book calls the thing it points back to ("How do I add an account for it?" after an answer from "Secure
domain setup"): its retrieval in context searches with the subject's words those headings hold.

Null for every citation stored before (the page title then stands alone).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # A nullable column without a default is a catalogue change: no rewrite, a brief lock.
    op.execute("ALTER TABLE source_citations ADD COLUMN heading_path text[]")


def downgrade() -> None:
    op.execute("ALTER TABLE source_citations DROP COLUMN heading_path")
