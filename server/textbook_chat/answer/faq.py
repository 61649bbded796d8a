"""The FAQ: served at ``/api/faq`` (the panel suggests its first questions) and the answer of last resort when
retrieval is down.

Three parts, in this order: the book's own entries (``faq.json`` beside the served book's ``docs/``, as the demo
book carries one), entries about the book read from its index (what it covers, its modules: any book has them,
and they outlive an outage of the index once read), and the entries about the assistant itself (``FAQ_PATH``, the
package's by default). Matching is keyword overlap with each entry's question, keywords and answer; it needs no
index, no embedder and no network, which is the point: it works when everything else has failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textbook_chat.core.errors import RetrievalUnavailable
from textbook_chat.index import sparse
from textbook_chat.index.vectors import ModuleInfo, VectorIndex

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


class Faq:
    def __init__(self, own: Sequence[FaqEntry] = (), assistant: Sequence[FaqEntry] = ()) -> None:
        self.own = tuple(own)  # the book's own file
        self.assistant = tuple(assistant)  # FAQ_PATH
        self.about_book: tuple[FaqEntry, ...] = ()  # read from the index (``refresh``)
        self._refreshing: asyncio.Task[None] | None = None

    @classmethod
    def load(cls, path: Path, *, base_url: str, own: Path | None = None, book: Path | None = None) -> Faq:
        """``path`` (the entries about the assistant) and the book's own entries: ``own`` (BOOK_FAQ_PATH), else
        the ``faq.json`` of the served ``book``'s folder where it has one. A file named but missing or broken
        gives no entries and one logged error, never a crash."""
        if own is None and book is not None and (book / "faq.json").is_file():
            own = book / "faq.json"
        return cls(_read(own, base_url) if own is not None else (), _read(path, base_url))

    @property
    def entries(self) -> tuple[FaqEntry, ...]:
        """The book's own entries, then those read from its index (unless its own file answers the same
        question: the same ``id``), then the assistant's."""
        own = {entry.id for entry in self.own}
        return (*self.own, *(e for e in self.about_book if e.id not in own), *self.assistant)

    def refresh_soon(self, index: VectorIndex | None) -> None:
        """``refresh`` in the background (one at a time): a reader asking for the FAQ never waits on the index,
        which may be the very thing that is down; the next one gets what it read."""
        if index is not None and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.create_task(self.refresh(index), name="faq-refresh")

    async def refresh(self, index: VectorIndex | None) -> None:
        """Read the book's title and modules from ``index`` (cached there until its next write); while the index
        is down, the entries last read stay."""
        if index is None:
            return
        try:
            if not await index.exists():
                return
            self.about_book = about_the_book(await index.book_title(), await index.modules())
        except RetrievalUnavailable:
            pass

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


MODULE_ENTRIES = 12  # modules given an entry of their own; a longer book's are all in "how is it organised"


def about_the_book(title: str | None, modules: Sequence[ModuleInfo]) -> tuple[FaqEntry, ...]:
    """What any book's index can say about it: what it covers, how it is organised, and what each module holds."""
    if not modules:
        return ()
    name = f"“{title}”" if title else "The book"
    listed = "; ".join(m.title for m in modules if m.title)
    entries = [
        FaqEntry(
            "book-scope",
            "What does this textbook cover?",
            f"{name} has {len(modules)} module{'s' if len(modules) != 1 else ''}: {listed}.",
            ("cover", "contents", "topics", "about", "syllabus", "overview"),
            modules[0].url or None,
        ),
        FaqEntry(
            "modules",
            "How is the book organised into modules?",
            " ".join(f"{n}. {_module_line(m)}" for n, m in enumerate(modules, start=1)),
            ("organised", "organized", "structure", "modules", "chapters", "order", "parts"),
            modules[0].url or None,
        ),
    ]
    entries += [  # a module that is one page (its only chapter is itself) has nothing more to say here
        FaqEntry(f"module-{m.id}", f"What is in “{m.title}”?", _module_line(m), (), m.url or None)
        for m in modules[:MODULE_ENTRIES]
        if m.title and _chapters(m)
    ]
    return tuple(entries)


def _chapters(module: ModuleInfo) -> list[str]:
    return [c.title for c in module.chapters if c.title and c.title != module.title]


def _module_line(module: ModuleInfo) -> str:
    chapters = _chapters(module)
    if not chapters:
        return f"{module.title}."
    return f"{module.title}: {'; '.join(chapters)}."


def _read(path: Path, base_url: str) -> tuple[FaqEntry, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(_entry(raw, base_url) for raw in data["entries"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("FAQ not loaded from %s (%s); the retrieval fallback will have no entries from it", path, exc)
        return ()


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
