"""The errors this service raises on purpose, each carrying its HTTP status and a stable code.

Our exception hierarchy::

    AppError                      handled: becomes {"error": {"code", "message"}} with .status
    ├── BadRequest (400)          malformed JSON, wrong types, bad parameters
    ├── Unauthorized (401)        a bearer token that is expired, forged or malformed
    ├── NotFound (404)            unknown route or id; also used for "not yours" so nothing leaks
    ├── MethodNotAllowed (405)
    ├── Conflict (409)            a client_request_id already used in another conversation
    ├── PayloadTooLarge (413)     bodies over 64 KiB
    ├── RateLimited (429)         carries retry_after seconds
    └── ServiceUnavailable (503)  a dependency we cannot do without for this request
        ├── DatabaseUnavailable   Postgres down or too slow (DB_TIMEOUT_S)
        ├── RetrievalUnavailable  Qdrant or the embedder down
        ├── LLMUnavailable        the chat model failed after its retry
        └── IndexMismatch         the index was built by another embedder: re-ingest

Anything else is an *error* in Starlette's sense: it reaches the 500 handler, which logs the
traceback with the request id and answers a fixed message.
"""

from __future__ import annotations


class AppError(Exception):
    """Base class; its message is shown to the client, so it never holds internals."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        if code is not None:
            self.code = code


class BadRequest(AppError):
    """The client sent something we cannot read; the message says what, for the client."""

    status = 400
    code = "bad_request"


class Unauthorized(AppError):
    """The bearer token is not valid; the client should sign in again."""

    status = 401
    code = "unauthorized"


class NotFound(AppError):
    """Nothing here for this caller (also for things that exist but are not theirs)."""

    status = 404
    code = "not_found"


class Conflict(AppError):
    """The request clashes with one made before; the message says which field."""

    status = 409
    code = "conflict"


class MethodNotAllowed(AppError):
    """The route exists but not with this method."""

    status = 405
    code = "method_not_allowed"


class PayloadTooLarge(AppError):
    """The request body is over the limit."""

    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(AppError):
    """A body that is not declared as JSON (a cross-site form posts text/plain)."""

    status = 415
    code = "unsupported_media_type"


class RateLimited(AppError):
    """Too many requests; ``retry_after`` seconds until the next one is allowed."""

    status = 429
    code = "rate_limited"

    def __init__(
        self, message: str, *, retry_after: int, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, code=code, headers={**(headers or {}), "Retry-After": str(retry_after)})
        self.retry_after = retry_after


class ServiceUnavailable(AppError):
    """A dependency is down; the client may retry later."""

    status = 503
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    """Postgres is unreachable or slower than DB_TIMEOUT_S; shown as 'history unavailable'."""

    code = "database_unavailable"


class RetrievalUnavailable(ServiceUnavailable):
    """Qdrant or the embedder failed; chat falls back to the FAQ."""

    code = "retrieval_unavailable"


class LLMUnavailable(ServiceUnavailable):
    """The chat model failed (timeout, 5xx, 429 after backoff); chat falls back to extraction."""

    code = "llm_unavailable"


class IndexMismatch(ServiceUnavailable):
    """The collection was built with another embedder; the operator must re-ingest (message says so)."""

    code = "index_mismatch"
