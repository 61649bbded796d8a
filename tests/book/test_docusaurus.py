"""The book's name, read from its Docusaurus site: what the model's instructions and the demo page call it."""

from __future__ import annotations

from pathlib import Path

import pytest

from textbook_chat.book.docusaurus import TITLE_MAX_CHARS, book_title, site_title


def site(tmp_path: Path, config: str, name: str = "docusaurus.config.js") -> Path:
    (tmp_path / name).write_text(config)
    return tmp_path


def test_the_sites_own_title_wins_over_the_deeper_titles_of_its_navbar_and_footer(tmp_path: Path) -> None:
    config = (
        "const config = {\n"
        "  themeConfig: {\n    navbar: { title: 'Home' },\n"
        "    footer: { links: [{ title: 'Community', items: [] }] },\n  },\n"
        "  title: 'Open Source Education',\n"
        "};\nmodule.exports = config;\n"
    )
    assert site_title(site(tmp_path, config)) == "Open Source Education"


def test_a_title_declared_as_a_constant_and_used_as_a_shorthand_property_is_found(tmp_path: Path) -> None:
    config = (
        "const title = 'RxJS Fundamentals';\n"
        "module.exports = {\n  title,\n  themeConfig: {\n    footer: {\n      links: [\n"
        "        {\n          title: 'Open Learning',\n          items: [],\n        },\n      ],\n    },\n  },\n};\n"
    )
    assert site_title(site(tmp_path, config)) == "RxJS Fundamentals"


@pytest.mark.parametrize(
    ("config", "name", "expected"),
    [
        ('export default {\n  title: "Walking Robots",\n};\n', "docusaurus.config.ts", "Walking Robots"),
        ("export default {\n  title: `Walking Robots`,\n};\n", "docusaurus.config.mjs", "Walking Robots"),
        # A template with an interpolation is not the title as written: none is read.
        ("export default {\n  title: `${name} Docs`,\n};\n", "docusaurus.config.ts", None),
        ("module.exports = { tagline: 'No title here' };\n", "docusaurus.config.js", None),
    ],
)
def test_each_config_file_kind_and_quote_is_read(tmp_path: Path, config: str, name: str, expected: str | None) -> None:
    assert site_title(site(tmp_path, config, name)) == expected


def test_a_title_is_one_printable_line_of_bounded_length(tmp_path: Path) -> None:
    config = "module.exports = {\n  title: 'Robots\x1b[2J   and\tgears " + "x" * 300 + "',\n};\n"
    title = site_title(site(tmp_path, config))
    assert title is not None and title.startswith("Robots[2J and gears x") and len(title) == TITLE_MAX_CHARS
    assert title.isprintable()


def test_without_a_site_the_book_is_named_after_its_first_chapter(tmp_path: Path) -> None:
    assert site_title(tmp_path) is None
    assert book_title(tmp_path, "Welcome to Physical AI & Humanoid Robotics") == "Physical AI & Humanoid Robotics"
    assert book_title(tmp_path, "Introduction to Humanoid Robotics") == "Humanoid Robotics"
    assert book_title(tmp_path, None) == "Textbook"
    assert book_title(site(tmp_path, "module.exports = {\n  title: 'Its Own',\n};\n"), "Welcome to X") == "Its Own"
