"""What the chat stage is asked: one reader's question, already read and validated by the web stage.

The HTTP body (``web.schemas.ChatRequest``, with its JSON Schema and the fields only a browser sends) stays at
the edge: ``web`` parses it and hands on a ``Question``, so a field the chat stage needs is added here once and
read wherever the run needs it, and nothing in ``server/textbook_chat/chat`` knows how the question arrived.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from textbook_chat.core.modes import Mode, mode_of


@dataclass(frozen=True)
class SessionRef:
    """The conversation the question continues: none for a first question, else its id and the token proving it."""

    id: uuid.UUID | None = None
    token: str | None = None


@dataclass(frozen=True)
class Asker:
    """Who asks: ``key`` is the rate-limit identity (``user:<id>`` or ``ip:<client address>``); only its digest
    is stored, to tell a repeated first question from the same client apart from anyone else's."""

    key: str
    user_id: str | None = None


@dataclass(frozen=True)
class Question:
    text: str
    asker: Asker
    session: SessionRef = SessionRef()
    module: str | None = None  # the module to search first (a module id of the index)
    selected_text: str | None = None  # the passage the reader selected and asks about
    client_request_id: uuid.UUID | None = None  # a retry or double click with this id attaches to the first answer

    @property
    def mode(self) -> Mode:
        return mode_of(self.selected_text)
