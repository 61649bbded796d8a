"""Incremental ingestion into the embedded index: skip unchanged chunks, replace changed ones, drop deleted files.

Incremental cases run on a small copy of the demo book in tmp_path; the shared real book is ingested once
per session (``shared_index_dir``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEMO_BOOK, ROOT, SHARED_BOOK, copy_index, fake_embedder_env
from tests.fake_openai import FakeOpenAI
from tests.servers import serving
from textbook_chat.book import chunking
from textbook_chat.book.chunking import read_book
from textbook_chat.core.settings import Settings
from textbook_chat.core.tokens import local_counter
from textbook_chat.index import ingest, sparse
from textbook_chat.index.embeddings import Embedder, LocalEmbedder, create_embedder
from textbook_chat.index.engine import IndexLocked
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.web.app import create_app

BASE = "http://localhost:3000"


class RecordingEmbedder:
    """The real local embedder, remembering every text it was asked to embed."""

    def __init__(self, inner: LocalEmbedder) -> None:
        self.inner = inner
        self.name, self.model, self.query_model, self.dim = inner.name, inner.model, inner.query_model, inner.dim
        self.counter, self.chunk_tokens, self.chunk_overlap = inner.counter, inner.chunk_tokens, inner.chunk_overlap
        self.embedded: list[str] = []

    async def embed_documents(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        self.embedded.extend(texts)
        return await self.inner.embed_documents(texts, background=background)

    async def embed_query(self, text: str) -> list[float]:
        return await self.inner.embed_query(text)

    def prepare_queries(self) -> None:
        self.inner.prepare_queries()

    def release_batches(self) -> None:
        self.inner.release_batches()

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def local_embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    return LocalEmbedder(tmp_path_factory.mktemp("ingest-models"))


@pytest.fixture
def embedder(local_embedder: LocalEmbedder) -> RecordingEmbedder:
    return RecordingEmbedder(local_embedder)


@pytest.fixture
def book(tmp_path: Path) -> Path:
    """A small book: the demo book's intro and first module."""
    docs = tmp_path / "book" / "docs"
    docs.mkdir(parents=True)
    shutil.copy(DEMO_BOOK / "docs" / "intro.md", docs / "intro.md")
    shutil.copytree(DEMO_BOOK / "docs" / "01-foundations", docs / "01-foundations")
    return tmp_path / "book"


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[VectorIndex]:
    vector_index = VectorIndex.from_settings(Settings.from_env({"QDRANT_PATH": str(tmp_path / "qdrant")}))
    yield vector_index
    await vector_index.close()


def chunk_ids(book: Path, embedder: Embedder | None = None) -> dict[str, str]:
    """chunk id -> file path, as the book reads now, in the chunks of ``embedder`` (the local one's by default)."""
    counter, sizes = (local_counter(), LocalEmbedder) if embedder is None else (embedder.counter, embedder)
    chunks = read_book(
        book / "docs",
        base_url=BASE,
        count_tokens=counter.count,
        max_tokens=sizes.chunk_tokens,
        overlap_tokens=sizes.chunk_overlap,
    ).chunks
    return {c.chunk_id: c.file_path for c in chunks}


async def indexed(index: VectorIndex) -> dict[str, str]:
    return {p.id: p.file_path for p in await index.indexed_points()}


async def run(book: Path, index: VectorIndex, embedder: RecordingEmbedder, **options: object) -> ingest.IngestReport:
    embedder.embedded.clear()
    return await ingest.run(book, index, embedder, base_url=BASE, **options)  # type: ignore[arg-type]


def edit_one_paragraph(book: Path) -> Path:
    path = book / "docs" / "01-foundations" / "01-embodied-intelligence.md"
    text = path.read_text()
    paragraph = next(p for p in text.split("\n\n") if p.startswith("An actuator converts stored energy"))
    path.write_text(text.replace(paragraph, paragraph + " Gear ratios trade speed for torque."))
    return path


