"""Chunking a Docusaurus book: checked on the shared real book, the demo book and small made-up docs.

Expected anchors and URLs are computed here from the Markdown source with github-slugger's rules (the
slugs Docusaurus 3 gives headings), independently of server/textbook_chat/book/slugs.py.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from pathlib import Path

import pytest

from tests.conftest import DEMO_BOOK, SHARED_BOOK
from textbook_chat.book import chunking
from textbook_chat.book.chunking import Book, Chunk, read_book
from textbook_chat.book.docusaurus import CARDS_REASON
from textbook_chat.book.mdx import parse_blocks
from textbook_chat.book.slugs import Slugger
from textbook_chat.core.tokens import local_counter
from textbook_chat.index import sparse

BASE = "http://localhost:3000"
MAX_TOKENS = 200  # MiniLM's chunk target (LocalEmbedder.chunk_tokens)
OVERLAP = 30
FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING_LINE = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*$")


def count(text: str) -> int:
    return local_counter().count(text)


def chunk_book(root: Path, max_tokens: int = MAX_TOKENS, overlap: int = OVERLAP) -> Book:
    return read_book(root, base_url=BASE, count_tokens=count, max_tokens=max_tokens, overlap_tokens=overlap)


@pytest.fixture(scope="module")
def book() -> Book:
    return chunk_book(SHARED_BOOK / "docs")


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".md", ".mdx"))


def outside_fences(text: str) -> list[tuple[bool, str]]:
    """(inside a fence?, line) for every line; fence lines themselves count as inside."""
    lines: list[tuple[bool, str]] = []
    marker = ""
    for line in text.split("\n"):
        match = FENCE_LINE.match(line)
        if marker:
            lines.append((True, line))
            if (
                match
                and match.group(1)[0] == marker[0]
                and len(match.group(1)) >= len(marker)
                and not line.strip("`~ \t")
            ):
                marker = ""
        elif match:
            marker = match.group(1)
            lines.append((True, line))
        else:
            lines.append((False, line))
    return lines


def fences(text: str) -> list[str]:
    """Every fenced code block of a Markdown text, fence lines included."""
    blocks: list[str] = []
    current: list[str] = []
    for inside, line in outside_fences(text):
        if inside:
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    if current:
        blocks.append("\n".join(current))
    return blocks


def expected_slug(heading_markdown: str) -> str:
    """github-slugger (as Docusaurus 3 runs it), applied to the heading's text without Markdown marks."""
    text = re.sub(r"\s*\{#[^}]*\}$", "", heading_markdown)
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"(\*\*|__|\*|_)(?=\S)(.+?)(?<=\S)\1", r"\2", text)
    text = re.sub(r"<[^>]+>", "", text)
    kept = [
        ch
        for ch in text.strip().lower()
        if ch in " -_" or unicodedata.category(ch)[0] in "LM" or unicodedata.category(ch) == "Nd"
    ]
    return "".join(kept).replace(" ", "-")


def expected_anchors(markdown: str) -> list[tuple[int, str, str]]:
    """(level, heading line, anchor) for every heading of a page, duplicates numbered -1, -2 in page order."""
    seen: dict[str, int] = {}
    result = []
    for inside, line in outside_fences(markdown):
        match = HEADING_LINE.match(line)
        if inside or not match:
            continue
        explicit = re.search(r"\{#([^}]+)\}$", match.group(2))
        slug = base = expected_slug(match.group(2))
        if not explicit:
            while slug in seen:
                seen[base] += 1
                slug = f"{base}-{seen[base]}"
            seen[slug] = 0
        result.append((len(match.group(1)), line.strip(), explicit.group(1) if explicit else slug))
    return result


# -- the shared real book -------------------------------------------------------------------------


@pytest.mark.slow
def test_every_file_of_the_real_book_is_indexed_or_reported_with_a_reason(book: Book) -> None:
    root = SHARED_BOOK / "docs"
    files = {p.relative_to(root).as_posix() for p in source_files(root)}
    indexed = {d.file_path for d in book.documents}
    skipped = {s.file_path: s.reason for s in book.skipped}
    assert indexed | set(skipped) == files
    assert not indexed & set(skipped)
    assert all(reason.strip() for reason in skipped.values())
    assert "index.md" in skipped  # imports and a <Redirect />: no prose
    assert {c.file_path for c in book.chunks} == indexed


