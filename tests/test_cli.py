"""The command line: help for every command, one-line errors, migrate and purge against real Postgres."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml  # type: ignore[import-untyped]

from tests.conftest import ROOT
from textbook_chat.cli import main


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        [sys.executable, "-m", "textbook_chat", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_command_in_the_readme_exists_and_has_help() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = set(re.findall(r"python -m textbook_chat (\w+)", readme))
    assert {"serve", "migrate", "purge"} <= commands
    for command in commands:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0, command


def test_a_bad_setting_is_one_line_and_exit_2() -> None:
    result = _run("purge", env={"RATE_LIMIT_ANON": "abc"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: RATE_LIMIT_ANON='abc' is not valid: expected a rate such as '10/hour' or '5 per minute'"
    ]


def test_purge_without_a_database_says_so_without_a_traceback() -> None:
    result = _run("purge")
    assert result.returncode == 2
    assert "DATABASE_URL is not set" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_migrate_and_purge_against_a_real_database(clean_db: str) -> None:
    assert _run("migrate", env={"DATABASE_URL": clean_db}).returncode == 0
    with psycopg.connect(clean_db) as conn:
        conn.execute(
            "INSERT INTO chat_sessions (id, token_hash, last_activity_at) "
            "SELECT gen_random_uuid(), 'h', now() - make_interval(days => g, hours => -12) "
            "FROM generate_series(1, 10) g"
        )
    result = _run("purge", "--days", "5", env={"DATABASE_URL": clean_db})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "purged 5 session(s) idle for more than 5 day(s)"


def test_the_compose_file_runs_migrations_the_app_and_a_daily_purge() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "qdrant", "app", "purge"} <= set(services)
    assert "python -m textbook_chat migrate" in " ".join(services["app"]["command"])
    assert "python -m textbook_chat purge" in " ".join(services["purge"]["command"])
    assert (ROOT / "Dockerfile").exists()


def test_ci_runs_the_readme_test_command() -> None:
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    first_block = (ROOT / "README.md").read_text().split("```")[1]
    assert "scripts/run.sh" in first_block and "scripts/test.sh" in first_block
    assert Path(ROOT / "scripts" / "test.sh").stat().st_mode & 0o111


def test_serve_refuses_several_workers_without_redis() -> None:
    result = _run("serve", "--workers", "2", env={"QDRANT_URL": "http://127.0.0.1:6333"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: --workers > 1 needs REDIS_URL: streams, resume and rate limits are shared through Redis"
    )
