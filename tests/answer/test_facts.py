"""Issue 30's strict rule for the offline answer's facts, and the faults of form ``eval`` counts beside them."""

from __future__ import annotations

import pytest

from textbook_chat.answer.extract import is_navigation
from textbook_chat.answer.facts import (
    AnswerOutcome,
    content_words,
    dangling_lead_ins,
    figures,
    holds,
    navigation_lines,
    repeated_sentences,
    score,
)


def test_content_words_are_lower_cased_without_stop_words_or_short_words_but_keep_numbers() -> None:
    assert content_words("The ZMP is at 5 cm, in 2 of the 3 Cases; it's OK") == ["zmp", "5", "2", "3", "cases"]


FACT = "it accumulates past errors to eliminate steady-state error"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Integral action accumulates the past errors to eliminate the steady-state error.", True),  # 7 of 7
        ("The integral term accumulates past errors, and steady state is reached.", True),  # 5 of 7
        ("The integral term accumulates past errors.", False),  # 3 of 7
        ("Accumulating past errors eliminates steady-state errors.", False),  # no stemming: 4 of 7, under 60 %
    ],
)
def test_a_fact_counts_when_sixty_percent_of_its_content_words_are_in_the_answer(answer: str, expected: bool) -> None:
    assert content_words(FACT) == ["accumulates", "past", "errors", "eliminate", "steady", "state", "error"]
    assert holds(set(content_words(answer)), FACT) is expected


def test_a_lead_in_without_its_list_dangles_and_one_with_its_list_does_not() -> None:
    assert dangling_lead_ins("X consists of several key components: [1].") == 1
    assert dangling_lead_ins("X consists of several key components:. The next point [2].") == 1
    assert dangling_lead_ins("X consists of several key components [1]:") == 1
    assert dangling_lead_ins("X consists of several key components [1]:\n\n- a part\n- another part") == 0
    assert dangling_lead_ins("The equations are [1]:\n\n**Prediction:**\n\n- x = F x\n") == 0
    assert dangling_lead_ins("Run this [1]:\n\n```bash\nls -l\n```") == 0
    assert dangling_lead_ins("Note: the robot stops at once [1].") == 0
    assert dangling_lead_ins("```python\ndef f():\n    return 1\n```") == 0  # a colon in code is code


def test_repeated_sentences_are_counted_word_for_word_markers_and_case_aside() -> None:
    assert repeated_sentences("The course lasts thirteen weeks [1]. The course lasts thirteen weeks [2].") == 1
    assert repeated_sentences("The course lasts thirteen weeks [1].\n\n- the course lasts thirteen weeks") == 1
    assert repeated_sentences("The course lasts thirteen weeks. The course lasts fourteen weeks.") == 0


def test_navigation_lines_are_labels_or_bare_links() -> None:
    assert navigation_lines("**Previous:** [Intro](./intro) [1]") == 1
    assert navigation_lines("- [Processes](./p.md)\n- [Signals](./s.md)") == 2
    assert navigation_lines("The next step reads the [manual page](./man.md) for the command [1].") == 0


@pytest.mark.parametrize(
    "line",
    [
        "Next: Loops",
        "Next: [Loops](./loops.md) [2]",
        "← Back to the outline",
        "[Chapter 1](./ch1) · [Chapter 2](./ch2)",
        "- **Up next**: [Signals](./signals.md)",
        "Next, run the following command: `ls -l` [1]",
        "See [the manual](./man.md) for every option the command takes.",
        "Previous chapters explained the shell's prompt.",
    ],
)
def test_eval_counts_navigation_by_the_rule_the_offline_answer_leaves_it_out_by(line: str) -> None:
    assert navigation_lines(line) == int(is_navigation(line.replace(" [1]", "").replace(" [2]", "")))


def test_figures_share_recall_all_none_and_faults() -> None:
    outcomes = [
        score("q1", "answerable", "Integral action accumulates past errors [1].", ["accumulates past errors"]),
        score("q2", "answerable", "Nothing relevant here: [1].", ["accumulates past errors", "steady state"]),
        score("q3", "answerable", "Steady state error vanishes. Steady state error vanishes.", ["steady state", "x"]),
    ]
    assert [o.found for o in outcomes] == [1, 0, 1]
    result = figures(outcomes)
    assert result.questions == 3 and result.facts == 5
    assert result.fact_recall == 0.4 and result.all_facts == round(1 / 3, 4) and result.no_facts == round(1 / 3, 4)
    assert result.dangling_lead_ins == 1 and result.repeated_sentences == 1 and result.navigation == 0
    assert isinstance(outcomes[0], AnswerOutcome) and outcomes[1].missing == ("accumulates past errors", "steady state")
