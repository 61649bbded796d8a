"""Privacy and abuse: nobody reads another reader's chats, nobody runs up the bill, hostile input is harmless.

Real Postgres and Redis, the app on a real socket, the offline generator (no model is paid for here).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import jwt
import psycopg
import pytest
import redis

from tests.conftest import TEST_REDIS_URL, copy_index
from tests.servers import serving
from tests.sse_client import answer_text, read_all
from textbook_chat.core.settings import Settings
from textbook_chat.web.app import create_app
from textbook_chat.web.ratelimit import client_address

SECRET = "test-jwt-secret-that-is-long-enough-for-hs256"
QUESTION = "What is a ROS 2 topic?"

App = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


def token(sub: str, *, expires_in: int = 3600, secret: str = SECRET) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + expires_in}, secret, algorithm="HS256")


def bearer(sub: str, **kwargs: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(sub, **kwargs)}"}


@pytest.fixture
def app_server(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> App:
    redis.Redis.from_url(TEST_REDIS_URL).flushdb()

    @asynccontextmanager
    async def start(**env: str) -> AsyncIterator[httpx.AsyncClient]:
        values = {
            "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
            "DATABASE_URL": clean_db,
            "AUTH_JWT_SECRET": SECRET,
            "LOG_FORMAT": "text",
            **env,
        }
        async with (
            serving(create_app(Settings.from_env(values))) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as c,
        ):
            yield c

    return start


async def ask(client: httpx.AsyncClient, headers: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    stream = await read_all(client, "POST", "/api/chat", json={"question": QUESTION, **fields}, headers=headers)
    meta: dict[str, Any] = stream[0].json()
    meta["answer"] = answer_text(stream)
    return meta


def count_rows(database_url: str) -> tuple[int, int]:
    with psycopg.connect(database_url) as conn:
        sessions = conn.execute("SELECT count(*) FROM chat_sessions").fetchone()
        messages = conn.execute("SELECT count(*) FROM chat_messages").fetchone()
    assert sessions is not None and messages is not None
    return sessions[0], messages[0]


# -- history and ownership ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_session_token_reads_the_history_with_citations_oldest_first(app_server: App) -> None:
    async with app_server() as client:
        first = await ask(client)
        session = {"session_id": first["session_id"], "session_token": first["session_token"]}
        await ask(client, question="And what is a service?", **session)
        history = await client.get(
            f"/api/sessions/{first['session_id']}/messages", headers={"X-Session-Token": first["session_token"]}
        )
        page = await client.get(
            f"/api/sessions/{first['session_id']}/messages?limit=3", headers={"X-Session-Token": first["session_token"]}
        )
        rest = await client.get(
            f"/api/sessions/{first['session_id']}/messages",
            params={"after": page.json()["next"]},
            headers={"X-Session-Token": first["session_token"]},
        )
    assert history.status_code == 200 and "ratelimit-remaining" in history.headers
    messages = history.json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == QUESTION and messages[1]["content"] == first["answer"]
    assert messages[1]["citations"] and messages[1]["citations"][0]["url"].startswith("http://localhost:3000/docs/")
    assert [m["id"] for m in page.json()["messages"] + rest.json()["messages"]] == [m["id"] for m in messages]
    assert rest.json()["next"] is None


@pytest.mark.slow
async def test_a_signed_in_reader_lists_and_reads_their_sessions_from_any_device(app_server: App) -> None:
    async with app_server() as client:
        mine = await ask(client, headers=bearer("alice"))
        await ask(client, headers=bearer("bob"))
        listed = await client.get("/api/sessions", headers=bearer("alice"))
        history = await client.get(f"/api/sessions/{mine['session_id']}/messages", headers=bearer("alice"))
        anonymous_list = await client.get("/api/sessions")
    assert [s["id"] for s in listed.json()["sessions"]] == [mine["session_id"]]
    assert listed.json()["sessions"][0]["title"] == QUESTION
    assert history.status_code == 200 and len(history.json()["messages"]) == 2
    assert anonymous_list.status_code == 401


@pytest.mark.parametrize(
    "credentials",
    [
        {},
        {"X-Session-Token": "not-the-token"},
        {"Authorization": f"Bearer {token('mallory')}"},
        {"Authorization": f"Bearer {token('alice', secret='another-secret-of-enough-length-to-sign')}"},
    ],
    ids=["none", "wrong-token", "other-user", "forged-jwt"],
)
@pytest.mark.slow
async def test_another_readers_session_cannot_be_read_deleted_or_rated(
    app_server: App, clean_db: str, credentials: dict[str, str]
) -> None:
    async with app_server() as client:
        owner = await ask(client, headers=bearer("alice"))
        before = count_rows(clean_db)
        sid, mid = owner["session_id"], owner["message_id"]
        read = await client.get(f"/api/sessions/{sid}/messages", headers=credentials)
        delete = await client.delete(f"/api/sessions/{sid}", headers=credentials)
        rate = await client.post(f"/api/messages/{mid}/feedback", json={"rating": "down"}, headers=credentials)
        cont = await client.post(
            "/api/chat", json={"question": "hi", "session_id": sid, "session_token": "guess"}, headers=credentials
        )
    expected = 401 if "forged" in str(credentials) or credentials.get("Authorization", "").endswith("==") else None
    for response in (read, delete, rate, cont):
        assert response.status_code in ((401,) if expected else (401, 404)), response.text
        assert response.status_code == 401 or response.json()["error"]["code"] in ("not_found", "session_not_found")
    assert count_rows(clean_db) == before
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT feedback FROM chat_messages WHERE id = %s", (mid,)).fetchone() == (None,)


async def test_an_expired_or_malformed_token_is_a_401_not_an_anonymous_downgrade(app_server: App) -> None:
    async with app_server() as client:
        expired = await client.post("/api/chat", json={"question": QUESTION}, headers=bearer("alice", expires_in=-600))
        garbage = await client.get("/api/sessions", headers={"Authorization": "Bearer not.a.jwt"})
        wrong_scheme = await client.get("/api/sessions", headers={"Authorization": "Basic abc"})
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "token_expired"
    assert garbage.status_code == 401 and wrong_scheme.status_code == 401


@pytest.mark.slow
async def test_feedback_is_idempotent_and_the_last_rating_wins(app_server: App, clean_db: str) -> None:
    async with app_server() as client:
        meta = await ask(client)
        headers = {"X-Session-Token": meta["session_token"]}
        url = f"/api/messages/{meta['message_id']}/feedback"
        assert (await client.post(url, json={"rating": "up"}, headers=headers)).status_code == 200
        assert (await client.post(url, json={"rating": "up"}, headers=headers)).status_code == 200
        last = await client.post(url, json={"rating": "down", "comment": "too short"}, headers=headers)
    assert last.json() == {"message_id": meta["message_id"], "rating": "down", "comment": "too short"}
    with psycopg.connect(clean_db) as conn:
        row = conn.execute("SELECT feedback, feedback_comment FROM chat_messages WHERE id = %s", (meta["message_id"],))
        assert row.fetchone() == ("down", "too short")


@pytest.mark.slow
async def test_deleting_a_session_removes_its_messages_and_citations(app_server: App, clean_db: str) -> None:
    async with app_server() as client:
        meta = await ask(client)
        deleted = await client.delete(
            f"/api/sessions/{meta['session_id']}", headers={"X-Session-Token": meta["session_token"]}
        )
        again = await client.get(
            f"/api/sessions/{meta['session_id']}/messages", headers={"X-Session-Token": meta["session_token"]}
        )
    assert deleted.status_code == 204 and again.status_code == 404
    assert count_rows(clean_db) == (0, 0)
    with psycopg.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM source_citations").fetchone() == (0,)


# -- budgets ------------------------------------------------------------------------------------------


async def test_the_eleventh_question_in_the_window_gets_429_with_retry_after(app_server: App) -> None:
    async with app_server(MAX_STREAMS_PER_CLIENT="50") as client:
        answers = [await client.post("/api/chat/messages", json={"question": QUESTION}) for _ in range(10)]
        eleventh = await client.post("/api/chat/messages", json={"question": QUESTION})
        reads = await client.get("/api/faq")
    assert [a.status_code for a in answers] == [202] * 10
    assert [a.headers["ratelimit-remaining"] for a in answers] == [str(n) for n in range(9, -1, -1)]
    assert eleventh.status_code == 429 and eleventh.json()["error"]["code"] == "rate_limited"
    assert 3000 < int(eleventh.headers["retry-after"]) <= 3600
    assert eleventh.headers["ratelimit-limit"] == "10" and eleventh.headers["ratelimit-remaining"] == "0"
    assert reads.status_code == 200  # reading has its own budget


@pytest.mark.slow
async def test_two_workers_on_redis_share_one_limit(app_server: App) -> None:
    env = {"REDIS_URL": TEST_REDIS_URL, "RATE_LIMIT_ANON": "3/hour"}
    async with app_server(**env) as worker_a, app_server(**env) as worker_b:
        codes = [
            (await w.post("/api/chat/messages", json={"question": QUESTION})).status_code
            for w in (worker_a, worker_b) * 2
        ]
    assert codes == [202, 202, 202, 429]


@pytest.mark.slow
async def test_a_forged_x_forwarded_for_mints_no_new_budget(app_server: App) -> None:
    async with app_server(RATE_LIMIT_ANON="2/hour") as client:
        codes = [
            (
                await client.post(
                    "/api/chat/messages", json={"question": QUESTION}, headers={"X-Forwarded-For": f"203.0.113.{i}"}
                )
            ).status_code
            for i in range(3)
        ]
    assert codes == [202, 202, 429]


@pytest.mark.parametrize(
    ("peer", "header", "trusted", "expected"),
    [
        ("10.0.0.5", "203.0.113.9", [], "10.0.0.5"),
        ("10.0.0.5", "203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
        ("10.0.0.5", "198.51.100.1, 203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),  # the left one is the client's claim
        ("10.0.0.5", "203.0.113.9, 10.0.0.7", ["10.0.0.0/8"], "203.0.113.9"),  # through two trusted hops
        ("192.0.2.1", "203.0.113.9", ["10.0.0.0/8"], "192.0.2.1"),  # an untrusted peer's header is ignored
        ("10.0.0.5", "not-an-ip", ["10.0.0.0/8"], "10.0.0.5"),
        # Two header lines joined in order: the client's own line first, then the one its proxy appended.
        ("10.0.0.5", "192.0.2.77, 203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
        # An IPv6 client is its /64; an IPv4-mapped address is the IPv4 address.
        ("2001:db8:1:2::1", None, [], "2001:db8:1:2::/64"),
        ("10.0.0.5", "2001:db8:1:2:aaaa:bbbb:cccc:dddd", ["10.0.0.0/8"], "2001:db8:1:2::/64"),
        ("::ffff:203.0.113.9", None, [], "203.0.113.9"),
        ("10.0.0.5", "::ffff:203.0.113.9", ["10.0.0.0/8"], "203.0.113.9"),
        # A proxy that appends the port (issue 25): the port is dropped, so each port mints no budget of its own.
        ("10.0.0.5", "9.9.9.9:80", ["10.0.0.0/8"], "9.9.9.9"),
        ("10.0.0.5", "9.9.9.9:61234, 10.0.0.7:443", ["10.0.0.0/8"], "9.9.9.9"),
        ("10.0.0.5", "[2001:db8:1:2::1]:443", ["10.0.0.0/8"], "2001:db8:1:2::/64"),
        ("10.0.0.5", "[2001:db8:1:2::1]", ["10.0.0.0/8"], "2001:db8:1:2::/64"),
        ("10.0.0.5", "9.9.9.9:", ["10.0.0.0/8"], "10.0.0.5"),
        ("10.0.0.5", "9.9.9.9:８０", ["10.0.0.0/8"], "10.0.0.5"),  # full-width digits are no port
        ("10.0.0.5", "[9.9.9.9]:80", ["10.0.0.0/8"], "10.0.0.5"),
        ("10.0.0.5", "[2001:db8::1]x", ["10.0.0.0/8"], "10.0.0.5"),
    ],
)
def test_the_client_address_believes_forwarded_for_only_through_trusted_proxies(
    peer: str, header: str | None, trusted: list[str], expected: str
) -> None:
    import ipaddress

    assert client_address(peer, header, [ipaddress.ip_network(t) for t in trusted]) == expected


@pytest.mark.slow
async def test_a_caller_gets_at_most_n_answers_at_once(app_server: App) -> None:
    async with app_server(MAX_STREAMS_PER_CLIENT="2") as client:
        codes = [(await client.post("/api/chat/messages", json={"question": QUESTION})).status_code for _ in range(3)]
        busy = await client.post("/api/chat/messages", json={"question": QUESTION})
    assert codes == [202, 202, 429]
    assert busy.json()["error"]["code"] == "too_many_streams"


@pytest.mark.slow
async def test_a_session_over_its_daily_token_budget_is_refused(app_server: App, clean_db: str) -> None:
    async with app_server(SESSION_DAILY_TOKENS="100") as client:
        meta = await ask(client)
        with psycopg.connect(clean_db) as conn:
            conn.execute(
                "UPDATE chat_messages SET prompt_tokens = 90, completion_tokens = 20 WHERE id = %s",
                (meta["message_id"],),
            )
        refused = await client.post(
            "/api/chat",
            json={"question": QUESTION, "session_id": meta["session_id"], "session_token": meta["session_token"]},
        )
        fresh = await client.post("/api/chat/messages", json={"question": QUESTION})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "token_budget_exhausted"
    assert fresh.status_code == 202


# -- CORS ---------------------------------------------------------------------------------------------


async def test_cors_allows_listed_origins_with_credentials_and_nobody_else(app_server: App) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-session-token",
    }
    async with app_server(ALLOWED_ORIGINS="https://book.example.org") as client:
        allowed = await client.options("/api/chat", headers={"Origin": "https://book.example.org", **preflight})
        denied = await client.options("/api/chat", headers={"Origin": "https://evil.example", **preflight})
        simple = await client.get("/api/faq", headers={"Origin": "https://book.example.org"})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://book.example.org"
    assert allowed.headers["access-control-allow-credentials"] == "true"
    assert "x-session-token" in allowed.headers["access-control-allow-headers"].lower()
    assert denied.status_code == 400 and "access-control-allow-origin" not in denied.headers
    assert "ratelimit-remaining" in simple.headers["access-control-expose-headers"].lower()


# -- a replayed client_request_id (the attack run's session takeover) --------------------------------


def _from(address: str) -> dict[str, str]:
    return {"X-Forwarded-For": address}


@pytest.mark.slow
async def test_a_client_request_id_replayed_by_someone_else_hands_over_nothing(app_server: App) -> None:
    async with app_server(TRUSTED_PROXIES="127.0.0.1/32") as client:
        request_id = str(uuid.uuid4())
        victim = await ask(client, _from("198.51.100.7"), question="What is ZMP?", client_request_id=request_id)
        assert victim["session_token"]

        other_question = await client.post(
            "/api/chat", json={"question": "x", "client_request_id": request_id}, headers=_from("203.0.113.9")
        )
        same_question_other_client = await client.post(
            "/api/chat",
            json={"question": "What is ZMP?", "client_request_id": request_id},
            headers=_from("203.0.113.9"),
        )
        as_messages = await client.post(
            "/api/chat/messages", json={"question": "x", "client_request_id": request_id}, headers=_from("203.0.113.9")
        )

    for refused in (other_question, same_question_other_client, as_messages):
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "duplicate_request"
        assert victim["session_token"] not in refused.text and victim["stream_url"] not in refused.text


@pytest.mark.slow
async def test_the_owners_own_retry_still_attaches_without_the_token_again(app_server: App) -> None:
    async with app_server(TRUSTED_PROXIES="127.0.0.1/32") as client:
        request_id = str(uuid.uuid4())
        first = await client.post(
            "/api/chat/messages",
            json={"question": QUESTION, "client_request_id": request_id},
            headers=_from("198.51.100.7"),
        )
        retry = await client.post(
            "/api/chat/messages",
            json={"question": QUESTION, "client_request_id": request_id},
            headers=_from("198.51.100.7"),
        )
        replayed = await ask(client, _from("198.51.100.7"), client_request_id=request_id)

    assert first.status_code == retry.status_code == 202
    assert retry.json()["message_id"] == first.json()["message_id"] == replayed["message_id"]
    assert retry.json()["created"] is False and "session_token" not in retry.json()
    assert "session_token" not in replayed


@pytest.mark.slow
async def test_a_signed_in_readers_request_id_repeats_only_for_that_reader(app_server: App) -> None:
    async with app_server() as client:
        request_id = str(uuid.uuid4())
        body = {"question": QUESTION, "client_request_id": request_id}
        first = await client.post("/api/chat/messages", json=body, headers=bearer("ada"))
        stranger = await client.post("/api/chat/messages", json=body, headers=bearer("mallory"))
        anonymous = await client.post("/api/chat/messages", json=body)
        again = await client.post("/api/chat/messages", json=body, headers=bearer("ada"))

    assert first.status_code == 202 and again.status_code == 202
    assert again.json()["message_id"] == first.json()["message_id"] and again.json()["created"] is False
    assert stranger.status_code == anonymous.status_code == 409


@pytest.mark.slow
async def test_the_session_token_is_sent_once_and_never_in_a_replayed_meta(app_server: App) -> None:
    async with app_server() as client:
        live = await read_all(client, "POST", "/api/chat", json={"question": QUESTION})
        meta = live[0].json()
        replay = await read_all(client, "GET", meta["stream_url"])
        posted = (await client.post("/api/chat/messages", json={"question": QUESTION})).json()
        streamed = await read_all(client, "GET", posted["stream_url"])

    assert meta["session_token"]  # the response that created the session carries it
    assert posted["session_token"]
    for events in (replay, streamed):
        assert events[0].event == "meta" and "session_token" not in events[0].json()
        assert all("session_token" not in (e.data or "") for e in events)


# -- limits that bent in the attack run ---------------------------------------------------------------


@pytest.mark.slow
async def test_a_clients_own_forwarded_line_before_the_proxys_buys_no_budget(app_server: App) -> None:
    async with app_server(TRUSTED_PROXIES="127.0.0.1/32", RATE_LIMIT_ANON="3/minute") as client:
        codes = []
        for i in range(5):
            # The client sends its own X-Forwarded-For line; its proxy (HAProxy) appends a second line.
            headers = [("X-Forwarded-For", f"192.0.2.{i}"), ("X-Forwarded-For", "198.51.100.7")]
            response = await client.post("/api/chat/messages", json={"question": QUESTION}, headers=headers)
            codes.append(response.status_code)
    assert codes == [202, 202, 202, 429, 429]


@pytest.mark.slow
async def test_behind_a_proxy_that_appends_the_port_each_client_has_its_own_budget_whatever_its_port(
    app_server: App,
) -> None:
    async with app_server(TRUSTED_PROXIES="127.0.0.1/32", RATE_LIMIT_ANON="2/minute") as client:

        async def from_(forwarded: str) -> int:
            headers = {"X-Forwarded-For": forwarded}
            return (await client.post("/api/chat/messages", json={"question": QUESTION}, headers=headers)).status_code

        first = [await from_(f"9.9.9.9:{port}") for port in (80, 81, 82)]
        other = [await from_("9.9.9.10:80")]
    assert first == [202, 202, 429] and other == [202]


@pytest.mark.slow
async def test_an_ipv6_client_is_limited_per_64_and_a_mapped_ipv4_is_the_ipv4(app_server: App) -> None:
    async with app_server(TRUSTED_PROXIES="127.0.0.1/32", RATE_LIMIT_ANON="3/minute") as client:

        async def from_(address: str) -> int:
            answer = await client.post("/api/chat/messages", json={"question": QUESTION}, headers=_from(address))
            return answer.status_code

        same_64 = [await from_(f"2001:db8:1:2::{i}") for i in range(1, 5)]
        next_64 = await from_("2001:db8:1:3::1")
        mapped = [
            await from_(a) for a in ("::ffff:198.51.100.8", "198.51.100.8", "::ffff:198.51.100.8", "198.51.100.8")
        ]
    assert same_64 == [202, 202, 202, 429] and next_64 == 202
    assert mapped == [202, 202, 202, 429]


@pytest.mark.slow
async def test_a_question_refused_for_too_many_open_answers_spends_nothing_and_says_the_budget(
    app_server: App,
) -> None:
    async with app_server(MAX_STREAMS_PER_CLIENT="1", RATE_LIMIT_ANON="5/hour") as client:
        first = await client.post("/api/chat/messages", json={"question": QUESTION})
        busy = await client.post("/api/chat/messages", json={"question": QUESTION})
        await read_all(client, "GET", first.json()["stream_url"])
        for _ in range(50):  # the slot is released just after the answer ends
            later = await client.post("/api/chat/messages", json={"question": QUESTION})
            if later.status_code == 202:
                break
            await asyncio.sleep(0.05)
    assert first.headers["ratelimit-remaining"] == "4"
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "too_many_streams"
    assert busy.headers["ratelimit-limit"] == "5" and busy.headers["ratelimit-remaining"] == "4"
    assert int(busy.headers["retry-after"]) >= 1
    assert later.status_code == 202 and later.headers["ratelimit-remaining"] == "3"


@pytest.mark.slow
async def test_an_answer_still_streaming_counts_against_the_daily_token_budget(app_server: App, clean_db: str) -> None:
    from textbook_chat.chat.exchange import IN_FLIGHT_TOKENS

    async with app_server(SESSION_DAILY_TOKENS=str(IN_FLIGHT_TOKENS)) as client:
        meta = await ask(client)
        follow_up = {"question": QUESTION, "session_id": meta["session_id"], "session_token": meta["session_token"]}
        with psycopg.connect(clean_db) as conn:  # as if that answer were still being generated
            conn.execute(
                "UPDATE chat_messages SET status = 'streaming', prompt_tokens = NULL, completion_tokens = NULL "
                "WHERE id = %s",
                (meta["message_id"],),
            )
        while_streaming = await client.post("/api/chat/messages", json=follow_up)
        with psycopg.connect(clean_db) as conn:  # it ends having used little
            conn.execute(
                "UPDATE chat_messages SET status = 'complete', prompt_tokens = 30, completion_tokens = 10 "
                "WHERE id = %s",
                (meta["message_id"],),
            )
        after = await client.post("/api/chat/messages", json=follow_up)
    assert while_streaming.status_code == 429
    assert while_streaming.json()["error"]["code"] == "token_budget_exhausted"
    assert after.status_code == 202
