"""Operator routes: the authors' report as JSON (``/api/admin/report``) and as a page (``/admin/report``).

They answer only ``Authorization: Bearer $ADMIN_TOKEN`` (compared in constant time). With ADMIN_TOKEN
unset they do not exist (404), and a reader's session token or sign-in JWT never opens them (401).
"""

from __future__ import annotations

import asyncio
import hmac
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from textbook_chat.core.errors import BadRequest, NotFound, Unauthorized
from textbook_chat.web import api

if TYPE_CHECKING:
    from textbook_chat.reports.report import Report

_REPORT_TIMEOUT_S = 120.0
_one_at_a_time = asyncio.Lock()  # a report reads every question of its period: never two at once per process


def routes() -> list[Route]:
    return [
        Route("/api/admin/report", report_json, methods=["GET"]),
        Route("/admin/report", report_page, methods=["GET"]),
    ]


async def report_json(request: Request) -> Response:
    result = await _report(request)  # report and its scikit-learn load on the first request, not with the app
    return JSONResponse(result.to_json(), headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})


async def report_page(request: Request) -> Response:
    from textbook_chat.reports import report_views

    result = await _report(request)
    return HTMLResponse(report_views.html(result), headers=_PAGE_HEADERS)


# The page is inline SVG and CSS with no script: a policy that allows nothing else costs it nothing, and stops a
# reader's text from ever running or loading anything there; no other site may frame it (issue 25).
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def _authorize(request: Request) -> None:
    token = api.services(request).settings.admin_token
    if token is None:
        raise NotFound("Not found.")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    expected = token.reveal().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise Unauthorized("This route needs the operator's ADMIN_TOKEN as a Bearer token.")


async def _report(request: Request) -> Report:
    from textbook_chat.reports import report

    _authorize(request)
    svc = api.services(request)
    store = api.require_store(request)
    assert svc.embedder is not None  # the server always opens retrieval
    try:
        days = report.period_days(request.query_params.get("since", "30d"))
    except ValueError as exc:
        raise BadRequest(f"since: {exc}", code="validation_error") from None
    retriever = svc.chat.retriever if svc.chat is not None else None
    async with _one_at_a_time, store.connection(timeout_s=_REPORT_TIMEOUT_S) as conn:
        return await report.build(
            conn, svc.embedder, days=days, retention_days=svc.settings.session_retention_days, retriever=retriever
        )
