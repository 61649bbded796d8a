"""How common a word is in general English: wordfreq's small English list (Zipf frequency 3 and up), read from the
installed wheel's pinned data file without importing the library (its text-processing imports cost ~12 MB).

A content word of a question that the book never uses and that is rare in English (a command, a tool, a product)
is strong evidence that the book does not answer it; a common English word the book lacks is only a paraphrase.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

PACKAGE = "wordfreq"
_FILE = ("data", "small_en.msgpack.gz")
# The file as the wordfreq 3.1.1 wheel ships it (word data CC BY-SA 4.0): another file is another list.
PINNED_SHA256 = "f94a80cba6a3857b260d0666b5432bb7ea9b85315574dee9c306e87f61298247"
# Zipf frequency (log10 of occurrences per billion words) under which a word is rare: the small list holds the
# words from about 3.0 up ("yolk" 3.0, "gait" 3.1, "teacher" 4.9); tool and command names lie below ("gdb" 2.0,
# "strace" 1.1, "rclpy" 0). docs/evaluation.md "The second opinion".
RARE_BELOW = 3.0
EVERYDAY_AT = 7.0  # and from which a word is as common as English has ("the" 7.7, "is" 7.4; "put" 5.7)


class WordListUnavailable(RuntimeError):
    """wordfreq's data file is missing or not the pinned one."""


def data_file() -> Path:
    """The installed wheel's small English list, found without importing ``wordfreq``."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise WordListUnavailable(f"Python package {PACKAGE!r} is not installed (pip install wordfreq==3.1.1)")
    path = Path(locations[0]).joinpath(*_FILE)
    if not path.is_file():
        raise WordListUnavailable(f"{path} is missing; reinstall wordfreq==3.1.1")
    return path


class _Table:
    """The list as two arrays, 10 bytes a word (a dict of the words held ~3 MB): each word's 64-bit hash (this
    process's ``hash``, sorted) and its frequency in centibels below 1."""

    def __init__(self, hashes: npt.NDArray[np.int64], centibels: npt.NDArray[np.uint16]) -> None:
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.centibels = centibels[order]

    def get(self, word: str, default: float) -> float:
        key = hash(word)
        at = int(np.searchsorted(self.hashes, key))
        if at < len(self.hashes) and self.hashes[at] == key:
            return round(9.0 - int(self.centibels[at]) / 100, 2)
        return default


@functools.cache
def _zipf() -> _Table | None:
    """The list, or None (logged once) when it cannot be read."""
    try:
        path = data_file()
        raw = path.read_bytes()
        found = hashlib.sha256(raw).hexdigest()
        if found != PINNED_SHA256:
            raise WordListUnavailable(f"{path} is not the pinned file (sha256 {found}); reinstall wordfreq==3.1.1")
        import msgpack  # type: ignore[import-untyped, import-not-found, unused-ignore]

        # wordfreq's "cBpack": a header, then one list of words per centibel of frequency (index i: -i cB), read
        # one list at a time so that the words never all live at once.
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(gzip.decompress(raw))
        lists = unpacker.read_array_header()
        header = unpacker.unpack()
        if not isinstance(header, dict) or header.get("format") != "cB":
            raise WordListUnavailable(f"{path} is not a cBpack word list")
        hashes: list[npt.NDArray[np.int64]] = []
        centibels: list[npt.NDArray[np.uint16]] = []
        for i in range(lists - 1):
            words = unpacker.unpack()
            hashes.append(np.fromiter((hash(word) for word in words), dtype=np.int64, count=len(words)))
            centibels.append(np.full(len(words), i, dtype=np.uint16))
        del unpacker
    except (WordListUnavailable, ImportError, OSError, ValueError) as exc:
        log.warning("no English word frequencies; rare words are judged by their word pieces (%s)", exc)
        return None
    return _Table(np.concatenate(hashes), np.concatenate(centibels))


def available() -> bool:
    return _zipf() is not None


def load() -> None:
    """Read the list now (about 30,000 words, 40 ms; 0.3 MB kept), not on the first question."""
    _zipf()


def zipf(word: str, forms: Sequence[str] = ()) -> float | None:
    """The Zipf frequency of a lower-case word (0.0 when the list does not hold it), the largest of it and its
    ``forms``; None without the list. A plural the keyword side folded ("atlas" -> "atla") is looked up as written."""
    table = _zipf()
    if table is None:
        return None
    written = (word + "s", word[:-1] + "ies") if word.endswith("y") else (word + "s",)
    if word.endswith("n"):  # the keyword side splits a contraction: "shouldn't" -> "shouldn"
        written = (*written, word + "'t")
    return max(table.get(form, 0.0) for form in (word, *written, *forms))


def rare(word: str, forms: Sequence[str] = ()) -> bool | None:
    """Whether a lower-case word (and each of its ``forms``) is rare in English; None without the list."""
    value = zipf(word, forms)
    return None if value is None else value < RARE_BELOW
