"""Docusaurus 3 addressing: front matter, doc ids and URLs (`/docs/{folder path}/{doc id}`), heading anchors.

Mirrors `plugin-content-docs` (`getSlug`, number prefixes, category indexes) and the mdx-loader's
`headings` plugin (github-slugger); splitting Markdown into chunks is left to `chunking.py`.
"""

from __future__ import annotations

import html
import json
import re
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from posixpath import normpath

__all__ = [
    "Slugger",
    "doc_id",
    "doc_url",
    "github_slug",
    "plain_text",
    "read_front_matter",
    "read_yaml_mapping",
    "split_heading_id",
    "strip_number_prefix",
]


def github_slug(text: str) -> str:
    """The github-slugger slug of a heading's Markdown text, without duplicate tracking."""
    return _slugify(plain_text(text))


def plain_text(markdown: str) -> str:
    """Heading Markdown as mdast `toString` sees it: code content, link text, no marks or tags."""
    parts: list[str] = []
    for is_code, piece in _split_code_spans(markdown):
        parts.append(piece if is_code else _strip_inline_marks(piece))
    return "".join(parts).strip()


def split_heading_id(text: str) -> tuple[str, str | None]:
    """Split an explicit `{#id}` (or MDX 3 `{/* #id */}`) off the end of a heading: (text, id).

    The one reading of a heading's explicit id: ``mdx.py`` reads the MDX 3 comment with it too."""
    match = _CLASSIC_ID.search(text) or _COMMENT_ID.search(text)
    if match is None:
        return text, None
    return text[: match.start()].rstrip(), match.group("id").strip()


def split_comment_id(text: str) -> tuple[str, str | None]:
    """Split an MDX 3 heading-id comment (`{/* #id */}`) off the end of a heading line: (text, id)."""
    match = _COMMENT_ID.search(text)
    if match is None:
        return text, None
    return text[: match.start()].rstrip(), match.group("id")


class Slugger:
    """Heading ids on one page, in document order, as the remark `headings` plugin assigns them.

    Feed every heading (h1 included: Docusaurus renders no id on the h1, but its slug is still
    taken, so a later "## Intro" under "# Intro" becomes `intro-1`). An explicit id is used as
    is and, like Docusaurus, is not registered for duplicate counting.
    """

    def __init__(self) -> None:
        self._occurrences: dict[str, int] = {}

    def slug(self, text: str) -> str:
        """A unique slug for plain text, github-slugger style (`x`, `x-1`, `x-2`...)."""
        original = _slugify(text)
        result = original
        # github-slugger's loop: a generated `x-1` may itself collide with a literal "x-1" heading.
        while result in self._occurrences:
            self._occurrences[original] += 1
            result = f"{original}-{self._occurrences[original]}"
        self._occurrences[result] = 0
        return result

    def heading(self, markdown: str) -> tuple[str, str]:
        """(clean heading text, anchor id) for one heading's Markdown text."""
        rest, explicit = split_heading_id(markdown)
        text = plain_text(rest)
        if explicit:
            return text, explicit
        return text, self.slug(text)


def read_front_matter(text: str) -> tuple[dict[str, object], str]:
    """(front matter, body) of a doc; a file that does not open with `---` has none."""
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    return read_yaml_mapping(match.group(1) or ""), text[match.end() :]


def read_yaml_mapping(source: str) -> dict[str, object]:
    """Top-level `key: value` pairs of the simple YAML Docusaurus front matter uses; nested values are None."""
    data: dict[str, object] = {}
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        match = _YAML_KEY.match(lines[i])
        i += 1
        if match is None:
            continue
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][0] in " \t"):
            block.append(lines[i].strip())
            i += 1
        data[match.group(1)] = _yaml_scalar((match.group(2) or "").strip(), [line for line in block if line])
    return data


def _yaml_scalar(value: str, more: list[str]) -> object:
    if value[:1] in ("|", ">"):
        return ("\n" if value[0] == "|" else " ").join(more)
    if not value:
        return None  # a nested mapping or list
    text = " ".join([value, *more])
    if value[0] == "'" and text.rstrip().endswith("'"):
        return text.strip()[1:-1].replace("''", "'")
    if value[0] == '"':
        try:
            return str(json.loads(text.strip()))
        except ValueError:
            return text.strip().strip('"')
    text = re.sub(r"(?<!\s)\s+#.*$", "", text)  # a run of spaces is tried from its start only
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() in ("null", "~"):
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def strip_number_prefix(name: str) -> str:
    """`01-intro` -> `intro`, but `2021-11-notes` and `1.0-release` are kept (Docusaurus default parser)."""
    if _IGNORED_PREFIX.match(name):
        return name
    match = _NUMBER_PREFIX.match(name)
    return match.group("suffix") if match else name


def doc_id(file_path: str, front_matter: Mapping[str, object]) -> str:
    """Docusaurus doc id: folder path (number prefixes stripped) + `id` front matter or file name."""
    folder, _, name = file_path.rpartition("/")
    base = _front_matter_str(front_matter, "id") or strip_number_prefix(_stem(name))
    if not folder:
        return base
    return "/".join([*(strip_number_prefix(part) for part in folder.split("/")), base])


def doc_url(base_url: str, file_path: str, front_matter: Mapping[str, object]) -> str:
    """`{base_url}/docs/{path}` for a doc, as Docusaurus `getSlug` computes it, without trailing slash.

    Docusaurus gives category indexes a trailing slash (`/docs/guide/`); our citation URLs have none,
    and with the default `trailingSlash: undefined` both forms serve the page.
    """
    folder, _, name = file_path.rpartition("/")
    folder_slug = "/" + "/".join(strip_number_prefix(part) for part in folder.split("/")) + "/" if folder else "/"
    slug = _front_matter_str(front_matter, "slug")
    if slug.startswith("/"):
        path = slug
    elif not slug and _is_category_index(name, folder):
        path = folder_slug
    else:
        target = slug or _front_matter_str(front_matter, "id") or strip_number_prefix(_stem(name))
        path = _resolve(folder_slug, target)
    return base_url.rstrip("/") + "/docs" + path.rstrip("/")


