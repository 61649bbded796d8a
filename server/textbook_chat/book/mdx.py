"""MDX/Markdown source -> blocks: headings (with their Docusaurus anchors), fences, tables, admonitions, prose.

MDX `import`/`export` lines, comments and JSX/HTML tags are removed outside code fences; the prose
between tags stays; `<Admonition type title>` is read as the `:::type title` it stands for. This is the
one reading of a page: `chunking.py` groups the blocks into chunks, `web/webapp.py` renders them as HTML, and
the offline answer (`answer/extract.py`) cuts a chunk into units by the same line rules (``atx_heading``...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from textbook_chat.book.slugs import Slugger, split_comment_id, split_heading_id

_FENCE = re.compile(r"^(\s*)(`{3,}(?!.*`)|~{3,})(.*)$")
_FENCE_CLOSE = re.compile(r"^\s*(`{3,}|~{3,})\s*$")
_ATX_OPEN = re.compile(r" {0,3}(#{1,6})(?=[ \t]|$)")  # the text after it is read in ``atx_heading``, linearly
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_NOT_SETEXT = re.compile(r"^\s*(?:[-*+>|]|\d+[.)])(?:\s|$)")
# `:::tip Title` (Docusaurus 2) or `:::tip[Title]` (Docusaurus 3); the type, then the title.
_ADMONITION_OPEN = re.compile(r"^[ \t]*(:{3,})([A-Za-z][\w-]*)[ \t]*(?:\[(.*)\][ \t]*|(.*))$")
_ADMONITION_CLOSE = re.compile(r"^\s*(:{3,})\s*$")
_TABLE_DELIMITER = re.compile(r"^[ \t]*(?:\|[ \t]*)?:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*(?:\|[ \t]*)?$")
_THEMATIC_BREAK = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
# MDX ESM: `import x from`, `import {`, `export const` ... at the start of a paragraph.
_ESM = re.compile(
    r"^(?:import\s+(?:type\s+)?(?:[\w$]+\s*(?:,|\s+from\b)|[{*'\"])|"
    r"export\s+(?:default|const|let|var|function|class|async|[{*]))"
)
# The JSX spelling of an admonition, on lines of their own: `<Admonition type="info" title="...">` ... `</Admonition>`.
_ADMONITION_TAG = re.compile(r"^\s*<Admonition\b([^>]*)>\s*$")
_ADMONITION_TAG_CLOSE = re.compile(r"^\s*</Admonition>\s*$")
_TAG_VALUE = re.compile(r"""(?<!\w)(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)')""")  # a name is tried from its start only
_MARKUP = re.compile(r"`+|<!--|\{/\*|</?[A-Za-z>]")
_TAG_OPEN = re.compile(r"</?(?:[A-Za-z][\w.:-]*)?")
_ATTRIBUTE = re.compile(r"[A-Za-z_:$][\w.:$-]*(?:\s*=\s*(?=[{])|\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`{}]+))?")


@dataclass
class Block:
    kind: str  # "text", "heading", "fence", "table" or "admonition"
    text: str
    gap: bool = True  # a blank line came before it
    level: int = 0
    plain: str = ""  # headings: clean text for heading_path; admonitions: the title as written ("" for none)
    anchor: str = ""
    variant: str = ""  # admonitions: "note", "tip", "info", "warning", "danger"...
    children: list[Block] = field(default_factory=list)  # admonitions: the blocks inside, headings numbered


def parse_blocks(text: str, slugger: Slugger) -> list[Block]:
    """The blocks of a doc body (front matter already removed), headings numbered by ``slugger``."""
    return _scan(_clean(text.split("\n")), slugger)


# -- line rules, shared with the offline answer's unit cutter (answer/extract.py) ---------------------------------


def fence_opening(line: str) -> re.Match[str] | None:
    """A code fence's opening line: groups (indent, marker, info string)."""
    return _FENCE.match(line)


def fence_end(lines: list[str], start: int, opening: re.Match[str]) -> tuple[int, bool]:
    """(index after the closing fence line, closed?); an unclosed fence runs to the end of the file."""
    marker = opening.group(2)
    for i in range(start + 1, len(lines)):
        close = _FENCE_CLOSE.match(lines[i])
        if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
            return i + 1, True
    return len(lines), False


def code_lines(text: str) -> list[tuple[str, bool]]:
    """Each line of ``text`` with whether it belongs to a fenced code block (its fence lines included; an unclosed
    fence runs to the end): the one reading of fences that ingestion, the offline answer's checks and the
    excerpts share."""
    lines = text.split("\n")
    marked: list[tuple[str, bool]] = []
    i = 0
    while i < len(lines):
        if opening := _FENCE.match(lines[i]):
            end = fence_end(lines, i, opening)[0]
            marked.extend((line, True) for line in lines[i:end])
            i = end
        else:
            marked.append((lines[i], False))
            i += 1
    return marked


def without_code(text: str) -> str:
    """``text`` with its fenced code blocks left out: what it says in prose."""
    return "\n".join(line for line, code in code_lines(text) if not code)


def atx_heading(line: str) -> tuple[int, str] | None:
    """(level, text) of an ATX heading line (``## Title ##``): the closing #s, after a space, and the spaces around
    the text dropped. Read without a backtracking pattern, so a long line costs its length, not its square."""
    opening = _ATX_OPEN.match(line)
    if opening is None:
        return None
    text = line[opening.end() :].strip(" \t")
    unclosed = text.rstrip("#")
    if unclosed != text and (not unclosed or unclosed[-1] in " \t"):
        text = unclosed.rstrip(" \t")
    return len(opening.group(1)), text


