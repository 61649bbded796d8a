"""The documentation says what the code does: ``docs/`` against the code, and the README within its size.

- docs/settings.md lists exactly the variables ``Settings.from_env`` reads, and a default written as one value is
  the default (setting the variable to it changes nothing);
- docs/sse-protocol.md names the event types of the stream and the notice codes the server sends;
- docs/http-api.md names exactly the app's routes;
- docs/schema.md names exactly the tables and columns the migrations create;
- docs/architecture.md lists the stages in the order the import contract holds them to;
- README.md, frontend/README.md, docs/*.md and the dated results under docs/results/ link only to files of this
  repository that exist (and to headings those files have), and name no path outside it; the README stays a first
  read (at most 350 lines), docs/evaluation.md a few pages (at most 300 lines, none absurdly long);
- no file of the repository names a capitalised ``*.md`` page (a design notes page) the repository does not have.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import get_args

import psycopg
from markdown_it import MarkdownIt
from starlette.routing import Mount, Route

from textbook_chat.book.mdx import Block, parse_blocks
from textbook_chat.book.slugs import Slugger
from textbook_chat.core.settings import Settings
from textbook_chat.streams.events import EventType
from textbook_chat.web.app import create_app
from textbook_chat.web.openapi import document

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SERVER = ROOT / "server" / "textbook_chat"
README_MAX_LINES = 350
EVALUATION_MAX_LINES = 300
MAX_LINE_CHARS = 120


# -- reading the Markdown --------------------------------------------------------------------------------


def table_rows(text: str) -> Iterator[list[str]]:
    """The cells of every table body row (header and delimiter rows left out); ``\\|`` does not split a cell."""
    for line in text.split("\n"):
        if not line.startswith("|") or re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
            continue
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells and cells[0] not in ("name", "event", "code", "route", "column"):
            yield cells


def first_cell_names(text: str) -> list[str]:
    """The backticked names in the first cell of every table row (``QDRANT_URL`` / ``QDRANT_API_KEY``: two)."""
    return [name for cells in table_rows(text) for name in re.findall(r"`([^`]+)`", cells[0])]


def sections(text: str, level: int) -> dict[str, str]:
    """Each heading of ``level`` (its text without backticks) and the text up to the next heading of that level."""
    marker = "#" * level + " "
    found: dict[str, str] = {}
    name: str | None = None
    for line in text.split("\n"):
        if line.startswith(marker):
            name = line[len(marker) :].strip().strip("`")
            found[name] = ""
        elif line.startswith("#" * (level - 1) + " ") and level > 1:
            name = None
        elif name is not None:
            found[name] += line + "\n"
    return found


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


# -- settings --------------------------------------------------------------------------------------------


class _Recording(Mapping[str, str]):
    """An environment that remembers every variable asked for."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return self._values[key]

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("Settings must ask for each variable by name, not walk the environment")

    def __len__(self) -> int:
        return len(self._values)


def read_variables() -> set[str]:
    env = _Recording()
    Settings.from_env(env)
    return env.asked


def test_every_setting_the_code_reads_is_documented_and_nothing_else() -> None:
    documented = first_cell_names(read("settings.md"))
    assert len(documented) == len(set(documented)), "a setting documented twice"
    assert set(documented) == read_variables()
    assert len(documented) >= 40


def test_a_documented_default_is_the_default() -> None:
    """Where the default column holds one value, setting the variable to it gives the settings of not setting it."""
    unset = Settings.from_env({})
    checked = 0
    for cells in table_rows(read("settings.md")):
        names = re.findall(r"`([^`]+)`", cells[0])
        value = re.fullmatch(r"`([^`]+)`", cells[1])
        if len(names) == 1 and value is not None:
            assert Settings.from_env({names[0]: value.group(1)}) == unset, names[0]
            checked += 1
    assert checked >= 25


def test_the_settings_check_sees_a_variable_read_but_not_documented() -> None:
    env = _Recording({"LOG_LEVEL": "debug"})
    Settings.from_env(env)
    assert {"LOG_LEVEL", "DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR"} <= env.asked
    assert "NOT_A_SETTING" not in env.asked


# -- the SSE protocol ------------------------------------------------------------------------------------


def notice_codes_in(source: str) -> set[str]:
    """The notice codes a module sends, read from the ways the code spells them: ``Notice("code", ...)`` (and
    any ``...Notice`` type), ``publish("notice", {"code": "code"})``, ``("code", _NOTICE_...)`` pairs,
    ``metrics.notice("code")`` and a ``...NoticeCode = Literal[...]`` type."""
    codes: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0] if node.args else None
            if (name.endswith("Notice") or name == "notice") and _text(first) is not None:
                codes.add(str(_text(first)))
            if any(_text(arg) == "notice" for arg in node.args):
                for arg in node.args:
                    if isinstance(arg, ast.Dict):
                        codes.update(
                            str(_text(v)) for k, v in zip(arg.keys, arg.values, strict=True) if _text(k) == "code"
                        )
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and _text(node.elts[0]) is not None:
            second = node.elts[1]
            if isinstance(second, ast.Name) and second.id.startswith("_NOTICE"):
                codes.add(str(_text(node.elts[0])))
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.endswith("NoticeCode") for t in node.targets
        ):
            codes.update(str(_text(c)) for c in ast.walk(node.value) if _text(c) is not None and c is not node.value)
    codes.discard("None")
    return codes - {"Literal"}


