"""The shape of ``server/textbook_chat/``: what the import contracts leave unsaid, and proof that the contracts bite.

The shape itself is stated as import-linter contracts in ``pyproject.toml`` (``[tool.importlinter]``), checked by
``lint-imports`` in ``scripts/test.sh``: the stage order, only ``web`` importing starlette / sse_starlette,
the stages that must not know each other, and no import cycle inside a stage. Relative imports are ruff's
(``TID252``). What no import contract can say is tested here: each stage's ``__init__.py`` says in its docstring
what the stage takes in and hands on and re-exports nothing (so an import names the module it means), and
``server/textbook_chat/__init__.py`` holds only ``__version__``.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server" / "textbook_chat"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return found


def stages() -> list[str]:
    """The stages, top to bottom, as the layers contract lists them (the top-level modules left out)."""
    (layers,) = [c for c in contracts() if c["type"] == "layers"]
    names = layers["layers"]
    assert isinstance(names, list)
    return [name for name in names if (SERVER / name).is_dir()]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_contract_lists_every_stage_from_the_edge_down_to_core() -> None:
    assert stages() == ["web", "reports", "chat", "streams", "store", "answer", "search", "index", "book", "core"]
    assert {p.parent.name for p in SERVER.glob("*/__init__.py")} == set(stages())


def test_every_stage_says_what_it_takes_in_and_hands_on_and_re_exports_nothing() -> None:
    for stage in stages():
        tree = ast.parse((SERVER / stage / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"textbook_chat/{stage}/__init__.py has no docstring"
        assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body), f"{stage}: re-exports"


def test_the_package_root_holds_only_its_version() -> None:
    tree = ast.parse((SERVER / "__init__.py").read_text())
    assigned = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    assert assigned == ["__version__"]
    assert all(isinstance(n, (ast.Expr, ast.Assign)) for n in tree.body)  # the docstring and __version__


def test_the_contracts_hold_and_break_when_an_upward_or_a_framework_import_is_slipped_in(tmp_path: Path) -> None:
    """On a copy of the tree: as it is, every contract is kept; then a search module imports chat (upward), a
    streams module imports starlette, a store module imports answer, a chat module imports the HTTP body's
    schemas and a book module imports a module that imports it back (a cycle). Each breaks the contract that
    forbids it, and lint-imports fails."""
    shutil.copytree(SERVER, tmp_path / "textbook_chat", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    clean = lint_imports(tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in clean.stdout

    slipped = {
        "search/retrieval.py": "from textbook_chat.chat import run",
        "streams/relay.py": "import starlette.responses",
        "store/sessions.py": "from textbook_chat.answer import generation",
        "chat/exchange.py": "from textbook_chat.web.schemas import ChatRequest",
        "book/slugs.py": "from textbook_chat.book import mdx",  # mdx imports slugs
    }
    for module, line in slipped.items():
        path = tmp_path / "textbook_chat" / module
        path.write_text(path.read_text() + f"\n\ndef _slipped() -> None:\n    {line}  # noqa\n")
    broken = lint_imports(tmp_path)
    assert broken.returncode == 1
    out = broken.stdout
    assert "textbook_chat.search is not allowed to import textbook_chat.chat" in out
    assert "textbook_chat.streams is not allowed to import starlette" in out
    assert (
        "textbook_chat.store is not allowed to import textbook_chat.answer" in out
        or "textbook_chat.answer is not allowed" in out
    )
    assert "textbook_chat.chat is not allowed to import textbook_chat.web.schemas" in out
    assert "No import cycle among the modules of a stage BROKEN" in out
    assert f"Contracts: 0 kept, {len(contracts())} broken." in out.replace("\n", " ")
