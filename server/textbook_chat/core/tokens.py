"""Token counting behind one interface: tiktoken when its encoding loads, else the MiniLM word-piece tokenizer.

Chunking, prompt budgets and the OpenAI embedder count through here; nothing else imports tiktoken.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    import tiktoken
    from tokenizers import Encoding, Tokenizer

logger = logging.getLogger(__name__)

LOCAL_NAME = "minilm-wordpiece"


class TokenCounter(Protocol):
    name: str
    exact: bool

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, max_tokens: int) -> str: ...


def local_counter() -> TokenCounter:
    """The all-MiniLM-L6-v2 word-piece tokenizer, without [CLS]/[SEP]: exact for the local embedder."""
    return _local(exact=True)


@functools.cache
def tiktoken_counter(encoding: str) -> TokenCounter:
    """tiktoken's ``encoding``, or the local tokenizer as a stand-in (``exact=False``) when it cannot load.

    Loading fails fast offline (tiktoken tries to download its BPE file; docs/settings.md: ``TIKTOKEN_CACHE_DIR``).
    Caching the returned object, stand-in included, is what caches the failure: one attempt, one warning.
    """
    import tiktoken

    try:
        enc = tiktoken.get_encoding(encoding)
    except Exception as exc:  # noqa: BLE001 -- network, hash mismatch, unknown name: all mean "no exact counts"
        logger.warning(
            "tiktoken encoding %s could not load (%s); counting tokens with the MiniLM tokenizer instead, "
            "so OpenAI token budgets are approximate. Run scripts/fill_tiktoken_cache.py and set "
            "TIKTOKEN_CACHE_DIR for exact counts.",
            encoding,
            type(exc).__name__,
        )
        return _local(exact=False)
    return _TiktokenCounter(enc)


def counter_for_model(model: str) -> TokenCounter:
    """The counter for an OpenAI model name; unknown (newer) models get o200k_base."""
    return tiktoken_counter(encoding_for_model(model))


def encoding_for_model(model: str) -> str:
    name = model.lower().rsplit("/", 1)[-1]
    if name.startswith(("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o")) or _O_SERIES.match(name):
        return "o200k_base"
    if name.startswith(("text-embedding-3-", "text-embedding-ada-002", "gpt-3.5", "gpt-35")) or _GPT4.match(name):
        return "cl100k_base"
    return "o200k_base"


def configure_tiktoken_cache(data_dir: Path, bundled: Path | None = None) -> Path | None:
    """Point tiktoken at ``data_dir/tiktoken`` (filled by scripts/fill_tiktoken_cache.py), else at the files a
    wheel carries (``bundled``), unless TIKTOKEN_CACHE_DIR is already set; returns the folder tiktoken reads."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:  # set empty, it tells tiktoken to keep no cache
        return Path(os.environ["TIKTOKEN_CACHE_DIR"]) if os.environ["TIKTOKEN_CACHE_DIR"] else None
    for cache_dir in (data_dir / "tiktoken", bundled):
        if cache_dir is not None and cache_dir.is_dir():
            # The one environ write outside settings.py: tiktoken reads its cache location only from the
            # environment (tiktoken/load.py), so this is the sole way to hand it a folder.
            os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir.resolve())
            return cache_dir
    return None


_Piece = TypeVar("_Piece")
_O_SERIES = re.compile(r"^o\d")
_GPT4 = re.compile(r"^gpt-4(?:$|-)")


class _Truncating(Generic[_Piece]):
    """``truncate`` for a counter that can split a text into tokens (``_pieces``) and cut it after ``keep`` of
    them (``_prefix``). Re-encoded, a prefix can count more tokens than it was cut after; the cut then moves
    back by the excess until the prefix fits."""

    def count(self, text: str) -> int:
        return len(self._pieces(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        if max_tokens <= 0:
            return ""
        pieces = self._pieces(text)
        if len(pieces) <= max_tokens:
            return text
        keep = max_tokens
        while keep > 0:
            prefix = self._prefix(text, pieces, keep)
            excess = self.count(prefix) - max_tokens
            if excess <= 0:
                return prefix
            keep -= excess
        return ""

    def _pieces(self, text: str) -> Sequence[_Piece]:
        raise NotImplementedError

    def _prefix(self, text: str, pieces: Sequence[_Piece], keep: int) -> str:
        raise NotImplementedError


class _TiktokenCounter(_Truncating[int]):
    exact = True

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        # tiktoken keeps the encoding's BPE ranks twice: in its Rust core, which encodes, and as a Python dict
        # (~25 MB for o200k) read only to pickle the Encoding. Nothing here pickles it, so the dict goes.
        if isinstance(getattr(encoding, "_mergeable_ranks", None), dict):
            encoding._mergeable_ranks = {}  # noqa: SLF001
        self._enc = encoding
        self.name = f"tiktoken:{encoding.name}"

    def _pieces(self, text: str) -> list[int]:
        # Book text may contain "<|endoftext|>"; encode_ordinary treats it as plain text instead of raising.
        return self._enc.encode_ordinary(text)

    def _prefix(self, text: str, pieces: Sequence[int], keep: int) -> str:
        # A token can end inside a multi-byte character; dropping the partial tail keeps a clean prefix.
        return self._enc.decode_bytes(pieces[:keep]).decode("utf-8", errors="ignore")

    def __repr__(self) -> str:
        return f"<TokenCounter {self.name}>"


class _LocalCounter(_Truncating[tuple[int, int]]):
    name = LOCAL_NAME

    def __init__(self, tokenizer: Tokenizer, *, exact: bool) -> None:
        self._tokenizer = tokenizer
        self.exact = exact

    def _encode(self, text: str) -> Encoding:
        # encode_batch, not encode: only the batch call lets go of the GIL while it runs, and ingest counts in
        # a worker thread while the event loop streams answers (a 30 KB section held the loop ~15 ms).
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=False)
        return encoding

    def _pieces(self, text: str) -> list[tuple[int, int]]:
        return self._encode(text).offsets

    def _prefix(self, text: str, pieces: Sequence[tuple[int, int]], keep: int) -> str:
        # Words over 100 characters are one [UNK] whose prefix may split into several pieces.
        return text[: pieces[keep - 1][1]]

    def __repr__(self) -> str:
        return f"<TokenCounter {self.name} exact={self.exact}>"


@functools.lru_cache(maxsize=2)
def _local(*, exact: bool) -> _LocalCounter:
    return _LocalCounter(wordpiece_tokenizer(), exact=exact)


@functools.lru_cache(maxsize=1)
def wordpiece_tokenizer() -> Tokenizer:
    """The one all-MiniLM-L6-v2 tokenizer of the process (counting and the local embedder), never truncating."""
    from tokenizers import Tokenizer

    from textbook_chat.core.onnx_minilm import model_dir

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    # tokenizer.json ships truncation and fixed padding at 128; counting must see the whole text.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
