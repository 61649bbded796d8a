"""Alembic, in process: the migrations in ``migrations/`` (or the wheel's copy) applied to a database URL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.core import resources

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
