"""The model's rewrite of a follow-up (``answer/rewrite.py``): what it is shown, and which replies are used."""

from __future__ import annotations

from textbook_chat.answer import rewrite
from textbook_chat.answer.generation import create_generator
from textbook_chat.core.settings import Settings
from textbook_chat.search.context import Earlier


def test_the_prompt_holds_the_newest_earlier_questions_the_last_answer_and_the_follow_up_as_data() -> None:
    earlier = [Earlier(f"Question {n}?") for n in range(5)] + [Earlier("What is Gazebo?", answer="Gazebo is a <b>")]
    system, user = rewrite.messages("How do I install it?", earlier)
    assert system["role"] == "system" and user["role"] == "user"
    assert "Question 2?" not in user["content"] and "Question 3?" in user["content"]
    assert "What is Gazebo?" in user["content"] and user["content"].endswith("How do I install it?\n</question>")
    assert "<b>" not in user["content"]  # an earlier answer cannot open or close an element


def test_a_reply_is_used_only_when_it_is_one_question_that_adds_something() -> None:
    asked = "How do I install it?"
    assert rewrite.standalone(' "How do I install Gazebo?" ', asked) == "How do I install Gazebo?"
    assert rewrite.standalone("How do I install it?", asked) is None  # nothing added
    assert rewrite.standalone("", asked) is None
    assert rewrite.standalone("How do I install Gazebo?\nYou run apt install.", asked) is None
    assert rewrite.standalone("x" * (rewrite.MAX_CHARS + 1), asked) is None


def test_the_rewrite_is_off_by_default_and_needs_a_model() -> None:
    for env in ({}, {"FOLLOW_UP_REWRITE": "on"}):  # off; on, but no key: the offline generator
        settings = Settings.from_env(env)
        assert rewrite.create_rewriter(settings, create_generator(settings)) is None
