"""The embedded engine (Qdrant Edge): metadata kept beside the shard, one opener, a killed ingest leaves a
consistent index, an index of the older embedded format says what to run, and a reopened index holds neither its
write-ahead log in memory nor more than one search thread."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import DEMO_BOOK, ROOT
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest, sparse
from textbook_chat.index.engine import IndexLocked
from textbook_chat.index.sparse import Sparse
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.web.services import open_services


def _settings(path: Path) -> Settings:
    return Settings.from_env({"DATA_DIR": str(path), "EMBEDDER": "local", "LOG_LEVEL": "warning"})


async def test_metadata_written_beside_the_shard_survives_a_reopen(tmp_path: Path) -> None:
    index = VectorIndex.from_settings(_settings(tmp_path))
    try:
        await index.ensure_collection(embedder="local", model="m", dim=4)
        await index.write_metadata(calibration={"decline": 0.31, "fingerprint": "abc"})
    finally:
        await index.close()
    again = VectorIndex.from_settings(_settings(tmp_path))
    try:
        meta = await again.read_metadata()
    finally:
        await again.close()
    assert meta == {"embedder": "local", "model": "m", "dim": 4, "calibration": {"decline": 0.31, "fingerprint": "abc"}}


async def test_one_opener_at_a_time_even_before_a_shard_exists(tmp_path: Path) -> None:
    first = VectorIndex.from_settings(_settings(tmp_path))
    try:
        with pytest.raises(IndexLocked, match="in use by another process"):
            VectorIndex.from_settings(_settings(tmp_path))
        await first.ensure_collection(embedder="local", model="m", dim=4)
        with pytest.raises(IndexLocked, match="in use by another process"):
            VectorIndex.from_settings(_settings(tmp_path))
    finally:
        await first.close()
    reopened = VectorIndex.from_settings(_settings(tmp_path))  # free again once closed
    await reopened.close()


@pytest.mark.slow
async def test_an_ingest_killed_mid_write_leaves_an_index_that_opens_answers_and_completes(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(tmp_path), "EMBEDDER": "local", "LOG_LEVEL": "warning"}
    shard = tmp_path / "qdrant" / "edge" / "textbook"
    process = subprocess.Popen(
        [sys.executable, "-m", "textbook_chat", "ingest", str(DEMO_BOOK)], cwd=ROOT, env=env, start_new_session=True
    )
    deadline = time.monotonic() + 60
    while not (shard.exists() and any(shard.iterdir())) and time.monotonic() < deadline and process.poll() is None:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # inside the upserts
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()

    async with open_services(_settings(tmp_path), retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        partial = await services.index.count() if await services.index.exists() else 0
        report = await ingest.run(DEMO_BOOK, services.index, services.embedder, base_url="http://book.test")
        total = await services.index.count()
        dense = await services.embedder.embed_query("Zero Moment Point support polygon")
        hits = await services.index.hybrid_search(dense, sparse.query_vector("Zero Moment Point"), limit=5)
    assert 0 <= partial <= total
    assert total == report.chunks and hits and hits[0].payload["file_path"].startswith("01-foundations/")


async def test_an_index_of_the_older_embedded_format_says_what_to_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = tmp_path / "qdrant"
    (old / "collection" / "textbook").mkdir(parents=True)
    (old / "meta.json").write_text('{"collections": {"textbook": {}}}')
    with caplog.at_level(logging.WARNING):
        index = VectorIndex.from_settings(_settings(tmp_path))
    try:
        exists = await index.exists()
        await index.ensure_collection(embedder="local", model="m", dim=4)  # what ingest (or serve --book) does
    finally:
        await index.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not exists
    assert len(warned) == 1 and "older version" in warned[0] and "python -m textbook_chat ingest" in warned[0]
    assert not (old / "meta.json").exists() and not (old / "collection").exists()  # rebuilt in the new format


def _resident_kib(folder: Path) -> int:
    """This process's resident KiB of the files mapped under ``folder`` (/proc/self/smaps)."""
    prefix, inside, total = f"{folder.resolve()}/", False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5].startswith(prefix)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def _search_threads() -> set[str]:
    """The names of Edge's search threads in this process (each shard's pool names its own from edge-search-0)."""
    return {name for task in Path("/proc/self/task").iterdir() if (name := _comm(task)).startswith("edge-search")}


def _comm(task: Path) -> str:
    try:
        return (task / "comm").read_text().strip()
    except OSError:  # the thread ended while listed
        return ""


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc (Linux)")
async def test_a_reopened_index_holds_no_log_in_memory_and_searches_on_one_thread(tmp_path: Path) -> None:
    dim, count = 128, 800
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((count, dim)).astype(np.float32)
    index = VectorIndex.from_settings(_settings(tmp_path))
    try:
        await index.ensure_collection(embedder="local", model="m", dim=dim)
        await index.upsert(
            [str(uuid.UUID(int=i + 1)) for i in range(count)],
            [list(v / np.linalg.norm(v)) for v in vectors],
            [Sparse((i % 50, 100 + i % 7), (1.0, 0.5)) for i in range(count)],
            [{"module": "m", "file_path": f"doc-{i % 9}.md", "text": "words " * 40} for i in range(count)],
        )
    finally:
        await index.close()
    wal = next(tmp_path.rglob("wal"))
    assert sum(f.stat().st_blocks for f in wal.iterdir()) * 512 > 512 * 1024  # the log holds every write

    again = VectorIndex.from_settings(_settings(tmp_path))
    try:
        assert _resident_kib(wal) <= 64  # read to replay, then handed back (it was the whole log)
        assert _search_threads() == {"edge-search-0"}  # Edge's default pool would add edge-search-1 to -7
        hits = await again.hybrid_search(list(vectors[5] / np.linalg.norm(vectors[5])), Sparse((5,), (1.0,)), limit=3)
        assert hits[0].id == str(uuid.UUID(int=6))
    finally:
        await again.close()
