"""A stored answer as events: in the live stream's numbering where its stream marks say what each event had
brought, so a reader resuming after any event gets exactly the rest of the text; from 1 without them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from textbook_chat.store.rows import MessageRow
from textbook_chat.streams import replay
from textbook_chat.streams.events import Event

TEXT = "Balance comes from the ankles, then the hips [1]."
# Live: meta (1), sources (2), a notice (3), tokens (4-6), then done (7).
MARKS = (0, 0, 0, 9, 27, len(TEXT))


def stored(*, marks: tuple[int, ...] | None = MARKS, status: str = "complete") -> MessageRow:
    return MessageRow(
        id=uuid.uuid4(),
        session_id=uuid.uuid4(),
        role="assistant",
        content=TEXT,
        status=status,  # type: ignore[arg-type]
        mode="textbook",
        module_filter=None,
        selected_text=None,
        confidence=0.8,
        model="gpt-4o-mini",
        prompt_tokens=10,
        completion_tokens=12,
        latency_ms=900,
        feedback=None,
        feedback_comment=None,
        client_request_id=None,
        created_at=datetime.now(UTC),
        stream_marks=marks,
    )


def shape(events: list[Event]) -> list[tuple[int, str, str | None]]:
    return [(e.id, e.event, e.data.get("text") if e.event == "token" else None) for e in events]


def test_a_reader_with_nothing_gets_the_whole_answer_numbered_as_it_streamed() -> None:
    assert shape(replay.events(stored(), stream_url="u")) == [
        (1, "meta", None),
        (2, "sources", None),
        (6, "token", TEXT),
        (7, "done", None),
    ]


def test_a_reader_who_resumes_mid_answer_gets_exactly_the_rest() -> None:
    for after, brought in [(2, 0), (3, 0), (4, 9), (5, 27)]:
        events = replay.events(stored(), stream_url="u", after=after)
        assert shape(events) == [(6, "token", TEXT[brought:]), (7, "done", None)], after
    assert shape(replay.events(stored(), stream_url="u", after=6)) == [(7, "done", None)]
    assert replay.events(stored(), stream_url="u", after=7) == []


def test_an_interrupted_answer_ends_as_it_was_stored_after_the_rest_of_its_text() -> None:
    events = replay.events(stored(status="interrupted"), stream_url="u", after=4)
    assert shape(events) == [(6, "token", TEXT[9:]), (7, "done", None)]
    assert events[-1].data["finish_reason"] == "cancelled"


def test_without_trustworthy_marks_the_replay_is_numbered_from_one() -> None:
    old_style = [(1, "meta", None), (2, "sources", None), (3, "token", TEXT), (4, "done", None)]
    for marks in [None, (), (0, 0, 9, 5), (0, 0, len(TEXT) + 1), (3, 3, 9)]:
        message = stored(marks=marks)
        assert not replay.resumable(message), marks
        assert shape(replay.events(message, stream_url="u")) == old_style, marks
    assert replay.resumable(stored())
