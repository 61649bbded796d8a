"""Hand back the memory that start-up touched and serving does not use: glibc's free heap, and the pages of the
libraries' code that only loading ran.

Loading the two ONNX models runs onnxruntime's kernel registration and graph optimizers once; importing the
libraries runs their initialisers once. Their code pages stay mapped, resident and counted in RSS (about 40 MB
here, most of it onnxruntime's), though nothing runs them again. They are clean pages of files the page cache
holds: dropping them from this process (``madvise(MADV_DONTNEED)``) frees nothing the process owns and loses
nothing; a page that is run again comes back from the page cache with a minor fault. Only executable mappings of
shared objects with no private or anonymous page are dropped (a library whose code the loader patched keeps it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    kb: dict[str, int] = field(default_factory=dict)  # smaps' fields in kB (Rss, Anonymous, Private_Dirty, ...)

    @property
    def clean_code(self) -> bool:
        """Executable code of a shared object whose every resident page is the file's own."""
        return (
            self.perms == "r-xp"
            and ".so" in Path(self.path).name
            and self.kb.get("Anonymous", 1) == 0
            and self.kb.get("Private_Dirty", 1) == 0
        )


def mappings(smaps: str) -> list[Mapping]:
    """``/proc/PID/smaps`` read into its mappings."""
    found: list[Mapping] = []
    for line in smaps.splitlines():
        head = _HEADER.match(line)
        if head:
            found.append(Mapping(int(head[1], 16), int(head[2], 16), head[3], head[4]))
        elif found and line.endswith(" kB"):
            name, _, value = line.partition(":")
            found[-1].kb[name] = int(value.split()[0])
    return found


def drop_loaded_code() -> int:
    """Drop this process's resident pages of clean library code; the kB dropped (0 where not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        smaps = Path("/proc/self/smaps").read_text()
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for m in mappings(smaps):
        if m.clean_code and m.kb.get("Rss", 0) and libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            dropped += m.kb["Rss"]
    return dropped


def trim_heap() -> None:
    """glibc keeps freed memory for reuse; after start-up it stays unused and counts in RSS (~15-30 MB here)."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        pass


def release_after_start() -> None:
    """Both, once start-up is done."""
    trim_heap()
    dropped = drop_loaded_code()
    if dropped:
        log.info("start-up: %.0f MB of library code that only loading ran handed back", dropped / 1024)
