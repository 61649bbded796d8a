"""The authors' report: gaps grouped by meaning, use figures, purge keeping numbers not words, operator-only routes."""

from __future__ import annotations

import json
import random
import stat
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest

from tests.conftest import ROOT, Chat, copy_index
from tests.report_data import BREAD, FOOTBALL, MONEY, Asked, insert, reader_month
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import LocalEmbedder
from textbook_chat.reports import questions, report, report_views, retention
from textbook_chat.search.retrieval import Retriever
from textbook_chat.store.sessions import Store
from textbook_chat.web.services import open_services

ADMIN_TOKEN = "operator-" + "x" * 24


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> LocalEmbedder:
    return LocalEmbedder(tmp_path_factory.mktemp("embedder"))


def _seed(url: str, asked: list[Asked]) -> None:
    with psycopg.connect(url) as conn:
        insert(conn, asked)


async def _build(store: Store, embedder: LocalEmbedder, **kwargs: object) -> report.Report:
    async with store.connection(timeout_s=120) as conn:
        return await report.build(conn, embedder, **kwargs)  # type: ignore[arg-type]


def _subject(text: str) -> str:
    lowered = text.lower()
    for name, base in (("bread", BREAD), ("football", FOOTBALL), ("money", MONEY)):
        if any(q.lower() in lowered for q in base) or any(q[1:].lower() in lowered for q in base):
            return name
    return "book"


