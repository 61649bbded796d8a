"""One embedding interface, two embedders: local all-MiniLM-L6-v2 (onnxruntime, no torch) and OpenAI.

The local model's ONNX graph is built once from the package's safetensors and cached under DATA_DIR
(``onnx_minilm.py``); inference runs in one worker thread so the event loop never blocks. OpenAI errors
are translated here into ``RetrievalUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from textbook_chat.core import cpus, onnx_minilm
from textbook_chat.core.errors import RetrievalUnavailable
from textbook_chat.core.inflight import InFlight
from textbook_chat.core.settings import Settings
from textbook_chat.core.tokens import TokenCounter, counter_for_model, local_counter, wordpiece_tokenizer

log = logging.getLogger(__name__)

Role = Literal["batch", "background", "query"]  # which of the local model's sessions embeds (LocalEmbedder)

_LOCAL_MAX_WORDPIECES = 256
# The int8 question graph is used where its vectors of these texts are within QUERY_COSINE of the float32 graph's
# (short and odd texts drift most: the one letter "x" went to 0.975 on an AVX2 CPU without VNNI).
PROBE_TEXTS = (
    "x",
    "?",
    "ros2 topic echo /joint_states",
    "Gazebo & Unity",
    "What is a URDF file?",
    "A humanoid keeps its balance by moving its centre of mass over the support polygon.",
)
QUERY_COSINE = 0.98
_OPENAI_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
_OPENAI_MAX_INPUT_TOKENS = 8191
_OPENAI_MAX_REQUEST_TOKENS = 250_000
_OPENAI_MAX_INPUTS = 2048
_RETRIES = 3
_MAX_RETRY_AFTER_S = 20.0


class Embedder(Protocol):
    name: str
    model: str  # what embeds the chunks: kept with the index, which only this model's queries can search
    query_model: str  # what embeds a question (a calibration derived from questions is this model's)
    dim: int
    counter: TokenCounter
    chunk_tokens: int
    chunk_overlap: int

    async def embed_documents(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        """Vectors of ``texts`` in order; ``background`` (a re-ingest while serving) leaves cores to the readers."""
        ...

    async def embed_query(self, text: str) -> list[float]: ...

    def prepare_queries(self) -> None:
        """Settle now, at the end of an ingest, how questions will be embedded, so a server started next loads only
        that."""

    def release_batches(self) -> None:
        """Free what only document batches (ingest) use; the next batch loads it again."""

    async def aclose(self) -> None: ...


def create_embedder(settings: Settings) -> Embedder:
    if settings.embedder == "openai":
        if settings.openai_api_key is None:
            raise RetrievalUnavailable("EMBEDDER=openai needs OPENAI_API_KEY.")
        return OpenAIEmbedder(
            api_key=settings.openai_api_key.reveal(),
            base_url=settings.openai_base_url,
            model=settings.embedding_model,
            timeout_s=settings.llm_timeout_s,
        )
    return LocalEmbedder(settings.data_dir)


def _lower_priority() -> None:
    """Give this thread (only: Linux nices threads one by one) a lower CPU priority, where that is allowed."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _truncated(ids: list[int]) -> list[int]:
    """At most the word pieces the model reads: the text's first ones, then the closing [SEP]."""
    return ids if len(ids) <= _LOCAL_MAX_WORDPIECES else ids[: _LOCAL_MAX_WORDPIECES - 1] + ids[-1:]


