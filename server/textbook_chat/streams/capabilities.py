"""Signed, expiring capabilities for one message's stream: whoever holds the ``stream_url`` may read or stop it.

The key is ``STREAM_SIGNING_KEY`` (the same on every worker), or a random per-process key when unset.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

_MAX_EXPIRY_DIGITS = 12


class Capabilities:
    def __init__(self, key: bytes | None, *, ttl_s: float) -> None:
        self._key = key or secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def issue(self, message_id: str, *, now: float | None = None) -> str:
        expires = int((now if now is not None else time.time()) + self.ttl_s)
        return f"{expires}.{self._sign(message_id, expires)}"

    def verify(self, message_id: str, capability: str | None, *, now: float | None = None) -> bool:
        if not capability or "." not in capability:
            return False
        expires_text, signature = capability.split(".", 1)
        # ASCII digits only ("²".isdigit() is true) and no longer than any real expiry: never a 500.
        if not (expires_text.isascii() and expires_text.isdigit() and len(expires_text) <= _MAX_EXPIRY_DIGITS):
            return False
        expires = int(expires_text)
        if expires < (now if now is not None else time.time()):
            return False
        return hmac.compare_digest(signature, self._sign(message_id, expires))

    def caller_digest(self, caller: str) -> str:
        """Who asked a first question (their rate-limit identity), kept with the session so that only the same
        caller can repeat it; keyed, so the stored value does not give the address away."""
        return hmac.new(self._key, f"caller.{caller}".encode(), hashlib.sha256).hexdigest()[:32]

    def stream_url(self, message_id: str) -> str:
        return f"/api/chat/messages/{message_id}/stream?cap={self.issue(message_id)}"

    def _sign(self, message_id: str, expires: int) -> str:
        digest = hmac.new(self._key, f"{message_id}.{expires}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:24]).decode().rstrip("=")
