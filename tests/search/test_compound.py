"""A question that joins two: its parts, read apart where the whole reads as nothing the book answers."""

from __future__ import annotations

import pytest

from textbook_chat.search.compound import MAX_PARTS, parts


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (
            "Should I let people DM me on Discord about the project, and how do I tell contributors I'm away?",
            ["Should I let people DM me on Discord about the project", "how do I tell contributors I'm away?"],
        ),
        (
            "Something throws inside my map callback and the pipeline dies. How do I recover with a fallback?",
            ["Something throws inside my map callback and the pipeline dies.", "How do I recover with a fallback?"],
        ),
        (
            "Which ROS 2 topics exist; what messages does each topic carry?",
            ["Which ROS 2 topics exist", "what messages does each topic carry?"],
        ),
    ],
)
def test_a_question_splits_between_sentences_before_and_plus_a_question_word_and_at_semicolons(
    question: str, expected: list[str]
) -> None:
    assert parts(question) == expected


@pytest.mark.parametrize(
    "question",
    [
        "How do sensors and actuators work together in a humanoid robot?",  # "and" joins two nouns, not questions
        "What is the Zero Moment Point, and why?",  # "why?" alone says nothing
        "What is the Zero Moment Point? What is it?",  # nor does a part of one content term: "What is it?"
        "What is a topic?",
    ],
)
def test_one_question_has_no_parts(question: str) -> None:
    assert parts(question) == []


def test_a_long_list_is_read_as_its_first_parts_only() -> None:
    question = "What is a ROS node? What is a ROS topic? What is a ROS service? What is a ROS action?"
    assert parts(question) == ["What is a ROS node?", "What is a ROS topic?", "What is a ROS service?"][:MAX_PARTS]
