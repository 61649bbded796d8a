"""What every generator yields and takes: the ``Generator`` protocol, its events and its request.

A generator (the chat model in ``generation.py``, the offline one in ``offline.py``) takes a
``GenerationRequest`` and yields ``Token``s and ``GenNotice``s, then one ``Finished``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from textbook_chat.answer.prompts import Turn

if TYPE_CHECKING:
    from textbook_chat.search.retrieval import Source

FinishReason = Literal["stop", "length", "declined", "fallback", "cancelled"]


@dataclass(frozen=True)
class Token:
    text: str


@dataclass(frozen=True)
class GenNotice:
    code: str
    message: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    usage: Usage
    model: str


GenEvent = Token | GenNotice | Finished


@dataclass(frozen=True)
class GenerationRequest:
    question: str
    sources: Sequence[Source]
    history: Sequence[Turn]
    mode: str
    selected_text: str | None = None
    low_confidence: bool = False
    # The question with the context retrieval took from the conversation (``search/context.py``): what the
    # offline answer's cross-encoder reads; None when the question took none. The model reads the history.
    standalone: str | None = None
    book_title: str | None = None  # what the model's instructions call the book (``prompts.build_messages``)


class Generator(Protocol):
    name: str

    def stream(self, request: GenerationRequest) -> AsyncIterator[GenEvent]: ...

    def warm_up(self) -> None: ...

    async def aclose(self) -> None: ...
