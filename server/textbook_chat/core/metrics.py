"""Every Prometheus metric of the service, the helpers that record them, and ``GET /metrics``'s exposition.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve --workers N`` sets one up), every process writes its values
there and a scrape of any worker sums them all; without it, one process exposes its own registry.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess

# Label values are fixed sets (route templates, notice codes, finish reasons), never raw input:
# an unbounded label (a raw path, a message id) would grow the series without end. The web stage
# names the route template (web/app.py), or UNMATCHED_ROUTE when no route matched.
UNMATCHED_ROUTE = "<unmatched>"
FALLBACK_NOTICES = {"offline_generator": "offline_generator", "fallback_faq": "faq", "history_unavailable": "history"}
TOKEN_KINDS = ("prompt", "completion")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ANSWER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0, 120.0)

REQUESTS = Counter(
    "textbook_http_requests", "HTTP requests by route template, method and status", ["route", "method", "status"]
)
REQUEST_SECONDS = Histogram(
    "textbook_http_request_duration_seconds",
    "Time to the end of the response (for SSE routes: the whole stream)",
    ["route", "method"],
    buckets=_ANSWER_BUCKETS,
)
OPEN_STREAMS = Gauge("textbook_open_streams", "SSE responses open now", multiprocess_mode="livesum")
GENERATIONS = Gauge("textbook_generations_in_progress", "Answers being generated now", multiprocess_mode="livesum")
DRAINING = Gauge(
    "textbook_draining", "1 while the process refuses new questions before exiting", multiprocess_mode="livemax"
)
FIRST_TOKEN_SECONDS = Histogram(
    "textbook_first_token_seconds", "From the question to the first answer token", buckets=_ANSWER_BUCKETS
)
ANSWER_SECONDS = Histogram(
    "textbook_answer_seconds", "From the question to the end of the answer", ["outcome"], buckets=_ANSWER_BUCKETS
)
RETRIEVAL_SECONDS = Histogram(
    "textbook_retrieval_seconds", "Embedding plus vector search for one question", buckets=_LATENCY_BUCKETS
)
ANSWERS = Counter("textbook_answers", "Answers by how they ended (finish_reason, error or interrupted)", ["outcome"])
CONFIDENCE = Counter("textbook_confidence_levels", "Answers by retrieval confidence level", ["level"])
DECLINES = Counter("textbook_declines", "Questions declined as not covered by the book")
SECOND_OPINIONS = Counter(
    "textbook_second_opinions",
    "Questions the cross-encoder read, by what it changed (kept, declined, answered)",
    ["change"],
)
FALLBACKS = Counter("textbook_fallbacks", "Degraded answers by kind (offline_generator, faq, history)", ["kind"])
LLM_ERRORS = Counter("textbook_llm_errors", "Failed chat-model attempts (each retry or fallback follows one)")
LLM_RETRIES = Counter("textbook_llm_retries", "Chat-model attempts retried after a failure")
TOKENS = Counter("textbook_llm_tokens", "Chat-model tokens used", ["kind"])
RATE_LIMITED = Counter(
    "textbook_rate_limit_rejections", "Requests refused by a limit (anon, user, read, streams, token_budget)", ["limit"]
)
INTERRUPTED = Counter(
    "textbook_generations_interrupted", "Generations stopped before the end (client, abandoned, shutdown)", ["reason"]
)
RELAY_DROPPED = Counter(
    "textbook_relay_events_dropped",
    "Stream events not mirrored to Redis (queue_full, redis_error, bad_event): resume elsewhere falls back",
    ["reason"],
)
SOCKETS_CLOSED = Counter(
    "textbook_http_sockets_closed",
    "Connections closed before their request was whole (header_timeout, body_timeout, pending_cap, too_large, busy)",
    ["reason"],
)
PURGE_RUNS = Counter(
    "textbook_purge_runs", "Runs of `python -m textbook_chat purge` (counted here with a shared metrics dir)"
)
PURGED_SESSIONS = Counter("textbook_purged_sessions", "Sessions deleted by purge")

for _kind in FALLBACK_NOTICES.values():
    FALLBACKS.labels(_kind)
for _kind in TOKEN_KINDS:
    TOKENS.labels(_kind)
for _kind in ("queue_full", "redis_error", "bad_event"):
    RELAY_DROPPED.labels(_kind)
for _kind in ("header_timeout", "body_timeout", "pending_cap", "too_large", "busy"):
    SOCKETS_CLOSED.labels(_kind)


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """One HTTP request: ``route`` is its route template or ``UNMATCHED_ROUTE``, never a raw path."""
    REQUESTS.labels(route, method, str(status)).inc()
    REQUEST_SECONDS.labels(route, method).observe(seconds)


@contextlib.contextmanager
def open_stream() -> Iterator[None]:
    OPEN_STREAMS.inc()
    try:
        yield
    finally:
        OPEN_STREAMS.dec()


def notice(code: str) -> None:
    """Count what a reader-facing notice says about the system (fallbacks, model retries)."""
    kind = FALLBACK_NOTICES.get(code)
    if kind is not None:
        FALLBACKS.labels(kind).inc()
    if code == "llm_retry":
        LLM_RETRIES.inc()


def tokens(prompt: int, completion: int) -> None:
    TOKENS.labels("prompt").inc(prompt)
    TOKENS.labels("completion").inc(completion)


def purged(sessions: int) -> None:
    PURGE_RUNS.inc()
    PURGED_SESSIONS.inc(sessions)


# -- exposition and the multiprocess directory ---------------------------------------------------------


def render(multiproc_dir: Path | None) -> tuple[bytes, str]:
    """The exposition text and its content type; sums every process's files when ``multiproc_dir`` is set."""
    if multiproc_dir is None:
        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
    mark_dead_processes(multiproc_dir)
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry, path=str(multiproc_dir))  # type: ignore[no-untyped-call]
    return generate_latest(registry), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int, multiproc_dir: Path) -> None:
    """Drop a finished process's live gauges (its counters and histograms keep counting in the sum)."""
    _multiprocess.mark_process_dead(pid, str(multiproc_dir))  # type: ignore[no-untyped-call]


_LIVE_FILE = re.compile(r"^gauge_live\w+_(\d+)\.db$")


def mark_dead_processes(multiproc_dir: Path) -> list[int]:
    """Mark every process whose live-gauge files remain but which no longer runs (a crashed worker)."""
    dead: set[int] = set()
    for path in multiproc_dir.glob("gauge_live*.db"):
        match = _LIVE_FILE.match(path.name)
        if match is not None and not _alive(int(match.group(1))):
            dead.add(int(match.group(1)))
    for pid in dead:
        mark_process_dead(pid, multiproc_dir)
    return sorted(dead)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
