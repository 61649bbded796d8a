"""A passage's kind is read from its form (headings, asking lines, instructions), never from its topic."""

from __future__ import annotations

import pytest

from textbook_chat.search import passages


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("### Question 4\n\nWhat are the parts of an action?\na) Goal\nb) Result\nc) Feedback", 1.0),
        ("Actions have a goal, a result and feedback.\nThey can be cancelled.", 0.0),
        ("Why does this matter?\nBecause latency adds up.", 0.5),
        ("**Which one is right?**\n- (b) The second", 1.0),
        ("", 0.0),
    ],
)
def test_question_share_measures_how_much_of_a_passage_asks_rather_than_tells(text: str, share: float) -> None:
    assert passages.question_share(text) == pytest.approx(share)


@pytest.mark.parametrize(
    ("headings", "text", "kind"),
    [
        (["Module 2: Quiz", "Section A: Multiple Choice Questions"], "Pick one.\nThen move on.", "assessment"),
        (["Chapter 3", "Review questions"], "Think about the examples above.", "assessment"),
        (["Chapter 3", "Summary"], "What is a node?\na) A process\nb) A file\nc) A topic", "assessment"),
        (["Week 4 assignment", "Deliverables"], "A report of four pages and the source code.", "exercise"),
        (["Practical Lab: Sensors", "Lab Overview"], "You will wire a sensor and read it.", "exercise"),
        (["Chapter 3", "Challenges of legged locomotion"], "Uneven ground makes balance hard.", "teaching"),
        (["Lab infrastructure", "Network"], "The lab's switches carry the robot's traffic.", "teaching"),
    ],
)
def test_a_kind_comes_from_headings_and_the_form_of_the_lines(headings: list[str], text: str, kind: str) -> None:
    assert passages.classify(text, headings) == kind


def test_ranking_pushes_quizzes_most_exercises_less_and_teaching_by_its_questions() -> None:
    quiz = {"title": "Quiz", "heading_path": ["Quiz"], "text": "Explain it."}
    lab = {"title": "Assignment", "heading_path": ["Assignment Brief"], "text": "Build it."}
    prose = {"title": "Gears", "heading_path": ["Ratios"], "text": "Why gears?\nThey trade speed for torque."}
    question = "How do gears trade speed for torque?"
    assert passages.rank_penalty(quiz, question) == passages.ASSESSMENT_PENALTY
    assert passages.rank_penalty(lab, question) == passages.EXERCISE_PENALTY
    assert passages.rank_penalty(prose, question) == pytest.approx(passages.QUESTION_PENALTY * 0.5)
    assert passages.rank_penalty(quiz, "What does the quiz ask about gears?") == 0.0


@pytest.mark.parametrize(
    ("sentence", "kind", "refused"),
    [
        ("Question 12: What does the point tell a walking robot?", "assessment", True),
        ("a) The point where all external forces are zero", "assessment", True),
        ("**Answer**: b, because the moment vanishes there.", "assessment", True),
        ("Design a gripper that adapts to the shape of the object.", "exercise", True),
        ("Design a gripper that adapts to the shape of the object.", "teaching", False),
        ("The point lies where the net moment of the ground reaction force is zero.", "assessment", False),
        ("Why does this matter for a walking robot?", "teaching", True),
    ],
)
def test_an_answer_never_presents_a_question_an_option_or_a_prompt_as_teaching(
    sentence: str, kind: passages.Kind, refused: bool
) -> None:
    assert passages.is_not_teaching(sentence, kind) is refused