class LocalEmbedder:
    """all-MiniLM-L6-v2: 384 dimensions, mean-pooled and L2-normalised; reads at most 256 word pieces."""

    name = "local"
    model = onnx_minilm.MODEL_NAME
    query_model = f"{onnx_minilm.MODEL_NAME} int8"
    dim = 384
    chunk_tokens = 200  # below the 256 word pieces it reads, leaving room for the heading breadcrumb
    chunk_overlap = 30

    def __init__(
        self, data_dir: Path, *, batch_size: int = 32, query_cache_size: int = 512, query_cosine: float = QUERY_COSINE
    ) -> None:
        self.counter = local_counter()
        self._data_dir = data_dir
        self._query_cosine = query_cosine
        self._batch_size = batch_size
        # onnxruntime sessions, each loaded on first use (onnx_minilm.py has the two graphs):
        # "batch": float32 chunks at ingest, each inference spread over every core;
        # "background": float32 chunks of a re-ingest while serving, on one core at a lower priority;
        # "query": the int8 graph (float32 where this CPU's integer kernels drift: query_graph), one question at a
        # time on one thread (a question is too small to split: 2.3x faster here under load, bench/chat.py), so
        # two questions run side by side on two cores.
        # Only "query" lives as long as the server; release_batches drops the other two.
        self._sessions: dict[Role, Any] = {}
        self._words: onnx_minilm.WordTable | None = None  # rows read from the model's word table as needed
        self._executor: ThreadPoolExecutor | None = None  # one batch at a time; each uses every core
        self._query_executor: ThreadPoolExecutor | None = None
        self._background_executor: ThreadPoolExecutor | None = None  # re-ingest while serving (nice 10)
        self._cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._cache_size = query_cache_size
        # Questions under way; one given up on still runs to the end on its thread, so its vector is kept.
        self._embedding = InFlight[str, npt.NDArray[np.float32]](on_result=self._keep, cancel_abandoned=False)
        self._load_lock = threading.Lock()

    def warm_up(self) -> None:
        self.embed(["warm up"])

    def embed(self, texts: Sequence[str], *, role: Role = "batch") -> npt.NDArray[np.float32]:
        """Synchronous, batched; rows in input order; ``role`` picks the session (see ``__init__``).

        Texts are tokenised once and batched by word-piece count, so a batch pads to little more than its
        own length: the model's cost is in the padded tokens (sorting by characters pads ~30% more).
        """
        session = self._load(role)
        words = self._words
        assert words is not None  # loaded with the session
        result = np.zeros((len(texts), self.dim), dtype=np.float32)
        encodings = [_truncated(e.ids) for e in wordpiece_tokenizer().encode_batch(list(texts))]
        lengths = [len(ids) for ids in encodings]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        for start in range(0, len(order), self._batch_size):
            batch = order[start : start + self._batch_size]
            ids = np.zeros((len(batch), lengths[batch[-1]]), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(batch):
                ids[row, : lengths[i]] = encodings[i]
                mask[row, : lengths[i]] = 1
            feeds = {"word_embeddings": words.rows(ids), "attention_mask": mask}
            (vectors,) = session.run([onnx_minilm.OUTPUT_NAME], feeds)
            result[batch] = vectors
        return result

    async def embed_documents(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        if not texts:
            return []
        # In the background (a re-ingest while serving) a batch runs on one core, the query session's, in a
        # thread of lower CPU priority: the other cores, and this one when they need it, stay with readers.
        if background and self._background_executor is None:
            self._background_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="minilm-bg", initializer=_lower_priority
            )
        if not background and self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minilm")
        executor = self._background_executor if background else self._executor
        role: Role = "background" if background else "batch"
        # run_in_executor hands the batch to the thread in this very step (anyio's to_thread first yields
        # twice), so a caller that schedules it and then blocks the loop (an embedded-Qdrant write) overlaps.
        vectors = await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(self.embed, list(texts), role=role)
        )
        return vectors.tolist()  # type: ignore[no-any-return]

    async def embed_query(self, text: str) -> list[float]:
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached.tolist()  # type: ignore[no-any-return]
        # Readers who ask the same question at once (a panel's suggestion) share one run of the model.
        vector = await self._embedding(text, functools.partial(self._embed_question, text))
        return vector.tolist()  # type: ignore[no-any-return]

    def _embed_question(self, text: str) -> asyncio.Future[npt.NDArray[np.float32]]:
        if self._query_executor is None:
            self._query_executor = ThreadPoolExecutor(max_workers=cpus.usable(), thread_name_prefix="minilm-q")
        return asyncio.get_running_loop().run_in_executor(self._query_executor, self._question_vector, text)

    def _question_vector(self, text: str) -> npt.NDArray[np.float32]:
        # Kept as float32 (1.5 KB), not as a list of Python floats (12 KB): 512 questions cost 0.8 MB, not 6.
        vector: npt.NDArray[np.float32] = self.embed([text], role="query")[0].copy()
        return vector

    def _keep(self, text: str, vector: npt.NDArray[np.float32]) -> None:
        self._cache[text] = vector
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def forget_queries(self) -> None:
        """Empty the query cache (a benchmark that must embed each conversation's questions afresh)."""
        self._cache.clear()

    def prepare_queries(self) -> None:
        """Decide the question graph on this CPU now (``query_graph``, which the ingest's float32 session can check
        against): a server that starts next only reads the verdict. Probing there instead loaded the float32 graph
        beside the int8 one and left ~7 MB of its heap behind."""
        self.query_graph(onnx_minilm.cached_model(self._data_dir))

    def release_batches(self) -> None:
        # The float32 sessions are copies of the model (~95 MB with the batch's arena) beside the query's
        # int8 one; a server that ingested at start-up, or re-ingested a changed book, only answers questions.
        with self._load_lock:
            self._sessions.pop("batch", None)
            self._sessions.pop("background", None)
        for executor in (self._executor, self._background_executor):
            if executor is not None:
                executor.shutdown(wait=False)
        self._executor = self._background_executor = None

    async def aclose(self) -> None:
        for executor in (self._executor, self._query_executor, self._background_executor):
            if executor is not None:
                executor.shutdown(wait=False)
        self._executor = self._query_executor = self._background_executor = None
        self._sessions.clear()
        if self._words is not None:
            self._words.close()
            self._words = None

    def _load(self, role: Role) -> Any:
        with self._load_lock:  # the query threads may race to load
            session = self._sessions.get(role)
            if session is not None:
                return session
            files = onnx_minilm.cached_model(self._data_dir)
            if self._words is None:
                self._words = onnx_minilm.WordTable(files.words)
            graph = self.query_graph(files) if role == "query" else files.graph
            session = _session(graph, role)
            self._sessions[role] = session
            return session

    def query_graph(self, files: onnx_minilm.ModelFiles) -> Path:
        """The int8 graph if its vectors of ``PROBE_TEXTS`` are within ``query_cosine`` of float32's on this CPU,
        else the float32 graph; checked once per CPU and model (``files.query_check`` keeps the verdict), logged."""
        cpu = _cpu_signature()
        try:
            record = json.loads(files.query_check.read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("cpu") != cpu or not isinstance(record.get("cosine"), float):
            record = {"cpu": cpu, "cosine": self._probe(files)}
            tmp = files.query_check.with_name(f".{files.query_check.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(files.query_check)
        cosine = float(record["cosine"])
        if cosine >= self._query_cosine:
            log.info("questions are embedded by the int8 graph (cosine %.4f to float32 on this CPU)", cosine)
            return files.query_graph
        log.warning(
            "questions are embedded by the float32 graph: this CPU's integer kernels put the int8 graph at cosine "
            "%.4f of float32 (under %.2f)",
            cosine,
            self._query_cosine,
        )
        return files.graph

    def _probe(self, files: onnx_minilm.ModelFiles) -> float:
        """The lowest cosine between the int8 and the float32 graph's vectors of ``PROBE_TEXTS``, one at a time."""
        if self._words is None:
            self._words = onnx_minilm.WordTable(files.words)
        # One float32 copy, not two: the ingest's own where it has one.
        exact = self._sessions.get("batch") or self._sessions.get("background") or _session(files.graph, "query")
        graphs = (exact, _session(files.query_graph, "query"))
        lowest = 1.0
        for encoding in wordpiece_tokenizer().encode_batch(list(PROBE_TEXTS)):
            ids = np.array([_truncated(encoding.ids)], dtype=np.int64)
            feeds = {"word_embeddings": self._words.rows(ids), "attention_mask": np.ones_like(ids)}
            exact, quantized = (graph.run([onnx_minilm.OUTPUT_NAME], feeds)[0][0] for graph in graphs)
            lowest = min(lowest, float(np.dot(exact, quantized)))
        return round(lowest, 4)


def _session(graph: Path, role: Role) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = cpus.usable() if role == "batch" else 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime's CPU arena keeps the peak of the largest batch for the life of its session (about
    # 1 GB after an ingest). The query session, which lives as long as the server, has none: a query
    # is as fast without (6.1 vs 6.2 ms). The every-core batch session keeps it: whole-book ingest is
    # 24 % slower without (600 chunks of the shared book in 22.7 s vs 17.3 s), and a server releases
    # that session, arena and all, once its start-up ingest is done (release_batches).
    options.enable_cpu_mem_arena = role == "batch"
    return onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def _cpu_signature() -> str:
    """This CPU's model and instruction sets (which integer kernels onnxruntime picks), as a short digest."""
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        import platform

        info = f"{platform.machine()} {platform.processor()}"
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return hashlib.sha256("\n".join(sorted(set(lines))).encode()).hexdigest()[:16]


class OpenAIEmbedder:
    """OpenAI embeddings, batched by input count and tokens, with our own retry policy (429 and 5xx)."""

    name = "openai"
    chunk_tokens = 512
    chunk_overlap = 64

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str | None,
        model: str,
        timeout_s: float,
        max_inputs: int = _OPENAI_MAX_INPUTS,
        dim: int | None = None,
    ) -> None:
        from openai import AsyncOpenAI

        self.model = self.query_model = model
        self.dim = dim or _OPENAI_DIMS.get(model, 1536)
        self.counter = counter_for_model(model)
        self._max_inputs = max_inputs
        self._client = AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)

    async def embed_documents(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        vectors: list[list[float]] = []
        for batch in self._batches([self.counter.truncate(t, _OPENAI_MAX_INPUT_TOKENS) for t in texts]):
            vectors.extend(await self._request(batch))
        return vectors

    async def embed_query(self, text: str) -> list[float]:
        (vector,) = await self.embed_documents([text])
        return vector

    def prepare_queries(self) -> None:
        pass  # questions go to the same model as the chunks

    def release_batches(self) -> None:
        pass  # nothing is held between requests

    async def aclose(self) -> None:
        await self._client.close()

    def _batches(self, texts: Sequence[str]) -> list[list[str]]:
        batches: list[list[str]] = []
        current: list[str] = []
        tokens = 0
        for text in texts:
            n = self.counter.count(text)
            if current and (len(current) >= self._max_inputs or tokens + n > _OPENAI_MAX_REQUEST_TOKENS):
                batches.append(current)
                current, tokens = [], 0
            current.append(text)
            tokens += n
        if current:
            batches.append(current)
        return batches

    async def _request(self, batch: list[str]) -> list[list[float]]:
        import openai

        for attempt in range(_RETRIES + 1):
            try:
                response = await self._client.embeddings.create(model=self.model, input=batch)
                return [item.embedding for item in sorted(response.data, key=lambda d: d.index)]
            except openai.RateLimitError as exc:
                delay = _retry_after(exc.response.headers.get("retry-after"), attempt)
                if attempt == _RETRIES or delay > _MAX_RETRY_AFTER_S:
                    raise _unavailable(exc) from exc
            except (openai.APITimeoutError, openai.APIConnectionError, openai.InternalServerError) as exc:
                if attempt == _RETRIES:
                    raise _unavailable(exc) from exc
                delay = _backoff(attempt)
            except openai.APIError as exc:
                raise _unavailable(exc) from exc
            log.warning("embedding request failed; retrying in %.1f s", delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


def _backoff(attempt: int) -> float:
    return min(8.0, 0.5 * 2.0**attempt) * (0.8 + 0.4 * random.random())


def _retry_after(header: str | None, attempt: int) -> float:
    try:
        return max(0.0, float(header)) if header is not None else _backoff(attempt)
    except ValueError:
        return _backoff(attempt)


def _unavailable(exc: Exception) -> RetrievalUnavailable:
    log.warning("embedding service unavailable: %s", type(exc).__name__)
    return RetrievalUnavailable("The textbook search is temporarily unavailable.")