_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)?---[ \t]*(?:\n|\Z)", re.DOTALL)
_YAML_KEY = re.compile(r"^([A-Za-z_][\w-]*)[ \t]*:(?:[ \t]+(.*))?$")
# Docusaurus `parseMarkdownHeadingId`: the id runs to the last `}` of the heading.
_CLASSIC_ID = re.compile(r"\\?\{#(?P<id>(?:.(?!\{#|\}))*.)\}$")  # the space before it: rstrip
_COMMENT_ID = re.compile(r"\{/\*\s*#(?P<id>\S+)\s*\*/\}$")
_IGNORED_PREFIX = re.compile(r"^\d+[-_.]\d+")
_NUMBER_PREFIX = re.compile(r"^(?P<prefix>\d+)\s*[-_.]+\s*(?P<suffix>[^-_.\s].*)$")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_MDX_COMMENT = re.compile(r"\{/\*(?:(?!\{/\*|\*/\}).)*\*/\}", re.DOTALL)  # each try stops at the next "{/*"
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\[\]]*)\](?:\([^)\[\]]*\)|\[[^\[\]]*\])")  # stops at a bracket: linear on "[[[["
_AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^>\s]*)>")
_TAG = re.compile(r"</?[A-Za-z][\w.:-]*(?:\s[^<>]*)?/?>|<>|</>")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_STAR_EM = re.compile(r"\*(?=\S)(.+?)(?<=\S)\*")
_UNDERSCORE_EM = re.compile(r"(?<![^\W_])_(?=\S)(.+?)(?<=\S)_(?![^\W_])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ESCAPE_BASE = 0xF0000  # Supplementary Private Use Area-A: never in real headings.
_UNESCAPE = {_ESCAPE_BASE + code: chr(code) for code in range(128)}
# github-slugger removes symbols but keeps characters with the Unicode `Alphabetic` property:
# the only `So` ones are circled and squared Latin letters.
_ALPHABETIC_SYMBOLS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))


def _slugify(text: str) -> str:
    # github-slugger 1.5 (Docusaurus 3): lowercase, drop what its Unicode-category regex
    # matches, then each plain space becomes `-` (runs are not collapsed).
    return "".join("-" if ch == " " else ch for ch in text.lower() if ch == " " or _kept(ch))


@lru_cache(maxsize=4096)
def _kept(ch: str) -> bool:
    if ch == "-":
        return True
    category = unicodedata.category(ch)
    if category[0] in "LM" or category in ("Nd", "Nl", "Pc"):
        return True
    code = ord(ch)
    return any(low <= code <= high for low, high in _ALPHABETIC_SYMBOLS)


def _split_code_spans(text: str) -> list[tuple[bool, str]]:
    """(is_code, piece) pairs; a code span's piece is its content (CommonMark space stripping)."""
    pieces: list[tuple[bool, str]] = []
    pos = start = 0
    while (tick := text.find("`", pos)) != -1:
        run_end = tick
        while run_end < len(text) and text[run_end] == "`":
            run_end += 1
        fence = text[tick:run_end]
        close = _find_backtick_run(text, run_end, len(fence))
        if close == -1 or (tick > 0 and text[tick - 1] == "\\"):
            pos = run_end
            continue
        pieces.append((False, text[start:tick]))
        content = text[run_end:close].replace("\n", " ")
        if len(content) > 2 and content[0] == " " and content[-1] == " " and content.strip(" "):
            content = content[1:-1]
        pieces.append((True, content))
        pos = start = close + len(fence)
    pieces.append((False, text[start:]))
    return pieces


def _find_backtick_run(text: str, pos: int, length: int) -> int:
    while (tick := text.find("`", pos)) != -1:
        end = tick
        while end < len(text) and text[end] == "`":
            end += 1
        if end - tick == length:
            return tick
        pos = end
    return -1


def _strip_inline_marks(text: str) -> str:
    text = _ESCAPE.sub(lambda m: chr(_ESCAPE_BASE + ord(m.group(1))), text)
    text = _MDX_COMMENT.sub("", text)
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _AUTOLINK.sub(r"\1", text)
    text = _TAG.sub("", text)
    text = _STRONG.sub(r"\2", text)
    text = _STRIKE.sub(r"\1", text)
    text = _STAR_EM.sub(r"\1", text)
    text = _UNDERSCORE_EM.sub(r"\1", text)
    return html.unescape(text.translate(_UNESCAPE))


def _front_matter_str(front_matter: Mapping[str, object], key: str) -> str:
    value = front_matter.get(key)
    if value is None or isinstance(value, bool):
        return ""
    return str(value).strip()


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else name


def _is_category_index(name: str, folder: str) -> bool:
    # Docusaurus `isCategoryIndex`: index.md, README.md or <folder>/<folder>.md, case-insensitive,
    # compared on the raw names (number prefixes included).
    stem = _stem(name).lower()
    parent = folder.rpartition("/")[2].lower()
    return stem in ("index", "readme") or (bool(parent) and stem == parent)


def _resolve(folder_slug: str, target: str) -> str:
    # `resolvePathname(slug, folder)`: relative slugs resolve against the folder, never above `/`.
    return "/" + normpath(folder_slug + target).lstrip("/")