def test_modules_follow_the_sidebar_order_with_their_category_labels(book: Book) -> None:
    assert [(m.id, m.title) for m in book.modules] == [
        ("intro", "Introduction to Humanoid Robotics"),
        ("module-1-physical-ai-foundations", "Module 1: Physical AI Foundations"),
        ("module-2-ros-2-fundamentals", "Module 2: ROS 2 Fundamentals"),
        ("module-3-digital-twin-simulation", "Module 3: Digital Twin Simulation"),
        ("module-4-ai-robot-brain", "Module 4: AI Robot Brain"),
        ("appendices", "Reference Materials"),
        ("capstone-the-autonomous-humanoid", "Capstone: The Autonomous Humanoid"),
    ]


def test_no_chunk_is_empty_or_only_headings(book: Book) -> None:
    for chunk in book.chunks:
        prose = [line for inside, line in outside_fences(chunk.text) if line.strip() and not HEADING_LINE.match(line)]
        code = [line for inside, line in outside_fences(chunk.text) if inside]
        assert prose or code, (chunk.file_path, chunk.text[:80])


@pytest.mark.slow
def test_every_chunk_fits_the_minilm_budget_breadcrumb_included(book: Book) -> None:
    assert max(c.token_count for c in book.chunks) <= MAX_TOKENS
    assert all(c.token_count == count(c.text) for c in book.chunks[::25])
    # MiniLM reads 256 word pieces with [CLS] and [SEP]: what is embedded is never cut off.
    assert max(count(c.embedding_text) for c in book.chunks) <= 254


def test_sections_split_at_h1_to_h3_only(book: Book) -> None:
    for chunk in book.chunks:
        levels = [
            len(match.group(1))
            for n, (inside, line) in enumerate(outside_fences(chunk.text))
            if n and not inside and (match := HEADING_LINE.match(line))
        ]
        assert all(level >= 4 for level in levels), (chunk.file_path, chunk.text[:120])
    h4_in_source = sum(
        1
        for path in source_files(SHARED_BOOK / "docs")
        for inside, line in outside_fences(path.read_text())
        if not inside and line.startswith("#### ")
    )
    h4_in_chunks = {
        line for c in book.chunks for inside, line in outside_fences(c.text) if not inside and line.startswith("#### ")
    }
    assert h4_in_source == 0 or h4_in_chunks  # H4 headings stay inside their H3 section's text


def test_code_blocks_are_never_cut_and_oversized_ones_split_only_between_lines(book: Book) -> None:
    by_file: dict[str, list[Chunk]] = {}
    for chunk in book.chunks:
        by_file.setdefault(chunk.file_path, []).append(chunk)
        assert all(block.rstrip().split("\n")[-1].strip().strip("`~") == "" for block in fences(chunk.text)), (
            "a chunk holds an unclosed code fence"
        )
    checked_whole = checked_split = 0
    for file_path, chunks in by_file.items():
        chunk_fences = [block for c in chunks for block in fences(c.text)]
        for block in fences((SHARED_BOOK / "docs" / file_path).read_text()):
            if count(block) <= MAX_TOKENS // 2:
                assert any(block in c.text for c in chunks), (file_path, block[:80])
                checked_whole += 1
            else:
                opening = block.split("\n")[0]
                parts = [part for part in chunk_fences if part.split("\n")[0] == opening]
                inner = {line for part in parts for line in part.split("\n")[1:-1]}
                assert all(line in inner for line in block.split("\n")[1:-1] if line.strip()), (file_path, opening)
                checked_split += 1
    assert checked_whole >= 50 and checked_split >= 100  # the book has both kinds in numbers


def test_tables_stay_whole_or_repeat_their_header_in_every_part(book: Book) -> None:
    checked = 0
    for path in source_files(SHARED_BOOK / "docs"):
        file_path = path.relative_to(SHARED_BOOK / "docs").as_posix()
        lines = [line for inside, line in outside_fences(path.read_text()) if not inside]
        chunks = [c for c in book.chunks if c.file_path == file_path]
        for i in range(len(lines) - 1):
            if lines[i].startswith("|") and re.match(r"^\|[\s:|-]+\|$", lines[i + 1]) and "-" in lines[i + 1]:
                end = i + 2
                while end < len(lines) and lines[end].startswith("|"):
                    end += 1
                table = "\n".join(lines[i:end])
                header = "\n".join(lines[i : i + 2])
                if count(table) <= MAX_TOKENS // 2:
                    assert any(table in c.text for c in chunks), (file_path, lines[i])
                else:
                    rows = lines[i + 2 : end]
                    holding = [c for c in chunks if header in c.text]
                    assert all(any(row in c.text for c in holding) for row in rows), (file_path, lines[i])
                checked += 1
    assert checked >= 5


