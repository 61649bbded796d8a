"""The offline answer's material: a chunk's Markdown cut into units a reader can be given whole, chosen, ordered.

A unit is a sentence (with the sentence it leans on, when it opens with "This", "For example" ...), a lead-in with
the list, code or table it introduces (cut to a budget), a list or a table row with its header. Units are read from
the Markdown's form alone, never from what a book is about: navigation lines, link lists, admonition markers, MDX
and HTML are never units, and a lead-in without what follows it is dropped. Scoring (lexical, then the
cross-encoder) and streaming are ``generation.py``'s; this module chooses, merges duplicates and renders.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from textbook_chat.book import mdx
from textbook_chat.index import sparse
from textbook_chat.search import passages

UnitKind = Literal["sentence", "block"]

LIST_BUDGET_WORDS = 90  # a lead-in's list, code or table is cut to about this many words
CODE_BUDGET_LINES = 12
SCORED_WORDS = 20  # what the cross-encoder reads of a unit (beside its heading)


@dataclass(frozen=True)
class Unit:
    """A piece of a source the answer may quote whole."""

    kind: UnitKind
    body: str  # Markdown as it will be shown, without the citation marker
    lead: str  # for a block: its lead-in sentence ("" when it has none); the marker goes before its colon
    heading: str  # the nearest heading above it, for scoring only
    n: int | None  # the source (None: the reader's selection)
    position: int  # order within its source
    cites: tuple[int, ...] = ()
    score: float = 0.0
    terms: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def words(self) -> int:
        return len(self.lead.split()) + len(self.body.split())

    @property
    def bare_code(self) -> bool:
        """A code block with no lead-in sentence saying what it shows."""
        return not self.lead and self.body.startswith(("```", "~~~"))

    def scoring_text(self) -> str:
        """What a scorer reads: the heading, then the unit's first ``SCORED_WORDS`` words without Markdown syntax
        (backticks, emphasis, fences and list markers cost word pieces and say nothing)."""
        text = _MARKUP_SYNTAX.sub(" ", f"{self.lead}\n{self.body}")
        words = text.split()
        text = " ".join(words[:SCORED_WORDS])
        return f"{self.heading}. {text}" if self.heading else text


# -- Markdown to units ----------------------------------------------------------------------------------

_MARKUP_SYNTAX = re.compile(r"`{3}[\w+-]*|[`*_|]+|^\s*(?:[-+]|\d{1,3}[.)])\s", re.M)
# Code lines that only set the stage: imports, includes, comments, an XML declaration.
_PREAMBLE = re.compile(
    r"^\s*(?:import\s|from\s+\S+\s+import\s|#(?!!)|//|/\*|\*|--\s|using\s|package\s|require[\s(]|<\?xml|<!--)"
)
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d{1,3}[.)])\s+(.*)$")
LIST_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")  # a list item's bullet or number, with its space
_TABLE = re.compile(r"^\s*\|")
# Markup lines that are never text: HTML / JSX, MDX imports and exports, comments (fences, headings, tables,
# thematic breaks and admonition markers are book/mdx.py's line rules, the ones the book's pages are read by).
_SKIP_LINE = re.compile(r"^\s*(?:<|import\s|export\s|\{/\*)")
# A link's text and target stop at a bracket, so "[[[[" or "[a]([a](" costs its length, not its square.
_LINK = re.compile(r"!?\[([^\[\]]*)\]\([^)\[\]]*\)")
MAX_LINE_CHARS = 4000  # what the line rules read of a line (a longer one is kept whole, classified by its start)
_NAV_CHARS = 1000  # a navigation line is short: a longer one is not read by the navigation rules at all
_NAV_LABEL = re.compile(
    r"^(?:[-*+]\s+)?[*_]*(?:[←→⬅➡«»‹›<>]+\s*)?(?:previous|prev|next|back(?:\s+to)?|up next|continue(?:\s+to)?|"
    r"go to|return to|home)\b[^.!?]{0,80}$",
    re.I,
)
_NAV_COLON = re.compile(
    r"^[\W_]*(?:previous|prev|next|up next)"
    r"(?:\s+(?:chapter|page|lesson|section|topic|module|part|unit))?[*_]*\s*:",
    re.I,
)
_ARROWS = re.compile(r"[←→⬅➡«»]")
NAV_WORDS = 14  # a navigation line is short
# Headings of what is not teaching text to quote: a page's reading lists and navigation, and what a chapter
# promises or assumes rather than teaches (its objectives restate the topics a question asks about).
_SKIPPED_SECTION = re.compile(
    r"^\W*(?:[\d.]+\s*)?(?:references|bibliography|further reading|additional resources|resources|see also|"
    r"related (?:pages|topics|reading)|external links|links|navigation|what'?s next|next steps|citations?|"
    r"(?:learning )?objectives|learning outcomes|prerequisites|what you(?:'ll| will) learn)\W*$",
    re.I,
)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(*`])")
# A sentence that leans on the one before it: it is quoted with it, or not at all.
_LEANS_BACK = re.compile(
    r"^(?:[*_]+)?(?:this|these|that|those|it|its|they|their|such|here|thus|hence|therefore|however|"
    r"for example|for instance|e\.g\.|in other words|in this case|that is|instead|otherwise|similarly|likewise)\b",
    re.I,
)
# A label line inside what a lead-in introduces: "**Prediction:**", "**Update**:", "Where:" (emphasised, or three
# words at most; "To create a workspace:" is a lead-in of its own).
_LABEL = re.compile(r"^(?:[*_]{1,2}[^*_.!?]{1,60}:?[*_]{1,2}:?|(?:\S+\s+){0,2}\S+:)$")
# Words by which a sentence points at what comes next ("the code below", "as follows", "the following steps").
_POINTS_AHEAD = re.compile(r"\b(?:below|as follows|the following|here is|here's)\b", re.I)
# A prompt to the student, wherever it sits ("Discuss the challenges of ...:", "Explain the differences ..."):
# it asks what the reader asked, it does not answer it. Verbs a reader follows ("Install", "List") are not here.
_STUDY_PROMPT = re.compile(
    r"^[*_]*(?:discuss|explain|describe|compare|contrast|analy[sz]e|evaluate|reflect|justify|summari[sz]e|define|"
    r"investigate|research)\b",
    re.I,
)
_MIN_WORDS = 5
TERM_WORDS = 6  # "Linear Inverted Pendulum Model (LIPM)" is a name, not a statement


@dataclass
class _Block:
    kind: Literal["heading", "para", "list", "code", "table"]
    lines: list[str]


def code_units(text: str, n: int | None, heading: str = "") -> list[Unit]:
    """A chunk's code blocks as units under their headings (``heading``: the chunk's section, before any of its
    own), cut as a lead-in's code is: what an answer may quote when no sentence anywhere answers ("how do I cancel
    a goal?" after a listing split across chunks)."""
    found: list[Unit] = []
    for block in _blocks(text):
        if block.kind == "heading":
            heading = _plain(block.lines[0])
        elif block.kind == "code" and not _SKIPPED_SECTION.match(heading) and (unit := _listing(block, heading, n)):
            found.append(unit)
    return _numbered(found)


