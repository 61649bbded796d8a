"""A stored answer as SSE events, for a reader who comes back after the live events have expired.

Postgres keeps the answer, not its events, so the replay is the same protocol in fewer events:
``meta``, ``sources`` (the cited ones, which is what is stored), one ``token`` with the text, then
``done`` (or ``error`` for a failed answer, or for one whose generating worker is gone).

An answer stored with its ``stream_marks`` (where each live event ended in its text) replays in the live stream's
numbering: a reader who resumes after event N (the live events gone: a restart, another process without Redis)
gets the text after what event N had brought, as one ``token`` numbered as the live stream's last one, then the
terminal event numbered as the live one was. Without marks (answers stored before them) the events are numbered
from 1, and only a reader with nothing yet can be given the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textbook_chat.answer.generation import invalid_markers
from textbook_chat.search import confidence
from textbook_chat.store.rows import MessageRow
from textbook_chat.streams.events import Event

_FINISH = {"complete": "stop", "interrupted": "cancelled"}


def events(message: MessageRow, *, stream_url: str, after: int = 0) -> list[Event]:
    """The stored answer's events after event ``after`` (every one, numbered, for ``after`` 0)."""
    score = message.confidence if message.confidence is not None else 0.0
    meta = {
        "message_id": str(message.id),
        "session_id": str(message.session_id),
        "stream_url": stream_url,
        "mode": message.mode,
        "confidence": round(score, 4),
        "confidence_level": confidence.level(score) if message.confidence is not None else "none",
        "scope": {
            "requested_module": message.module_filter,
            "searched": "module" if message.module_filter else "all",
            "note": None,
        },
    }
    if message.status in _FINISH:
        terminal = ("done", _done(message, _FINISH[message.status]))
    elif message.status == "failed":
        terminal = ("error", {"code": "generation_failed", "message": _FAILED, "retryable": True})
    else:  # still "streaming" in Postgres, but no worker has it live: that worker died mid-answer
        terminal = ("error", {"code": "generation_lost", "message": _LOST, "retryable": True})
    items: list[tuple[int, str, dict[str, Any]]] = [(1, "meta", meta), (2, "sources", {"sources": _sources(message)})]
    marks = _marks(message)
    if marks is None:  # numbered from 1: meta, sources, the whole text, the end
        if message.content:
            items.append((3, "token", {"text": message.content}))
        items.append((len(items) + 1, *terminal))
    else:  # the live stream's numbering: the text after what event ``after`` had brought, then the end
        last = len(marks)
        rest = message.content[marks[after - 1] if after > 0 else 0 :] if after < last else ""
        if rest:
            items.append((last, "token", {"text": rest}))
        items.append((last + 1, *terminal))
    return [Event(id=n, event=kind, data=data) for n, kind, data in items if n > after]  # type: ignore[arg-type]


def resumable(message: MessageRow) -> bool:
    """Whether a reader who resumes after any event gets exactly the rest of the stored text (it has stream marks)."""
    return _marks(message) is not None


def _marks(message: MessageRow) -> Sequence[int] | None:
    """The answer's stream marks if they can be trusted: past meta and sources, never decreasing, within the text."""
    marks = message.stream_marks
    if not marks or len(marks) < 2 or marks[0] != 0 or marks[-1] > len(message.content):
        return None
    if any(later < earlier for earlier, later in zip(marks, marks[1:], strict=False)):
        return None
    return marks


def _sources(message: MessageRow) -> list[dict[str, Any]]:
    return [
        {
            "n": c.position,
            "chunk_id": c.chunk_id,
            "file_path": "",  # not stored with citations (docs/schema.md)
            "module": c.module,
            "chapter": c.chapter,
            "title": c.title,
            "heading_path": [c.title] if c.title else [],
            "url": c.url,
            "score": c.relevance_score,
            "excerpt": c.excerpt,
        }
        for c in message.citations
    ]


def _done(message: MessageRow, finish_reason: str) -> dict[str, Any]:
    return {
        "message_id": str(message.id),
        "finish_reason": "declined" if message.model == "decline" else finish_reason,
        "cited": [c.position for c in message.citations],
        "invalid_markers": invalid_markers(message.content or "", {c.position for c in message.citations})
        if message.model not in (None, "decline", "extractive", "faq")
        else [],
        "usage": {
            "prompt_tokens": message.prompt_tokens or 0,
            "completion_tokens": message.completion_tokens or 0,
        },
        "timings_ms": {"retrieval": 0.0, "first_token": 0.0, "total": float(message.latency_ms or 0)},
        "replayed": True,
    }


_FAILED = "This answer could not be completed. Please ask again."
_LOST = "The server answering this question went away. Please ask again."