def test_jsx_markup_is_dropped_but_the_prose_inside_it_is_kept(book: Book) -> None:
    intro = " ".join(c.text for c in book.chunks if c.file_path == "intro.md")
    assert "Modern Humanoid Robotics Platform" in intro  # <p style={{...}}><em>...</em></p>
    for chunk in book.chunks:
        prose = "\n".join(line for inside, line in outside_fences(chunk.text) if not inside)
        assert not re.search(r"</?(div|img|p|Redirect)\b|className=|style=\{\{", prose), (
            chunk.file_path,
            chunk.text[:120],
        )


def test_twenty_sampled_chunks_link_to_the_anchor_docusaurus_gives_their_heading(book: Book) -> None:
    root = SHARED_BOOK / "docs"
    starts = [c for c in book.chunks if HEADING_LINE.match(c.text.split("\n")[0])]
    opening_a_section = [c for c in starts if c.anchor and c.text.split("\n")[0].startswith(("## ", "### "))]
    sample = random.Random(20).sample(opening_a_section, 20)
    for chunk in sample:
        source = (root / chunk.file_path).read_text()
        front_id = re.search(r"^id:\s*(\S+)\s*$", source.split("\n---", 1)[0], re.MULTILINE)
        folder, _, name = chunk.file_path.rpartition("/")
        doc_url = f"{BASE}/docs/{folder + '/' if folder else ''}{front_id.group(1) if front_id else name[:-3]}"
        heading = chunk.text.split("\n")[0]
        # The k-th chunk of this file opening with this heading line belongs to its k-th occurrence.
        same_line = [c for c in starts if c.file_path == chunk.file_path and c.text.split("\n")[0] == heading]
        openers = [c for c in same_line if c.chunk_index == min(x.chunk_index for x in same_line if x.url == c.url)]
        occurrence = [c.url for c in openers].index(chunk.url)
        anchors = [anchor for level, line, anchor in expected_anchors(source) if line == heading]
        assert chunk.url == f"{doc_url}#{anchors[occurrence]}", heading


def test_repeated_headings_on_a_page_get_numbered_anchors(book: Book) -> None:
    repeated = {
        (c.file_path, c.anchor)
        for c in book.chunks
        if re.search(r"-\d+$", c.anchor) and c.anchor.rsplit("-", 1)[0] in {x.anchor for x in book.chunks}
    }
    for file_path, anchor in repeated:
        expected = {a for _, _, a in expected_anchors((SHARED_BOOK / "docs" / file_path).read_text())}
        assert anchor in expected


def test_each_chunk_carries_the_payload_of_the_design(book: Book) -> None:
    required = {"module", "chapter", "title", "heading_path", "anchor", "url", "file_path", "chunk_index"}
    required |= {"content_hash", "text"}
    for chunk in book.chunks[::50]:
        payload = chunk.payload()
        assert required <= payload.keys()
        json.dumps(payload)  # storable as is
        assert payload["heading_path"] == list(chunk.heading_path) and chunk.heading_path[0] == chunk.chapter
        assert chunk.url.startswith(chunk.doc_url)
    assert len({c.chunk_id for c in book.chunks}) == len(book.chunks)  # same file names in several modules


