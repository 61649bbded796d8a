"""The embedded engine (Qdrant Edge): metadata kept beside the shard, one opener, a killed ingest leaves a
consistent index, and an index of the older embedded format says what to run."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DEMO_BOOK, ROOT
from textbook_chat.core.settings import Settings
from textbook_chat.index import ingest, sparse
from textbook_chat.index.engine import IndexLocked
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
