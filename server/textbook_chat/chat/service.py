"""What an exchange and its answer's run share: the chat service's clients and what starting one returns."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from textbook_chat.answer.faq import Faq
from textbook_chat.answer.generation import Generator
from textbook_chat.answer.rewrite import Rewriter
from textbook_chat.search.retrieval import Retriever
from textbook_chat.store.rows import SessionToCreate
from textbook_chat.store.sessions import Store
from textbook_chat.store.writes import AnswerWriter
from textbook_chat.streams.capabilities import Capabilities
from textbook_chat.streams.streaming import StreamRegistry


@dataclass
class ChatService:
    store: Store | None
    registry: StreamRegistry
    retriever: Retriever | None
    generator: Generator
    faq: Faq
    capabilities: Capabilities
    llm_enabled: bool
    daily_tokens: int = 50_000  # SESSION_DAILY_TOKENS: a session's budget over the last 24 hours
    writer: AnswerWriter | None = None  # writes finished answers (with the store)
    rewriter: Rewriter | None = None  # FOLLOW_UP_REWRITE=on with a model: a follow-up needing context is rewritten


@dataclass(frozen=True)
class Started:
    message_id: uuid.UUID
    session_id: uuid.UUID
    session_token: str | None
    stream_url: str
    created: bool


@dataclass(frozen=True)
class Session:
    id: uuid.UUID
    token: str | None  # only for a session created by this request
    persisted: bool
    to_create: SessionToCreate | None = None  # a new session, stored with the question (one round trip)
