"""Token counting: tiktoken when its BPE file is cached (filled from js-tiktoken), the MiniLM tokenizer otherwise.

Each case runs in a fresh interpreter: tiktoken and textbook_chat.core.tokens cache what they load per process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from textbook_chat.core import tokens

ROOT = Path(__file__).resolve().parents[2]
FILL_SCRIPT = ROOT / "scripts" / "fill_tiktoken_cache.py"


def load_fill_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fill_tiktoken_cache", FILL_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


fill_script = load_fill_script()


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TIKTOKEN_CACHE_DIR holding cl100k_base and o200k_base: copied from setup's data/tiktoken, else rebuilt."""
    target = tmp_path_factory.mktemp("tiktoken")
    setup_cache = ROOT / "data" / "tiktoken"
    for encoding in fill_script.ENCODINGS:
        source = encoding.cache_path(setup_cache)
        if source.is_file():
            shutil.copy(source, encoding.cache_path(target))
    try:
        fill_script.fill(target)
    except fill_script.FillError as exc:
        pytest.skip(f"cannot fill a tiktoken cache here: {exc}")
    return target


def run_python(code: str, *, cache_dir: Path | None) -> dict[str, object]:
    """Run ``code`` in a new interpreter that cannot reach the network; it prints one JSON object."""
    env = {key: value for key, value in os.environ.items() if not key.endswith(("_PROXY", "_proxy"))}
    env.pop("DATA_GYM_CACHE_DIR", None)
    env["TIKTOKEN_CACHE_DIR"] = str(cache_dir) if cache_dir is not None else ""
    # tiktoken fetches a missing BPE file with requests, which honours the proxy: a closed port refuses at once.
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:1"
    env["PYTHONPATH"] = str(ROOT)
    prelude = textwrap.dedent(
        """
        import json, socket, sys
        connections = []
        _connect = socket.socket.connect
        def recording_connect(self, address):
            connections.append(str(address))
            return _connect(self, address)
        socket.socket.connect = recording_connect
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_importing_the_counting_and_chunking_modules_loads_no_encoding_and_opens_no_socket() -> None:
    result = run_python(
        """
        import textbook_chat.core.tokens, textbook_chat.book.chunking
        import textbook_chat.index.embeddings, textbook_chat.index.ingest
        print(json.dumps({"tiktoken_loaded": "tiktoken" in sys.modules, "connections": connections}))
        """,
        cache_dir=None,
    )
    assert result == {"tiktoken_loaded": False, "connections": []}


def test_the_filled_cache_gives_exact_tiktoken_counts_without_the_network(filled_cache: Path) -> None:
    result = run_python(
        """
        from textbook_chat.core.tokens import counter_for_model, tiktoken_counter
        chat = counter_for_model("gpt-4o-mini")
        embed = tiktoken_counter("cl100k_base")
        print(json.dumps({
            "chat": [chat.name, chat.exact, chat.count("Hello world")],
            "embed": [embed.name, embed.exact, embed.count("Hello world")],
            "truncated": chat.truncate("one two three four five", 2),
            "connections": connections,
        }))
        """,
        cache_dir=filled_cache,
    )
    assert result["chat"] == ["tiktoken:o200k_base", True, 2]
    assert result["embed"] == ["tiktoken:cl100k_base", True, 2]
    assert result["truncated"] == "one two"
    assert result["connections"] == []


def test_without_the_bpe_file_counting_falls_back_to_the_local_tokenizer(tmp_path: Path) -> None:
    result = run_python(
        """
        from textbook_chat.core.tokens import counter_for_model, local_counter
        counter = counter_for_model("gpt-4o-mini")
        text = "ros2 topic echo /joint_states prints every message."
        print(json.dumps({
            "name": counter.name,
            "exact": counter.exact,
            "same_as_local": counter.count(text) == local_counter().count(text),
            "count": counter.count(text),
        }))
        """,
        cache_dir=tmp_path / "empty",
    )
    assert result["name"] == "minilm-wordpiece"
    assert result["exact"] is False
    assert result["same_as_local"] is True
    assert isinstance(result["count"], int) and result["count"] > 5


def test_a_failed_encoding_load_is_tried_once_and_warned_about_once(tmp_path: Path) -> None:
    result = run_python(
        """
        import logging
        import tiktoken.load
        warnings = []
        class Collect(logging.Handler):
            def emit(self, record):
                warnings.append(record.getMessage())
        logging.getLogger("textbook_chat.core.tokens").addHandler(Collect())
        downloads = []
        _read_file = tiktoken.load.read_file
        def counting_read_file(blobpath):
            downloads.append(blobpath)
            return _read_file(blobpath)
        tiktoken.load.read_file = counting_read_file
        from textbook_chat.core.tokens import tiktoken_counter
        first = tiktoken_counter("o200k_base")
        second = tiktoken_counter("o200k_base")
        print(json.dumps({"same": first is second, "downloads": len(downloads), "warnings": len(warnings)}))
        """,
        cache_dir=tmp_path / "empty",
    )
    assert result == {"same": True, "downloads": 1, "warnings": 1}


def test_filling_an_already_filled_cache_rewrites_nothing(filled_cache: Path) -> None:
    before = {path.name: path.stat().st_mtime_ns for path in filled_cache.iterdir()}
    assert fill_script.fill(filled_cache) == []
    assert {path.name: path.stat().st_mtime_ns for path in filled_cache.iterdir()} == before


def test_a_js_tiktoken_ranks_module_becomes_tiktoken_lines_in_rank_order() -> None:
    module = 'export default {"pat_str":"x","special_tokens":{},"bpe_ranks":"! 0 YQ== Yg==\\n! 5 Yw=="};'
    assert fill_script.to_tiktoken_file(module) == b"YQ== 0\nYg== 1\nYw== 5\n"


def test_both_counters_truncate_to_a_prefix_that_fits_even_where_a_cut_falls_inside_a_character(
    filled_cache: Path,
) -> None:
    """Both counters share one truncate: at every budget the result is a prefix of the text within the budget,
    a larger budget never keeps less, and the whole text comes back at its own count. tiktoken's tokens can end
    inside a multi-byte character (the emoji, the CJK) and the word-piece one has a 150-character [UNK] word."""
    result = run_python(
        """
        from textbook_chat.core.tokens import local_counter, tiktoken_counter
        texts = ["Joint torque 扭矩 控制器 🤖🤖🤖 balance", "short " + "x" * 150 + " tail words here", "plain"]
        out = []
        for counter in (tiktoken_counter("cl100k_base"), local_counter()):
            for text in texts:
                for budget in range(0, counter.count(text) + 2):
                    cut = counter.truncate(text, budget)
                    out.append([counter.name, text, budget, cut, counter.count(cut)])
        print(json.dumps({"cuts": out, "connections": connections}))
        """,
        cache_dir=filled_cache,
    )
    cuts = result["cuts"]
    assert isinstance(cuts, list) and {c[0] for c in cuts} == {"tiktoken:cl100k_base", "minilm-wordpiece"}
    kept: dict[tuple[str, str], list[int]] = {}
    for name, text, budget, cut, count in cuts:
        assert text.startswith(cut) and count <= budget, (name, text, budget, cut)
        kept.setdefault((name, text), []).append(len(cut))
    for (name, text), lengths in kept.items():
        assert lengths == sorted(lengths), name  # a larger budget never keeps less
        assert lengths[-2:] == [len(text), len(text)], name  # the whole text at its own count and above
    assert result["connections"] == []


def test_tiktoken_reads_the_data_dirs_files_else_the_wheels_unless_told_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir, bundled = tmp_path / "data", tmp_path / "bundled"
    bundled.mkdir()
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    assert tokens.configure_tiktoken_cache(data_dir, bundled) == bundled
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(bundled.resolve())

    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    (data_dir / "tiktoken").mkdir(parents=True)
    assert tokens.configure_tiktoken_cache(data_dir, bundled) == data_dir / "tiktoken"

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "mine"))
    assert tokens.configure_tiktoken_cache(data_dir, bundled) == tmp_path / "mine"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path / "mine")


def test_without_any_files_tiktoken_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    assert tokens.configure_tiktoken_cache(tmp_path / "data", None) is None
    assert "TIKTOKEN_CACHE_DIR" not in os.environ