def is_table_delimiter(line: str) -> bool:
    """A table's second line: cells of dashes, each with an optional colon at either end (``|:--|--:|``)."""
    return "-" in line and bool(_TABLE_DELIMITER.match(line))


def is_thematic_break(line: str) -> bool:
    return bool(_THEMATIC_BREAK.match(line))


def is_directive(line: str) -> bool:
    """An admonition's opening (``:::tip Title``, ``:::note[Title]``) or closing (``:::``) line."""
    return bool(_ADMONITION_OPEN.match(line) or _ADMONITION_CLOSE.match(line))


def substantive(block: Block) -> bool:
    """Whether a block carries text of its own (not a heading, not only a thematic break)."""
    if block.kind == "heading":
        return False
    if block.kind != "text":
        return True
    return any(line.strip() and not _THEMATIC_BREAK.match(line) for line in block.text.split("\n"))


def _clean(lines: list[str]) -> list[str]:
    """Drop ESM, comments and JSX tags outside code fences; fences stay verbatim."""
    out: list[str] = []
    start = i = 0
    while i < len(lines):
        if match := _FENCE.match(lines[i]):
            end = fence_end(lines, i, match)[0]
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
        elif tag := _ADMONITION_TAG.match(line):
            attrs = {m.group(1): m.group(2) or m.group(3) or "" for m in _TAG_VALUE.finditer(tag.group(1))}
            kept.append(f":::{attrs.get('type', 'note')} {attrs.get('title', '')}".rstrip())
        elif _ADMONITION_TAG_CLOSE.match(line):
            kept.append(":::")
        else:
            kept.append(line)
    text = _strip_markup("\n".join(_classic_id(line) for line in kept))
    return [line if line.strip() else "" for line in text.split("\n")]


def _classic_id(line: str) -> str:
    """``## Title {/* #id */}`` as ``## Title {#id}``: comments are stripped next, and the id would go with them."""
    if "{/*" not in line or not _ATX_OPEN.match(line):
        return line
    text, found = split_comment_id(line.rstrip(" \t"))
    return line if found is None else f"{text} {{#{found}}}"


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


def _scan(lines: list[str], slugger: Slugger) -> list[Block]:
    """Block structure: headings (ids assigned in document order), fences, tables, admonitions, text."""
    blocks: list[Block] = []
    i, gap = 0, True
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i, gap = i + 1, True
            continue
        block: Block | None
        if fence := _FENCE.match(line):
            end, closed = fence_end(lines, i, fence)
            body = lines[i:end] if closed else [*lines[i:end], fence.group(1) + fence.group(2)]
            block = Block("fence", "\n".join(body))
        elif heading := atx_heading(line):
            block, end = _heading(heading[1], heading[0], slugger), i + 1
        elif (opening := _ADMONITION_OPEN.match(line)) and (end := _admonition_end(lines, i, opening)) > 0:
            inside = _scan(lines[i + 1 : end - 1], slugger)  # its headings take ids but do not split it
            title = opening.group(3) if opening.group(3) is not None else opening.group(4).strip()
            variant = opening.group(2).lower()
            block = Block("admonition", "\n".join(lines[i:end]), plain=title, variant=variant, children=inside)
        elif _table_starts(lines, i):
            end = i + 2
            while end < len(lines) and lines[end].strip() and "|" in lines[end]:
                end += 1
            block = Block("table", "\n".join(lines[i:end]))
        elif _ADMONITION_CLOSE.match(line):
            block, end = None, i + 1  # a stray directive fence: markup only
        else:
            block, end = _paragraph(lines, i, slugger)
        if block is not None:
            block.gap = gap
            blocks.append(block)
        i, gap = end, False
    return blocks


def _heading(markdown: str, level: int, slugger: Slugger) -> Block:
    plain, anchor = slugger.heading(markdown)
    raw = split_heading_id(markdown.strip())[0]
    return Block("heading", "#" * level + " " + raw, level=level, plain=plain, anchor=anchor)


def _paragraph(lines: list[str], start: int, slugger: Slugger) -> tuple[Block, int]:
    end = start + 1
    while end < len(lines) and lines[end].strip():
        line = lines[end]
        if _SETEXT.match(line) and not _NOT_SETEXT.match(lines[start]):
            text = " ".join(part.strip() for part in lines[start:end])
            return _heading(text, 1 if line.strip()[0] == "=" else 2, slugger), end + 1
        if (
            _FENCE.match(line)
            or atx_heading(line)
            or _ADMONITION_OPEN.match(line)
            or _ADMONITION_CLOSE.match(line)
            or _table_starts(lines, end)
        ):
            break
        end += 1
    return Block("text", "\n".join(lines[start:end])), end


def _admonition_end(lines: list[str], start: int, opening: re.Match[str]) -> int:
    """Index after the matching `:::` (nested admonitions use more colons), or -1 if unclosed."""
    stack = [len(opening.group(1))]
    i = start + 1
    while i < len(lines):
        if fence := _FENCE.match(lines[i]):
            i = fence_end(lines, i, fence)[0]
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
    return is_table_delimiter(lines[i + 1])
