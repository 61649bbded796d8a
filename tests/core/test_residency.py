"""Start-up hands back the library code only loading ran: clean executable pages of shared objects, never a page
the process wrote."""

from __future__ import annotations

import sys
import zlib

import pytest

from textbook_chat.core import residency

SMAPS = """\
7f0000000000-7f0000100000 r-xp 00001000 fe:00 42    /venv/lib/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
Rss:                 900 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000100000-7f0000200000 r--p 00101000 fe:00 42    /venv/lib/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
Rss:                 100 kB
Anonymous:            20 kB
Private_Dirty:        20 kB
7f0000200000-7f0000300000 r-xp 00000000 fe:00 43    /usr/lib/libpatched.so.1
Rss:                  64 kB
Anonymous:             4 kB
Private_Dirty:         4 kB
7f0000300000-7f0000400000 rw-s 00000000 fe:00 44    /data/qdrant/wal/open-1
Rss:                8000 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000400000-7f0000500000 r-xp 00000000 00:00 0
Rss:                  12 kB
Anonymous:            12 kB
Private_Dirty:        12 kB
"""


def test_only_clean_library_code_is_dropped() -> None:
    found = residency.mappings(SMAPS)
    assert [m.kb["Rss"] for m in found] == [900, 100, 64, 8000, 12]
    # code; relocated read-only data (written by the loader); code the loader patched; a file the index writes;
    # anonymous executable memory
    assert [m.clean_code for m in found] == [True, False, False, False, False]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_the_process_runs_on_after_its_loaded_code_is_dropped() -> None:
    assert residency.drop_loaded_code() > 0  # libpython's and the extension modules' code at least
    assert zlib.decompress(zlib.compress(b"still here" * 100)) == b"still here" * 100  # code faulted back in
    residency.release_after_start()
