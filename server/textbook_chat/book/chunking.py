"""Docusaurus docs -> heading-aware chunks of at most N tokens, each carrying its citation (module, section, URL).

Structure and sections come from `docusaurus.py`; here sections are packed into chunks. Token counting is
injected; embedding and storage belong to `ingest.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from textbook_chat.book.docusaurus import Doc, Module, Section, Skipped, read_doc, read_tree
from textbook_chat.book.mdx import Block, substantive

__all__ = ["Book", "Chunk", "Document", "Module", "Skipped", "TokenCounter", "read_book", "read_document"]

# Deliberate choices (the ingest and retrieval modules rely on them):
# - A section with no text of its own (only a heading, or only JSX that was stripped) yields no
#   chunk; its heading still appears in the heading_path of the sections nested under it.
# - A code fence longer than max_tokens is split at blank lines inside it (then at line ends),
#   each part re-wrapped in the same opening and closing fence lines, so every chunk is valid
#   Markdown and every part is embedded; tables likewise repeat their header row. Admonitions
#   are never split. A single line longer than max_tokens becomes an oversized chunk.
# - An unclosed fence runs to the end of the file and gets a closing fence in the chunk text.
# - max_tokens bounds `text`; the breadcrumb in `embedding_text` comes on top.
# - Three texts per chunk: `text` (stored, cited, shown: the Markdown as written), `keyword_text`
#   (breadcrumb + the whole text: what the sparse BM25 vector indexes, so every identifier in a
#   listing stays findable) and `embedding_text` (what MiniLM embeds densely: breadcrumb + the text
#   with each code fence cut to its head, at most CODE_HEAD_TOKENS word pieces of whole lines after
#   the opening fence line).
#   MiniLM is a sentence model: a listing's comments, imports and def names say what it is about;
#   its body mostly costs inference time (code bodies were 53% of the word pieces embedded).
# - content_hash covers the text and the embedding text, so a change to either recipe re-embeds;
#   it leaves out chunk_index and the positions: moving a section or reordering the sidebar does
#   not re-embed; ingest refreshes the payload of unchanged ids instead. It holds the URL's path and
#   anchor, not its scheme and host: a book served from a new address (BOOK_BASE_URL) is not
#   re-embedded either; ingest rewrites the stored URLs.

TokenCounter = Callable[[str], int]
# Word pieces of a code fence's body that are embedded densely (whole lines): about ten lines of code. 48
# ranked as well and ingested the shared book 12 s quicker, but weakened some passages' evidence enough to
# tip a module-filter decision (README, "Evaluation").
CODE_HEAD_TOKENS = 96
CHUNK_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://textbook-chat.invalid/chunks")
_UNSTORED = frozenset({"embedding_text", "embedding_tokens"})


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
    # What the dense model reads (the breadcrumb, the text with code cut to its head) and its length in
    # tokens, by which ingest orders its embedding calls; neither is stored.
    embedding_text: str = field(repr=False)
    embedding_tokens: int = field(repr=False)

    @property
    def keyword_text(self) -> str:
        """The breadcrumb ("Module › Chapter › H2 › H3") and the whole text: what the sparse vector indexes."""
        return _breadcrumb(self.module_title, self.heading_path) + "\n\n" + self.text

    def payload(self) -> dict[str, object]:
        """The stored fields as a JSON-able dict for the vector store (the embedding text is not stored)."""
        data: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _UNSTORED}
        data["heading_path"] = list(self.heading_path)
        return data


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
class Book:
    root: Path
    modules: list[Module]
    documents: list[Document]
    chunks: list[Chunk]
    skipped: list[Skipped]


def read_book(root: Path, *, base_url: str, count_tokens: TokenCounter, max_tokens: int, overlap_tokens: int) -> Book:
    """Chunk every doc under `root` in sidebar order; files that yield nothing are in `skipped`."""
    _check_sizes(max_tokens, overlap_tokens)
    skipped: list[Skipped] = []
    modules: list[Module] = []
    documents: list[Document] = []
    chunks: list[Chunk] = []
    for module, docs in read_tree(root, base_url, skipped):
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
    found, doc = read_doc(path, root, base_url)
    if doc.skipped_because:
        return []  # as ``read_book`` leaves it out (a draft, a card list, no text)
    return _make_chunks(doc, module or found, doc.position or 0.0, count_tokens, max_tokens, overlap_tokens)


_PROSE_BREAKS = (re.compile(r"\n+"), re.compile(r"(?<=[.!?])[ \t]+"), re.compile(r"[ \t]+"))
_TAIL_BREAK = re.compile(r"\n+|(?<=[.!?])[ \t]+")


@dataclass
class _Unit:
    text: str
    sep: str  # what joins it to the unit before
    atomic: bool
    tokens: int
    dense: str  # the same as the dense model reads it: code fences cut to their head


def _site_relative(url: str) -> str:
    """The URL without its scheme and host ("/docs/ros2/nodes#qos"), as a chunk's identity holds it."""
    parts = urlsplit(url)
    return urlunsplit(("", "", parts.path, parts.query, parts.fragment))


