"""Rules about the package's source that keep it readable: each rule has one home, and no module outgrows a sitting.

- A regular expression of 20 characters or more is written in one module. Two copies of one pattern (say, how a
  heading's explicit id is spelled) agree the day they are written; the next change reaches one of them, and a
  citation points at an anchor its page does not have. Read with ``ast``: the pattern literal of every
  ``re.compile`` and of every ``re.search``/``match``/``sub``/... call (which compile it too).
- One rule is not written twice in other spellings either: no two modules define the same ``Literal`` alias (one
  ``Mode``), and no two long patterns of two modules are near-copies (a table delimiter written ``-{2,}`` in one
  and ``-+`` in the other).
- Every pattern runs in time linear in its input: the server matches text from the model, the book and readers,
  and one nested or adjacent pair of overlapping quantifiers made a heading line of 10,000 spaces cost minutes.
- No module is longer than ``MAX_LINES``: past that, a module holds more than one concept; split it at a seam.
- No function in the chat stage takes more than ``MAX_PARAMETERS`` (every parameter but ``self``/``cls``, keyword-only
  ones too). The run of an answer once took eleven, and a field added for a question went through five signatures;
  what a step needs is on the run object (``chat/run.py`` ``AnswerRun``) or the question (``chat/question.py``).
"""

from __future__ import annotations

import ast
import difflib
import importlib
import pkgutil
import re
import time
from collections import defaultdict
from pathlib import Path

import pytest

import textbook_chat

SERVER = Path(__file__).resolve().parents[1] / "server" / "textbook_chat"
MAX_LINES = 500
MIN_PATTERN = 20
MAX_PARAMETERS = 6
NARROW_STAGES = ("server/textbook_chat/chat/",)  # where MAX_PARAMETERS holds
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
    return {path.relative_to(SERVER.parents[1]).as_posix(): path.read_text() for path in sorted(SERVER.rglob("*.py"))}


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


