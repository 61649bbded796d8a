"""Logging set-up: one JSON object per line (or plain text), with the request and message ids of the current work.

Question text is logged only at debug level (docs/settings.md: LOG_LEVEL); ``configure`` may run any number
of times (each app, each command) and always leaves exactly one handler of ours on the root logger.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
message_id_var: ContextVar[str | None] = ContextVar("message_id", default=None)

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_IDS = ("request_id", "message_id")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _IDS:
            value = getattr(record, key, None)
            if value and value != "-":  # "-" is the text format's placeholder for "no request"
                entry[key] = value
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in entry and key not in _IDS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        message_id = getattr(record, "message_id", None)
        return f"{line} (message {message_id})" if message_id else line


class _ContextFilter(logging.Filter):
    """Fills in the ids from the context of the code that logs, unless the call passed them in ``extra``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = request_id_var.get() or "-"
        if not getattr(record, "message_id", None):
            record.message_id = message_id_var.get()
        return True


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream it was when configured.

    A test runner swaps ``sys.stderr`` per test and closes the old one; a handler holding it would print
    "--- Logging error --- ValueError: I/O operation on closed file" for every later record.
    """

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ assigns it; the property always wins
        pass


def configure(level: str = "info", fmt: str = "json") -> None:
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    # Replace only our own handler: others (a test runner's capture) stay attached.
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _StderrHandler)] + [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # uvicorn's own handlers would print a second, unstructured line; route its loggers to ours.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def bind_message(message_id: str) -> None:
    """Every later log line of this task (and of tasks it starts) carries ``message_id``."""
    message_id_var.set(message_id)
