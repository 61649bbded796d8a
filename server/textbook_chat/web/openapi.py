"""``GET /openapi.json``: the OpenAPI 3.1 document of the HTTP API (docs/http-api.md).

Written by hand from the request schemas in ``schemas.py``; tests/web/test_openapi.py checks that every
route of the app is described here and nothing else is.
"""

from __future__ import annotations

from typing import Any

from textbook_chat import __version__
from textbook_chat.web.schemas import CHAT_REQUEST_SCHEMA, FEEDBACK_REQUEST_SCHEMA

_ERROR = {"$ref": "#/components/schemas/Error"}
_SSE = {
    "text/event-stream": {
        # One server-sent event (tools such as schemathesis check every event against it); docs/sse-protocol.md.
        "schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"enum": ["meta", "sources", "notice", "token", "done", "error"]},
                "data": {"type": "string", "description": "one JSON object"},
                "id": {"type": "string", "pattern": "^[0-9]+$"},
                "retry": {"type": "integer"},
            },
        }
    }
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "Malformed or invalid request",
        401: "Bearer token expired, forged or malformed",
        404: "Not found, or not yours",
        409: "client_request_id already used, by another conversation or another caller",
        413: "Body over 64 KiB",
        415: "Body not declared as application/json",
        431: "Request headers over 32 KiB",
        429: "Rate limit or budget exceeded (Retry-After)",
        503: "A dependency this route needs is down, or the server is shutting down (Retry-After)",
    }
    return {str(s): {"description": reasons[s], "content": _json(_ERROR)} for s in statuses}


_SESSION_TOKEN = {"name": "X-Session-Token", "in": "header", "required": False, "schema": {"type": "string"}}
_UUID_PARAM = {"required": True, "in": "path", "schema": {"type": "string", "format": "uuid"}}
_CAP = {"name": "cap", "in": "query", "required": True, "schema": {"type": "string"}}
_OBJECT = {"type": "object"}


def document() -> dict[str, Any]:
    """The API's OpenAPI 3.1 description; every operation also lists the refusals the middleware makes on any route
    (413 body too large, 431 headers too large), with a JSON body 415 for any other content type, and on /api/
    routes 401 for a bad bearer token."""
    spec = _paths()
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            limits: tuple[int, ...] = (413, 415, 431) if "requestBody" in operation else (413, 431)
            if path.startswith("/api/"):
                limits += (401,)  # every API route reads a bearer token if one is sent: a bad one is a 401
            operation["responses"] = {**operation["responses"], **_errors(*limits)}
    return spec


