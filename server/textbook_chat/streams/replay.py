"""A stored answer as SSE events, for a reader who comes back after the live events have expired.

Postgres keeps the answer, not its events, so the replay is the same protocol in fewer events:
``meta``, ``sources`` (the cited ones, which is what is stored), one ``token`` with the whole text, then
``done`` (or ``error`` for a failed answer, or for one whose generating worker is gone).
"""

from __future__ import annotations

from typing import Any

from textbook_chat.answer.generation import invalid_markers
from textbook_chat.search import confidence
from textbook_chat.store.rows import MessageRow
from textbook_chat.streams.events import Event

_FINISH = {"complete": "stop", "interrupted": "cancelled"}


def events(message: MessageRow, *, stream_url: str) -> list[Event]:
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
    items: list[tuple[str, dict[str, Any]]] = [("meta", meta), ("sources", {"sources": _sources(message)})]
    if message.content:
        items.append(("token", {"text": message.content}))
    if message.status in _FINISH:
        items.append(("done", _done(message, _FINISH[message.status])))
    elif message.status == "failed":
        items.append(("error", {"code": "generation_failed", "message": _FAILED, "retryable": True}))
    else:  # still "streaming" in Postgres, but no worker has it live: that worker died mid-answer
        items.append(("error", {"code": "generation_lost", "message": _LOST, "retryable": True}))
    return [Event(id=i, event=kind, data=data) for i, (kind, data) in enumerate(items, start=1)]  # type: ignore[arg-type]


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
