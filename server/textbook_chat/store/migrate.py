"""Alembic, in process: the migrations in ``migrations/`` (or the wheel's copy) applied to a database URL, and
which revision is newest."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from textbook_chat.core import resources

if TYPE_CHECKING:
    from alembic.config import Config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(_config(url), revision)


def _config(url: str) -> Config:
    from alembic.config import Config

    files = resources.current()
    config = Config(str(files.alembic_ini))
    config.set_main_option("script_location", str(files.migrations))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolates %
    return config


@functools.cache
def revisions() -> tuple[frozenset[str], frozenset[str]]:
    """Every revision in ``migrations/versions`` and the newest one(s), read from the files without importing
    Alembic (the server asks this for /health; Alembic with SQLAlchemy would add ~20 MB to it)."""
    known: set[str] = set()
    replaced: set[str] = set()
    for path in (resources.current().migrations / "versions").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        revision = re.search(r"^revision\b[^=\n]*=\s*[\"']([^\"']+)[\"']", text, re.M)
        if revision is None:
            continue
        known.add(revision.group(1))
        down = re.search(r"^down_revision\b[^=\n]*=\s*(.+)$", text, re.M)
        if down is not None:
            replaced.update(re.findall(r"[\"']([^\"']+)[\"']", down.group(1)))
    return frozenset(known), frozenset(known - replaced)


def pending(applied: set[str]) -> bool:
    """Whether a database at ``applied`` (its ``alembic_version`` rows) still needs ``migrate``; a database newer
    than this code (a revision it does not know) is not pending."""
    known, heads = revisions()
    if not known:
        return False  # no migrations shipped with this copy: nothing to compare with
    return not applied or (applied <= known and not applied & heads)
