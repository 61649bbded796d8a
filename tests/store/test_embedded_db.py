"""With DATABASE_URL unset, ``serve`` keeps history in a private PostgreSQL in DATA_DIR; it stops with the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ROOT, copy_index
from tests.servers import server_process


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    return {"DATA_DIR": str(data_dir), "EMBEDDER": "local", "LOG_FORMAT": "text", "DATABASE_URL": "", **extra}


def _postgres_of(data_dir: Path) -> list[psutil.Process]:
    folder = str((data_dir / "postgres").resolve())
    found = []
    for process in psutil.process_iter(attrs=["name", "cmdline"]):
        if process.info["name"] == "postgres" and folder in " ".join(process.info["cmdline"] or ()):
            found.append(process)
    return found


async def _ask(url: str) -> tuple[str, str]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        started = (await client.post("/api/chat/messages", json={"question": "What is the Zero Moment Point?"})).json()
        async with client.stream("GET", started["stream_url"]) as stream:
            async for _ in stream.aiter_lines():
                pass
        return started["session_id"], started["session_token"]


@pytest.mark.slow
async def test_the_default_run_keeps_history_across_a_restart_and_stops_its_postgres(
    demo_index_dir: Path, tmp_path: Path
) -> None:
    data = copy_index(demo_index_dir, tmp_path / "data")
    async with server_process(_env(data), tmp_path / "a.log") as (_, url):
        health = httpx.get(f"{url}/health").json()
        session_id, token = await _ask(url)
        assert health["services"]["postgres"] == "ok"
        assert _postgres_of(data)
    assert not _postgres_of(data), "the embedded Postgres stops with the server"
    assert "history: embedded PostgreSQL in" in (tmp_path / "a.log").read_text()

    async with server_process(_env(data), tmp_path / "b.log") as (_, url):
        history = httpx.get(f"{url}/api/sessions/{session_id}/messages", headers={"X-Session-Token": token})
    assert history.status_code == 200
    assert [m["role"] for m in history.json()["messages"]] == ["user", "assistant"]


@pytest.mark.slow
async def test_a_server_killed_outright_leaves_postgres_to_the_next_one_which_stops_it(
    demo_index_dir: Path, tmp_path: Path
) -> None:
    data = copy_index(demo_index_dir, tmp_path / "data")
    async with server_process(_env(data), tmp_path / "a.log") as (process, _):
        process.kill()
        process.wait()
    assert _postgres_of(data), "kill -9 leaves the embedded Postgres running"

    async with server_process(_env(data), tmp_path / "b.log") as (_, url):
        assert httpx.get(f"{url}/health").json()["services"]["postgres"] == "ok"
    assert not _postgres_of(data)


@pytest.mark.slow
async def test_embedded_postgres_off_means_history_off(demo_index_dir: Path, tmp_path: Path) -> None:
    data = copy_index(demo_index_dir, tmp_path / "data")
    async with server_process(_env(data, EMBEDDED_POSTGRES="off"), tmp_path / "s.log") as (_, url):
        health = httpx.get(f"{url}/health").json()
    assert health["services"]["postgres"] == "disabled"
    assert not (data / "postgres").exists()


@pytest.mark.slow
async def test_a_postgres_that_cannot_start_is_one_line_and_history_off(demo_index_dir: Path, tmp_path: Path) -> None:
    data = copy_index(demo_index_dir, tmp_path / "data")
    (data / "postgres").write_text("not a folder")
    async with server_process(_env(data), tmp_path / "s.log") as (_, url):
        health = httpx.get(f"{url}/health").json()
    log = (tmp_path / "s.log").read_text()
    assert health["services"]["postgres"] == "disabled"
    assert log.count("history is off: the embedded Postgres") == 1 and "Traceback" not in log


@pytest.mark.slow
async def test_report_and_purge_use_the_embedded_database_a_server_made(demo_index_dir: Path, tmp_path: Path) -> None:
    data = copy_index(demo_index_dir, tmp_path / "data")
    async with server_process(_env(data), tmp_path / "s.log") as (_, url):
        await _ask(url)
        # While the server runs, the report attaches to its Postgres (and leaves it running).
        during = subprocess.run(
            [sys.executable, "-m", "textbook_chat", "report"], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **_env(data)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert _postgres_of(data)
    after = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "purge"], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **_env(data)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert during.returncode == 0, during.stderr
    assert "questions            1" in during.stdout
    assert after.returncode == 0 and "purged 0 session(s)" in after.stdout
    assert not _postgres_of(data)


@pytest.mark.slow
def test_without_an_embedded_database_report_says_what_to_set(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "report"], cwd=ROOT, env={"PATH": "/usr/bin:/bin", **_env(tmp_path)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "DATABASE_URL is not set" in result.stderr
    assert not (tmp_path / "postgres").exists()
