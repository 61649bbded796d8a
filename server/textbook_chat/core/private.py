"""Files that hold readers' words or secrets are the owner's alone: folders 0700, files 0600, whatever the umask.

Spilled answers, the index, the embedded Postgres and ``DATA_DIR`` itself are made with these (issue 34); a
``DATA_DIR`` that others can read already is said once at start, not changed behind the operator's back.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
UMASK = 0o077  # what the commands that write readers' data run under: whatever a library creates is private too


def private_dir(path: Path) -> Path:
    """``path`` and each folder this creates on the way to it, 0700; a folder already there is left as it is."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:  # made meanwhile by another process: its own choice of mode stands
            continue
        os.chmod(folder, DIR_MODE)  # the umask may take bits away, never give them: this says it exactly
    return path


def own_dir(path: Path) -> Path:
    """A folder only this server uses (spilled answers, the index): made 0700, or made 0700 again if it was not."""
    private_dir(path)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def open_private(path: Path) -> IO[str]:
    """``path`` opened for writing text (created or truncated) as a 0600 file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def prepare_data_dir(path: Path) -> bool:
    """``DATA_DIR`` made private when it is new; one warning line when it is there and others may read it.
    True when it is private."""
    private_dir(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning(
            "DATA_DIR %s is readable by other users (mode %03o) and holds readers' questions and answers; "
            "make it private: chmod 700 %s",
            path,
            mode,
            path,
        )
        return False
    return True
