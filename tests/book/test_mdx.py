"""Fenced code in Markdown: the one reading of fences (``mdx.code_lines``) that ingestion, the offline answer's
checks and the sources' excerpts share."""

from __future__ import annotations

from textbook_chat.book import mdx


def test_a_fence_and_its_body_are_code_and_the_prose_around_it_is_not() -> None:
    text = "Run this:\n\n```bash\nls -l\n```\n\nThen look."
    assert mdx.code_lines(text) == [
        ("Run this:", False),
        ("", False),
        ("```bash", True),
        ("ls -l", True),
        ("```", True),
        ("", False),
        ("Then look.", False),
    ]


def test_a_fence_closes_only_with_its_own_marker_at_least_as_long() -> None:
    text = "````md\n```python\nx = 1\n```\n````\nafter\n~~~\ny\n```\n~~~\nend"
    code = [line for line, is_code in mdx.code_lines(text) if is_code]
    assert code == ["````md", "```python", "x = 1", "```", "````", "~~~", "y", "```", "~~~"]
    assert mdx.without_code(text) == "after\nend"


def test_an_unclosed_fence_runs_to_the_end() -> None:
    assert mdx.without_code("Prose.\n```\ncode that never closes\nmore") == "Prose."


def test_an_indented_fence_is_read_as_a_fence_and_inline_backticks_are_prose() -> None:
    text = "- step:\n  ```bash\n  make\n  ```\nUse `ls` or ``` inline ``` here."
    assert mdx.without_code(text) == "- step:\nUse `ls` or ``` inline ``` here."