def _text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_the_event_types_are_the_streams_and_the_openapi_documents() -> None:
    documented = first_cell_names(sections(read("sse-protocol.md"), 2)["Events"])
    assert documented == list(get_args(EventType))
    stream = document()["paths"]["/api/chat"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    assert documented == stream["schema"]["properties"]["event"]["enum"]


def test_the_notice_codes_are_the_ones_the_server_sends() -> None:
    documented = first_cell_names(sections(read("sse-protocol.md"), 2)["Notice codes"])
    sent = set().union(*(notice_codes_in(p.read_text()) for p in SERVER.rglob("*.py")))
    assert len(documented) == len(set(documented))
    assert set(documented) == sent


def test_the_notice_scan_reads_each_spelling() -> None:
    source = """
NoticeCode = Literal["low_confidence", "scope_widened"]
notices.append(("history_unavailable", _NOTICE_HISTORY_OFF))
yield GenNotice("llm_retry", "again")
stream.publish("notice", {"code": "uncited", "message": m})
metrics.notice("fallback_faq")
stream.publish("token", {"text": "not a code"})
pair = ("meta", other)
"""
    assert notice_codes_in(source) == {
        "low_confidence",
        "scope_widened",
        "history_unavailable",
        "llm_retry",
        "uncited",
        "fallback_faq",
    }


# -- the HTTP API ----------------------------------------------------------------------------------------


def served_routes() -> set[str]:
    app = create_app(Settings.from_env({"LOG_FORMAT": "text"}))
    routes: set[str] = set()
    for route in app.routes:
        if isinstance(route, Route):
            path = route.path.replace("{path:path}", "{path}")
            routes.update(f"{method} {path}" for method in route.methods or () if method != "HEAD")
        elif isinstance(route, Mount):
            routes.add(f"GET {route.path}/{{path}}")
    return routes


def test_the_documented_routes_are_the_apps_routes() -> None:
    documented = first_cell_names(sections(read("http-api.md"), 2)["Routes"])
    assert len(documented) == len(set(documented))
    assert set(documented) == served_routes()


# -- the schema ------------------------------------------------------------------------------------------


def test_the_documented_tables_and_columns_are_the_migrated_ones(database_url: str) -> None:
    documented = {table: first_cell_names(body) for table, body in sections(read("schema.md"), 3).items()}
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name <> 'alembic_version' ORDER BY table_name, ordinal_position"
        ).fetchall()
    migrated: dict[str, list[str]] = {}
    for table, column in rows:
        migrated.setdefault(table, []).append(column)
    assert documented == migrated


# -- the architecture ----------------------------------------------------------------------------------


def test_the_stages_are_the_ones_the_layers_contract_orders() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    stages = [name for name in reversed(layers["layers"]) if (SERVER / name).is_dir()]
    assert first_cell_names(sections(read("architecture.md"), 2)["Stages"]) == stages


# -- links and size --------------------------------------------------------------------------------------


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "frontend" / "README.md", *sorted(DOCS.glob("*.md")), *results()]


def results() -> list[Path]:
    return sorted((DOCS / "results").glob("*.md"))


def links(path: Path) -> list[str]:
    """Every link and image target of a Markdown page (code spans and fences are not links)."""
    found: list[str] = []
    for token in MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8")):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrGet("href")))
            elif child.type == "image":
                found.append(str(child.attrGet("src")))
    return found


def anchors(path: Path) -> set[str]:
    """The ids GitHub gives a page's headings (github-slugger, as Docusaurus does: ``book/slugs.py``)."""
    text = path.read_text(encoding="utf-8")
    return {block.anchor for block in _headings(parse_blocks(text, Slugger()))}


def _headings(blocks: list[Block]) -> Iterator[Block]:
    for block in blocks:
        if block.kind == "heading":
            yield block
        yield from _headings(block.children)


def test_every_link_stays_in_the_repository_and_lands_on_a_file_and_heading_it_names() -> None:
    checked = 0
    for page in pages():
        for target in links(page):
            if target.startswith(("http://", "https://", "mailto:")):
                continue  # the web, not a file of ours
            checked += 1
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
            assert resolved.exists(), f"{page.name}: {target} does not exist"
            if anchor and resolved.suffix == ".md":
                assert anchor in anchors(resolved), f"{page.name}: {target} names no heading of {resolved.name}"
    assert checked >= 20


def test_no_page_links_outside_the_repository_even_to_the_web() -> None:
    """A fresh clone reads complete: the docs point at the web only for example addresses in code, never as links."""
    outside = [(p.name, t) for p in pages() for t in links(p) if t.startswith(("http://", "https://"))]
    assert outside == []


def test_the_readme_is_a_first_read() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES


def test_the_evaluation_page_is_a_few_pages_of_short_lines_and_its_figures_live_in_dated_results() -> None:
    lines = (DOCS / "evaluation.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= EVALUATION_MAX_LINES
    assert [n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS] == []
    assert results() and all(re.fullmatch(r"\d{4}-\d{2}\.md", page.name) for page in results())


def test_no_page_names_a_path_outside_the_repository() -> None:
    """A link is checked above; a path written as text (in code, a command) must not leave the checkout either."""
    outside = re.compile(r"(?<![\w.])\.\./|/work/")  # up and out of the checkout, or this machine's folders
    for page in pages():
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"\]\([^)\s]*\)", "]", text)  # link targets: resolved and checked by the test above
        assert [line for line in text.splitlines() if outside.search(line)] == [], page.name


def test_no_file_names_a_capitalised_page_the_repository_does_not_have() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    names = {Path(path).name for path in tracked.splitlines()}
    missing: dict[str, str] = {}
    for path in tracked.splitlines():
        if Path(path).suffix in (".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".ts", ".tsx", ".cfg", ".ini", ""):
            file = ROOT / path
            if file.is_file():
                for name in re.findall(r"\b[A-Z][A-Z_]+\.md\b", file.read_text(encoding="utf-8", errors="replace")):
                    if name not in names:
                        missing[path] = name
    assert missing == {}
