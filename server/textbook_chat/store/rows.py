"""What the store reads and writes, as values: sessions, messages, exchanges, completions and citations."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from textbook_chat.core.modes import Mode

Role = Literal["user", "assistant"]
Status = Literal["streaming", "complete", "interrupted", "failed"]
Rating = Literal["up", "down"]


@dataclass(frozen=True)
class NewSession:
    id: uuid.UUID
    token: str  # shown to the client once; only its hash is stored


@dataclass(frozen=True)
class SessionToCreate:
    """A session made in the process (its id and token) and stored with its first question (``start_exchange``)."""

    id: uuid.UUID
    token: str  # shown to the client once; only its hash is stored
    user_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, *, user_id: str | None = None, metadata: dict[str, Any] | None = None) -> SessionToCreate:
        return cls(uuid.uuid4(), secrets.token_urlsafe(32), user_id, metadata or {})


@dataclass(frozen=True)
class SessionRow:
    id: uuid.UUID
    user_id: str | None
    created_at: datetime
    last_activity_at: datetime
    metadata: dict[str, Any]


@dataclass(frozen=True)
class SessionSummary:
    id: uuid.UUID
    created_at: datetime
    last_activity_at: datetime
    title: str  # the first question, shortened
    message_count: int


@dataclass(frozen=True)
class Citation:
    position: int
    chunk_id: str
    module: str | None
    chapter: str | None
    title: str | None
    url: str
    relevance_score: float | None
    excerpt: str | None
    heading_path: tuple[str, ...] = ()  # the cited section's headings, page first (none for citations stored before)


@dataclass(frozen=True)
class MessageRow:
    id: uuid.UUID
    session_id: uuid.UUID
    role: Role
    content: str
    status: Status
    mode: Mode
    module_filter: str | None
    selected_text: str | None
    confidence: float | None
    model: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: int | None
    feedback: Rating | None
    feedback_comment: str | None
    client_request_id: uuid.UUID | None
    created_at: datetime
    citations: tuple[Citation, ...] = field(default=())
    # An answer's characters streamed through each live event (Completion.stream_marks); read by get_message only.
    stream_marks: Sequence[int] | None = None


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A message of the conversation as a prompt's history reads it: a question, or an answer that completed."""

    id: uuid.UUID
    role: Role
    content: str
    standalone: str | None = None  # a question's standalone form, as retrieval read it in its session
    # An answer's: the (page title, heading path) of each section it cited, in citation order (``context.Earlier``).
    sections: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Exchange:
    """One question: the stored user message and the assistant message that answers it."""

    session_id: uuid.UUID
    user_message_id: uuid.UUID
    assistant_message_id: uuid.UUID
    created: bool  # False when a client_request_id matched an earlier question
    # For a matched earlier question: who asked it, so a repeat can be checked to come from the same caller.
    question: str | None = None
    owner_user_id: str | None = None
    caller_digest: str | None = None


@dataclass(frozen=True)
class Completion:
    """What the assistant message holds when generation ends."""

    content: str
    status: Status
    confidence: float | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: int | None = None
    citations: Sequence[Citation] = ()
    # The question answered (its message id) and the standalone form retrieval used for it, written to it
    # with the answer; None when the question took no context from its session.
    question_id: uuid.UUID | None = None
    standalone: str | None = None
    # How many characters of ``content`` had been streamed once each live event was out (the i-th for event i + 1,
    # up to the terminal one): a reader resuming from the stored answer gets the rest (streams/replay.py).
    stream_marks: Sequence[int] = ()


@dataclass(frozen=True)
class LateQuestion:
    """A question the store could not take when it was asked (the database away, or too slow to answer in
    time): the answer writer writes it with its answer once the database is back, so nothing a reader wrote
    is lost. It is written only into a session ``token_hash`` or ``user_id`` owns, checked at write time, as
    when it was asked; ``new_session`` creates that session (its token never reached the reader)."""

    session_id: uuid.UUID
    new_session: bool
    token_hash: str | None
    user_id: str | None
    user_message_id: uuid.UUID
    asked_at: datetime
    question: str
    mode: Mode = "textbook"
    module_filter: str | None = None
    selected_text: str | None = None
    client_request_id: uuid.UUID | None = None
    session_metadata: dict[str, Any] = field(default_factory=dict)


def hash_token(token: str) -> str:
    # Session tokens are 256-bit random values, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()
