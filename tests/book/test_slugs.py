"""Docusaurus 3 heading ids (github-slugger) and doc URLs, as Docusaurus 3 gives them."""

from __future__ import annotations

import pytest

from textbook_chat.book.slugs import (
    Slugger,
    doc_id,
    doc_url,
    github_slug,
    plain_text,
    read_front_matter,
    split_heading_id,
    strip_number_prefix,
)

BASE = "http://localhost:3000"


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Calling `rclpy.spin()`", "calling-rclpyspin"),
        ("Gazebo & Unity", "gazebo--unity"),
        ("2.2.2 PID Control", "222-pid-control"),
        ("1.4.1 Morphological Computation", "141-morphological-computation"),
        ("Appendix A — Hardware Requirements", "appendix-a--hardware-requirements"),
        ("Required Software/Tools", "required-softwaretools"),
        ("Section A: Multiple Choice (30 points, 3 points each)", "section-a-multiple-choice-30-points-3-points-each"),
        ("What is *Physical* **AI**?", "what-is-physical-ai"),
        ("See [the ROS docs](https://docs.ros.org) now", "see-the-ros-docs-now"),
        ("snake_case_name and __dunder__", "snake_case_name-and-dunder"),
        ("Intro <span>new</span>", "intro-new"),
        ("C++ vs. C#", "c-vs-c"),
        ("Привет non-latin 你好", "привет-non-latin-你好"),
        ("Ünïcödé Überblick", "ünïcödé-überblick"),
        ("😄 unicode emoji", "-unicode-emoji"),
        ("🤖 Robots 🦾 arms", "-robots--arms"),
        # github-slugger keeps Unicode marks, and an emoji's variation selector is one.
        ("⚠️ Warning", "\ufe0f-warning"),
        ("x² and ½", "x-and-"),
        ("Tab\there", "tabhere"),
        ("&amp; entities &lt;3", "-entities-3"),
    ],
)
def test_github_slug_matches_github_slugger(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


@pytest.mark.parametrize(
    ("markdown", "text"),
    [
        ("Calling `rclpy.spin()`", "Calling rclpy.spin()"),
        ("``code with ` tick``", "code with ` tick"),
        ("**Bold** _it_ ~~old~~ [link](u) ![alt](i.png)", "Bold it old link alt"),
        (r"Escaped \*stars\*", "Escaped *stars*"),
        ("Keep `*args*` literal", "Keep *args* literal"),
        ("Title {/* note */}", "Title"),
    ],
)
def test_plain_text_strips_marks_like_mdast_to_string(markdown: str, text: str) -> None:
    assert plain_text(markdown) == text


def test_slugger_counts_repeats_like_github_slugger() -> None:
    slugger = Slugger()
    assert [slugger.slug(t) for t in ["echo", "echo", "echo 1", "echo-1", "echo"]] == [
        "echo",
        "echo-1",
        "echo-1-1",
        "echo-1-2",
        "echo-2",
    ]


def test_h1_takes_its_slug_so_a_same_named_h2_gets_suffix_1() -> None:
    slugger = Slugger()
    headings = ["Overview", "Overview", "Setup", "Overview"]  # the h1, then three h2s
    assert [slugger.heading(h)[1] for h in headings] == ["overview", "overview-1", "setup", "overview-2"]


@pytest.mark.parametrize(
    ("heading", "text", "anchor"),
    [
        ("Install ROS 2 {#install}", "Install ROS 2", "install"),
        (r"Install ROS 2 \{#install}", "Install ROS 2", "install"),
        ("Install ROS 2 {/* #install */}", "Install ROS 2", "install"),
        ("Using `spin()` {#spin-loop}", "Using spin()", "spin-loop"),
        ("Braces {not an id}", "Braces {not an id}", "braces-not-an-id"),
    ],
)
def test_explicit_heading_id_wins_and_is_stripped(heading: str, text: str, anchor: str) -> None:
    assert Slugger().heading(heading) == (text, anchor)


def test_explicit_id_is_not_counted_for_duplicates() -> None:
    # Docusaurus uses an explicit id verbatim without registering it with the slugger.
    slugger = Slugger()
    assert slugger.heading("Setup {#setup}") == ("Setup", "setup")
    assert slugger.heading("Setup") == ("Setup", "setup")
    assert slugger.heading("Setup") == ("Setup", "setup-1")


def test_split_heading_id_without_id() -> None:
    assert split_heading_id("Plain heading") == ("Plain heading", None)


@pytest.mark.parametrize(
    ("name", "stripped"),
    [
        ("01-intro", "intro"),
        ("003 - My Doc", "My Doc"),
        ("2_setup", "setup"),
        ("intro", "intro"),
        ("2021-11-release-notes", "2021-11-release-notes"),
        ("1.0-changelog", "1.0-changelog"),
        ("01-", "01-"),
    ],
)
def test_number_prefixes_follow_the_docusaurus_default_parser(name: str, stripped: str) -> None:
    assert strip_number_prefix(name) == stripped


@pytest.mark.parametrize(
    ("file_path", "front_matter", "url"),
    [
        ("intro.md", {}, "/docs/intro"),
        ("module-1-physical-ai-foundations/chapter-1.md", {}, "/docs/module-1-physical-ai-foundations/chapter-1"),
        ("guide/setup.mdx", {"id": "install"}, "/docs/guide/install"),
        ("guide/setup.md", {"slug": "/start-here"}, "/docs/start-here"),
        ("guide/setup.md", {"slug": "quick/start"}, "/docs/guide/quick/start"),
        ("guide/deep/setup.md", {"slug": "../start"}, "/docs/guide/start"),
        ("guide/setup.md", {"slug": "../../../../x"}, "/docs/x"),
        ("guide/setup.md", {"id": "ignored", "slug": "/wins"}, "/docs/wins"),
        ("01-basics/02-first-steps.md", {}, "/docs/basics/first-steps"),
        ("01-basics/2021-11-notes.md", {}, "/docs/basics/2021-11-notes"),
        ("guide/index.md", {}, "/docs/guide"),
        ("guide/README.md", {}, "/docs/guide"),
        ("guide/InDeX.mdx", {"id": "landing"}, "/docs/guide"),
        ("guide/guide.md", {}, "/docs/guide"),
        ("01-guide/01-guide.md", {}, "/docs/guide"),
        ("guide/index.md", {"slug": "/custom"}, "/docs/custom"),
        ("index.md", {"slug": "/"}, "/docs"),
        ("index.md", {}, "/docs"),
    ],
)
def test_doc_url_follows_docusaurus_get_slug(file_path: str, front_matter: dict[str, object], url: str) -> None:
    assert doc_url(BASE, file_path, front_matter) == BASE + url
    assert doc_url(BASE + "/", file_path, front_matter) == BASE + url


@pytest.mark.parametrize(
    ("file_path", "front_matter", "identifier"),
    [
        ("intro.md", {}, "intro"),
        ("module-1/chapter-1.md", {}, "module-1/chapter-1"),
        ("01-basics/02-first-steps.md", {}, "basics/first-steps"),
        ("guide/setup.md", {"id": "install"}, "guide/install"),
        ("guide/index.md", {}, "guide/index"),
        ("index.md", {"id": "docs-index"}, "docs-index"),
    ],
)
def test_doc_id_is_folder_path_plus_id_or_file_name(
    file_path: str, front_matter: dict[str, object], identifier: str
) -> None:
    assert doc_id(file_path, front_matter) == identifier


def test_front_matter_reader_handles_the_yaml_docusaurus_docs_use() -> None:
    text = (
        "---\n"
        "id: capstone-deep-dive\n"
        "title: 'Capstone — The Humanoid | Chapter 3: Theory'\n"
        'sidebar_label: "Chapter \\"3\\""\n'
        "sidebar_position: 3\n"
        "weight: 1.5\n"
        "hide_table_of_contents: true\n"
        "slug: /custom # trailing comment\n"
        "description: >\n"
        "  Folded over\n"
        "  two lines\n"
        "tags:\n"
        "  - ros\n"
        "---\n"
        "# Body\n"
    )
    front_matter, body = read_front_matter(text)
    assert front_matter == {
        "id": "capstone-deep-dive",
        "title": "Capstone — The Humanoid | Chapter 3: Theory",
        "sidebar_label": 'Chapter "3"',
        "sidebar_position": 3,
        "weight": 1.5,
        "hide_table_of_contents": True,
        "slug": "/custom",
        "description": "Folded over two lines",
        "tags": None,
    }
    assert body == "# Body\n"


@pytest.mark.parametrize("text", ["# No front matter\n", "---\nnot closed\n", "Text\n---\ntitle: x\n---\n"])
def test_text_without_a_leading_front_matter_block_is_all_body(text: str) -> None:
    assert read_front_matter(text) == ({}, text)