def _paths() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Textbook Chat", "version": __version__},
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                        }
                    },
                },
                "ChatRequest": CHAT_REQUEST_SCHEMA,
                "FeedbackRequest": FEEDBACK_REQUEST_SCHEMA,
            },
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "admin": {"type": "http", "scheme": "bearer", "description": "the operator's ADMIN_TOKEN"},
            },
        },
        "paths": {
            "/health": {
                "get": {
                    **_op("Per-service health; 200 while the process can answer", _OBJECT, errors=()),
                    "responses": {
                        "200": {"description": "ok or degraded", "content": _json(_OBJECT)},
                        "503": {
                            "description": "draining: shutting down, send questions elsewhere",
                            "content": _json(_OBJECT),
                        },
                    },
                }
            },
            "/api/chat": {
                "post": {
                    **_op(
                        "Ask; the answer streams back as SSE in this response",
                        None,
                        errors=(400, 401, 404, 409, 413, 429, 503),
                    ),
                    "requestBody": _chat_body(),
                    "responses": {
                        "200": {"description": "SSE stream", "content": _SSE},
                        **_errors(400, 401, 404, 409, 413, 429, 503),
                    },
                }
            },
            "/api/chat/messages": {
                "post": {
                    **_op(
                        "Ask; generation starts, read it from stream_url",
                        _OBJECT,
                        status=202,
                        errors=(400, 401, 404, 409, 413, 429, 503),
                    ),
                    "requestBody": _chat_body(),
                }
            },
            "/api/chat/messages/{message_id}/stream": {
                "get": {
                    "summary": "The message's events (EventSource); resumes after Last-Event-ID; 204 after done",
                    "parameters": [
                        {"name": "message_id", **_UUID_PARAM},
                        _CAP,
                        {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"}},
                        {"name": "last_event_id", "in": "query", "required": False, "schema": {"type": "integer"}},
                    ],
                    "responses": {
                        "200": {"description": "SSE stream", "content": _SSE},
                        "204": {"description": "Already finished: stop reconnecting"},
                        **_errors(404, 429),
                    },
                }
            },
            "/api/chat/messages/{message_id}": {
                "delete": {
                    **_op(
                        "Stop a generation (same capability as the stream); 202 with where it stands",
                        {
                            "type": "object",
                            "required": ["message_id", "status"],
                            "properties": {
                                "message_id": {"type": "string", "format": "uuid"},
                                "status": {"enum": ["cancelled", "cancelling", "finished"]},
                            },
                        },
                        status=202,
                        errors=(400, 404, 429),
                    ),
                    "parameters": [{"name": "message_id", **_UUID_PARAM}, _CAP],
                }
            },
            "/api/sessions": {
                "get": {
                    **_op("A signed-in reader's sessions, newest first", _OBJECT, errors=(401, 429, 503)),
                    "security": [{"bearer": []}],
                }
            },
            "/api/sessions/{session_id}/messages": {
                "get": {
                    **_op(
                        "A session's messages with citations, oldest first", _OBJECT, errors=(400, 401, 404, 429, 503)
                    ),
                    "parameters": [
                        {"name": "session_id", **_UUID_PARAM},
                        _SESSION_TOKEN,
                        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer"}},
                        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
                    ],
                }
            },
            "/api/sessions/{session_id}": {
                "delete": {
                    "summary": "Delete a session and everything in it",
                    "parameters": [{"name": "session_id", **_UUID_PARAM}, _SESSION_TOKEN],
                    "responses": {"204": {"description": "Deleted"}, **_errors(401, 404, 429, 503)},
                }
            },
            "/api/messages/{message_id}/feedback": {
                "post": {
                    **_op("Rate an answer; the last rating wins", _OBJECT, errors=(400, 401, 404, 413, 429, 503)),
                    "parameters": [{"name": "message_id", **_UUID_PARAM}, _SESSION_TOKEN],
                    "requestBody": {
                        "required": True,
                        "content": _json({"$ref": "#/components/schemas/FeedbackRequest"}),
                    },
                }
            },
            "/api/modules": {"get": _op("Modules and chapters in the index", _OBJECT, errors=(429, 503))},
            "/api/faq": {"get": _op("The static FAQ", _OBJECT, errors=(429,))},
            "/api/admin/report": {
                "get": {
                    **_op(
                        "The authors' report: gap topics and use figures (ADMIN_TOKEN; 404 when it is unset)",
                        _OBJECT,
                        errors=(400, 401, 404, 503),
                    ),
                    "parameters": [
                        {
                            "name": "since",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string", "pattern": "^[0-9]{1,4}d?$", "default": "30d"},
                        }
                    ],
                    "security": [{"admin": []}],
                }
            },
            "/openapi.json": {"get": _op("This document", _OBJECT, errors=())},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text exposition format); not rate limited",
                    "responses": {
                        "200": {
                            "description": "Every metric of this process, or of every worker with a multiprocess dir",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
    }


def _chat_body() -> dict[str, Any]:
    return {"required": True, "content": _json({"$ref": "#/components/schemas/ChatRequest"})}


def _op(summary: str, schema: dict[str, Any] | None, *, status: int = 200, errors: tuple[int, ...]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": summary}
    if schema is not None:
        ok["content"] = _json(schema)
    return {"summary": summary, "responses": {str(status): ok, **_errors(*errors)}}
