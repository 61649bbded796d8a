"""What holds readers' words is the owner's alone under the usual umask 022: spilled answers, the index, DATA_DIR;
a DATA_DIR others can read already is said once at start (issue 34)."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLOSED_PORT_PG_URL
from textbook_chat.core import private
from textbook_chat.index.edge import EdgeCollection
from textbook_chat.store.database import create_pool
from textbook_chat.store.rows import Completion
from textbook_chat.store.sessions import Store
from textbook_chat.store.writes import AnswerWriter


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    before = os.umask(0o022)
    yield
    os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_folders_made_on_the_way_are_0700_and_a_private_file_is_0600(tmp_path: Path) -> None:
    deep = private.private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", deep)] == [0o700] * 3
    with private.open_private(deep / "f.jsonl") as out:
        out.write("secret\n")
    assert mode(deep / "f.jsonl") == 0o600


async def test_answers_spilled_with_postgres_away_are_0600_in_a_0700_folder(tmp_path: Path) -> None:
    spill = tmp_path / "data" / "pending-writes"
    spill.parent.mkdir()
    spill.mkdir(mode=0o755)  # left by an older version: made private again
    away = Store(create_pool(CLOSED_PORT_PG_URL, timeout_s=0.3), timeout_s=0.3)
    await away.open()
    try:
        writer = AnswerWriter(away, spill)
        await writer.start()
        writer.submit(uuid.uuid4(), Completion(content="a reader's answer", status="complete"))
        await writer.close(drain_s=0.3)
    finally:
        await away.close()
    (spilled,) = spill.glob("*.jsonl")
    assert mode(spill) == 0o700 and mode(spilled) == 0o600


async def test_the_embedded_index_folders_are_0700(tmp_path: Path) -> None:
    index = EdgeCollection.open(tmp_path / "data" / "qdrant", "textbook")
    try:
        await index.create(4, {"embedder": "test"})
    finally:
        await index.close()
    for folder in (tmp_path / "data", tmp_path / "data" / "qdrant", tmp_path / "data" / "qdrant" / "edge"):
        assert mode(folder) == 0o700, folder
    assert mode(tmp_path / "data" / "qdrant" / "edge" / "textbook.json") == 0o600


def test_a_new_data_dir_is_private_and_one_others_can_read_gets_one_warning_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=private.__name__):
        assert private.prepare_data_dir(tmp_path / "new") is True
        assert mode(tmp_path / "new") == 0o700 and not caplog.records
        (tmp_path / "shared").mkdir(mode=0o755)
        assert private.prepare_data_dir(tmp_path / "shared") is False
    (line,) = caplog.records
    assert "readable by other users" in line.getMessage() and "chmod 700" in line.getMessage()
    assert mode(tmp_path / "shared") == 0o755  # said, not changed behind the operator's back