def _listing(block: _Block, heading: str, n: int | None) -> Unit | None:
    """A code block as a unit of its own under ``heading``, cut as a lead-in's code is; None when too short to
    stand (or nothing but imports and comments)."""
    body = _render_blocks([block])
    return Unit("block", body, "", heading, n, 0) if len(body.split()) >= _MIN_WORDS else None


def units(text: str, n: int | None, kind: passages.Kind = "teaching") -> list[Unit]:
    """The quotable units of a chunk's Markdown, in source order."""
    blocks = _blocks(text)
    result: list[Unit] = []
    heading = ""
    skipping = False
    i = 0
    while i < len(blocks):
        block = blocks[i]
        if block.kind == "heading":
            heading = _plain(block.lines[0])
            skipping = bool(_SKIPPED_SECTION.match(heading))
            i += 1
            continue
        if skipping:
            i += 1
            continue
        if block.kind == "para":
            sentences = _paragraph_sentences(block.lines)
            lead = sentences.pop() if sentences and _introduces(sentences[-1]) else None
            result += _sentence_units(sentences, heading, n, kind)
            if lead is not None:
                following, i = _introduced(blocks, i + 1)
                if following and kind == "teaching" and _STUDY_PROMPT.match(lead):
                    lead = ""  # in teaching text the list under a prompt may still teach; the prompt is not quoted
                if following and (not lead or _quotable(lead, kind, allow_short=True)):
                    body = _render_blocks(following)
                    if body:
                        result.append(Unit("block", body, lead, heading, n, 0))
                continue
        elif block.kind == "list":
            group = [block]
            if _is_lead_in(block.lines[-1]):  # "4. **Implementation**:" and the code under it
                following, after = _introduced(blocks, i + 1)
                group += following
                i = after - 1
            if (
                not _is_link_list(block.lines)
                and not _mostly_not_teaching(block.lines, kind)
                and not _is_term_list(group)
            ):
                body = _render_blocks(group)
                if len(body.split()) >= _MIN_WORDS:
                    result.append(Unit("block", body, "", heading, n, 0))
        elif block.kind == "table":
            result += [Unit("block", row, "", heading, n, 0) for row in _table_rows(block.lines)]
        elif block.kind == "code" and kind == "teaching" and (unit := _listing(block, heading, n)):
            # A listing no sentence introduces, under its heading: often the only place the answer to "how do I
            # cancel a goal?" is written (``offline._lexical`` weighs it half: nothing says what it shows)
            result.append(unit)
        i += 1
    return _numbered(result)


