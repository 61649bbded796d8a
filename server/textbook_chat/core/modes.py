"""What a question is asked about: the whole book (``textbook``), or a passage the reader selected (``selection``).

One literal and one rule for every stage: retrieval searches by it, the store keeps it, the chat run reads it.
"""

from __future__ import annotations

from typing import Literal

Mode = Literal["textbook", "selection"]


def mode_of(selected_text: str | None) -> Mode:
    """A question that comes with a selected passage is about that passage; any other, about the book."""
    return "selection" if selected_text else "textbook"
