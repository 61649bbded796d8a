"""The offline answer's units, read from a chunk's Markdown form: what is quoted whole, what never is, and how
chosen units are merged, ordered and rendered."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from textbook_chat.answer import compose, extract
from textbook_chat.answer.compose import Budget, choose, order, render, shape
from textbook_chat.answer.extract import Unit, units
from textbook_chat.answer.facts import dangling_lead_ins, navigation_lines
from textbook_chat.book import mdx
from textbook_chat.book.slugs import Slugger


def bodies(text: str) -> list[str]:
    return [f"{u.lead}\n\n{u.body}" if u.lead else u.body for u in units(text, 1)]


def test_a_lead_in_keeps_the_list_it_introduces() -> None:
    text = (
        "## Components\n"
        "A digital twin consists of several key components:\n\n"
        "- **Physical model**: the geometry and inertia of the robot\n"
        "- **Sensor simulation**: cameras, lidar and IMUs with their noise\n"
        "- **Control system**: the same controllers that run on the hardware\n"
    )
    (unit,) = units(text, 1)
    assert unit.lead == "A digital twin consists of several key components:"
    assert unit.body.splitlines() == [
        "- **Physical model**: the geometry and inertia of the robot",
        "- **Sensor simulation**: cameras, lidar and IMUs with their noise",
        "- **Control system**: the same controllers that run on the hardware",
    ]
    rendered = render([replace(unit, cites=(1,))])
    assert rendered.startswith("A digital twin consists of several key components [1]:\n\n- **Physical model**")
    assert dangling_lead_ins(rendered) == 0


def test_a_lead_in_whose_list_is_not_in_the_chunk_is_not_quoted() -> None:
    text = "Physical AI systems are built from many parts working together in a loop. It has these parts:"
    assert all(not b.rstrip().endswith(":") for b in bodies(text))
    assert bodies(text) == ["Physical AI systems are built from many parts working together in a loop."]


def test_a_sentence_pointing_ahead_is_quoted_with_what_it_points_at_or_not_at_all() -> None:
    text = (
        "Each topic carries one message type. The node below publishes a simple heartbeat twice per second.\n\n"
        "```python\nself.publisher = self.create_publisher(String, 'robot_status', 10)\n```\n"
    )
    sentence, code = units(text, 1)
    assert sentence.body == "Each topic carries one message type."
    assert code.lead.startswith("The node below") and "create_publisher" in code.body
    # The code it promised is in the next chunk: what would say "below" over nothing is not quoted.
    cut = "Each topic carries one message type. The node below publishes a simple heartbeat twice per second."
    assert bodies(cut) == ["Each topic carries one message type."]
    assert bodies("You install the whole toolchain on Ubuntu as follows.\n\nThen open a new shell and source it.") == [
        "Then open a new shell and source it."
    ]


def test_a_long_list_is_cut_at_a_whole_item_within_the_budget() -> None:
    items = "\n".join(f"- Item number {i} says something rather long about the topic at hand here" for i in range(30))
    (unit,) = units(f"The checklist has these entries:\n{items}", 1)
    assert unit.words <= extract.LIST_BUDGET_WORDS + 20
    assert all(line.startswith("- Item number ") for line in unit.body.splitlines())


def test_a_lead_in_keeps_its_code_and_the_labels_between_lists() -> None:
    text = (
        "The discrete-time Kalman filter equations are:\n\n"
        "**Prediction:**\n- x = F x + B u\n- P = F P F^T + Q\n\n"
        "**Update:**\n- K = P H^T (H P H^T + R)^-1\n\n"
        "To create a workspace:\n```bash\nmkdir -p ~/ws/src\ncolcon build\n```\n"
    )
    kalman, workspace = units(text, 1)
    assert kalman.lead.startswith("The discrete-time Kalman filter")
    assert "**Prediction:**" in kalman.body and "**Update:**" in kalman.body and "K = P H^T" in kalman.body
    assert workspace.lead == "To create a workspace:" and "colcon build" in workspace.body
    assert workspace.body.startswith("```bash") and workspace.body.endswith("```")


def test_a_table_row_keeps_its_header() -> None:
    text = (
        "| Feature | Gazebo | Unity |\n|---|---|---|\n"
        "| Rendering quality | Moderate | High |\n| Physics accuracy | Excellent | Good |\n"
    )
    rows = bodies(text)
    assert rows == [
        "- Feature: Rendering quality; Gazebo: Moderate; Unity: High",
        "- Feature: Physics accuracy; Gazebo: Excellent; Unity: Good",
    ]


def test_a_step_keeps_its_number() -> None:
    text = (
        "Upon activation of any safety system:\n\n"
        "1. **Maintain Distance**: Do not approach the robot until the reset is verified\n"
        "2. **Assess Situation**: Determine the cause through the diagnostic systems\n"
        "3. **Secure Environment**: Ensure no hazardous conditions exist before reset\n"
    )
    (unit,) = units(text, 1)
    assert [line[:3] for line in unit.body.splitlines()] == ["1. ", "2. ", "3. "]


@pytest.mark.parametrize(
    "navigation",
    [
        "[← Previous: Kinematics](./kinematics) | [Next: Dynamics →](./dynamics)",
        "**Previous:** [Introduction](../intro)",
        "Next: [Setting up your shell](./setup)",
        "⬅️ [Back to the course outline](../index.md)",
        "[Chapter 1](./ch1) · [Chapter 2](./ch2) · [Chapter 3](./ch3)",
    ],
)
def test_navigation_is_never_quoted(navigation: str) -> None:
    text = f"The shell reads each command line and runs the program it names.\n\n{navigation}\n"
    found = bodies(text)
    assert found == ["The shell reads each command line and runs the program it names."]
    assert navigation_lines(navigation) == 1


def test_link_lists_front_matter_admonition_markers_and_markup_are_never_quoted() -> None:
    text = (
        ":::tip Remember the prompt\n"
        "The prompt shows the current working directory of the shell session.\n"
        ":::\n\n"
        '<div className="banner">\n'
        "import Tabs from '@theme/Tabs';\n\n"
        "See the related pages:\n\n"
        "- [Processes](./processes.md)\n- [Signals](./signals.md)\n- [Pipes](./pipes.md)\n\n"
        "## Further reading\n\n"
        "- Kerrisk, M. (2010). The Linux Programming Interface. No Starch Press.\n"
    )
    assert bodies(text) == ["The prompt shows the current working directory of the shell session."]


def test_a_sentence_that_leans_on_the_one_before_is_quoted_with_it() -> None:
    text = (
        "Morphological computation lets the body do part of the work of control. "
        "For example, a flexible tendon stores energy and returns it on the next step."
    )
    (unit,) = units(text, 1)
    assert unit.body.startswith("Morphological computation") and unit.body.endswith("next step.")


def unit(body: str, n: int, position: int = 0, score: float = 1.0) -> Unit:
    made = units(body, n)[0]
    return replace(made, position=position, score=score)


def test_near_duplicates_are_said_once_with_every_source_cited() -> None:
    first = unit("The course runs for thirteen weeks of lectures and laboratory work.", 1, score=3.0)
    again = unit("The course runs for thirteen weeks of lectures and laboratory work in total.", 3, score=2.0)
    other = unit("Each module ends with a graded practical assignment.", 2, score=1.0)
    chosen = choose([first, again, other], Budget(units=4, words=100))
    assert [u.cites for u in chosen] == [(1, 3), (2,)]
    text = render(order(chosen))
    assert text.count("thirteen weeks") == 1 and "[1][3]" in text


def test_the_best_unit_opens_then_its_source_in_order_then_other_sources() -> None:
    a0 = unit("Joint limits bound how far each joint of the arm may move.", 1, position=0)
    a2 = unit("The Jacobian relates joint velocities to end-effector velocities.", 1, position=2)
    a5 = unit("A singular Jacobian means the arm has lost a direction of motion.", 1, position=5)
    b1 = unit("Velocity kinematics is solved numerically on the robot controller.", 2, position=1)
    ordered = order([a2, b1, a5, a0])
    assert [u.body[:12] for u in ordered] == [a2.body[:12], a0.body[:12], a5.body[:12], b1.body[:12]]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What is the Zero Moment Point?", "define"),
        ("How do I build the packages in a workspace?", "steps"),
        ("Which tool records ROS 2 data?", "other"),
    ],
)
def test_the_answer_length_follows_the_question(question: str, expected: str) -> None:
    assert shape(question) == expected
    assert compose.BUDGETS["define"].words < compose.BUDGETS["other"].words < compose.BUDGETS["steps"].words


def test_a_lead_in_with_emphasis_or_space_after_its_colon_takes_its_marker_before_the_colon() -> None:
    text = (
        "**The launch file does three things:** \n\n- starts the driver\n- loads the parameters\n- opens the viewer\n"
    )
    (found,) = units(text, 2)
    rendered = render([replace(found, cites=(2,))])
    assert rendered.startswith("**The launch file does three things [2]:**\n\n- starts the driver")


def test_a_listing_no_sentence_introduces_is_a_unit_of_its_own_and_a_lead_ins_listing_is_quoted_once() -> None:
    text = (
        "### Cancelling a goal\n```python\ndef cancel_callback(self, goal_handle):\n"
        "    return CancelResponse.ACCEPT\n```\n\n"
        "To start the server:\n\n```bash\nros2 run demo action_server --ros-args -p rate:=10\n```\n"
    )
    found = units(text, 1)
    assert [u.bare_code for u in found] == [True, False]
    assert found[0].heading == "Cancelling a goal" and "CancelResponse.ACCEPT" in found[0].body
    assert found[1].lead == "To start the server:" and "ros2 run" in found[1].body
    assert not any(u.bare_code for u in units(text, 1, "assessment"))  # a quiz's code is the student's to write


def test_a_bare_list_of_terms_and_code_of_nothing_but_imports_are_not_quoted() -> None:
    text = (
        "## Key Terms\n- Morphological Computation\n- Central Pattern Generators\n- Soft Robotics\n\n"
        "## Example\nThe integration starts from these imports:\n\n"
        "```python\n# Isaac integration example\nimport numpy as np\nfrom omni.isaac.core import World\n```\n"
    )
    assert units(text, 1) == []


def test_a_chapters_objectives_are_not_quoted_as_its_teaching() -> None:
    text = (
        "## Learning Objectives\nAfter completing this chapter, students will be able to:\n\n"
        "- Explain how a shell finds the program a command names\n- Write a script that loops over files\n\n"
        "## The search path\nThe shell looks for a command in each directory listed in the PATH variable, in order.\n"
    )
    assert bodies(text) == ["The shell looks for a command in each directory listed in the PATH variable, in order."]


def test_a_prompt_to_the_student_is_not_quoted_but_the_list_under_it_still_may_be() -> None:
    text = (
        "## Sim-to-real\nExplain the differences between simulation and the real robot in your own words.\n\n"
        "Discuss the methods for closing the sim-to-real gap:\n\n"
        "1. **Domain randomization**: vary lighting, textures and masses during training\n"
        "2. **System identification**: tune the simulation's parameters to match the robot\n"
    )
    (unit,) = units(text, 1)
    assert unit.lead == "" and unit.body.startswith("1. **Domain randomization**")
    assert render([replace(unit, cites=(1,))]).startswith("From “Sim-to-real” [1]:\n\n1. **Domain randomization**")


@pytest.mark.parametrize(
    "step",
    [
        "Next, run the following command in the project directory:",
        "Next you install the compiler with the package manager:",
        "Back in the terminal, list the files of the directory:",
    ],
)
def test_a_step_that_opens_with_next_or_back_is_not_navigation(step: str) -> None:
    (unit,) = units(f"{step}\n\n```bash\nls -la\n```\n", 1)
    assert unit.lead == step and "ls -la" in unit.body


def test_the_unit_cutter_reads_tables_headings_and_fences_by_the_books_own_grammar() -> None:
    """book/mdx.py's line rules, the ones the book's pages are read by: a one-dash table delimiter is a table,
    a closing run of #s after a space is not the heading's text, and a fence closes only on its own marker."""
    text = (
        "## Simulators ##\n\n"
        "| Feature | Gazebo |\n|-|-|\n| Physics | ODE and DART engines |\n\n"
        "````python\nprint('```')\n````\n"
    )
    blocks = mdx.parse_blocks(text, Slugger())
    assert [b.kind for b in blocks] == ["heading", "table", "fence"]
    found = units(text, 1)
    assert [(u.heading, u.body) for u in found] == [("Simulators", "- Feature: Physics; Gazebo: ODE and DART engines")]


@pytest.mark.parametrize(
    "line", ["# a" + " " * 10_000 + "b", "|---" + " " * 10_000 + "x", ":::tip" + " " * 10_000 + "x"]
)
def test_a_pathological_line_of_the_book_is_cut_in_linear_time(line: str) -> None:
    started = time.perf_counter()
    units(f"Some teaching text about robots and their joints.\n{line}\n", 1)
    mdx.parse_blocks(line, Slugger())
    assert time.perf_counter() - started < 0.5  # a backtracking heading rule took minutes on the first
