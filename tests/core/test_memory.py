"""Memory handed back: a shared file mapping's pages leave this process's RSS and read back unchanged; a private
mapping and files outside the folder are left alone."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from textbook_chat.core import memory

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc (Linux)")

SIZE = 4 << 20


def _resident_kib(path: Path) -> int:
    inside, total = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def _mapped(path: Path, *, shared: bool) -> mmap.mmap:
    path.write_bytes(bytes(range(256)) * (SIZE // 256))
    with path.open("r+b") as f:
        flags = mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE
        mapping = mmap.mmap(f.fileno(), SIZE, flags=flags)
    sum(mapping[i] for i in range(0, SIZE, 4096))  # every page resident
    return mapping


def test_a_shared_mapping_leaves_rss_and_keeps_what_was_written(tmp_path: Path) -> None:
    (tmp_path / "wal").mkdir()
    log = _mapped(tmp_path / "wal" / "open-1", shared=True)
    try:
        log[100:105] = b"hello"  # written through the mapping, not yet flushed
        assert _resident_kib(tmp_path / "wal" / "open-1") >= SIZE // 1024 - 64
        assert memory.release_file_pages(tmp_path / "wal") == SIZE
        assert _resident_kib(tmp_path / "wal" / "open-1") <= 64
        assert log[100:105] == b"hello" and log[SIZE - 1] == 255  # read back from the file's pages
    finally:
        log.close()
    assert (tmp_path / "wal" / "open-1").read_bytes()[100:105] == b"hello"


def test_private_mappings_and_other_folders_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "wal").mkdir()
    (tmp_path / "other").mkdir()
    private = _mapped(tmp_path / "wal" / "private", shared=False)
    elsewhere = _mapped(tmp_path / "other" / "shared", shared=True)
    try:
        private[0:3] = b"own"  # a private copy: dropping it would lose this
        assert memory.release_file_pages(tmp_path / "wal") == 0
        assert private[0:3] == b"own"
        assert _resident_kib(tmp_path / "other" / "shared") >= SIZE // 1024 - 64
    finally:
        private.close()
        elsewhere.close()


def test_a_missing_proc_file_releases_nothing(tmp_path: Path) -> None:
    assert memory.release_file_pages(tmp_path, maps=tmp_path / "no-such-maps") == 0
    memory.return_free_heap()  # glibc here; elsewhere a no-op
