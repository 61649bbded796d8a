"""Memory the process holds but no longer reads, handed back to the operating system.

Both calls are Linux/glibc facilities and do nothing elsewhere: they change what RSS counts, never what the
process reads (a page given back is read again from the file, or allocated afresh, on next use).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def return_free_heap() -> None:
    """Hand the heap that loading left free (a model file's parse, an ingest's batches) back to the OS.

    glibc keeps freed memory for reuse; after start-up it stays unused and counts in RSS (~15-30 MB here).
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):  # not glibc (musl, macOS): nothing to do
        libc.malloc_trim(0)


def release_file_pages(folder: Path, maps: Path = Path("/proc/self/maps")) -> int:
    """Drop this process's resident pages of the shared file mappings under ``folder``; returns the bytes of
    mapping they spanned.

    For a file mapped shared (``MAP_SHARED``), ``MADV_DONTNEED`` only unmaps the pages from this process: what
    was written is already the file's (the page cache keeps it, written or not), and the next read faults the
    page back in. Private mappings are left alone (there it would discard writes).
    """
    libc = _libc()
    if libc is None or not hasattr(libc, "madvise"):
        return 0
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # no /proc (not Linux)
        return 0
    prefix = f"{folder.resolve()}/"
    released = 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith(prefix) or not fields[1].endswith("s"):
            continue
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), _MADV_DONTNEED) == 0:
            released += high - low
        else:
            log.debug("madvise(%s) failed: errno %d", fields[5], ctypes.get_errno())
    return released


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    if hasattr(libc, "madvise"):
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    return libc
