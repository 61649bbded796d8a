"""Conversation sets (docs/evaluation.md): they load and point into their books, and ``eval`` replays them,
each later turn in its session, alone and as its hand rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DEMO_BOOK, SHARED_BOOK, copy_index
from textbook_chat import cli
from textbook_chat.search import conversations

DATA = Path(__file__).parents[1] / "data"
SETS = {DATA / "conversations_shared.jsonl": SHARED_BOOK, DATA / "conversations_demo.jsonl": DEMO_BOOK}


@pytest.mark.parametrize("path", SETS, ids=lambda p: p.stem)
def test_our_conversation_sets_point_into_their_books_with_every_kind_of_turn(path: Path) -> None:
    sets = conversations.load(path)
    later = [t for c in sets for t in c.turns[1:]]
    follow_ups = [t for t in later if t.kind == "follow_up"]
    assert len(follow_ups) >= 25 and sum(t.kind == "switch" for t in later) >= 8
    assert any(t.kind == "out_of_scope" for t in later) and any(len(c.turns) >= 3 for c in sets)
    assert 0.25 <= sum(t.other_page for t in follow_ups) / len(follow_ups) <= 0.5
    assert all(t.standalone for t in follow_ups)  # each follow-up has its hand rewrite (the upper bound)
    for turn in (t for c in sets for t in c.turns):
        for name in turn.expected_files:
            assert (SETS[path] / "docs" / name).is_file(), name


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        ([{"question": "What is Gazebo?", "expected_files": ["a.md"]}], "at least two turns"),
        ([{"question": "Q", "expected_files": ["a.md"]}, {"question": "R", "kind": "later"}], "unknown kind"),
        ([{"question": "Q", "expected_files": ["a.md"]}, {"question": "How do I install it?"}], "no expected_files"),
    ],
)
def test_a_bad_conversation_names_the_file_and_line(tmp_path: Path, turns: list[object], message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "c1", "turns": [{"question": "ok", "expected_files": ["a.md"]}] * 2}) + "\n")
    path.write_text(path.read_text() + json.dumps({"id": "c2", "turns": turns}) + "\n")
    with pytest.raises(conversations.ConversationFileError, match=f"c.jsonl:2: .*{message}"):
        conversations.load(path)


def test_a_follow_up_on_another_page_than_the_first_question_is_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    first = {"question": "What is Gazebo?", "expected_files": ["sim.md"]}
    turns = [first, {"question": "And its install?", "expected_files": ["sim.md", "intro.md"]}]
    turns += [{"question": "And the reality gap it leaves?", "expected_files": ["rl.md"]}]
    path.write_text(json.dumps({"id": "c", "turns": turns}) + "\n")
    (conversation,) = conversations.load(path)
    assert [t.other_page for t in conversation.turns] == [False, False, True]


@pytest.mark.slow
def test_eval_replays_a_conversation_set_in_context_alone_and_rewritten(
    demo_index_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATA_DIR", str(copy_index(demo_index_dir, tmp_path / "data")))
    monkeypatch.setenv("EMBEDDER", "local")
    monkeypatch.delenv("QDRANT_PATH", raising=False)
    monkeypatch.delenv("QDRANT_URL", raising=False)
    simulators = "03-simulation-and-learning/01-simulators.md"
    sets = tmp_path / "conversations.jsonl"
    gazebo = {
        "question": "What is Gazebo?",
        "expected_files": [simulators],
        "answer_facts": ["the open-source simulator developed alongside ROS by Open Robotics"],
    }
    lines = [
        {"id": "c1", "turns": [gazebo, {"question": "How do I install it?", "expected_files": [simulators],
                                        "standalone": "How do I install the Gazebo simulator?",
                                        "answer_facts": ["a kosher pickle brine recipe"]}]},
        {"id": "c2", "turns": [gazebo, {"question": "And how do I cook pasta?", "kind": "out_of_scope"}]},
    ]  # fmt: skip
    sets.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cli.main(["eval", str(sets), "--misses"]) == 0
    printed = capsys.readouterr().out.splitlines()
    follow_up = next(line.split() for line in printed if line.startswith("follow-ups"))
    assert follow_up[-4:] == ["1", "1.000", "1.000", "0.000"]  # in context: found first, not declined
    alone = next(line.split() for line in printed if line.strip().startswith("alone"))
    assert alone[-1] == "1.000"  # alone, "How do I install it?" names nothing the book can answer: declined
    assert any(line.startswith("out-of-scope follow-ups") and line.endswith("1.000") for line in printed)
    # Turns with facts: each group's offline answers scored apart (the first question's holds its fact; the
    # follow-up's fact is one no answer from this book holds)
    firsts, follow_ups = (
        printed.index(f"offline answers to {group}") for group in ("first questions", "follow-ups, in context")
    )
    assert printed[firsts + 3].split() == ["fact", "recall", "1.000"]
    assert printed[follow_ups + 1].split()[-1] == "1" and printed[follow_ups + 3].split() == ["fact", "recall", "0.000"]
