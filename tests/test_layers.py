"""The shape of ``server/``: stages import only downward, and no module imports itself round a circle.

The rule, read from the source with ``ast`` (every ``import``/``from ... import`` of ``server``, at module
level, inside functions, and inside ``if TYPE_CHECKING:`` blocks alike — a type-only import still ties one
module to another):

- Each module belongs to a stage, its subpackage under ``server/``; ``STAGES`` lists them from the ground
  floor up. A module may import from its own stage or a stage listed before it, never one listed after.
  ``server/__main__.py`` and ``server/cli.py`` are the top floor; ``server/__init__.py`` holds only
  ``__version__`` and is the ground floor (so it may import nothing of ``server``).
- The graph of module-to-module imports has no cycle (a depth-first search finds no back edge).
  ``from server.x import y`` counts as an import of ``server.x.y`` when ``y`` is a module, else of ``server.x``.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "server"

# Ground floor first; a stage may import only from itself and the stages before it.
STAGES = ["core", "book", "index", "search", "answer", "store", "streams", "chat", "reports", "web"]
TOP = len(STAGES)  # server/__main__.py, server/cli.py


def _modules() -> dict[str, Path]:
    found = {}
    for path in SERVER.rglob("*.py"):
        parts = path.relative_to(SERVER.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every ``server`` module that ``path`` imports, wherever in the file the import is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name.split(".")[0] == "server")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "server":
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                out.add(child if child in known else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; write the absolute server.… path")
    return out


def graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: {d for d in _imports(path, known) if d != name} for name, path in known.items()}


def rank(module: str) -> int:
    """The floor ``module`` is on: its stage's place in ``STAGES``, or the top floor for server/*.py."""
    parts = module.split(".")
    if module == "server":
        return 0
    if len(parts) >= 2 and parts[1] in STAGES:
        return STAGES.index(parts[1])
    assert len(parts) <= 2, f"{module}: a subpackage missing from STAGES"
    return TOP


def upward(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in g.items() for d in deps if d in g and rank(d) > rank(m))


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (found := visit(d)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_every_subpackage_is_a_stage() -> None:
    packages = {p.parent.name for p in SERVER.glob("*/__init__.py")}
    assert packages == set(STAGES)


def test_no_stage_imports_a_later_one() -> None:
    assert upward(graph()) == []


def test_no_import_cycle() -> None:
    assert cycle(graph()) is None


def test_every_stage_says_what_it_takes_in_and_hands_on() -> None:
    for stage in STAGES:
        tree = ast.parse((SERVER / stage / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"server/{stage}/__init__.py has no docstring"
        assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body), f"{stage}: re-exports"


def test_the_checks_can_fail() -> None:
    """The checks see an upward import and a circle when there is one (on a made-up graph)."""
    g = {
        "server.core.errors": {"server.web.app"},
        "server.web.app": {"server.core.errors"},
        "server.streams.relay": {"server.streams.streaming"},
        "server.streams.streaming": {"server.streams.relay"},
    }
    assert upward(g) == ["server.core.errors -> server.web.app"]
    assert cycle(g) in (
        ["server.core.errors", "server.web.app", "server.core.errors"],
        ["server.streams.relay", "server.streams.streaming", "server.streams.relay"],
    )