@pytest.mark.slow
async def test_a_first_ingest_indexes_every_chunk_of_the_book(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    report = await run(book, index, embedder)
    expected = chunk_ids(book)
    assert await indexed(index) == expected
    assert (report.new, report.updated, report.deleted, report.unchanged) == (len(expected), 0, 0, 0)
    assert len(embedder.embedded) == len(expected)
    assert report.summary().startswith(f"{len(expected)} new, 0 updated, 0 deleted, 0 unchanged")


@pytest.mark.slow
async def test_re_ingesting_an_unchanged_book_embeds_nothing(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    await run(book, index, embedder)
    before = await indexed(index)
    report = await run(book, index, embedder)
    assert embedder.embedded == []
    assert (report.new, report.updated, report.deleted, report.unchanged) == (0, 0, 0, len(before))
    assert await indexed(index) == before


@pytest.mark.slow
async def test_a_book_served_from_a_new_address_is_not_re_embedded_and_its_citations_follow(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    await run(book, index, embedder)
    before = await index.indexed_points()
    embedder.embedded.clear()
    moved = "https://new-home.example.org:8443"
    report = await ingest.run(book, index, embedder, base_url=moved)
    after = await index.indexed_points()
    assert embedder.embedded == [] and not report.changed
    assert {p.id for p in after} == {p.id for p in before}
    assert all(p.url.startswith(moved + "/docs/") and p.doc_url.startswith(moved + "/docs/") for p in after)
    assert sorted(p.url.removeprefix(moved) for p in after) == sorted(p.url.removeprefix(BASE) for p in before)


@pytest.mark.slow
async def test_editing_one_file_re_embeds_only_its_changed_chunks(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    await run(book, index, embedder)
    before = await indexed(index)
    edited = edit_one_paragraph(book)
    after = chunk_ids(book)
    changed = set(after) - set(before)
    assert changed and {after[i] for i in changed} == {edited.relative_to(book / "docs").as_posix()}

    report = await run(book, index, embedder)
    assert len(embedder.embedded) == len(changed) < len([f for f in after.values() if f == after[next(iter(changed))]])
    assert any("Gear ratios trade speed for torque." in text for text in embedder.embedded)
    assert report.updated == len(changed) and report.new == report.deleted == 0
    assert await indexed(index) == after


@pytest.mark.slow
async def test_deleting_a_file_removes_its_points(book: Path, index: VectorIndex, embedder: RecordingEmbedder) -> None:
    await run(book, index, embedder)
    gone = book / "docs" / "01-foundations" / "02-kinematics-balance-control.md"
    gone_chunks = sum(
        1 for f in (await indexed(index)).values() if f == "01-foundations/02-kinematics-balance-control.md"
    )
    gone.unlink()
    report = await run(book, index, embedder)
    assert embedder.embedded == []
    assert report.deleted == gone_chunks > 0
    assert await indexed(index) == chunk_ids(book)
    assert "01-foundations/02-kinematics-balance-control.md" not in set((await indexed(index)).values())


@pytest.mark.slow
async def test_the_index_keeps_the_books_title_and_a_re_ingest_follows_a_new_one(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    await run(book, index, embedder)
    assert await index.book_title() == "Physical AI & Humanoid Robotics"  # no site: its first chapter's, unwelcomed
    (book / "docusaurus.config.ts").write_text("export default {\n  title: 'Walking Robots',\n};\n")
    report = await run(book, index, embedder)
    assert report.new == report.updated == 0  # only the metadata changed
    assert await index.book_title() == "Walking Robots"


async def test_a_dry_run_reports_changes_and_writes_nothing(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    report = await run(book, index, embedder, dry_run=True)
    assert report.new == len(chunk_ids(book)) and report.dry_run
    assert embedder.embedded == [] and not await index.exists()

    await run(book, index, embedder)
    before = await indexed(index)
    edit_one_paragraph(book)
    (book / "docs" / "intro.md").unlink()
    report = await run(book, index, embedder, dry_run=True)
    assert report.updated > 0 and report.deleted > 0
    assert report.summary().startswith("dry run: ")
    assert embedder.embedded == []
    assert await indexed(index) == before


@pytest.mark.slow
async def test_an_interrupted_ingest_followed_by_a_rerun_leaves_a_consistent_index(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    await run(book, index, embedder)
    edit_one_paragraph(book)
    (book / "docs" / "intro.md").unlink()
    shutil.copy(DEMO_BOOK / "docs" / "02-ros2" / "01-nodes-and-topics.md", book / "docs" / "01-foundations")
    monkeypatch.setattr(ingest, "EMBED_BATCH", 4)  # several batches, so the crash lands between two of them

    def crash_after_first_batch(total: int) -> ingest.Progress:
        def advance(done: int) -> None:
            raise KeyboardInterrupt  # what Ctrl-C does between two batches

        return advance

    with pytest.raises(KeyboardInterrupt):
        await run(book, index, embedder, progress=crash_after_first_batch)
    half_done = await indexed(index)
    assert half_done != chunk_ids(book)

    report = await run(book, index, embedder)
    assert await indexed(index) == chunk_ids(book)
    assert await index.count() == len(chunk_ids(book))
    assert len(embedder.embedded) == report.new + report.updated
    # What was written before the crash is not embedded again.
    assert len(embedder.embedded) == len(set(chunk_ids(book)) - set(half_done))


@pytest.mark.slow
async def test_code_past_its_head_is_not_embedded_but_found_by_keyword(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunking, "CODE_HEAD_TOKENS", 16)
    listing = "\n".join(["```python", "import rclpy", *(f"step_{n} = read_joint({n})" for n in range(14))])
    page = f"# Gait\n\n## Stepping\n\nA gait loop reads every joint.\n\n{listing}\ncommit_gait_zz(step_13)\n```\n"
    (book / "docs" / "01-foundations" / "09-gait.md").write_text(page)
    await run(book, index, embedder)
    assert any("import rclpy" in text for text in embedder.embedded)
    assert not any("commit_gait_zz" in text for text in embedder.embedded)  # the dense model reads the head only
    assert await index.mentions(sparse.Sparse((sparse.term_index("commit_gait_zz"),), (1.0,)))
    assert not await index.mentions(sparse.Sparse((sparse.term_index("commit_gait_yy"),), (1.0,)))


@pytest.mark.slow
async def test_force_rebuilds_the_collection_from_scratch(
    book: Path, index: VectorIndex, embedder: RecordingEmbedder
) -> None:
    await run(book, index, embedder)
    report = await run(book, index, embedder, force=True)
    assert report.new == len(chunk_ids(book)) == len(embedder.embedded)
    assert await indexed(index) == chunk_ids(book)


async def test_a_second_opener_of_the_embedded_index_is_refused(tmp_path: Path, book: Path) -> None:
    settings = Settings.from_env({"QDRANT_PATH": str(tmp_path / "held")})
    holder = VectorIndex.from_settings(settings)
    try:
        with pytest.raises(IndexLocked, match="in use by another process"):
            VectorIndex.from_settings(settings)
        env = {**os.environ, "QDRANT_PATH": str(tmp_path / "held"), "DATA_DIR": str(tmp_path / "data")}
        done = subprocess.run(
            [sys.executable, "-m", "textbook_chat", "ingest", str(book)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        await holder.close()
    assert done.returncode == 2
    assert "in use by another process" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- the shared real book -------------------------------------------------------------------------


@pytest.fixture
async def shared_book_api(shared_index_dir: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app over the shared book's index, with the fake model that embedded it (``shared_index_dir``)."""
    data_dir = copy_index(shared_index_dir, tmp_path / "data")
    async with serving(FakeOpenAI().app()) as llm_url:
        env = {"DATA_DIR": str(data_dir), "LOG_FORMAT": "text", **fake_embedder_env(llm_url)}
        async with (
            serving(create_app(Settings.from_env(env))) as base_url,
            httpx.AsyncClient(base_url=base_url) as client,
        ):
            yield client


@pytest.mark.slow
async def test_the_shared_book_is_indexed_whole(shared_index_dir: Path, tmp_path: Path) -> None:
    data_dir = copy_index(shared_index_dir, tmp_path / "data")
    # The embedder is read for how it chunks (its counter and sizes), never asked: no model needs to listen.
    settings = Settings.from_env({"DATA_DIR": str(data_dir), **fake_embedder_env("http://127.0.0.1:9")})
    vector_index = VectorIndex.from_settings(settings)
    embedder = create_embedder(settings)
    try:
        points = await indexed(vector_index)
    finally:
        await vector_index.close()
        await embedder.aclose()
    assert len(points) > 1000
    assert points == chunk_ids(SHARED_BOOK, embedder)


@pytest.mark.slow
async def test_api_modules_lists_modules_and_chapters_with_titles_and_urls(shared_book_api: httpx.AsyncClient) -> None:
    response = await shared_book_api.get("/api/modules")
    assert response.status_code == 200
    modules = response.json()["modules"]
    assert [m["id"] for m in modules] == [
        "intro",
        "module-1-physical-ai-foundations",
        "module-2-ros-2-fundamentals",
        "module-3-digital-twin-simulation",
        "module-4-ai-robot-brain",
        "appendices",
        "capstone-the-autonomous-humanoid",
    ]
    by_id = {m["id"]: m for m in modules}
    ros = by_id["module-2-ros-2-fundamentals"]
    assert ros["title"] == "Module 2: ROS 2 Fundamentals"
    assert len(ros["chapters"]) == 10
    assert all(c["title"] and c["url"].startswith(f"{BASE}/docs/module-2-ros-2-fundamentals/") for c in ros["chapters"])
    assert ros["url"] == ros["chapters"][0]["url"]
    capstone = by_id["capstone-the-autonomous-humanoid"]
    assert {c["id"] for c in capstone["chapters"]} >= {"capstone-the-autonomous-humanoid/capstone-intro"}
    assert by_id["intro"]["chapters"] == [
        {"id": "intro", "title": "Introduction to Humanoid Robotics", "url": f"{BASE}/docs/intro"}
    ]