def literal_aliases(source: str) -> list[frozenset[str]]:
    """The values of each module-level ``Name = Literal[...]`` alias of ``source``."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
            value = node.value
            if isinstance(value.value, ast.Name) and value.value.id == "Literal":
                items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                found.append(frozenset(str(i.value) for i in items if isinstance(i, ast.Constant)))
    return found


def test_no_literal_type_is_spelled_out_in_two_modules() -> None:
    homes: dict[frozenset[str], set[str]] = defaultdict(set)
    for name, source in server_sources().items():
        for values in literal_aliases(source):
            homes[values].add(name)
    assert {tuple(sorted(v)): n for v, n in homes.items() if len(n) > 1} == {}
    assert literal_aliases("Mode = Literal['textbook', 'selection']\nX = 1") == [frozenset({"textbook", "selection"})]


def near_copies(sources: dict[str, str], *, similarity: float = 0.85, length: int = 30) -> list[tuple[str, str]]:
    """Pairs of long patterns of two different modules that differ in a few characters (``difflib`` ratio)."""
    written = [(name, p) for name, source in sources.items() for p in set(patterns(source)) if len(p) >= length]
    pairs = []
    for i, (home, pattern) in enumerate(written):
        for other_home, other in written[i + 1 :]:
            if home != other_home and pattern != other:
                if difflib.SequenceMatcher(None, pattern, other).ratio() >= similarity:
                    pairs.append((pattern, other))
    return pairs


def test_no_long_pattern_is_a_near_copy_of_another_modules() -> None:
    assert near_copies(server_sources()) == []
    delimiter = r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$"
    stricter = delimiter.replace("-+", "-{2,}", 1)  # one of its two cells written another way
    sources = {
        "a.py": f"import re\nX = re.compile(r'{delimiter}')",
        "b.py": f"import re\nY = re.compile(r'{stricter}')",
    }
    assert len(near_copies(sources)) == 1


# Lines that made a backtracking pattern slow (a heading of spaces: minutes), each 10,000 characters or so.
N = 10_000
PATHOLOGICAL = [
    "# a" + " " * N + "b",
    " " * N + "x",
    "\t" * N + "x",
    "a" * N + "!",
    "*" * N + "x",
    "* " * (N // 2) + "x",
    "_a" * (N // 2),
    "[" * N,
    "[a](" * (N // 4),
    "](" * (N // 2),
    "{/* #" + "a" * N,
    "{#" * (N // 2),
    "{/*" * (N // 3),
    "<!--" * (N // 4),
    ":" * N + "x",
    ":::tip" + " " * N + "x",
    "|" + "-" * N + "x",
    "|---" + " " * N + "x",
    "| a " * (N // 4) + "x",
    "1." * (N // 2) + "x",
    "next " * (N // 5) + "x",
    "<a " * (N // 3),
    "`" * N + "x",
    ". " * (N // 2) + "x",
    "a " * (N // 2) + "!",
    "[1]" * (N // 3) + "x",
    "a=" * (N // 2),
    "-" * N + "x",
    "#" + " #" * (N // 2) + "x",
]
TIME_LIMIT_S = 0.25  # a linear pattern takes about a millisecond here; a quadratic one, seconds


def server_patterns() -> dict[str, re.Pattern[str]]:
    """Every pattern of the package: compiled at module level (with their flags), and written inline in a call."""
    found: dict[str, re.Pattern[str]] = {}
    for info in pkgutil.walk_packages(textbook_chat.__path__, "textbook_chat."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                found[f"{info.name}.{name}"] = value
    for name, source in server_sources().items():
        for i, pattern in enumerate(patterns(source)):
            found.setdefault(f"{name}:inline{i}", re.compile(pattern))
    return found


@pytest.mark.slow
def test_every_pattern_runs_in_linear_time_on_pathological_lines() -> None:
    compiled = server_patterns()
    slow = {}
    for where, pattern in compiled.items():
        for text in PATHOLOGICAL:
            for _attempt in range(2):  # a busy machine may stall one try; a quadratic pattern is slow every time
                started = time.perf_counter()
                pattern.search(text)
                elapsed = time.perf_counter() - started
                if elapsed < TIME_LIMIT_S:
                    break
            else:
                slow[where] = (text[:12], round(elapsed, 2))
    assert slow == {}
    assert len(compiled) > 100  # the check reads the package's patterns


def test_the_linear_time_check_catches_a_pattern_of_adjacent_overlapping_quantifiers() -> None:
    heading = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")  # answer/extract.py's heading rule before
    started = time.perf_counter()
    # 800 spaces, under a tenth of the test's line: already about four times the limit (500 took just under it on
    # a quiet AVX2 machine; the time grows with the cube of the spaces).
    heading.search("# a" + " " * 800 + "b")
    assert time.perf_counter() - started > TIME_LIMIT_S


def test_no_module_is_longer_than_the_limit() -> None:
    lengths = {name: len(source.splitlines()) for name, source in server_sources().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > MAX_LINES // 2  # the check reads real modules


def parameters(source: str) -> dict[str, int]:
    """Each function or method of ``source`` (by qualified name) with its number of parameters: positional-only,
    ordinary, ``*args``, keyword-only and ``**kwargs``, less a method's ``self`` or ``cls``."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args
                names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
                names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                if in_class and names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                counts[f"{prefix}{child.name}"] = len(names)
                visit(child, f"{prefix}{child.name}.", False)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(source), "", False)
    return counts


def test_no_function_of_the_chat_stage_takes_more_than_the_limit() -> None:
    counts = {
        f"{name}:{function}": n
        for name, source in server_sources().items()
        if name.startswith(NARROW_STAGES)
        for function, n in parameters(source).items()
    }
    assert {where: n for where, n in counts.items() if n > MAX_PARAMETERS} == {}
    assert any(
        where.startswith("server/textbook_chat/chat/run.py:AnswerRun.") for where in counts
    )  # the check reads the stage


def test_the_parameter_count_includes_keyword_only_and_star_parameters_but_not_self() -> None:
    source = (
        "def f(a, /, b, *args, c, d=1, **kw): pass\n"
        "class Run:\n"
        "    def step(self, a, *, b): pass\n"
        "    @classmethod\n"
        "    def make(cls, a): pass\n"
        "    @staticmethod\n"
        "    def plain(self_like): pass\n"
        "async def g(*, a, b, c, d, e, f, g):\n"
        "    def inner(self, x): pass\n"
    )
    assert parameters(source) == {
        "f": 6,
        "Run.step": 2,
        "Run.make": 1,
        "Run.plain": 1,
        "g": 7,
        "g.inner": 2,
    }
