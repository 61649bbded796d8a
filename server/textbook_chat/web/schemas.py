"""Request bodies: JSON in, validated frozen dataclasses out, with a clear 400 naming the field.

The limits are ``ChatRequest``'s (docs/http-api.md); the JSON Schemas here also feed ``/openapi.json``. Only
``web`` reads them: it hands the chat stage a ``chat.question.Question``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from textbook_chat.core.errors import BadRequest

MAX_QUESTION_CHARS = 2000
MAX_SELECTION_CHARS = 4000
MAX_COMMENT_CHARS = 2000


@dataclass(frozen=True)
class ChatRequest:
    question: str
    session_id: uuid.UUID | None = None
    session_token: str | None = None
    module: str | None = None
    selected_text: str | None = None
    page_url: str | None = None
    client_request_id: uuid.UUID | None = None


@dataclass(frozen=True)
class FeedbackRequest:
    rating: str
    comment: str | None = None


CHAT_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["question"],
    "additionalProperties": False,
    "properties": {
        "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS},
        "session_id": {"type": ["string", "null"], "format": "uuid"},
        "session_token": {"type": ["string", "null"], "minLength": 1, "maxLength": 200},
        "module": {"type": ["string", "null"], "maxLength": 200},
        "selected_text": {"type": ["string", "null"], "maxLength": MAX_SELECTION_CHARS},
        "page_url": {"type": ["string", "null"], "maxLength": 2000},
        "client_request_id": {"type": ["string", "null"], "format": "uuid"},
    },
}

FEEDBACK_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["rating"],
    "additionalProperties": False,
    "properties": {
        "rating": {"type": "string", "enum": ["up", "down"]},
        "comment": {"type": ["string", "null"], "maxLength": MAX_COMMENT_CHARS},
    },
}


def decode_json(body: bytes) -> Any:
    if not body.strip():
        raise BadRequest("The request body is empty; send a JSON object.", code="invalid_json")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"The request body is not valid JSON ({_json_reason(exc)}).", code="invalid_json") from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise BadRequest("The request body nests too deeply to be a request.", code="invalid_json") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise BadRequest("The request body holds a number too long to read.", code="invalid_json") from None


def parse_chat_request(data: Any) -> ChatRequest:
    fields = _object(data, CHAT_REQUEST_SCHEMA)
    question = _string(fields, "question", required=True, max_chars=MAX_QUESTION_CHARS, strip=True)
    assert question is not None
    session_id = _uuid(fields, "session_id")
    if fields.get("session_token") == "":
        raise BadRequest(
            "session_token must not be empty (leave it out to start a new conversation).", code="validation_error"
        )
    session_token = _string(fields, "session_token", max_chars=200)
    if session_id is not None and session_token is None:
        raise BadRequest("session_token is required with session_id.", code="validation_error")
    selected = _string(fields, "selected_text", max_chars=MAX_SELECTION_CHARS, strip=True)
    return ChatRequest(
        question=question,
        session_id=session_id,
        session_token=session_token,
        module=_string(fields, "module", max_chars=200, strip=True),
        selected_text=selected,
        page_url=_string(fields, "page_url", max_chars=2000),
        client_request_id=_uuid(fields, "client_request_id"),
    )


def parse_feedback(data: Any) -> FeedbackRequest:
    fields = _object(data, FEEDBACK_REQUEST_SCHEMA)
    rating = _string(fields, "rating", required=True, max_chars=MAX_COMMENT_CHARS)
    if rating not in ("up", "down"):
        raise BadRequest("rating must be 'up' or 'down'.", code="validation_error")
    return FeedbackRequest(rating=rating, comment=_string(fields, "comment", max_chars=MAX_COMMENT_CHARS, strip=True))


def _object(data: Any, schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRequest("The request body must be a JSON object.", code="validation_error")
    unknown = sorted(set(data) - set(schema["properties"]))
    if unknown:
        raise BadRequest(f"Unknown field(s): {', '.join(unknown)}.", code="validation_error")
    return data


def _string(
    fields: dict[str, Any], name: str, *, required: bool = False, max_chars: int, strip: bool = False
) -> str | None:
    value = fields.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required.", code="validation_error")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string.", code="validation_error")
    if "\x00" in value:
        raise BadRequest(f"{name} must not contain NUL characters.", code="validation_error")
    if not _encodable(value):
        raise BadRequest(f"{name} is not valid Unicode (a lone surrogate such as \\ud800).", code="validation_error")
    if strip:
        value = value.strip()
    if len(value) > max_chars:
        raise BadRequest(f"{name} is too long ({len(value)} characters; at most {max_chars}).", code="too_long")
    if not value:
        if required:
            raise BadRequest(f"{name} must not be empty.", code="validation_error")
        return None
    return value


def _encodable(value: str) -> bool:
    """JSON's \\uXXXX escapes can spell half of a surrogate pair, which no UTF-8 text (nor Postgres) can hold."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _uuid(fields: dict[str, Any], name: str) -> uuid.UUID | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a UUID string.", code="validation_error")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"{name} is not a valid UUID.", code="validation_error") from None


def _json_reason(exc: Exception) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return "not UTF-8"
