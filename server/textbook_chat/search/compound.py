"""A question that asks two things ("Should I let people DM me, and how do I tell contributors I'm away?"): its parts.

One vector for the whole is the average of two subjects and resembles neither section well, so a question whose
every part the book answers can read as one it does not. Where the whole reads as nothing the book answers,
retrieval reads its parts apart (``Retriever.retrieve``): the best part answered is better than a decline.
"""

from __future__ import annotations

import re

from textbook_chat.index import sparse

MAX_PARTS = 3  # read apart at most; a longer list is a list, not questions joined
MIN_TERMS = 2  # a part with fewer content terms ("and why?") says too little to be read alone

# Between two sentences, before "and" + a question word, or at a semicolon; read on the question with its spaces
# made single (so that no run of them is scanned again from each of its positions).
_BETWEEN = re.compile(
    r"(?<=[?.!]) "
    r"|,? and (?=(?:how|what|which|why|when|where|who|whom|whose|is|are|can|could|do|does|did|should|would)\b)"
    r"|; ",
    re.IGNORECASE,
)


def parts(question: str) -> list[str]:
    """The questions ``question`` joins, in order; empty when it is one question (or its pieces say too little)."""
    pieces = [p.strip() for p in _BETWEEN.split(" ".join(question.split())) if p.strip()]
    pieces = [p for p in pieces if len(sparse.terms(p)) >= MIN_TERMS]
    return pieces[:MAX_PARTS] if len(pieces) >= 2 else []
