"""Docusaurus docs folder structure: modules (top folders, `_category_.json`), sidebar order, front matter.

A module is a top-level folder; a root-level doc (e.g. `intro.md`) is its own module, id = its doc id
and title = its title. Each doc is read into sections at H1-H3 (`mdx.py` gives the blocks).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from textbook_chat.book.mdx import Block, parse_blocks, substantive
from textbook_chat.book.slugs import Slugger, doc_id, doc_url, read_front_matter, read_yaml_mapping, strip_number_prefix

EMPTY_REASON = "no text left after removing front matter, MDX imports/exports, JSX markup and comments"
DRAFT_REASON = "a draft (draft: true): Docusaurus builds it in development only, so the published site lacks it"
CARDS_REASON = "an index of its category's pages (a card list and a sentence or two): those pages hold the content"
# A page that renders its category's cards (`<DocCardList />`) and says at most this many words of its own is an
# index: it restates the description its pages open with, and a reader cited to it finds only links there.
CARD_INDEX_WORDS = 60
_CARD_LIST = re.compile(r"^[ \t]*<DocCardList\b", re.M)


@dataclass(frozen=True)
class Module:
    id: str
    title: str
    position: float
    description: str


@dataclass(frozen=True)
class Skipped:
    file_path: str
    reason: str


@dataclass
class Section:
    heading: str  # the heading line as Markdown ("" for the top of the document)
    title: str
    path: tuple[str, ...]
    anchor: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Doc:
    file_path: str
    front_matter: dict[str, object]
    title: str
    doc_id: str
    url: str
    position: float | None
    sections: list[Section]
    card_list: bool = False  # it renders its category's cards (`<DocCardList />`)

    @property
    def has_content(self) -> bool:
        return any(substantive(block) for section in self.sections for block in section.blocks)

    @property
    def is_card_index(self) -> bool:
        """A card list with a sentence or two of its own (CARD_INDEX_WORDS): navigation, not teaching."""
        if not self.card_list:
            return False
        words = sum(
            len(block.text.split()) for section in self.sections for block in section.blocks if substantive(block)
        )
        return words <= CARD_INDEX_WORDS

    @property
    def skipped_because(self) -> str | None:
        """Why the doc is left out of the index, or None when it is read."""
        if self.front_matter.get("draft") in (True, "true"):
            return DRAFT_REASON
        if not self.has_content:
            return EMPTY_REASON
        return CARDS_REASON if self.is_card_index else None


@dataclass
class _Folder:
    name: str
    category: dict[str, object]
    docs: list[Doc] = field(default_factory=list)
    folders: list[_Folder] = field(default_factory=list)


CONFIG_FILES = ("docusaurus.config.ts", "docusaurus.config.js", "docusaurus.config.mjs")
# `title: "…"` (or `const title = "…"`, which a config may use as `title,`) with its indentation; a template
# literal counts only without `${…}` in it.
_TITLE = re.compile(r"""^([ \t]*)(?:(?:const|let|var)\s+title\s*=|title\s*:)\s*(['"`])((?:(?!\2|\$\{).)+)\2""", re.M)
_WELCOME = re.compile(r"^(Welcome to|Introduction to)\s+", re.I)
TITLE_MAX_CHARS = 120


def book_title(site: Path, first_chapter: str | None) -> str:
    """The book's name: its site's own ``title`` (``site_title``), else its first chapter's title without a
    "Welcome to" (a docs folder without a site), else "Textbook"."""
    title = site_title(site) or _WELCOME.sub("", first_chapter or "").strip()
    return title or "Textbook"


def site_title(site: Path) -> str | None:
    """The ``title`` of the site's docusaurus.config (.ts, .js or .mjs): the least indented one, since the
    navbar's and the footer's link groups have titles too, nested deeper; None without a config or a title.
    One line of plain text whatever the file holds (it reaches the model's instructions), at most
    ``TITLE_MAX_CHARS``."""
    for name in CONFIG_FILES:
        config = site / name
        try:
            text = config.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = [(len(m.group(1).expandtabs()), m.group(3)) for m in _TITLE.finditer(text)]
        if found:
            title = " ".join(min(found, key=lambda f: f[0])[1].split())
            return "".join(c for c in title if c.isprintable())[:TITLE_MAX_CHARS].strip() or None
    return None


def read_tree(root: Path, base_url: str, skipped: list[Skipped]) -> list[tuple[Module, list[Doc]]]:
    """Modules and their docs with content, in sidebar order; what is left out is appended to `skipped`.

    Positions are 1-based ranks in sidebar order: `position` in `_category_.json` or
    `sidebar_position`, else the file/folder number prefix; unpositioned items come after the
    positioned ones; ties and the rest go by natural name order.
    """
    planned: list[tuple[Module, list[Doc]]] = []
    for item in _ordered(_walk(root, "", base_url, skipped)):
        judged = [(doc, doc.skipped_because) for doc in _flatten(item)]  # each doc's reason read once
        docs = [doc for doc, reason in judged if reason is None]
        skipped.extend(Skipped(doc.file_path, reason) for doc, reason in judged if reason is not None)
        if isinstance(item, _Folder):
            category = item.category
            description = _str(category.get("description")) or _str(_mapping(category.get("link")).get("description"))
            module = Module(item.name, _str(category.get("label")) or _titleize(item.name), 0.0, description)
        else:
            module = Module(item.doc_id, item.title, 0.0, _str(item.front_matter.get("description")))
        if docs:
            planned.append((module, docs))
    return [
        (Module(module.id, module.title, float(rank), module.description), docs)
        for rank, (module, docs) in enumerate(planned, 1)
    ]


def read_doc(path: Path, root: Path, base_url: str) -> tuple[Module, Doc]:
    """One file (under the docs `root`) and its module; raises OSError / UnicodeDecodeError."""
    file_path = path.resolve().relative_to(root.resolve()).as_posix()
    doc = parse_doc(path.read_bytes(), file_path, base_url)
    top, _, rest = file_path.partition("/")
    if rest:
        category = _read_category(root / top, top, [])
        position = _number(category.get("position")) or 0.0
        return Module(top, _str(category.get("label")) or _titleize(top), position, ""), doc
    return Module(doc.doc_id, doc.title, 0.0, _str(doc.front_matter.get("description"))), doc


def parse_doc(raw: bytes, file_path: str, base_url: str) -> Doc:
    """A doc's front matter, title, id, URL, sidebar position and sections."""
    front_matter, text = read_front_matter(raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n"))
    blocks = parse_blocks(text, Slugger())
    headings = [block for block in blocks if block.kind == "heading"]
    content_title = headings[0].plain if headings and headings[0].level == 1 else ""
    identifier = doc_id(file_path, front_matter)
    title = (
        _str(front_matter.get("title"))
        or content_title
        or _str(front_matter.get("sidebar_label"))
        or identifier.rpartition("/")[2]
    )
    stem = file_path.rpartition("/")[2].rsplit(".", 1)[0]
    position = _number(front_matter.get("sidebar_position"))
    return Doc(
        file_path,
        front_matter,
        title,
        identifier,
        doc_url(base_url, file_path, front_matter),
        position if position is not None else _prefix_number(stem),
        _sections(blocks, title, headings[0] if content_title else None),
        bool(_CARD_LIST.search(text)),
    )


def _walk(folder: Path, rel: str, base_url: str, skipped: list[Skipped]) -> _Folder:
    node = _Folder(folder.name, _read_category(folder, rel, skipped))
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = f"{rel}/{entry.name}" if rel else entry.name
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if not entry.name.startswith("_"):
                node.folders.append(_walk(Path(entry.path), path, base_url, skipped))
        elif entry.name.endswith((".md", ".mdx")):
            if entry.name.startswith("_"):
                skipped.append(Skipped(path, "partial: Docusaurus does not publish files starting with _"))
                continue
            try:
                node.docs.append(parse_doc(Path(entry.path).read_bytes(), path, base_url))
            except UnicodeDecodeError as exc:
                skipped.append(Skipped(path, f"not valid UTF-8 ({exc.reason} at byte {exc.start})"))
            except OSError as exc:
                skipped.append(Skipped(path, f"unreadable ({exc.strerror or exc})"))
    return node


def _read_category(folder: Path, rel: str, skipped: list[Skipped]) -> dict[str, object]:
    for name in ("_category_.json", "_category_.yml", "_category_.yaml"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8-sig")
            data = json.loads(text) if name.endswith(".json") else read_yaml_mapping(text)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            skipped.append(Skipped(f"{rel}/{name}" if rel else name, f"ignored: {exc}"))
            return {}
        return dict(data) if isinstance(data, dict) else {}
    return {}


def _ordered(folder: _Folder) -> list[_Folder | Doc]:
    """Docs and subfolders of one folder in Docusaurus autogenerated-sidebar order."""
    items: list[_Folder | Doc] = [*folder.docs, *folder.folders]

    def key(item: _Folder | Doc) -> tuple[bool, float, tuple[tuple[int, int | str], ...]]:
        if isinstance(item, _Folder):
            position = _number(item.category.get("position"))
            position = _prefix_number(item.name) if position is None else position
            name = item.name
        else:
            position, name = item.position, item.file_path.rpartition("/")[2]
        return position is None, position or 0.0, _natural(name)

    return sorted(items, key=key)


def _flatten(item: _Folder | Doc) -> list[Doc]:
    if isinstance(item, Doc):
        return [item]
    return [doc for child in _ordered(item) for doc in _flatten(child)]


def _sections(blocks: list[Block], title: str, content_title: Block | None) -> list[Section]:
    sections = [Section("", title, (), "")]
    stack: list[tuple[int, str]] = []
    for block in blocks:
        if block is content_title:
            sections[0].heading = block.text
        elif block.kind == "heading" and block.level <= 3:
            while stack and stack[-1][0] >= block.level:
                stack.pop()
            stack.append((block.level, block.plain))
            # Docusaurus renders no id on an h1, so a later h1 section links to the top of the page.
            anchor = block.anchor if block.level > 1 else ""
            sections.append(Section(block.text, block.plain, tuple(text for _, text in stack), anchor))
        else:
            sections[-1].blocks.append(block)
    return sections


def _str(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _prefix_number(name: str) -> float | None:
    # Docusaurus uses a file or folder number prefix (`02-setup`) as its sidebar position.
    stripped = strip_number_prefix(name)
    return float(name[: len(name) - len(stripped)].rstrip(" -_.")) if stripped != name else None


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part.lower()) for part in re.split(r"(\d+)", name) if part)


def _titleize(name: str) -> str:
    return " ".join(word[:1].upper() + word[1:] for word in re.split(r"[-_\s]+", strip_number_prefix(name)) if word)
