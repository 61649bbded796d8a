"""The chat panel in a real browser (Debian's chromium via playwright-core) against the real server.

Each test starts the app on a socket with a fresh copy of the demo book's index, the fake OpenAI server
and Postgres, then runs one scenario script from ``tests/e2e/``; screenshots go to ``test-output/e2e/``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from server.app import create_app
from server.settings import Settings
from tests.conftest import DEMO_BOOK, ROOT, demo_env
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import serving

E2E = ROOT / "tests" / "e2e"
OUTPUT = ROOT / "test-output" / "e2e"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
FRONTEND = ROOT / "frontend"
SCENARIO_TIMEOUT_S = 90
PAGE_JS_BUDGET_GZIP = 200 * 1024
ANSWER = (
    "The Zero Moment Point is the point on the ground where the net moment of gravity and inertia has no "
    "horizontal component [1]. While it stays inside the support polygon the foot does not tip, so a walking "
    "controller plans the centre of mass to keep it there [2]. A feedback loop corrects the drift on top [1]."
)


def _require_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing and scripts/setup.sh could not install Debian's chromium "
            "(apt-get install -y chromium); the browser tests need it"
        )
    missing = [
        what
        for what, ok_ in (
            ("node on PATH", shutil.which("node") is not None),
            (
                "frontend/node_modules/playwright-core (scripts/setup.sh runs npm ci)",
                (FRONTEND / "node_modules" / "playwright-core").is_dir(),
            ),
            (
                "frontend/dist/manifest.json (scripts/setup.sh runs npm run build)",
                (FRONTEND / "dist" / "manifest.json").is_file(),
            ),
        )
        if not ok_
    ]
    if missing:
        pytest.fail("the browser tests need " + ", ".join(missing))


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the test runner owns the signals
        pass


@asynccontextmanager
async def book_server(env: dict[str, str], *, ingest: bool = True) -> AsyncIterator[str]:
    """The app on a socket whose address is known before start-up, so BOOK_BASE_URL can be the server itself:
    citation links then land on its own rendering of the demo book (ingested at start with that base URL)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    values = {**env, "BOOK_BASE_URL": base_url, "ALLOWED_ORIGINS": base_url}
    settings = Settings.from_env({**values, "BOOK_PATH": str(DEMO_BOOK)} if ingest else values)
    config = uvicorn.Config(create_app(settings), log_config=None, lifespan="on", timeout_graceful_shutdown=2)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.02)
        yield base_url
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, timeout=10)
        finally:
            sock.close()


Stack = Callable[..., AbstractAsyncContextManager[tuple[str, FakeOpenAI]]]