def _check_sizes(max_tokens: int, overlap_tokens: int) -> None:
    if max_tokens <= 0 or not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"need 0 <= overlap_tokens < max_tokens, got {overlap_tokens} and {max_tokens}")


def _make_chunks(
    doc: Doc, module: Module, doc_position: float, count: TokenCounter, max_tokens: int, overlap_tokens: int
) -> list[Chunk]:
    chunks: list[Chunk] = []
    occurrences: dict[str, int] = {}
    for section in doc.sections:
        if not any(substantive(block) for block in section.blocks):
            continue
        heading_path = (doc.title, *section.path)
        url = doc.url + (f"#{section.anchor}" if section.anchor else "")
        breadcrumb = _breadcrumb(module.title, heading_path)
        for text, dense in _pack_units(_units(section, max_tokens, count), max_tokens, overlap_tokens, count):
            embedding_text = breadcrumb + "\n\n" + dense
            meta = {
                "module": module.id,
                "module_title": module.title,
                "chapter": doc.title,
                "chapter_id": doc.doc_id,
                "title": section.title,
                "heading_path": list(heading_path),
                "url": _site_relative(url),
                "text": text,
                "embedding_text": embedding_text,
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
                    embedding_text=embedding_text,
                    embedding_tokens=count(embedding_text),
                )
            )
    return chunks


def _units(section: Section, budget: int, count: TokenCounter) -> list[_Unit]:
    """Blocks as packing units; a heading, or a short lead-in ending in ":" before code or a table, is glued
    to the block after it, so it never ends a chunk apart from what it introduces."""
    units: list[_Unit] = []
    prefix, prefix_sep = section.heading, ""
    for i, block in enumerate(section.blocks):
        if block.kind == "heading" or _lead_in(block, section.blocks[i + 1 : i + 2], budget, count):
            if not prefix:
                prefix_sep = "\n\n" if block.gap else "\n"
            prefix = f"{prefix}\n\n{block.text}" if prefix else block.text
            continue
        prefix_tokens = count(prefix) + 1 if prefix else 0
        for n, (text, atomic, tokens) in enumerate(_split_block(block, max(budget - prefix_tokens, 1), count)):
            sep = ("\n\n" if block.gap else "\n") if n == 0 else ("\n" if block.kind == "text" else "\n\n")
            dense = _code_head(text, count) if block.kind == "fence" else text
            if prefix:
                text, dense = f"{prefix}\n\n{text}", f"{prefix}\n\n{dense}"
                tokens, sep, prefix = tokens + prefix_tokens, prefix_sep or sep, ""
            units.append(_Unit(text, sep, atomic, tokens, dense))
    return units


def _code_head(fence: str, count: TokenCounter) -> str:
    """A code fence as embedded densely: its opening line and the whole lines of its body that fit
    CODE_HEAD_TOKENS word pieces; the fence unchanged when its body fits."""
    lines = fence.split("\n")
    body = lines[1:-1]
    kept: list[str] = []
    total = 0
    for line in body:
        total += count(line) if line.strip() else 0
        if total > CODE_HEAD_TOKENS:
            return "\n".join([lines[0], *kept]).rstrip("\n")
        kept.append(line)
    return fence


def _lead_in(block: Block, following: list[Block], budget: int, count: TokenCounter) -> bool:
    return (
        block.kind == "text"
        and bool(following)
        and following[0].kind in ("fence", "table")
        and block.text.rstrip().endswith(":")
        and count(block.text) <= budget // 4
    )


def _split_block(block: Block, budget: int, count: TokenCounter) -> list[tuple[str, bool, int]]:
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


def _pack_units(units: list[_Unit], max_tokens: int, overlap_tokens: int, count: TokenCounter) -> list[tuple[str, str]]:
    """Greedy packing into chunks of at most max_tokens, each starting with the previous one's tail:
    (text, dense text) of each."""
    chunks: list[tuple[str, str]] = []
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
            tail = [_Unit(best, unit.sep, False, count(best), best)] if best else []
        break
    return tail


def _join(units: list[_Unit]) -> tuple[str, str]:
    text = "".join((unit.sep if n else "") + unit.text for n, unit in enumerate(units)).strip("\n")
    dense = "".join((unit.sep if n else "") + unit.dense for n, unit in enumerate(units))
    return text, dense.strip("\n")


def _breadcrumb(module_title: str, heading_path: tuple[str, ...]) -> str:
    crumbs: list[str] = []
    for crumb in (module_title, *heading_path):
        if crumb and (not crumbs or crumbs[-1] != crumb):
            crumbs.append(crumb)
    return " › ".join(crumbs)
