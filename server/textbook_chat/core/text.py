"""Text from somebody else's program made storable and sendable: what UTF-8 (and Postgres) cannot hold becomes U+FFFD.

A model server is other people's code: JSON's ``\\uXXXX`` escapes let it send half of a surrogate pair, or
split one pair across two chunks, and NUL, which Postgres text refuses (issue 25). ``ModelText`` joins pairs
split across chunks; ``scrub`` replaces whatever is still unencodable. The SSE encoder, the Redis mirror and
the answer writer call ``scrub`` too, so one bad item can never stop them. ``for_terminal`` shows readers' text
to an operator's terminal without letting it drive the terminal.
"""

from __future__ import annotations

import re

__all__ = ["REPLACEMENT", "ModelText", "for_terminal", "scrub"]

REPLACEMENT = "\ufffd"
_UNENCODABLE = re.compile("[\ud800-\udfff\x00]")
_HIGH = range(0xD800, 0xDC00)


def scrub(text: str) -> str:
    """``text`` with each lone surrogate and NUL replaced by U+FFFD; unchanged (and cheap) when it has none."""
    if text.isascii() and "\x00" not in text:
        return text
    if not _UNENCODABLE.search(text):
        return text
    # Through UTF-16: a high + low pair that came from two places is joined into the character it spells, and
    # what is left alone is replaced; NUL is a valid character everywhere but in Postgres text.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").replace("\x00", REPLACEMENT)


class ModelText:
    """The text deltas of one streamed answer, made whole: a high surrogate ending one chunk waits for the low
    one that may start the next (some servers split a UTF-16 pair at a token boundary)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        """What can be emitted of ``piece`` now (possibly empty), scrubbed."""
        if self._held:
            piece, self._held = self._held + piece, ""
        if piece and ord(piece[-1]) in _HIGH:
            piece, self._held = piece[:-1], piece[-1]
        return scrub(piece)

    def end(self) -> str:
        """What is still held once the stream ends: a high surrogate no low one followed (as U+FFFD)."""
        held, self._held = self._held, ""
        return scrub(held)


# C0 and C1 controls (ESC starts every terminal escape; C1's CSI and OSC do too on some terminals), DEL, and the
# marks that reorder what follows them (bidi overrides, embeddings, isolates) or break a line.
_TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def for_terminal(text: str) -> str:
    """One line of ``text`` that a terminal shows as it is: each control character, bidi mark or line break
    becomes a visible escape such as ``\\x1b`` or ``\\u202e`` (issue 25: a question set the window title)."""
    return _TERMINAL_UNSAFE.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
