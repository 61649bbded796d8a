"""How common a word is in English, from wordfreq's pinned small English list read without importing the library:
tool and command names are rare, everyday words are not, however technical they sound."""

from __future__ import annotations

import sys

import pytest

from textbook_chat.core import rarity

pytestmark = pytest.mark.skipif(not rarity.available(), reason="wordfreq==3.1.1 is not installed (requirements.lock)")


@pytest.mark.parametrize(
    ("word", "rare"),
    [
        ("rclpy", True),
        ("strace", True),
        ("gdb", True),
        ("conda", True),
        ("quadcopter", True),
        ("yolk", False),  # 3.0: an everyday word, in no robotics book
        ("gait", False),
        ("teacher", False),
        ("atla", False),  # "atlas" as the keyword side folds its plural
        ("shouldn", False),  # "shouldn't" as the keyword side splits it
    ],
)
def test_tool_names_are_rare_and_everyday_words_are_not(word: str, rare: bool) -> None:
    assert rarity.rare(word) is rare


def test_a_word_is_as_common_as_its_commonest_form() -> None:
    assert rarity.zipf("teacher") == pytest.approx(4.88, abs=0.01)
    assert rarity.rare("overwriting") is True  # no form of it is common
    assert rarity.rare("queried", ["query"]) is False


def test_the_list_is_read_without_importing_wordfreq_and_its_text_stack() -> None:
    rarity.load()
    assert "wordfreq" not in sys.modules and "ftfy" not in sys.modules and "langcodes" not in sys.modules


def test_a_file_that_is_not_the_pinned_one_is_refused_and_words_are_judged_without_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(rarity, "PINNED_SHA256", "0" * 64)
    rarity._zipf.cache_clear()
    try:
        assert rarity.rare("strace") is None and not rarity.available()
        assert "not the pinned file" in caplog.text
    finally:
        monkeypatch.undo()
        rarity._zipf.cache_clear()
    assert rarity.rare("strace") is True
