"""Docusaurus docs folder -> heading-aware chunks carrying their citation (module, chapter, section, URL).

A module is a top-level folder; a root-level doc (e.g. `intro.md`) is its own module, id = its doc id
and title = its title. Token counting is injected; embedding and storage belong to `ingest.py`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from server.slugs import Slugger, doc_id, doc_url, read_front_matter, read_yaml_mapping, strip_number_prefix

# Deliberate choices (the ingest and retrieval modules rely on them):
# - A section with no text of its own (only a heading, or only JSX that was stripped) yields no
#   chunk; its heading still appears in the heading_path of the sections nested under it.
# - A code fence longer than max_tokens is split at blank lines inside it (then at line ends),
#   each part re-wrapped in the same opening and closing fence lines, so every chunk is valid
#   Markdown and every part is embedded; tables likewise repeat their header row. Admonitions
#   are never split. A single line longer than max_tokens becomes an oversized chunk.
# - An unclosed fence runs to the end of the file and gets a closing fence in the chunk text.
# - max_tokens bounds `text`; the breadcrumb in `embedding_text` comes on top.
# - content_hash leaves out chunk_index and the positions: moving a section or reordering the
#   sidebar does not re-embed; ingest refreshes the payload of unchanged ids instead.

TokenCounter = Callable[[str], int]
CHUNK_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://textbook-chat.invalid/chunks")


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    file_path: str
    module: str
    module_title: str
    chapter: str
    chapter_id: str
    title: str
    heading_path: tuple[str, ...]
    anchor: str
    url: str
    doc_url: str
    chunk_index: int
    content_hash: str
    text: str
    token_count: int
    module_position: float
    doc_position: float

    @property
    def embedding_text(self) -> str:
        """The breadcrumb ("Module › Chapter › H2 › H3") and the text: what gets embedded."""
        return _breadcrumb(self.module_title, self.heading_path) + "\n\n" + self.text

    def payload(self) -> dict[str, object]:
        """All fields as a JSON-able dict for the vector store."""
        data: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["heading_path"] = list(self.heading_path)
        return data


@dataclass(frozen=True)
class Module:
    id: str
    title: str
    position: float
    description: str


@dataclass(frozen=True)
class Document:
    file_path: str
    module: str
    chapter: str
    chapter_id: str
    url: str
    position: float
    chunk_count: int


@dataclass(frozen=True)
class Skipped:
    file_path: str
    reason: str


@dataclass(frozen=True)
class Book:
    root: Path
    modules: list[Module]
    documents: list[Document]
    chunks: list[Chunk]
    skipped: list[Skipped]


def read_book(root: Path, *, base_url: str, count_tokens: TokenCounter, max_tokens: int, overlap_tokens: int) -> Book:
    """Chunk every doc under `root` in sidebar order; files that yield nothing are in `skipped`.

    Positions are 1-based ranks in sidebar order: `position` in `_category_.json` or
    `sidebar_position`, else the file/folder number prefix; unpositioned items come after the
    positioned ones; ties and the rest go by natural name order.
    """
    _check_sizes(max_tokens, overlap_tokens)
    skipped: list[Skipped] = []
    tree = _walk(root, "", base_url, skipped)
    planned: list[tuple[Module, list[_Doc]]] = []
    for item in _ordered(tree):
        if isinstance(item, _Folder):
            docs = [doc for doc in _flatten(item) if doc.has_content]
            category = item.category
            description = _str(category.get("description")) or _str(_mapping(category.get("link")).get("description"))
            module = Module(item.name, _str(category.get("label")) or _titleize(item.name), 0.0, description)
        else:
            docs = [item] if item.has_content else []
            module = Module(item.doc_id, item.title, 0.0, _str(item.front_matter.get("description")))
        skipped.extend(Skipped(doc.file_path, _EMPTY_REASON) for doc in _flatten(item) if not doc.has_content)
        if docs:
            planned.append((module, docs))
    modules: list[Module] = []
    documents: list[Document] = []
    chunks: list[Chunk] = []
    for module_rank, (draft, docs) in enumerate(planned, 1):
        module = Module(draft.id, draft.title, float(module_rank), draft.description)
        modules.append(module)
        for doc_rank, doc in enumerate(docs, 1):
            doc_chunks = _make_chunks(doc, module, float(doc_rank), count_tokens, max_tokens, overlap_tokens)
            chunks.extend(doc_chunks)
            documents.append(
                Document(doc.file_path, module.id, doc.title, doc.doc_id, doc.url, float(doc_rank), len(doc_chunks))
            )
    return Book(root, modules, documents, chunks, skipped)


def read_document(
    path: Path,
    root: Path,
    *,
    base_url: str,
    count_tokens: TokenCounter,
    max_tokens: int,
    overlap_tokens: int,
    module: Module | None = None,
) -> list[Chunk]:
    """Chunks of one file (relative to the docs `root`); raises OSError / UnicodeDecodeError."""
    _check_sizes(max_tokens, overlap_tokens)
    file_path = path.resolve().relative_to(root.resolve()).as_posix()
    doc = _parse(path.read_bytes(), file_path, base_url)
    if module is None:
        top, _, rest = file_path.partition("/")
        if rest:
            category = _read_category(root / top, top, [])
            position = _number(category.get("position")) or 0.0
            module = Module(top, _str(category.get("label")) or _titleize(top), position, "")
        else:
            module = Module(doc.doc_id, doc.title, 0.0, _str(doc.front_matter.get("description")))
    return _make_chunks(doc, module, doc.position or 0.0, count_tokens, max_tokens, overlap_tokens)


_EMPTY_REASON = "no text left after removing front matter, MDX imports/exports, JSX markup and comments"
_FENCE = re.compile(r"^(\s*)(`{3,}(?!.*`)|~{3,})(.*)$")
_FENCE_CLOSE = re.compile(r"^\s*(`{3,}|~{3,})\s*$")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_NOT_SETEXT = re.compile(r"^\s*(?:[-*+>|]|\d+[.)])(?:\s|$)")
_ADMONITION_OPEN = re.compile(r"^\s*(:{3,})[A-Za-z]")
_ADMONITION_CLOSE = re.compile(r"^\s*(:{3,})\s*$")
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_THEMATIC_BREAK = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
# MDX ESM: `import x from`, `import {`, `export const` ... at the start of a paragraph.
_ESM = re.compile(
    r"^(?:import\s+(?:type\s+)?(?:[\w$]+\s*(?:,|\s+from\b)|[{*'\"])|"
    r"export\s+(?:default|const|let|var|function|class|async|[{*]))"
)
_HEADING_COMMENT_ID = re.compile(r"^( {0,3}#{1,6}[ \t].*?)[ \t]*\{/\*\s*#(\S+)\s*\*/\}[ \t]*$", re.MULTILINE)
_MARKUP = re.compile(r"`+|<!--|\{/\*|</?[A-Za-z>]")
_TAG_OPEN = re.compile(r"</?(?:[A-Za-z][\w.:-]*)?")
_ATTRIBUTE = re.compile(r"[A-Za-z_:$][\w.:$-]*(?:\s*=\s*(?=[{])|\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`{}]+))?")
_PROSE_BREAKS = (re.compile(r"\n+"), re.compile(r"(?<=[.!?])[ \t]+"), re.compile(r"[ \t]+"))
_TAIL_BREAK = re.compile(r"\n+|(?<=[.!?])[ \t]+")


@dataclass
class _Block:
    kind: str  # "text", "heading", "fence", "table" or "admonition"
    text: str
    gap: bool = True  # a blank line came before it
    level: int = 0
    plain: str = ""  # headings: clean text for heading_path
    anchor: str = ""


@dataclass
class _Section:
    heading: str  # the heading line as Markdown ("" for the top of the document)
    title: str
    path: tuple[str, ...]
    anchor: str
    blocks: list[_Block] = field(default_factory=list)


@dataclass
class _Doc:
    file_path: str
    front_matter: dict[str, object]
    title: str
    doc_id: str
    url: str
    position: float | None
    sections: list[_Section]

    @property
    def has_content(self) -> bool:
        return any(_substantive(block) for section in self.sections for block in section.blocks)


@dataclass
class _Folder:
    name: str
    category: dict[str, object]
    docs: list[_Doc] = field(default_factory=list)
    folders: list[_Folder] = field(default_factory=list)


@dataclass
class _Unit:
    text: str
    sep: str  # what joins it to the unit before
    atomic: bool
    tokens: int


def _check_sizes(max_tokens: int, overlap_tokens: int) -> None:
    if max_tokens <= 0 or not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"need 0 <= overlap_tokens < max_tokens, got {overlap_tokens} and {max_tokens}")


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
                node.docs.append(_parse(Path(entry.path).read_bytes(), path, base_url))
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


def _ordered(folder: _Folder) -> list[_Folder | _Doc]:
    """Docs and subfolders of one folder in Docusaurus autogenerated-sidebar order."""
    items: list[_Folder | _Doc] = [*folder.docs, *folder.folders]

    def key(item: _Folder | _Doc) -> tuple[bool, float, tuple[tuple[int, int | str], ...]]:
        if isinstance(item, _Folder):
            position = _number(item.category.get("position"))
            position = _prefix_number(item.name) if position is None else position
            name = item.name
        else:
            position, name = item.position, item.file_path.rpartition("/")[2]
        return position is None, position or 0.0, _natural(name)

    return sorted(items, key=key)


def _flatten(item: _Folder | _Doc) -> list[_Doc]:
    if isinstance(item, _Doc):
        return [item]
    return [doc for child in _ordered(item) for doc in _flatten(child)]


def _parse(raw: bytes, file_path: str, base_url: str) -> _Doc:
    front_matter, text = read_front_matter(raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n"))
    blocks = _scan(_clean(text.split("\n")), Slugger())
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
    return _Doc(
        file_path,
        front_matter,
        title,
        identifier,
        doc_url(base_url, file_path, front_matter),
        position if position is not None else _prefix_number(stem),
        _sections(blocks, title, headings[0] if content_title else None),
    )


def _clean(lines: list[str]) -> list[str]:
    """Drop ESM, comments and JSX tags outside code fences; fences stay verbatim."""
    out: list[str] = []
    start = i = 0
    while i < len(lines):
        if match := _FENCE.match(lines[i]):
            end = _fence_end(lines, i, match)[0]
            out += _clean_region(lines[start:i]) + lines[i:end]
            start = i = end
        else:
            i += 1
    return out + _clean_region(lines[start:])


def _clean_region(lines: list[str]) -> list[str]:
    kept: list[str] = []
    in_esm = False
    for line in lines:
        if in_esm or (_ESM.match(line) and (not kept or not kept[-1].strip())):
            in_esm = bool(line.strip())
            kept.append("")
        else:
            kept.append(line)
    text = _strip_markup(_HEADING_COMMENT_ID.sub(r"\1 {#\2}", "\n".join(kept)))
    return [line if line.strip() else "" for line in text.split("\n")]


def _strip_markup(text: str) -> str:
    """Remove HTML/MDX comments and JSX/HTML tags (keeping the text between them), not in code spans."""
    out: list[str] = []
    pos = 0
    while match := _MARKUP.search(text, pos):
        token, start = match.group(), match.start()
        out.append(text[pos:start])
        end = -1
        if token[0] == "`":
            paragraph_end = text.find("\n\n", match.end())
            close = _backtick_run(len(token)).search(
                text, match.end(), len(text) if paragraph_end < 0 else paragraph_end
            )
            end = close.end() if close else match.end()
            out.append(text[start:end])
        elif token in ("<!--", "{/*"):
            close_at = text.find("-->" if token == "<!--" else "*/}", match.end())
            end = close_at + 3 if close_at >= 0 else -1
        else:
            end = _tag_end(text, start)
        if end < 0:
            out.append(token)
            end = match.end()
        pos = end
    out.append(text[pos:])
    return "".join(out)


@lru_cache(maxsize=16)
def _backtick_run(length: int) -> re.Pattern[str]:
    return re.compile(rf"(?<!`)`{{{length}}}(?!`)")


def _tag_end(text: str, start: int) -> int:
    """End of the JSX/HTML tag at `start`, or -1 when the `<` does not open a well-formed tag."""
    match = _TAG_OPEN.match(text, start)
    if match is None:
        return -1
    closing, pos = text.startswith("</", start), match.end()
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith("/>", pos):
            return pos + 2
        if text.startswith(">", pos):
            return pos + 1
        if closing:
            return -1
        if text.startswith("{", pos):
            pos = _brace_end(text, pos)
        elif attribute := _ATTRIBUTE.match(text, pos):
            pos = _brace_end(text, attribute.end()) if text.startswith("{", attribute.end()) else attribute.end()
        else:
            return -1
        if pos < 0:
            return -1
    return -1


def _brace_end(text: str, start: int) -> int:
    depth, pos, quote = 0, start, ""
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "\"'`":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return -1


def _fence_end(lines: list[str], start: int, opening: re.Match[str]) -> tuple[int, bool]:
    """(index after the closing fence line, closed?); an unclosed fence runs to the end of the file."""
    marker = opening.group(2)
    for i in range(start + 1, len(lines)):
        close = _FENCE_CLOSE.match(lines[i])
        if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
            return i + 1, True
    return len(lines), False


def _scan(lines: list[str], slugger: Slugger) -> list[_Block]:
    """Block structure: headings (ids assigned in document order), fences, tables, admonitions, text."""
    blocks: list[_Block] = []
    i, gap = 0, True
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i, gap = i + 1, True
            continue
        block: _Block | None
        if fence := _FENCE.match(line):
            end, closed = _fence_end(lines, i, fence)
            body = lines[i:end] if closed else [*lines[i:end], fence.group(1) + fence.group(2)]
            block = _Block("fence", "\n".join(body))
        elif heading := _ATX.match(line):
            block, end = _heading(heading.group(2) or "", len(heading.group(1)), slugger), i + 1
        elif (opening := _ADMONITION_OPEN.match(line)) and (end := _admonition_end(lines, i, opening)) > 0:
            _scan(lines[i + 1 : end - 1], slugger)  # its headings take ids but do not split it
            block = _Block("admonition", "\n".join(lines[i:end]))
        elif _table_starts(lines, i):
            end = i + 2
            while end < len(lines) and lines[end].strip() and "|" in lines[end]:
                end += 1
            block = _Block("table", "\n".join(lines[i:end]))
        elif _ADMONITION_CLOSE.match(line):
            block, end = None, i + 1  # a stray directive fence: markup only
        else:
            block, end = _paragraph(lines, i, slugger)
        if block is not None:
            block.gap = gap
            blocks.append(block)
        i, gap = end, False
    return blocks


def _heading(markdown: str, level: int, slugger: Slugger) -> _Block:
    plain, anchor = slugger.heading(markdown)
    raw = re.sub(r"\s*\\?\{#[^}]*\}$", "", markdown.strip())
    return _Block("heading", "#" * level + " " + raw, level=level, plain=plain, anchor=anchor)


def _paragraph(lines: list[str], start: int, slugger: Slugger) -> tuple[_Block, int]:
    end = start + 1
    while end < len(lines) and lines[end].strip():
        line = lines[end]
        if _SETEXT.match(line) and not _NOT_SETEXT.match(lines[start]):
            text = " ".join(part.strip() for part in lines[start:end])
            return _heading(text, 1 if line.strip()[0] == "=" else 2, slugger), end + 1
        if (
            _FENCE.match(line)
            or _ATX.match(line)
            or _ADMONITION_OPEN.match(line)
            or _ADMONITION_CLOSE.match(line)
            or _table_starts(lines, end)
        ):
            break
        end += 1
    return _Block("text", "\n".join(lines[start:end])), end


def _admonition_end(lines: list[str], start: int, opening: re.Match[str]) -> int:
    """Index after the matching `:::` (nested admonitions use more colons), or -1 if unclosed."""
    stack = [len(opening.group(1))]
    i = start + 1
    while i < len(lines):
        if fence := _FENCE.match(lines[i]):
            i = _fence_end(lines, i, fence)[0]
            continue
        if inner := _ADMONITION_OPEN.match(lines[i]):
            stack.append(len(inner.group(1)))
        elif (closing := _ADMONITION_CLOSE.match(lines[i])) and len(closing.group(1)) >= stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    return -1


def _table_starts(lines: list[str], i: int) -> bool:
    if i + 1 >= len(lines) or "|" not in lines[i] or "|" not in lines[i + 1] or "-" not in lines[i + 1]:
        return False
    return bool(_TABLE_DELIMITER.match(lines[i + 1]))


def _sections(blocks: list[_Block], title: str, content_title: _Block | None) -> list[_Section]:
    sections = [_Section("", title, (), "")]
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
            sections.append(_Section(block.text, block.plain, tuple(text for _, text in stack), anchor))
        else:
            sections[-1].blocks.append(block)
    return sections


def _substantive(block: _Block) -> bool:
    if block.kind == "heading":
        return False
    if block.kind != "text":
        return True
    return any(line.strip() and not _THEMATIC_BREAK.match(line) for line in block.text.split("\n"))


def _make_chunks(
    doc: _Doc, module: Module, doc_position: float, count: TokenCounter, max_tokens: int, overlap_tokens: int
) -> list[Chunk]:
    chunks: list[Chunk] = []
    occurrences: dict[str, int] = {}
    for section in doc.sections:
        if not any(_substantive(block) for block in section.blocks):
            continue
        heading_path = (doc.title, *section.path)
        url = doc.url + (f"#{section.anchor}" if section.anchor else "")
        for text in _pack_units(_units(section, max_tokens, count), max_tokens, overlap_tokens, count):
            meta = {
                "module": module.id,
                "module_title": module.title,
                "chapter": doc.title,
                "chapter_id": doc.doc_id,
                "title": section.title,
                "heading_path": list(heading_path),
                "url": url,
                "embedding_text": _breadcrumb(module.title, heading_path) + "\n\n" + text,
            }
            digest = hashlib.sha256(json.dumps(meta, ensure_ascii=False, sort_keys=True).encode()).hexdigest()
            occurrence = occurrences[digest] = occurrences.get(digest, -1) + 1
            chunk_id = uuid.uuid5(CHUNK_NAMESPACE, f"{doc.file_path}\n{digest}\n{occurrence}")
            chunks.append(
                Chunk(
                    chunk_id=str(chunk_id),
                    file_path=doc.file_path,
                    module=module.id,
                    module_title=module.title,
                    chapter=doc.title,
                    chapter_id=doc.doc_id,
                    title=section.title,
                    heading_path=heading_path,
                    anchor=section.anchor,
                    url=url,
                    doc_url=doc.url,
                    chunk_index=len(chunks),
                    content_hash=digest,
                    text=text,
                    token_count=count(text),
                    module_position=module.position,
                    doc_position=doc_position,
                )
            )
    return chunks


def _units(section: _Section, budget: int, count: TokenCounter) -> list[_Unit]:
    """Blocks as packing units; a heading is glued to the block after it so it never ends a chunk."""
    units: list[_Unit] = []
    prefix = section.heading
    for block in section.blocks:
        if block.kind == "heading":
            prefix = f"{prefix}\n\n{block.text}" if prefix else block.text
            continue
        prefix_tokens = count(prefix) + 1 if prefix else 0
        for n, (text, atomic, tokens) in enumerate(_split_block(block, max(budget - prefix_tokens, 1), count)):
            if prefix:
                text, tokens, prefix = f"{prefix}\n\n{text}", tokens + prefix_tokens, ""
            sep = ("\n\n" if block.gap else "\n") if n == 0 else ("\n" if block.kind == "text" else "\n\n")
            units.append(_Unit(text, sep, atomic, tokens))
    return units


def _split_block(block: _Block, budget: int, count: TokenCounter) -> list[tuple[str, bool, int]]:
    """(text, atomic, tokens) parts of a block; only oversized fences and tables are cut, re-wrapped."""
    if block.kind == "text":
        return [(text, False, tokens) for text, tokens in _split_prose(block.text, budget, count)]
    size = count(block.text)
    if block.kind == "admonition" or size <= budget:
        return [(block.text, True, size)]
    lines = block.text.split("\n")
    if block.kind == "table":
        header = "\n".join(lines[:2])
        return [
            (header + "\n" + "\n".join(rows), True, n) for rows, n in _pack(lines[2:], count(header), budget, count)
        ]
    opening, closing = lines[0], lines[-1]
    overhead = count(f"{opening}\n{closing}") + 2
    paragraphs = [part.strip("\n") for part in re.split(r"\n[ \t]*\n", "\n".join(lines[1:-1])) if part.strip()]
    parts: list[tuple[str, int]] = []
    for group, tokens in _pack(paragraphs, overhead, budget, count):
        if len(group) == 1 and tokens > budget:
            parts += [("\n".join(rows), n) for rows, n in _pack(group[0].split("\n"), overhead, budget, count)]
        else:
            parts.append(("\n\n".join(group), tokens))
    return [(f"{opening}\n{part}\n{closing}", True, tokens) for part, tokens in parts]


def _split_prose(text: str, budget: int, count: TokenCounter, level: int = 0) -> list[tuple[str, int]]:
    """Split at line breaks, then sentence ends, then spaces, until each piece fits."""
    size = count(text)
    if level == len(_PROSE_BREAKS) or size <= budget:
        return [(text, size)]
    joiner = "\n" if level == 0 else " "
    pieces = [piece for piece in _PROSE_BREAKS[level].split(text) if piece.strip()]
    out: list[tuple[str, int]] = []
    for group, tokens in _pack(pieces, 0, budget, count):
        out += _split_prose(group[0], budget, count, level + 1) if len(group) == 1 else [(joiner.join(group), tokens)]
    return out


def _pack(items: list[str], overhead: int, budget: int, count: TokenCounter) -> list[tuple[list[str], int]]:
    """Greedy groups whose estimated size fits `budget`: (items, estimate); a lone oversized item stays alone.

    The estimate (item counts + one token per separator + the wrapper's overhead) avoids
    re-counting every candidate group, which is quadratic; `Chunk.token_count` is exact.
    """
    groups: list[tuple[list[str], int]] = []
    current: list[str] = []
    total = overhead
    for item in items:
        size = count(item) + 1
        if current and total + size > budget:
            groups.append((current, total))
            current, total = [], overhead
        current.append(item)
        total += size
    return [*groups, (current, total)] if current else groups


def _pack_units(units: list[_Unit], max_tokens: int, overlap_tokens: int, count: TokenCounter) -> list[str]:
    """Greedy packing into chunks of at most max_tokens, each starting with the previous one's tail."""
    chunks: list[str] = []
    current: list[_Unit] = []
    total = 0
    for unit in units:
        if current and total + unit.tokens > max_tokens:
            chunks.append(_join(current))
            current = _overlap(current, overlap_tokens, count)
            total = sum(kept.tokens + 1 for kept in current)
            while current and total + unit.tokens > max_tokens:
                total -= current.pop(0).tokens + 1
        current.append(unit)
        total += unit.tokens + 1
    if current:
        chunks.append(_join(current))
    return chunks


def _overlap(units: list[_Unit], budget: int, count: TokenCounter) -> list[_Unit]:
    """Whole trailing prose units (else trailing sentences) worth at most `budget` tokens; never code."""
    tail: list[_Unit] = []
    for unit in reversed(units):
        if unit.atomic or budget <= 0:
            break
        if unit.tokens + sum(kept.tokens + 1 for kept in tail) <= budget:
            tail.insert(0, unit)
            continue
        if not tail:
            best = ""
            for cut in reversed([match.end() for match in _TAIL_BREAK.finditer(unit.text)]):
                candidate = unit.text[cut:].strip()
                if count(candidate) > budget:
                    break
                best = candidate or best
            tail = [_Unit(best, unit.sep, False, count(best))] if best else []
        break
    return tail


def _join(units: list[_Unit]) -> str:
    return "".join((unit.sep if n else "") + unit.text for n, unit in enumerate(units)).strip("\n")


def _breadcrumb(module_title: str, heading_path: tuple[str, ...]) -> str:
    crumbs: list[str] = []
    for crumb in (module_title, *heading_path):
        if crumb and (not crumbs or crumbs[-1] != crumb):
            crumbs.append(crumb)
    return " › ".join(crumbs)


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
