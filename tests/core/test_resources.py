"""Where the server's files are found: the checkout's own folders, or the copies a built wheel carries."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT
from textbook_chat.core import resources


def test_from_the_checkout_the_files_are_the_repositorys_own_folders() -> None:
    found = resources.locate()
    assert not found.installed and found.root == ROOT
    assert found.alembic_ini == ROOT / "alembic.ini" and (found.migrations / "env.py").is_file()
    assert found.faq.is_file() and (found.demo_book / "docs").is_dir()
    assert found.panel == ROOT / "frontend" / "dist"
    assert found.tiktoken is None  # a checkout keeps them in DATA_DIR/tiktoken (scripts/setup.sh)
    assert found.default_data_dir == Path("./data")


def test_a_package_with_a_bundle_is_installed_and_reads_everything_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "textbook_chat"
    (package / "_bundled").mkdir(parents=True)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    found = resources.locate(package)
    bundle = package / "_bundled"
    assert found.installed and found.root == bundle
    assert found.panel == bundle / "frontend" / "dist" and found.migrations == bundle / "migrations"
    assert found.faq == bundle / "faq" / "faq.json" and found.demo_book == bundle / "examples" / "textbook"
    assert found.tiktoken == bundle / "data" / "tiktoken"
    assert found.default_data_dir == tmp_path / "xdg" / "textbook-chat"


def test_every_path_found_relative_to_the_root_is_one_the_wheel_carries() -> None:
    found = resources.locate()
    bundled = {ROOT / path for path in resources.BUNDLED}
    for path in (found.panel, found.alembic_ini, found.migrations, found.faq, found.demo_book):
        assert any(path == b or b in path.parents for b in bundled), path
    assert any(b.name == "tiktoken" for b in bundled)


def test_setup_py_copies_exactly_the_paths_resources_looks_for() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    assigned = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "BUNDLED"
    }
    assert assigned["BUNDLED"] == resources.BUNDLED
