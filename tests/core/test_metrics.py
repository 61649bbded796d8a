"""GET /metrics: the counters and histograms move with real chats, labels stay bounded, workers add up.

Metrics are process-wide, so in-process tests compare a scrape before and after; the multiprocess tests
run ``python -m textbook_chat serve`` and ``purge`` as subprocesses sharing one PROMETHEUS_MULTIPROC_DIR.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CLOSED_PORT_PG_URL, ROOT, TEST_REDIS_URL, Chat, copy_index
from tests.fake_openai import Behaviour
from tests.servers import server_process
from tests.sse_client import SSEEvent, events, of_type, read_all
from textbook_chat.core import metrics

QUESTION = "What does the Zero Moment Point tell a walking humanoid?"
OUT_OF_SCOPE = "What is the best recipe for sourdough bread with a crispy crust?"


class Scrape:
    """One /metrics exposition, read with prometheus-client's own parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sample's value, or 0 when the series does not exist yet."""
        found = [
            s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sum(found)

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


async def scrape(client: httpx.AsyncClient) -> Scrape:
    response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


def moved(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


async def ask(client: httpx.AsyncClient, question: str = QUESTION) -> list[SSEEvent]:
    return await read_all(client, "POST", "/api/chat", json={"question": question})


@pytest.mark.slow
async def test_a_chat_moves_requests_latency_confidence_and_token_metrics(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, _):
        before = await scrape(client)
        stream = await ask(client)
        after = await scrape(client)
    meta, done = stream[0].json(), of_type(stream, "done")[0]
    assert moved(before, after, "textbook_http_requests_total", route="/api/chat", method="POST", status="200") == 1
    assert moved(before, after, "textbook_answers_total", outcome="stop") == 1
    assert moved(before, after, "textbook_answer_seconds_count", outcome="stop") == 1
    assert moved(before, after, "textbook_first_token_seconds_count") == 1
    assert moved(before, after, "textbook_retrieval_seconds_count") == 1
    assert moved(before, after, "textbook_confidence_levels_total", level=meta["confidence_level"]) == 1
    usage = done["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert moved(before, after, "textbook_llm_tokens_total", kind="prompt") == usage["prompt_tokens"]
    assert moved(before, after, "textbook_llm_tokens_total", kind="completion") == usage["completion_tokens"]
    assert after.value("textbook_open_streams") == 0 and after.value("textbook_generations_in_progress") == 0


@pytest.mark.slow
async def test_a_stream_in_progress_shows_as_open_until_it_ends(chat_server: Chat) -> None:
    async with chat_server(llm=True) as (client, fake):
        fake.default = Behaviour(text=" ".join(["walking"] * 200), token_delay_s=0.02)
        async with client.stream("POST", "/api/chat", json={"question": QUESTION}) as response:
            async for event in events(response):
                if event.event == "token":
                    during = await scrape(client)
                    break
        await asyncio.sleep(0.2)  # let the server notice the disconnect (STREAM_GRACE_S then stops the answer)
        after = await scrape(client)
    assert during.value("textbook_open_streams") == 1 and during.value("textbook_generations_in_progress") == 1
    assert after.value("textbook_open_streams") == 0


@pytest.mark.parametrize(
    ("env", "script", "question", "expected"),
    [
        pytest.param(
            {},
            [Behaviour(status=500)],
            QUESTION,
            {("textbook_llm_retries_total", ""): 1, ("textbook_llm_errors_total", ""): 1},
            id="one failed attempt, then retried",
        ),
        pytest.param(
            {},
            [Behaviour(status=500), Behaviour(status=500)],
            QUESTION,
            {("textbook_llm_errors_total", ""): 2, ("textbook_fallbacks_total", "offline_generator"): 1},
            id="two failed attempts: the offline generator answers",
        ),
        pytest.param(
            {"QDRANT_URL": "http://127.0.0.1:1", "QDRANT_TIMEOUT_S": "0.5"},
            [],
            "How do I install ROS 2?",
            {("textbook_fallbacks_total", "faq"): 1},
            id="retrieval down: the FAQ answers",
        ),
        pytest.param(
            {"DATABASE_URL": CLOSED_PORT_PG_URL, "DB_TIMEOUT_S": "0.5"},
            [],
            QUESTION,
            {("textbook_fallbacks_total", "history"): 1},
            id="postgres down: history unavailable",
        ),
        pytest.param({}, [], OUT_OF_SCOPE, {("textbook_declines_total", ""): 1}, id="out of scope: declined"),
    ],
)
@pytest.mark.slow
async def test_fallbacks_declines_and_llm_failures_are_counted_by_kind(
    chat_server: Chat,
    env: dict[str, str],
    script: list[Behaviour],
    question: str,
    expected: dict[tuple[str, str], int],
) -> None:
    async with chat_server(llm=True, **env) as (client, fake):
        fake.then(*script)
        before = await scrape(client)
        await ask(client, question)
        after = await scrape(client)
    for (name, kind), delta in expected.items():
        labels = {"kind": kind} if kind else {}
        assert moved(before, after, name, **labels) == delta, name
    untouched = {"textbook_llm_errors_total", "textbook_declines_total"} - {name for name, _ in expected}
    for name in untouched:
        assert moved(before, after, name) == 0, name


@pytest.mark.slow
async def test_without_an_api_key_every_answer_counts_as_an_offline_fallback_not_an_llm_error(
    chat_server: Chat,
) -> None:
    async with chat_server(llm=False) as (client, _):
        before = await scrape(client)
        await ask(client)
        after = await scrape(client)
    assert moved(before, after, "textbook_fallbacks_total", kind="offline_generator") == 1
    assert moved(before, after, "textbook_llm_errors_total") == 0


@pytest.mark.slow
async def test_rate_limit_rejections_are_counted_and_metrics_are_never_rate_limited(chat_server: Chat) -> None:
    async with chat_server(llm=True, RATE_LIMIT_ANON="1/hour", RATE_LIMIT_READ="1/minute") as (client, _):
        before = await scrape(client)
        await ask(client)
        assert (await client.post("/api/chat", json={"question": QUESTION})).status_code == 429
        assert (await client.get("/api/faq")).status_code == 200
        assert (await client.get("/api/faq")).status_code == 429
        for _ in range(5):
            after = await scrape(client)
    assert moved(before, after, "textbook_rate_limit_rejections_total", limit="anon") == 1
    assert moved(before, after, "textbook_rate_limit_rejections_total", limit="read") == 1
    assert moved(before, after, "textbook_http_requests_total", route="/metrics", method="GET", status="200") == 5


async def test_requests_are_labelled_by_route_template_never_by_raw_path(chat_server: Chat) -> None:
    session_id, message_id = uuid.uuid4(), uuid.uuid4()
    async with chat_server(llm=True) as (client, _):
        assert (await client.get(f"/api/sessions/{session_id}/messages")).status_code == 404
        assert (await client.get(f"/api/chat/messages/{message_id}/stream?cap=x")).status_code == 404
        assert (await client.get(f"/no/such/{uuid.uuid4()}")).status_code == 404
        after = await scrape(client)
    routes = after.label_values("textbook_http_requests_total", "route")
    assert {"/api/sessions/{session_id}/messages", "/api/chat/messages/{message_id}/stream"} <= routes
    assert metrics.UNMATCHED_ROUTE in routes
    assert str(session_id) not in after.text and str(message_id) not in after.text and "/no/such" not in after.text


# -- several processes sharing PROMETHEUS_MULTIPROC_DIR ---------------------------------------------------


def _python(code: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, check=True, timeout=60)


def test_a_dead_processes_open_streams_drop_out_but_its_counters_still_count(tmp_path: Path) -> None:
    shared = tmp_path / "metrics"
    shared.mkdir()
    # A worker that dies without its shutdown (os._exit): its live gauge file is left behind.
    _python(
        "import os; from textbook_chat.core import metrics; metrics.OPEN_STREAMS.inc(); "
        "metrics.observe_request('/api/chat', 'POST', 200, 0.1); os._exit(0)",
        {"PROMETHEUS_MULTIPROC_DIR": str(shared)},
    )
    assert list(shared.glob("gauge_livesum_*.db"))
    body, _ = metrics.render(shared)
    exposition = Scrape(body.decode())
    assert exposition.value("textbook_open_streams") == 0
    assert exposition.value("textbook_http_requests_total", route="/api/chat", status="200") == 1
    assert not list(shared.glob("gauge_livesum_*.db"))


def _purge(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PROMETHEUS_MULTIPROC_DIR")}
    result = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "purge"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _old_sessions(database_url: str, count: int) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO chat_sessions (id, token_hash, last_activity_at) "
            "SELECT gen_random_uuid(), 'h', now() - interval '400 days' FROM generate_series(1, %s)",
            (count,),
        )


@pytest.mark.slow
async def test_with_a_shared_dir_the_server_sums_its_own_and_the_purge_jobs_metrics(
    demo_index_dir: Path, tmp_path: Path, clean_db: str
) -> None:
    shared = tmp_path / "metrics"
    env = {"DATABASE_URL": clean_db, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    _old_sessions(clean_db, 3)
    assert _purge(env).startswith("purged 3 session(s)")  # a run from before this server started
    server_env = {**env, "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "data")), "EMBEDDER": "local"}
    async with asyncio.timeout(120):
        async with (
            server_process(server_env, tmp_path / "server.log") as (_, url),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            fresh = await scrape(client)
            await ask(client)
            _old_sessions(clean_db, 2)
            assert _purge(env).startswith("purged 2 session(s)")
            after = await scrape(client)
    assert fresh.value("textbook_purged_sessions_total") == 0  # serve starts from an emptied directory
    assert after.value("textbook_purged_sessions_total") == 2 and after.value("textbook_purge_runs_total") == 1
    assert after.value("textbook_http_requests_total", route="/api/chat", method="POST", status="200") == 1
    assert after.value("textbook_answers_total") == 1


@pytest.mark.slow
async def test_two_workers_write_to_one_dir_and_any_of_them_reports_the_sum(tmp_path: Path) -> None:
    shared = tmp_path / "metrics"
    # Qdrant on a closed port: the workers start anyway (the FAQ answers), which is all this needs.
    env = {
        "REDIS_URL": TEST_REDIS_URL,
        "QDRANT_URL": "http://127.0.0.1:1",
        "QDRANT_TIMEOUT_S": "0.5",
        "EMBEDDER": "local",
        "DATA_DIR": str(tmp_path / "data"),
        "RATE_LIMIT_READ": "10000/minute",
        "PROMETHEUS_MULTIPROC_DIR": str(shared),
    }
    async with asyncio.timeout(120):
        async with (
            server_process(env, tmp_path / "server.log", "--workers", "2") as (process, url),
            # A new connection per request, so the kernel spreads them over both workers.
            httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as client,
        ):
            for _ in range(40):
                assert (await client.get("/api/faq")).status_code == 200
            totals = [(await scrape(client)).value("textbook_http_requests_total", route="/api/faq") for _ in range(4)]
            writers = {path.stem.rsplit("_", 1)[1] for path in shared.glob("counter_*.db")}
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.wait, 30)
    assert totals == [40] * 4  # the same sum whichever worker answers the scrape
    assert len(writers) == 2
    assert not list(shared.glob("gauge_live*.db"))  # each worker marked itself dead on the way out
