"""The static FAQ (``FAQ_PATH``): served at ``/api/faq`` and the answer of last resort when retrieval is down.

Matching is keyword overlap with each entry's question, keywords and answer; it needs no index, no
embedder and no network, which is the point: it works when everything else has failed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textbook_chat.index import sparse

log = logging.getLogger(__name__)

MAX_ENTRIES = 3
_QUESTION_WEIGHT = 2.0
_KEYWORD_WEIGHT = 2.0
_ANSWER_WEIGHT = 0.5


@dataclass(frozen=True)
class FaqEntry:
    id: str
    question: str
    answer: str
    keywords: tuple[str, ...]
    url: str | None  # absolute (BOOK_BASE_URL applied) or None

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "answer": self.answer, "url": self.url}


@dataclass(frozen=True)
class Faq:
    entries: tuple[FaqEntry, ...]

    @classmethod
    def load(cls, path: Path, *, base_url: str) -> Faq:
        """Read ``path``; a missing or broken file gives an empty FAQ and one logged error, never a crash."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(tuple(_entry(raw, base_url) for raw in data["entries"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("FAQ not loaded from %s (%s); the retrieval fallback will have no entries", path, exc)
            return cls(())

    def match(self, question: str, limit: int = MAX_ENTRIES) -> list[FaqEntry]:
        """Entries sharing words with ``question``, best first; empty when nothing overlaps."""
        wanted = set(sparse.terms(question))
        if not wanted:
            return []
        scored = []
        for position, entry in enumerate(self.entries):
            score = (
                _QUESTION_WEIGHT * len(wanted & set(sparse.terms(entry.question)))
                + _KEYWORD_WEIGHT * len(wanted & set(sparse.terms(" ".join(entry.keywords))))
                + _ANSWER_WEIGHT * len(wanted & set(sparse.terms(entry.answer)))
            )
            if score > 0:
                scored.append((score, -position, entry))
        scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [entry for _, _, entry in scored[:limit]]

    def answer_text(self, question: str) -> str:
        """Markdown for the reader: the best-matching entries, or an honest "try again later"."""
        matches = self.match(question)
        if not matches:
            return (
                "The textbook search is unavailable right now and none of the frequently asked questions "
                "match yours. Please try again in a few minutes."
            )
        parts = ["The textbook search is unavailable right now. These frequently asked questions may help:"]
        for entry in matches:
            link = f" ([read more]({entry.url}))" if entry.url else ""
            parts.append(f"**{entry.question}**\n{entry.answer}{link}")
        return "\n\n".join(parts)


def _entry(raw: dict[str, Any], base_url: str) -> FaqEntry:
    url = raw.get("url")
    if isinstance(url, str) and url.startswith("/"):
        url = base_url.rstrip("/") + url
    return FaqEntry(
        id=str(raw["id"]),
        question=str(raw["question"]),
        answer=str(raw["answer"]),
        keywords=tuple(str(k) for k in raw.get("keywords", ())),
        url=url if isinstance(url, str) and url else None,
    )
