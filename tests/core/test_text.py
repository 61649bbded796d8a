"""core/text.py: what a model sends becomes text UTF-8 and Postgres can hold, with U+FFFD where it cannot."""

from __future__ import annotations

import pytest

from textbook_chat.core.text import REPLACEMENT, ModelText, scrub

R = REPLACEMENT


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain ASCII [1]", "plain ASCII [1]"),
        ("Zürich — 😀", "Zürich — 😀"),
        ("lone \ud800 [1]", f"lone {R} [1]"),
        ("low first \udfff", f"low first {R}"),
        ("\ud83d\ude00", "😀"),  # a pair that came from two places is the character it spells
        ("\ude00\ud83d", R + R),  # the wrong way round is two lone halves
        ("nul\x00byte", f"nul{R}byte"),
        ("bell\x07 escape\x1b[2J tab\t", "bell\x07 escape\x1b[2J tab\t"),  # encodable: left to the renderers
    ],
)
def test_scrub_replaces_only_what_utf8_or_postgres_cannot_hold(raw: str, clean: str) -> None:
    assert scrub(raw) == clean
    clean.encode("utf-8")


def test_scrub_returns_the_same_object_when_nothing_changes() -> None:
    text = "Zürich [1]"
    assert scrub(text) is text


def test_a_pair_split_across_two_deltas_is_joined() -> None:
    model = ModelText()
    assert [model.feed("smile \ud83d"), model.feed("\ude00 [1]"), model.end()] == ["smile ", "😀 [1]", ""]


def test_a_high_surrogate_ending_the_stream_becomes_a_replacement_character() -> None:
    model = ModelText()
    assert [model.feed("end \ud83d"), model.end()] == ["end ", R]


def test_a_high_surrogate_followed_by_no_low_one_is_replaced_in_the_next_delta() -> None:
    model = ModelText()
    assert [model.feed("a\ud83d"), model.feed("b"), model.end()] == ["a", f"{R}b", ""]
