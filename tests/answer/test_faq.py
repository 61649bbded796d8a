"""The FAQ of whichever book is served: the book's own entries, what its index says of it, the assistant's entries.

The panel suggests the FAQ's first questions and the FAQ answers while retrieval is down, so a book must never
get another book's entries: a small two-module course, ingested for real, is served here beside the demo book.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEMO_BOOK
from tests.servers import serving
from textbook_chat.answer.faq import Faq, FaqEntry, about_the_book
from textbook_chat.core import resources
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest
from textbook_chat.index.vectors import Chapter, ModuleInfo, VectorIndex
from textbook_chat.web.app import create_app
from textbook_chat.web.services import open_services

BASE = "https://book.example.org"


def course(root: Path) -> Path:
    """A Docusaurus site about reactive programming: two modules of one or two chapters."""
    (root / "docs").mkdir(parents=True)
    (root / "docusaurus.config.js").write_text("module.exports = {\n  title: 'Streams in Practice',\n};\n")
    for n, (module, chapters) in enumerate(
        {"Observables": ["Creating streams", "Subscribing"], "Operators": ["Mapping values"]}.items(), start=1
    ):
        folder = root / "docs" / f"0{n}-{module.lower()}"
        folder.mkdir()
        (folder / "_category_.json").write_text(json.dumps({"label": module, "position": n}))
        for m, chapter in enumerate(chapters, start=1):
            (folder / f"0{m}-{chapter.lower().replace(' ', '-')}.md").write_text(
                f"# {chapter}\n\n## Basics\n\nA stream emits values over time; {chapter.lower()} is about that.\n"
            )
    return root


def module(title: str, *chapters: str) -> ModuleInfo:
    return ModuleInfo(
        id=title.lower(),
        title=title,
        url=f"{BASE}/docs/{title.lower()}",
        position=0.0,
        chapters=tuple(Chapter(c.lower(), c, f"{BASE}/docs/{c.lower()}", 0.0) for c in chapters),
    )


def test_any_book_gets_entries_about_what_it_covers_and_each_module() -> None:
    entries = about_the_book("Streams in Practice", [module("Observables", "Creating", "Subscribing"), module("Ops")])
    by_id = {e.id: e for e in entries}
    assert by_id["book-scope"].answer == "“Streams in Practice” has 2 modules: Observables; Ops."
    assert by_id["modules"].answer == "1. Observables: Creating; Subscribing. 2. Ops."
    assert by_id["module-observables"].question == "What is in “Observables”?"
    assert by_id["module-observables"].url == f"{BASE}/docs/observables"
    assert "module-ops" not in by_id  # one page, no chapters: "What is in Ops?" would only say "Ops."
    assert about_the_book("Empty", []) == ()


def test_the_books_own_entries_come_first_and_replace_the_ones_read_from_the_index() -> None:
    own = FaqEntry("book-scope", "What does this textbook cover?", "Written by its authors.", (), None)
    assistant = FaqEntry("privacy", "What happens to my history?", "It is kept.", (), None)
    faq = Faq([own], [assistant])
    faq.about_book = about_the_book("Streams", [module("Observables")])
    assert [e.id for e in faq.entries] == ["book-scope", "modules", "privacy"]
    assert faq.entries[0].answer == "Written by its authors."


def test_the_served_books_folder_supplies_its_own_faq_and_a_named_file_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assistant = resources.locate().faq
    from_folder = Faq.load(assistant, base_url=BASE, book=DEMO_BOOK)
    assert any("ROS 2" in e.question for e in from_folder.own)
    assert all(e.url is None or e.url.startswith(BASE) for e in from_folder.entries)
    assert Faq.load(assistant, base_url=BASE, book=course(tmp_path / "course")).own == ()  # none there: none
    with caplog.at_level(logging.ERROR, logger="textbook_chat.answer.faq"):
        missing = Faq.load(assistant, base_url=BASE, own=tmp_path / "nowhere.json", book=DEMO_BOOK)
    assert missing.own == () and "nowhere.json" in caplog.text  # named but missing: said, not a crash
    # The package's own entries are about the assistant: no book's subject is in them.
    assert not any("ROS" in e.question + e.answer or "Humanoid" in e.answer for e in from_folder.assistant)


@pytest.mark.slow
async def test_a_served_course_suggests_its_own_questions_and_keeps_them_through_an_index_outage(
    tmp_path: Path,
) -> None:
    book = course(tmp_path / "course")
    data_dir = tmp_path / "data"
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_FORMAT": "text"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        await ingest.run(book, services.index, services.embedder, base_url=BASE)

    async with (
        serving(create_app(Settings.from_env(settings_env(data_dir)))) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        entries = (await client.get("/api/faq")).json()["entries"]
    questions = [e["question"] for e in entries]
    assert questions[:4] == [
        "What does this textbook cover?",
        "How is the book organised into modules?",
        "What is in “Observables”?",
        "What is in “Operators”?",
    ]
    assert entries[0]["answer"] == "“Streams in Practice” has 2 modules: Observables; Operators."
    assert not any("ROS" in e["question"] + e["answer"] for e in entries)  # not the demo book's

    # Read once, the book's entries outlive the index: a refresh that cannot reach it keeps them.
    faq = Faq()
    async with open_services(Settings.from_env(settings_env(data_dir)), retrieval=True) as services:
        await faq.refresh(services.index)
    unreachable = VectorIndex.from_settings(Settings.from_env({"QDRANT_URL": "http://127.0.0.1:1"}))
    try:
        await faq.refresh(unreachable)
    finally:
        await unreachable.close()
    assert [e.id for e in faq.entries][:2] == ["book-scope", "modules"]


def settings_env(data_dir: Path) -> dict[str, str]:
    return {"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_FORMAT": "text", "BOOK_BASE_URL": BASE}
