"""Rules about ``server/``'s source that keep it readable: each rule has one home, and no module outgrows a sitting.

- A regular expression of 20 characters or more is written in one module. Two copies of one pattern (say, how a
  heading's explicit id is spelled) agree the day they are written; the next change reaches one of them, and a
  citation points at an anchor its page does not have. Read with ``ast``: the pattern literal of every
  ``re.compile`` and of every ``re.search``/``match``/``sub``/... call (which compile it too).
- No module is longer than ``MAX_LINES``: past that, a module holds more than one concept; split it at a seam.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SERVER = Path(__file__).resolve().parents[1] / "server"
MAX_LINES = 500
MIN_PATTERN = 20
_COMPILING = {"compile", "search", "match", "fullmatch", "sub", "subn", "split", "findall", "finditer"}

# Copies that are another change's to remove, each with its reason; this list only shrinks.
_KNOWN_COPIES: dict[str, set[str]] = {}


def patterns(source: str) -> list[str]:
    """The literal patterns ``source`` hands to ``re``'s compiling functions (f-strings and names are skipped)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _COMPILING
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(node.args[0].value)
    return found


def copies(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each long pattern written in more than one module, with those modules."""
    homes: dict[str, set[str]] = defaultdict(set)
    for name, source in sources.items():
        for pattern in patterns(source):
            if len(pattern) >= MIN_PATTERN:
                homes[pattern].add(name)
    return {pattern: names for pattern, names in homes.items() if len(names) > 1}


def server_sources() -> dict[str, str]:
    return {path.relative_to(SERVER.parent).as_posix(): path.read_text() for path in sorted(SERVER.rglob("*.py"))}


def test_no_long_regex_is_written_in_two_modules() -> None:
    found = copies(server_sources())
    assert {p: n for p, n in found.items() if _KNOWN_COPIES.get(p) != n} == {}
    assert set(_KNOWN_COPIES) <= set(found), "a known copy is gone: take it off _KNOWN_COPIES"


def test_the_regex_check_sees_compiled_and_inline_copies_and_ignores_short_ones() -> None:
    heading_id = r"\s*\\?\{#[^}]*\}\s*$"
    sources = {
        "server/a.py": f"import re\nX = re.compile(r'{heading_id}')\nY = re.compile(r'^\\s+$')",
        "server/b.py": f"import re\ndef f(t): return re.sub(r'{heading_id}', '', t) or re.match(r'^\\s+$', t)",
        "server/c.py": "import re\nZ = re.compile(r'^\\s+$')",
    }
    assert copies(sources) == {heading_id: {"server/a.py", "server/b.py"}}


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {name: len(source.splitlines()) for name, source in server_sources().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > MAX_LINES // 2  # the check reads real modules