def _numbered(found: Sequence[Unit]) -> list[Unit]:
    """``found`` with each unit's place among them and the terms of what the keyword score reads of it."""
    # The keyword score reads what the cross-encoder reads, a unit's heading and opening words: the whole of a long
    # list would swamp the length normalisation with terms its lead-in does not promise (on the shared, held-out
    # and demo sets this gave fact recall 0.742 / 0.811 / 0.691 against 0.722 / 0.755 / 0.691 for whole units).
    return [replace(u, position=p, terms=frozenset(sparse.terms(u.scoring_text()))) for p, u in enumerate(found)]


def sentences(text: str) -> list[str]:
    """Prose sentences of a chunk: no code blocks, headings, tables, list markers or fragments too short to stand."""
    result = []
    for block in _blocks(text):
        if block.kind == "para":
            result += [s for s in _paragraph_sentences(block.lines) if _enough(s)]
        elif block.kind == "list":
            for line in block.lines:
                item = LIST_ITEM.match(line)
                piece = item.group(3) if item else line.strip()
                result += [s for s in _sentences(piece) if _enough(s)]
    return result


def _blocks(text: str) -> list[_Block]:
    """The chunk's blocks, read by book/mdx.py's line rules (fences, headings, tables, breaks, admonition markers)."""
    blocks: list[_Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        probe = line[:MAX_LINE_CHARS]
        fence = mdx.fence_opening(probe)
        if fence:
            end, closed = mdx.fence_end(lines, i, fence)
            body = lines[i:end] if closed else [*lines[i:end], fence.group(2)]
            blocks.append(_Block("code", body))
            i = end
            continue
        heading = mdx.atx_heading(probe)
        if heading:
            blocks.append(_Block("heading", [heading[1]]))
        elif (
            not probe.strip()
            or _SKIP_LINE.match(probe)
            or mdx.is_thematic_break(probe)
            or mdx.is_directive(probe)
            or is_navigation(probe)
        ):
            if blocks and blocks[-1].kind == "para" and blocks[-1].lines:
                blocks.append(_Block("para", []))  # a paragraph ends here; the next line starts another
        elif _TABLE.match(probe):
            _extend(blocks, "table", line)
        elif LIST_ITEM.match(probe):
            _extend(blocks, "list", line)
        elif blocks and blocks[-1].kind == "list" and line.startswith((" ", "\t")):
            blocks[-1].lines[-1] += " " + line.strip()  # an item's continuation line
        else:
            _extend(blocks, "para", re.sub(r"^\s*>\s?", "", line))
        i += 1
    return [b for b in blocks if b.lines]


def _extend(blocks: list[_Block], kind: Literal["para", "list", "table"], line: str) -> None:
    if blocks and blocks[-1].kind == kind:
        blocks[-1].lines.append(line)
    else:
        blocks.append(_Block(kind, [line]))


def _paragraph_sentences(lines: Sequence[str]) -> list[str]:
    """A paragraph's sentences; a line break ends one after a full stop, a question or a colon, and before an
    answer option, so a quiz's lines never run together into one "sentence"."""
    segments: list[str] = []
    for line in lines:
        line = line.strip()
        if segments and not segments[-1].endswith((".", "!", "?", ":")) and not passages.is_question_line(line):
            segments[-1] += " " + line
        else:
            segments.append(line)
    return [sentence for segment in segments for sentence in _sentences(segment)]


def _sentences(text: str) -> list[str]:
    return [p.strip() for p in _SENTENCE_SPLIT.split(text) if p.strip()]


def _enough(sentence: str) -> bool:
    return len(sentence.split()) >= _MIN_WORDS


def _is_lead_in(sentence: str) -> bool:
    return sentence.rstrip("*_ ").endswith(":")


def _introduces(sentence: str) -> bool:
    """A paragraph's last sentence that introduces what follows it: a lead-in, or one pointing ahead ("The node below
    publishes a heartbeat twice per second."): quoted with its code, list or table, or not at all."""
    return _is_lead_in(sentence) or bool(_POINTS_AHEAD.search(sentence))


def _quotable(sentence: str, kind: passages.Kind, *, allow_short: bool = False) -> bool:
    if not allow_short and not _enough(sentence):
        return False
    if _STUDY_PROMPT.match(sentence):
        return False
    return not passages.is_not_teaching(sentence, kind) and not is_navigation(sentence)


def _sentence_units(sentences: list[str], heading: str, n: int | None, kind: passages.Kind) -> list[Unit]:
    """One unit per sentence; a sentence that leans on the one before is joined to it (two at most)."""
    result: list[Unit] = []
    previous: str | None = None
    for sentence in sentences:
        if not _quotable(sentence, kind) or _is_lead_in(sentence):
            previous = None
            continue
        if _LEANS_BACK.match(sentence):
            if previous is not None:
                result[-1] = replace(result[-1], body=f"{previous} {sentence}")
            previous = None  # quoted with its antecedent, or not at all
            continue
        result.append(Unit("sentence", sentence, "", heading, n, 0))
        previous = sentence
    return result


def _introduced(blocks: list[_Block], start: int) -> tuple[list[_Block], int]:
    """The blocks a lead-in introduces: lists, code and tables, and label lines ("**Update:**") between them."""
    taken: list[_Block] = []
    i = start
    while i < len(blocks):
        block = blocks[i]
        if block.kind in ("list", "code", "table") or (
            block.kind == "para" and len(block.lines) == 1 and _LABEL.match(block.lines[0].strip())
        ):
            taken.append(block)
        else:
            break
        i += 1
    while taken and taken[-1].kind == "para":  # a trailing label introduces nothing here
        taken.pop()
    return taken, i


def _render_blocks(blocks: Sequence[_Block]) -> str:
    """Lists, code, tables and labels as Markdown, cut to ``LIST_BUDGET_WORDS`` at a whole item or line."""
    out: list[str] = []
    words = 0
    for block in blocks:
        if words >= LIST_BUDGET_WORDS:
            break
        if block.kind == "code":
            lines = block.lines[1:-1]
            kept = lines[:CODE_BUDGET_LINES]
            while kept and not kept[-1].strip():
                kept.pop()
            if not kept or all(_PREAMBLE.match(line) for line in kept if line.strip()):
                continue  # nothing but imports and comments within the budget says nothing
            out.append("\n".join([block.lines[0].strip(), *kept, block.lines[-1].strip()]))
            words += sum(len(line.split()) for line in kept)
        elif block.kind == "list":
            items: list[str] = []
            for line in block.lines:
                if is_navigation(line) or _is_link_list([line]):
                    continue
                length = len(line.split())
                if items and words + length > LIST_BUDGET_WORDS:
                    break
                items.append(line.rstrip())
                words += length
            if items:
                out.append("\n".join(_outdent(items)))
        elif block.kind == "table":
            rows = _table_rows(block.lines)
            kept_rows: list[str] = []
            for row in rows:
                if kept_rows and words + len(row.split()) > LIST_BUDGET_WORDS:
                    break
                kept_rows.append(row)
                words += len(row.split())
            if kept_rows:
                out.append("\n".join(kept_rows))
        else:
            out.append(block.lines[0].strip())
            words += len(block.lines[0].split())
    # Nothing may end on a lead-in whose list or code was cut away: a label, or an item ending in a colon.
    while out:
        lines = out[-1].splitlines()
        while lines and _is_lead_in(lines[-1]) and not lines[-1].lstrip().startswith(("```", "~~~")):
            lines.pop()
        if lines:
            out[-1] = "\n".join(lines)
            break
        out.pop()
    return "\n\n".join(out)


def _outdent(items: list[str]) -> list[str]:
    indent = min(len(line) - len(line.lstrip()) for line in items)
    return [line[indent:] for line in items]


def _table_rows(lines: list[str]) -> list[str]:
    """Each body row as a list item naming every column by its header: "- Feature: X; Gazebo: Y; Unity: Z"."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    if len(cells) < 3 or not mdx.is_table_delimiter(lines[1][:MAX_LINE_CHARS]):
        return []
    header = cells[0]
    rows = []
    for row in cells[2:]:
        pairs = [f"{h}: {v}" if h else v for h, v in zip(header, row, strict=False) if v]
        if pairs:
            rows.append("- " + "; ".join(pairs))
    return rows


def is_navigation(line: str) -> bool:
    """A page's navigation: a previous / next / back label line, an arrow between links, or nothing but links."""
    plain = line.strip()
    if not plain or len(plain) > _NAV_CHARS:
        return False
    labelled = _LINK.sub(r"\1", plain)
    if _NAV_LABEL.match(labelled) and len(labelled.split()) <= NAV_WORDS:
        # "Next: Loops", "**Previous:** [Intro](..)", "← Back to the outline": a label and a link or an arrow.
        # "Next, run the following command:" is a step, not navigation.
        if _LINK.search(plain) or _ARROWS.search(plain) or _NAV_COLON.match(labelled):
            return True
    links = _LINK.findall(plain)
    if not links:
        return False
    rest = LIST_MARKER.sub("", _LINK.sub(" ", plain))
    return len(re.findall(r"[A-Za-z]{3,}", rest)) <= 2 or bool(_ARROWS.search(plain))


def _is_link_list(lines: Sequence[str]) -> bool:
    """A list whose items are mostly bare links (a reading list, a table of contents)."""
    items = [line for line in lines if line.strip()]
    linked = sum(1 for line in items if is_navigation(line))
    return bool(items) and linked >= max(1, math.ceil(0.5 * len(items)))


def _is_term_list(blocks: Sequence[_Block]) -> bool:
    """A bare list of names (key terms, topics covered): short items that state nothing (no colon, no stop)."""
    if len(blocks) != 1:
        return False
    items = []
    for line in blocks[0].lines:
        item = LIST_ITEM.match(line)
        items.append(item.group(3) if item else line)
    return all(len(item.split()) <= TERM_WORDS and not re.search(r"[:.;!?=]", item) for item in items)


def _mostly_not_teaching(lines: Sequence[str], kind: passages.Kind) -> bool:
    flagged = 0
    for line in lines:
        item = LIST_ITEM.match(line)
        text = item.group(3) if item else line
        if passages.is_not_teaching(text, kind) or passages.is_question_line(text):
            flagged += 1
    return flagged * 2 > len(lines)


def _plain(text: str) -> str:
    return " ".join(re.sub(r"[*_`]", "", _LINK.sub(r"\1", text)).split())