def test_a_chunk_id_depends_on_its_content_not_on_its_position(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    page.write_text("# Page\n\n## Alpha\n\nAlpha text.\n\n## Beta\n\nBeta text.\n")
    before = {c.title: c.chunk_id for c in chunk_book(docs).chunks}
    page.write_text("# Page\n\nA new opening paragraph.\n\n## Alpha\n\nAlpha text.\n\n## Beta\n\nBeta text, edited.\n")
    after = {c.title: c.chunk_id for c in chunk_book(docs).chunks}
    assert after["Alpha"] == before["Alpha"]
    assert after["Beta"] != before["Beta"]


# -- the demo book and made-up docs ----------------------------------------------------------------


def test_admonitions_of_the_demo_book_stay_whole() -> None:
    demo = chunk_book(DEMO_BOOK / "docs")
    checked = 0
    for path in source_files(DEMO_BOOK / "docs"):
        source = path.read_text()
        for match in re.finditer(r"^:::\w+.*?^:::[ \t]*$", source, re.MULTILINE | re.DOTALL):
            assert any(match.group(0) in c.text for c in demo.chunks), match.group(0)[:60]
            checked += 1
    assert checked >= 1


def write_docs(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "docs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "docs"


def test_an_admonition_longer_than_a_chunk_is_kept_whole(tmp_path: Path) -> None:
    body = "\n".join(f"Safety rule {n}: keep the emergency stop within reach of the operator." for n in range(40))
    admonition = f":::danger Before you power the robot\n\n{body}\n\n:::"
    docs = write_docs(tmp_path, {"safety.md": f"# Safety\n\n## Power-on\n\nRead this first.\n\n{admonition}\n"})
    assert any(admonition in c.text for c in chunk_book(docs).chunks)


def test_the_jsx_admonition_is_read_as_the_directive_it_stands_for(tmp_path: Path) -> None:
    """``<Admonition type title>`` and ``:::type title`` are one admonition to Docusaurus, and to the chunker:
    kept whole, with its title, wherever the page is cut."""
    body = "Writing both legs by hand doubles the chance of a typo."
    jsx = f'<Admonition type="info" title="Xacro keeps legs symmetric">\n{body}\n</Admonition>'
    docs = write_docs(tmp_path, {"urdf.mdx": f"# URDF\n\n## Joints\n\nHips and knees.\n\n{jsx}\n"})
    blocks = parse_blocks(f"{jsx}\n", Slugger())
    assert [(b.kind, b.variant, b.plain) for b in blocks] == [("admonition", "info", "Xacro keeps legs symmetric")]
    assert [(b.kind, b.text) for b in blocks[0].children] == [("text", body)]
    assert any(f":::info Xacro keeps legs symmetric\n{body}\n:::" in c.text for c in chunk_book(docs).chunks)


def test_a_card_list_index_is_left_out_for_the_pages_it_lists(tmp_path: Path) -> None:
    """A category's index page that renders its cards (``<DocCardList />``) and a sentence restating their topic is
    navigation: a reader cited to it finds only links, so its pages answer instead. A page that teaches around its
    cards is read as any page."""
    cards = "import DocCardList from '@theme/DocCardList';\n\n<DocCardList />\n"
    intro = " ".join(["Falco watches the kernel's system calls and raises an alert on suspicious behaviour."] * 8)
    docs = write_docs(
        tmp_path,
        {
            "falco/index.md": f"---\ntitle: Falco\n---\n\nRuntime security monitoring with Falco.\n\n{cards}",
            "falco/falco.md": "# Falco\n\n## Overview\n\nDeploy Falco with Helm and read its alerts in the logs.\n",
            "rules/index.md": f"# Rules\n\n{intro}\n\n{cards}",
        },
    )
    book = chunk_book(docs)
    assert {d.file_path for d in book.documents} == {"falco/falco.md", "rules/index.md"}
    assert [s.reason for s in book.skipped] == [CARDS_REASON]
    assert (
        chunking.read_document(
            docs / "falco/index.md",
            docs,
            base_url=BASE,
            count_tokens=count,
            max_tokens=MAX_TOKENS,
            overlap_tokens=OVERLAP,
        )
        == []
    )


def test_a_draft_is_left_out_as_the_published_site_leaves_it_out(tmp_path: Path) -> None:
    """Docusaurus builds ``draft: true`` pages in development only: cited, one would be a broken link. An unlisted
    page is published (only hidden from the sidebar), and is read."""
    page = "---\n{}\n---\n\n# Grippers\n\nA parallel gripper closes two fingers on the object.\n"
    docs = write_docs(
        tmp_path,
        {"draft.md": page.format("draft: true"), "unlisted.md": page.format("unlisted: true"), "a.md": page.format("")},
    )
    book = chunk_book(docs)
    assert {d.file_path for d in book.documents} == {"a.md", "unlisted.md"}
    assert [(s.file_path, "draft" in s.reason) for s in book.skipped] == [("draft.md", True)]


def test_mdx_imports_and_exports_are_dropped_and_jsx_wrapped_prose_is_kept(tmp_path: Path) -> None:
    mdx = """---
title: Launch files
---

import Tabs from '@theme/Tabs';
import TabItem from '@theme/TabItem';
export const robot = 'atlas';

# Launch files

<Tabs groupId="lang">
  <TabItem value="py" label="Python">
    A launch file written in Python starts several nodes at once.
  </TabItem>
</Tabs>

<details>
<summary>Why not shell scripts?</summary>

Shell scripts cannot express **remappings** declaratively.

</details>

```python
import launch  # code keeps its imports
```
"""
    docs = write_docs(tmp_path, {"launch.mdx": mdx})
    (chunk,) = chunk_book(docs).chunks
    assert "A launch file written in Python starts several nodes at once." in chunk.text
    assert "Why not shell scripts?" in chunk.text and "**remappings**" in chunk.text
    assert "import launch  # code keeps its imports" in chunk.text
    assert "@theme/Tabs" not in chunk.text and "export const" not in chunk.text
    assert not re.search(r"</?(Tabs|TabItem|details|summary)", chunk.text)


def test_front_matter_id_slug_and_title_shape_the_citation(tmp_path: Path) -> None:
    docs = write_docs(
        tmp_path,
        {
            "01-basics/_category_.json": json.dumps({"label": "Basics", "position": 1}),
            "01-basics/02-first.md": "---\nid: renamed\ntitle: The First Page\n---\n# Ignored H1\n## Step One\nDo.\n",
            "01-basics/03-second.md": "---\nslug: /elsewhere/second-page\n---\n\n# Second\n\n## Step `Two`\n\nThen.\n",
            "01-basics/04-third.md": "---\nsidebar_label: Third (short)\n---\n\nNo heading here, only prose.\n",
        },
    )
    result = chunk_book(docs)
    by_file = {c.file_path: c for c in result.chunks}
    first, second, third = (
        by_file[f"01-basics/0{n}-{name}.md"] for n, name in ((2, "first"), (3, "second"), (4, "third"))
    )
    assert (first.module, first.module_title, first.chapter, first.chapter_id) == (
        "01-basics",
        "Basics",
        "The First Page",
        "basics/renamed",
    )
    assert first.url == f"{BASE}/docs/basics/renamed#step-one"
    assert first.heading_path == ("The First Page", "Step One")
    assert second.url == f"{BASE}/docs/elsewhere/second-page#step-two"
    assert second.chapter == "Second"
    assert third.chapter == "Third (short)" and third.url == f"{BASE}/docs/basics/third"
    assert [d.chapter for d in result.documents] == ["The First Page", "Second", "Third (short)"]


def test_explicit_heading_ids_and_duplicates_follow_docusaurus(tmp_path: Path) -> None:
    page = (
        "# Setup\n\n## Setup\n\nAgain.\n\n## Install {#get-it}\n\nPip.\n\n"
        "### Setup\n\nThird.\n\n## Gazebo & Unity\n\nBoth.\n"
    )
    docs = write_docs(tmp_path, {"page.md": page})
    anchors = [c.anchor for c in chunk_book(docs).chunks]
    assert anchors == ["setup-1", "get-it", "setup-2", "gazebo--unity"]
    assert [a for level, _, a in expected_anchors(page) if level > 1] == anchors


def test_a_long_section_is_split_at_paragraphs_with_overlap(tmp_path: Path) -> None:
    paragraphs = [
        f"Paragraph {n} explains how joint {n} is commanded through a position controller and why it matters."
        for n in range(30)
    ]
    docs = write_docs(tmp_path, {"long.md": "# Long\n\n## Control\n\n" + "\n\n".join(paragraphs) + "\n"})
    chunks = chunk_book(docs, max_tokens=120, overlap=30).chunks
    assert len(chunks) > 3
    assert all(c.token_count <= 120 for c in chunks)
    for previous, chunk in zip(chunks, chunks[1:], strict=False):
        first_paragraph = chunk.text.split("\n\n")[0]
        assert first_paragraph in previous.text  # the overlap: the previous chunk's last paragraph again
    assert all(any(p in c.text for c in chunks) for p in paragraphs)


LONG_LISTING = "\n".join(
    [
        "```python",
        "# Balance controller: reads the IMU and commands the ankle joints",
        "import rclpy",
        "from rclpy.node import Node",
        *(f"    angle_{n} = read_joint({n})" for n in range(12)),
        "    publish_ankle_torque_zz(angle_11)",
        "```",
    ]
)


def listing_book(tmp_path: Path, listing: str = LONG_LISTING) -> list[Chunk]:
    page = f"# Balance\n\n## Ankle control\n\nThe ankle controller keeps the robot upright.\n\n{listing}\n"
    return chunk_book(write_docs(tmp_path, {"balance.md": page})).chunks


def test_a_long_code_block_is_embedded_by_its_head_and_indexed_whole(tmp_path: Path) -> None:
    (chunk,) = listing_book(tmp_path)
    # Stored and cited: the section exactly as written, the listing whole.
    assert chunk.text == f"## Ankle control\n\nThe ankle controller keeps the robot upright.\n\n{LONG_LISTING}"
    assert chunk.payload()["text"] == chunk.text and "embedding_text" not in chunk.payload()
    assert chunk.embedding_tokens == count(chunk.embedding_text) < count(chunk.keyword_text)
    # Dense: the breadcrumb, the prose, the fence's language line and first lines (comment, imports), not the tail.
    dense = chunk.embedding_text
    prose = "Balance › Ankle control\n\n## Ankle control\n\nThe ankle controller keeps the robot upright.\n\n"
    assert dense.startswith(prose + "```python\n# Balance controller: reads the IMU and commands the ankle joints\n")
    assert "import rclpy\nfrom rclpy.node import Node\n    angle_0 = read_joint(0)" in dense
    assert "angle_11" not in dense and "publish_ankle_torque_zz" not in dense
    assert count(dense.split("```python\n", 1)[1]) <= chunking.CODE_HEAD_TOKENS
    # Keyword side: the breadcrumb and the whole text, every identifier of the listing.
    assert chunk.keyword_text == "Balance › Ankle control\n\n" + chunk.text
    assert {"publish_ankle_torque_zz", "angle_11"} <= set(sparse.terms(chunk.keyword_text))


def test_the_code_head_changes_what_is_embedded_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (cut,) = listing_book(tmp_path / "cut")
    monkeypatch.setattr(chunking, "CODE_HEAD_TOKENS", 10**6)
    (whole,) = listing_book(tmp_path / "whole")
    ids = {"chunk_id": "", "content_hash": ""}
    assert whole.payload() | ids == cut.payload() | ids
    assert whole.embedding_text == whole.keyword_text != cut.embedding_text
    # The recipe is part of the content hash: a changed code head re-embeds on the next incremental ingest.
    assert whole.content_hash != cut.content_hash and whole.chunk_id != cut.chunk_id


def test_a_short_code_block_and_prose_are_embedded_as_written(tmp_path: Path) -> None:
    listing = "```bash\nros2 topic echo /imu\n```"
    (chunk,) = listing_book(tmp_path, listing)
    assert chunk.embedding_text == chunk.keyword_text
    assert chunk.embedding_text.endswith("```bash\nros2 topic echo /imu\n```")


def test_an_edit_past_the_code_head_still_changes_the_chunk(tmp_path: Path) -> None:
    """The sparse vector reads the whole listing, so an edit it alone sees must re-index the chunk too."""
    (before,) = listing_book(tmp_path / "before")
    edited = LONG_LISTING.replace("publish_ankle_torque_zz", "publish_hip_torque_zz")
    (after,) = listing_book(tmp_path / "after", edited)
    assert before.text != after.text and before.embedding_text == after.embedding_text
    assert before.content_hash != after.content_hash and before.chunk_id != after.chunk_id


@pytest.mark.slow
def test_the_shared_books_code_is_embedded_by_its_head(book: Book) -> None:
    for chunk in book.chunks:
        if "```" not in chunk.text and "~~~" not in chunk.text:
            assert chunk.embedding_text == chunk.keyword_text
    dense = sum(count(c.embedding_text) for c in book.chunks)
    keyword = sum(count(c.keyword_text) for c in book.chunks)
    assert dense < 0.85 * keyword  # code was over half of what the model read; its heads are a fraction of it