@pytest.mark.slow
async def test_three_declined_subjects_come_out_as_three_topics_largest_first(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    _seed(clean_db, reader_month(random.Random(7)))

    result = await _build(store, embedder)

    top = result.topics[:3]
    assert [t.questions for t in top] == [30, 20, 12]
    assert [{_subject(e) for e in t.examples} for t in top] == [{"bread"}, {"football"}, {"money"}]
    assert all(t.declined == t.questions for t in top)
    assert "bread" in top[0].label or "sourdough" in top[0].label
    assert all(len(t.examples) == 3 and len(set(t.examples)) == 3 for t in top)
    assert all(sum(t.trend) == t.questions and len(t.trend) == 30 for t in top)
    # The thumbs-down book answers are gaps too, in smaller topics of their own.
    rated_down = [t for t in result.topics if t.rated_down]
    assert rated_down and all(t.questions < 12 for t in rated_down)
    assert result.gaps == 62 + sum(t.rated_down for t in rated_down)


async def test_use_figures_count_every_question_by_day_module_level_and_mode(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    asked = reader_month(random.Random(3))
    _seed(clean_db, asked)

    result = await _build(store, embedder)

    assert result.questions == len(asked) == sum(q for _, q, _ in result.per_day)
    assert result.levels["declined"] == 62
    assert result.levels["high"] + result.levels["medium"] == 200
    assert result.selection == sum(a.mode == "selection" for a in asked)
    modules = {m.module: m for m in result.modules}
    assert modules[""].questions == sum(a.module is None for a in asked)
    assert sum(m.up for m in result.modules) == sum(a.feedback == "up" for a in asked)
    given = Counter(c for a in asked for c in a.cites)  # each answer cited its one source as [1]
    assert len(result.cited) == min(10, len(given))
    assert [n for *_, n in result.cited] == sorted(given.values(), reverse=True)[:10]


async def test_a_source_listed_but_never_cited_does_not_count_as_cited(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    _seed(clean_db, [Asked("What is ZMP?", cites=(("ZMP", "https://b/zmp", "m"), ("Gait", "https://b/gait", "m")))])
    with psycopg.connect(clean_db) as conn:
        conn.execute("UPDATE chat_messages SET content = 'Only [1] here.' WHERE role = 'assistant'")

    result = await _build(store, embedder)

    assert result.cited == [("ZMP", "https://b/zmp", "m", 1)]


async def test_examples_come_only_from_sessions_inside_retention(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    old = [Asked(q, model="decline", confidence=0.1, days_ago=20, idle_days=20) for q in BREAD]
    recent = [Asked("Which yeast should I buy for baking bread?", model="decline", confidence=0.1, days_ago=1)]
    _seed(clean_db, old + recent)

    result = await _build(store, embedder, retention_days=10)

    (topic,) = result.topics
    assert topic.questions == 11
    assert topic.examples == ["Which yeast should I buy for baking bread?"]


async def test_the_report_never_carries_ids_tokens_or_addresses(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    _seed(clean_db, reader_month(random.Random(1))[:120])
    with psycopg.connect(clean_db) as conn:
        conn.execute("UPDATE chat_sessions SET user_id = 'reader@example.org', metadata = '{\"ip\": \"203.0.113.9\"}'")
        secrets = {str(v) for (v,) in conn.execute("SELECT id FROM chat_sessions UNION SELECT id FROM chat_messages")}

    result = await _build(store, embedder)
    rendered = json.dumps(result.to_json()) + report_views.html(result) + report_views.text(result)

    assert not [s for s in secrets if s in rendered]
    assert "reader@example.org" not in rendered and "203.0.113.9" not in rendered and "'h'" not in rendered


@pytest.mark.slow
async def test_closest_sections_point_into_the_book(
    store: Store, clean_db: str, embedder: LocalEmbedder, demo_index_dir: Path, tmp_path: Path
) -> None:
    _seed(clean_db, [Asked(q, model="decline", confidence=0.1) for q in BREAD])
    settings = Settings.from_env({"DATA_DIR": str(copy_index(demo_index_dir, tmp_path / "d")), "EMBEDDER": "local"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        retriever = Retriever(services.index, services.embedder)
        result = await _build(store, embedder, retriever=retriever)

    assert result.topics[0].sections
    assert all(s.url.startswith(settings.book_base_url + "/docs/") for s in result.topics[0].sections)


async def test_vectors_are_computed_once_and_cached(store: Store, clean_db: str, embedder: LocalEmbedder) -> None:
    _seed(clean_db, [Asked(q, model="decline", confidence=0.1) for q in FOOTBALL])

    await _build(store, embedder)
    with psycopg.connect(clean_db) as conn:
        (cached,) = conn.execute("SELECT count(*) FROM question_vectors").fetchone() or (0,)
    again = await _build(store, embedder)

    assert cached == len(FOOTBALL)
    assert again.topics[0].questions == len(FOOTBALL)


async def test_purge_keeps_the_numbers_and_the_trend_but_not_the_words(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    old = [Asked(q, model="decline", confidence=0.1, days_ago=12, idle_days=12) for q in BREAD + FOOTBALL]
    old += [Asked("What is the Zero Moment Point?", module="01-foundations", days_ago=12, idle_days=12)]
    recent = [Asked("How hot should the oven be for sourdough bread?", model="decline", confidence=0.1, days_ago=1)]
    _seed(clean_db, old + recent)
    before = await _build(store, embedder)

    async def fold(conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> None:
        await retention.fold(conn, embedder, ids)

    purged = await store.purge(retention_days=10, before_delete=fold)
    after = await _build(store, embedder)

    assert purged == len(old)
    assert after.questions == before.questions and after.gaps == before.gaps
    assert [d for d in after.per_day if d[1]] == [d for d in before.per_day if d[1]]
    assert sorted(t.questions for t in after.topics) == sorted(t.questions for t in before.topics)
    bread = next(t for t in after.topics if t.questions == len(BREAD) + 1)
    assert bread.examples == ["How hot should the oven be for sourdough bread?"]  # the purged words are gone
    football = next(t for t in after.topics if t.questions == len(FOOTBALL))
    assert football.purged_only and football.examples == []
    with psycopg.connect(clean_db) as conn:
        kept = json.dumps([list(map(str, row)) for row in conn.execute("SELECT * FROM gap_topics").fetchall()])
        kept += json.dumps([list(map(str, r)) for r in conn.execute("SELECT * FROM question_days").fetchall()])
    assert not [q for q in BREAD + FOOTBALL if q.lower()[:30] in kept.lower()]


async def test_a_second_purge_adds_to_the_topics_the_first_one_kept(
    store: Store, clean_db: str, embedder: LocalEmbedder
) -> None:
    async def fold(conn: psycopg.AsyncConnection[Any], ids: list[uuid.UUID]) -> None:
        await retention.fold(conn, embedder, ids)

    _seed(clean_db, [Asked(q, model="decline", confidence=0.1, days_ago=15, idle_days=15) for q in FOOTBALL])
    await store.purge(retention_days=10, before_delete=fold)
    _seed(clean_db, [Asked(q, model="decline", confidence=0.1, days_ago=14, idle_days=14) for q in FOOTBALL[:4]])
    await store.purge(retention_days=10, before_delete=fold)

    with psycopg.connect(clean_db) as conn:
        topics = conn.execute("SELECT count(*) FROM gap_topics").fetchone()
        counted = conn.execute("SELECT sum(questions) FROM gap_topic_days").fetchone()
    assert topics == (1,) and counted == (len(FOOTBALL) + 4,)


def test_period_parsing_accepts_days_and_refuses_the_rest() -> None:
    assert report.period_days("30d") == 30 and report.period_days("7") == 7
    for bad in ("0d", "30w", "²d", "99999d", "", "-3d"):
        with pytest.raises(ValueError):
            report.period_days(bad)


def test_the_gap_reasons_follow_the_stored_answer() -> None:
    assert questions.gap_reasons("decline", 0.1, None) == ("declined",)
    assert questions.gap_reasons("extractive", 0.25, "down") == ("low", "rated_down")
    assert questions.gap_reasons("extractive", 0.8, None) == ()
    assert questions.gap_reasons(None, None, None) == ()


# -- operator routes -------------------------------------------------------------------------------


@pytest.fixture
async def admin(chat_server: Chat, clean_db: str) -> AsyncIterator[httpx.AsyncClient]:
    _seed(clean_db, reader_month(random.Random(5))[:60] + [Asked(q, model="decline", confidence=0.1) for q in BREAD])
    async with chat_server(ADMIN_TOKEN=ADMIN_TOKEN, AUTH_JWT_SECRET="s" * 32) as (client, _):
        yield client


@pytest.mark.slow
async def test_the_report_routes_answer_only_the_admin_token(admin: httpx.AsyncClient) -> None:
    reply = await admin.post("/api/chat/messages", json={"question": "What is ZMP?"})
    reader_token = reply.json()["session_token"]
    user_jwt = jwt.encode({"sub": "reader", "exp": datetime.now(UTC) + timedelta(hours=1)}, "s" * 32, "HS256")
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": f"Bearer {user_jwt}"},
        {"Authorization": f"Bearer {reader_token}", "X-Session-Token": reader_token},
        {"Authorization": ADMIN_TOKEN},  # no scheme
    ):
        for path in ("/api/admin/report", "/admin/report"):
            denied = await admin.get(path, headers=headers)
            assert denied.status_code == 401, (path, headers)
            assert denied.json()["error"]["code"] == "unauthorized"

    allowed = await admin.get("/api/admin/report?since=7d", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    page = await admin.get("/admin/report", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    bad = await admin.get("/api/admin/report?since=forever", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})

    assert allowed.status_code == 200 and allowed.headers["cache-control"] == "no-store"
    body = allowed.json()
    assert body["since"] == (datetime.now(UTC).date() - timedelta(days=6)).isoformat()
    assert body["topics"][0]["questions"] >= len(BREAD) and body["topics"][0]["sections"]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "What the book does not answer" in page.text and "<script" not in page.text
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "validation_error"


@pytest.mark.slow
async def test_the_report_page_allows_no_script_no_framing_and_no_sniffing(admin: httpx.AsyncClient) -> None:
    page = await admin.get("/admin/report", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert page.status_code == 200
    policy = {d.split()[0]: d.split()[1:] for d in page.headers["content-security-policy"].split("; ")}
    assert policy["default-src"] == ["'none'"] and policy["style-src"] == ["'unsafe-inline'"]
    assert policy["frame-ancestors"] == ["'none'"] and "script-src" not in policy
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"


async def test_a_trailing_slash_redirects_relatively_whatever_the_host_header_says(admin: httpx.AsyncClient) -> None:
    forged = {"Host": "evil.example", "Authorization": f"Bearer {ADMIN_TOKEN}"}
    slash = await admin.get("/admin/report/?since=7d", headers=forged)
    assert slash.status_code == 307 and slash.headers["location"] == "/admin/report?since=7d"
    health = await admin.get("/health/", headers={"Host": "evil.example"})
    assert health.status_code == 307 and health.headers["location"] == "/health"
    missing = await admin.get("/no-such-page/", headers={"Host": "evil.example"})
    assert missing.status_code == 404 and "location" not in missing.headers


async def test_without_an_admin_token_the_report_routes_do_not_exist(chat_server: Chat) -> None:
    async with chat_server() as (client, _):
        for path in ("/api/admin/report", "/admin/report"):
            missing = await client.get(path, headers={"Authorization": "Bearer anything-at-all-here"})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_a_short_admin_token_is_refused_at_start() -> None:
    from textbook_chat.core.settings import SettingsError

    with pytest.raises(SettingsError, match="ADMIN_TOKEN is too short"):
        Settings.from_env({"ADMIN_TOKEN": "short"})


# -- the command -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_report_command_prints_a_table_and_writes_html_and_json(clean_db: str, tmp_path: Path) -> None:
    _seed(clean_db, [Asked(q, model="decline", confidence=0.1) for q in MONEY] + reader_month(random.Random(2))[:40])
    env = {"DATABASE_URL": clean_db, "DATA_DIR": str(tmp_path / "empty"), "PATH": "/usr/bin:/bin"}

    result = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "report", "--since", "30d", "--html", str(tmp_path / "r.html"),
         "--json", str(tmp_path / "r.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, umask=0o022,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    # Readers' questions: the files are the operator's alone under the usual umask.
    assert [stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("r.html", "r.json")] == [0o600, 0o600]
    assert "What readers ask that the book does not answer" in result.stdout
    assert "mortgage" in result.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["questions"] == len(MONEY) + 40 and data["topics"][0]["questions"] == len(MONEY)
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")


@pytest.mark.slow
def test_the_report_command_refuses_a_bad_period_in_one_line(clean_db: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "report", "--since", "a fortnight"],
        cwd=ROOT, env={"DATABASE_URL": clean_db, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--since" in result.stderr


@pytest.mark.slow
def test_the_report_command_shows_readers_terminal_escapes_without_obeying_them(clean_db: str, tmp_path: Path) -> None:
    hostile = [
        "How do I fix a mortgage rate?\x1b]0;PWNED\x07\x1b[2J",
        "Should I remortgage? \u202eetavirp si siht",
        "What deposit do I need\x9b31m for a mortgage?\r\noverwritten line",
    ]
    _seed(clean_db, [Asked(q, model="decline", confidence=0.1) for q in hostile + MONEY])
    env = {"DATABASE_URL": clean_db, "DATA_DIR": str(tmp_path / "empty"), "PATH": "/usr/bin:/bin"}

    result = subprocess.run(
        [sys.executable, "-m", "textbook_chat", "report", "--since", "30d"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    unsafe = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) != "\n"} | {"\u202e", "\u2028"}
    assert not unsafe & set(result.stdout), [c for c in result.stdout if c in unsafe]
    escaped = ("\\x1b]0;PWNED\\x07\\x1b[2J", "\\u202eetavirp", "\\x9b31m for a mortgage?\\x0d\\x0aoverwritten")
    assert any(form in result.stdout for form in escaped)  # shown, as visible escapes


def test_the_terminal_table_escapes_every_control_character_and_bidi_mark() -> None:
    topic = report.Topic(
        label="mortgage\x1b[2J", questions=1, declined=1, low=0, rated_down=0,
        examples=["a\u202eb", "c\x07d\ne"], sections=[], trend=[1],
    )  # fmt: skip
    fake = report.Report(
        generated_at=datetime.now(UTC), since=date(2026, 1, 1), until=date(2026, 1, 31), questions=1, gaps=1,
        selection=0, per_day=[], modules=[], levels={"declined": 1}, cited=[], topics=[topic],
    )  # fmt: skip
    rendered = report_views.text(fake)
    assert "mortgage\\x1b[2J" in rendered and "a\\u202eb" in rendered and "c\\x07d\\x0ae" in rendered
    assert "\x1b" not in rendered and "\u202e" not in rendered and "\x07" not in rendered
