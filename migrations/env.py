"""Alembic environment: synchronous, psycopg 3 driver (SQLAlchemy 2.1 installs no greenlet for an async engine)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from textbook_chat.core.settings import Settings


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url
    if not url:
        raise SystemExit("DATABASE_URL is not set: nothing to migrate.")
    return sqlalchemy_url(url)


def sqlalchemy_url(url: str) -> str:
    """postgresql://… → postgresql+psycopg://… so SQLAlchemy uses psycopg 3, not psycopg2."""
    scheme, rest = url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in ("postgresql", "postgres") else url


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