@pytest.fixture
def stack(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> Stack:
    """``async with stack(**env) as (base_url, fake)``: server + fake model + Postgres + the demo index."""
    _require_browser()

    @asynccontextmanager
    async def start(*, ingest: bool = True, **env: str) -> AsyncIterator[tuple[str, FakeOpenAI]]:
        fake = FakeOpenAI(default=ok(ANSWER, token_delay_s=0.03))
        async with serving(fake.app()) as llm_url:
            values = {
                **demo_env(demo_index_dir, tmp_path, clean_db, llm_url),
                "LOG_LEVEL": "warning",
                "RATE_LIMIT_ANON": "100/hour",
                "STREAM_GRACE_S": "0",
                **env,
            }
            async with book_server(values, ingest=ingest) as base_url:
                yield base_url, fake

    return start


async def run_scenario(name: str, base_url: str) -> dict[str, Any]:
    """Run ``tests/e2e/{name}.mjs`` in node against ``base_url``; its last stdout line is a JSON report."""
    env = {**os.environ, "E2E_BASE_URL": base_url, "E2E_OUTPUT_DIR": str(OUTPUT), "CHROMIUM": str(CHROMIUM)}
    process = await asyncio.create_subprocess_exec(
        "node", str(E2E / f"{name}.mjs"), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), SCENARIO_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    out, err = stdout.decode(), stderr.decode()
    assert process.returncode == 0, f"{name}.mjs failed (screenshots in {OUTPUT}):\n{err}\n{out}"
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


async def test_a_reader_asks_sees_the_answer_stream_follows_a_citation_and_gets_history_back(
    stack: Stack, clean_db: str
) -> None:
    async with stack() as (base_url, fake):
        report = await run_scenario("ask", base_url)
    assert report["href"].startswith(f"{base_url}/docs/")
    assert [r["question"] for r in report["requests"]] == ["What does the Zero Moment Point tell a walking humanoid?"]
    assert len(fake.requests) == 1
    assert report["cited"] == [1, 2] and report["related"] >= 1  # the demo search finds more than it cites
    import psycopg

    with psycopg.connect(clean_db) as conn:
        rated = conn.execute(
            "SELECT feedback, feedback_comment FROM chat_messages WHERE feedback IS NOT NULL"
        ).fetchall()
    # The conversation was deleted at the end of the scenario, so nothing is left, rating included.
    assert rated == []


async def test_selected_text_is_asked_about_in_selection_mode(stack: Stack) -> None:
    async with stack() as (base_url, _):
        report = await run_scenario("selection", base_url)
    [request] = report["requests"]
    assert "Zero Moment Point" in request["selected_text"]
    assert request["question"] == "Explain this in simpler words."


async def test_switching_module_sends_it_and_off_topic_questions_are_declined(stack: Stack) -> None:
    async with stack() as (base_url, _):
        report = await run_scenario("module", base_url)
    assert [r.get("module") for r in report["requests"]] == ["02-ros2", None]
    assert set(report["notices"]) & {"scope_widened", "scope_partial", "scope_limited"}


async def test_stop_cancels_a_generation(stack: Stack, clean_db: str) -> None:
    long_answer = " ".join(f"word{i}" for i in range(300)) + " [1]."
    async with stack() as (base_url, fake):
        fake.default = ok(long_answer, token_delay_s=0.03)
        report = await run_scenario("stop", base_url)
    assert 0 < report["length"] < len(long_answer) // 2
    assert fake.streams_completed == 0


async def test_a_reload_mid_answer_follows_the_answer_to_its_end(stack: Stack, clean_db: str) -> None:
    long_answer = " ".join(f"word{i}" for i in range(150)) + " [1]."
    # The default grace (not the suite's 0): an answer outlives its reader's reload by STREAM_GRACE_S.
    async with stack(STREAM_GRACE_S="20") as (base_url, fake):
        fake.default = ok(long_answer, token_delay_s=0.03)  # 4.5 s: the reload lands mid-answer
        report = await run_scenario("reload", base_url)
    assert report["text"].startswith("word0 word1") and "word149" in report["text"]  # the whole answer, once
    assert report["text"].count("word1 ") == 1
    assert len(fake.requests) == 1  # followed, not asked again


async def test_faq_answers_when_retrieval_is_down_and_429_says_when_to_ask_again(stack: Stack) -> None:
    down = {"QDRANT_URL": "http://127.0.0.1:1", "QDRANT_TIMEOUT_S": "0.5", "RATE_LIMIT_ANON": "2/hour"}
    async with stack(ingest=False, **down) as (url, fake):  # nothing to ingest into: the index is unreachable
        report = await run_scenario("faq", url)
    assert fake.requests == []
    assert "You can ask again" in report["message"]


async def test_the_demo_page_loads_under_200_kb_of_gzipped_javascript(stack: Stack) -> None:
    async with stack() as (base_url, _), httpx.AsyncClient(base_url=base_url) as client:
        page = (await client.get("/")).text
        scripts = [src for src in _script_sources(page)]
        sizes = [len(gzip.compress((await client.get(src)).content, 9)) for src in scripts]
    assert scripts and sum(sizes) < PAGE_JS_BUDGET_GZIP, sizes


def _script_sources(page: str) -> list[str]:
    import re

    return re.findall(r'<script[^>]*\bsrc="([^"]+)"', page)


async def test_the_authors_report_page_reads_well_in_light_and_dark(
    stack: Stack, clean_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    import psycopg

    from tests.report_data import insert, reader_month

    with psycopg.connect(clean_db) as conn:
        insert(conn, reader_month(random.Random(11)))
    token = "report-" + "t" * 24
    monkeypatch.setenv("E2E_ADMIN_TOKEN", token)
    async with stack(ADMIN_TOKEN=token, ingest=False) as (base_url, _):
        report = await run_scenario("report", base_url)
    assert report["light"]["topics"] >= 3
    assert report["light"]["background"] != report["dark"]["background"]
    assert report["light"]["ink"] != report["dark"]["ink"]
    assert (OUTPUT / "report-light.png").stat().st_size > 10_000


async def test_the_reader_keeps_their_scroll_position_and_long_words_wrap(stack: Stack) -> None:
    long_answer = "\n\n".join(" ".join(f"w{p}x{i}" for i in range(40)) + f" [{1 + p % 2}]." for p in range(12))
    async with stack() as (base_url, fake):
        fake.default = ok(long_answer, token_delay_s=0.01)
        report = await run_scenario("scroll", base_url)
    assert report["kept"] < 5 and report["gap"] < 30


async def test_on_a_phone_the_panel_fills_the_screen_and_its_menu_fits(stack: Stack) -> None:
    async with stack() as (base_url, _):
        report = await run_scenario("phone", base_url)
    assert report["panel"]["width"] == 390
