"""deploy/nginx.conf for real: Debian's nginx in front of two server processes sharing Postgres and Redis.

The config is the one in deploy/ with only its lines marked ``# local:`` rewritten (ports, log path, one
nginx worker so its round robin alternates). Each server process has its own copy of the embedded index,
as in test_resume.py; in production they share a Qdrant server.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
import yaml  # type: ignore[import-untyped]  # PyYAML comes with uvicorn[standard]; no stubs locked

from tests.conftest import ROOT, TEST_REDIS_URL, worker_envs
from tests.fake_openai import FakeOpenAI, ok
from tests.servers import free_port, server_process, serving
from tests.sse_client import answer_text, read_all, read_some
from tests.streams.test_resume import KEY, LONG_ANSWER, QUESTION, stored_answer

NGINX_CONF = ROOT / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


@dataclass
class Proxy:
    url: str
    upstreams: tuple[str, str]  # host:port of the two server processes
    access_log: Path

    async def upstream_of(self, request_id: str) -> str:
        """Which server process nginx sent the request with this X-Request-ID to (from its access log)."""
        pattern = re.compile(rf"upstream=(\S+) .* id={re.escape(request_id)}$")
        for _ in range(100):  # nginx writes the line when the request ends
            for line in self.access_log.read_text().splitlines():
                if match := pattern.search(line):
                    return match.group(1)
            await asyncio.sleep(0.05)
        raise AssertionError(f"no access log line for request {request_id}")


def local_config(template: str, *, tmp: Path, port: int, upstreams: tuple[str, str]) -> str:
    """deploy/nginx.conf with each ``# local:`` line replaced; fails if the template lost one of them."""
    temp_paths = " ".join(
        f"{kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    replacements = {
        "workers": "worker_processes 1;",
        "access log": f"access_log {tmp / 'access.log'} chat; {temp_paths}",
        "upstream servers": " ".join(f"server {u} max_fails=3 fail_timeout=10s;" for u in upstreams),
        "listen": f"listen 127.0.0.1:{port};",
    }
    lines = template.splitlines()
    for name, replacement in replacements.items():
        marked = [i for i, line in enumerate(lines) if line.rstrip().endswith(f"# local: {name}")]
        assert len(marked) == 1, f"deploy/nginx.conf should have one line marked '# local: {name}'"
        lines[marked[0]] = replacement
    if os.geteuid() == 0:
        # A root master drops its workers to `nobody`, who cannot enter pytest's private temp folders.
        lines.insert(0, "user root;")
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def nginx(tmp: Path, upstreams: tuple[str, str]) -> AsyncIterator[Proxy]:
    assert NGINX is not None
    tmp.mkdir()
    port = free_port()  # nginx cannot listen on port 0
    conf = tmp / "nginx.conf"
    conf.write_text(local_config(NGINX_CONF.read_text(), tmp=tmp, port=port, upstreams=upstreams))
    error_log = tmp / "error.log"
    process = subprocess.Popen(
        [NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(error_log), "-g", f"daemon off; pid {tmp / 'nginx.pid'};"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(100):
                if process.poll() is not None:
                    raise RuntimeError(f"nginx exited: {error_log.read_text() if error_log.exists() else ''}")
                try:
                    if (await probe.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        yield Proxy(url, upstreams, tmp / "access.log")
    finally:
        process.send_signal(signal.SIGQUIT)  # graceful: finish open requests, then exit
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Deployment:
    proxy: Proxy
    fake: FakeOpenAI


@pytest.fixture(scope="module")
async def deployment(
    demo_index_dir: Path, tmp_path_factory: pytest.TempPathFactory, database_url: str
) -> AsyncIterator[Deployment]:
    """nginx in front of two server processes, for the whole module (starting them is the slow part)."""
    if NGINX is None:
        pytest.skip("nginx is not installed (scripts/setup.sh installs it)")
    tmp = tmp_path_factory.mktemp("deploy")
    fake = FakeOpenAI()
    async with serving(fake.app()) as llm_url:
        env_a, env_b = worker_envs(
            demo_index_dir,
            tmp,
            database_url,
            llm_url,
            STREAM_SIGNING_KEY=KEY,
            TRUSTED_PROXIES="127.0.0.1/32",  # nginx connects to the servers from 127.0.0.1
            RATE_LIMIT_ANON="1/hour",
        )
        async with (
            server_process(env_a, tmp / "a.log") as (_, url_a),
            server_process(env_b, tmp / "b.log") as (_, url_b),
        ):
            upstreams = (url_a.removeprefix("http://"), url_b.removeprefix("http://"))
            async with nginx(tmp / "nginx", upstreams) as proxy:
                yield Deployment(proxy, fake)


@pytest.fixture
def deployed(deployment: Deployment, clean_db: str) -> Deployment:
    """The deployment with empty tables, Redis flushed (rate limits, relayed streams) and a fresh fake LLM record."""
    redis.Redis.from_url(TEST_REDIS_URL).flushdb()
    fake = deployment.fake
    fake.requests.clear()
    fake.streams_started = fake.streams_completed = fake.streams_closed_early = 0
    return deployment


def reader(proxy: Proxy, address: str) -> httpx.AsyncClient:
    """A client connecting to nginx from ``address``: the whole 127/8 is loopback, so each reader has its own."""
    return httpx.AsyncClient(base_url=proxy.url, timeout=30, transport=httpx.AsyncHTTPTransport(local_address=address))


async def test_a_stream_resumed_through_nginx_lands_on_the_other_process_and_completes_once(
    deployed: Deployment, clean_db: str
) -> None:
    proxy, fake = deployed.proxy, deployed.fake
    fake.default = ok(LONG_ANSWER, token_delay_s=0.03)
    ask, first_read, resume = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("ask", "first-read", "resume"))
    async with reader(proxy, "127.0.0.2") as client:
        posted = await client.post("/api/chat/messages", json={"question": QUESTION}, headers={"X-Request-ID": ask})
        assert posted.status_code == 202, posted.text
        created = posted.json()
        first = await read_some(client, created["stream_url"], tokens=5, headers={"X-Request-ID": first_read})
        # Events reached the reader while the answer was still being generated: nginx did not buffer them.
        assert stored_answer(clean_db, created["message_id"]) == ("", "streaming")
        rest = await read_all(
            client,
            "GET",
            created["stream_url"],
            headers={"Last-Event-ID": first[-1].id or "", "X-Request-ID": resume},
        )
        after_done = await client.get(created["stream_url"], headers={"Last-Event-ID": rest[-1].id or ""})
    for _ in range(100):  # the answer is written to Postgres just after `done` goes out
        if stored_answer(clean_db, created["message_id"])[1] != "streaming":
            break
        await asyncio.sleep(0.05)
    served_by = {name: await proxy.upstream_of(name) for name in (ask, first_read, resume)}

    assert served_by[resume] != served_by[first_read]
    assert set(served_by.values()) == set(proxy.upstreams)
    ids = [e.id for e in first + rest]
    assert ids == [str(i) for i in range(1, len(ids) + 1)]
    assert answer_text(first + rest) == LONG_ANSWER
    assert stored_answer(clean_db, created["message_id"]) == (LONG_ANSWER, "complete")
    assert len(fake.requests) == 1 and fake.streams_completed == 1
    assert after_done.status_code == 204
    log = proxy.access_log.read_text()
    assert f"GET /api/chat/messages/{created['message_id']}/stream HTTP/1.1" in log
    assert "cap=" not in log and created["stream_url"].split("cap=")[1] not in log  # capabilities stay out


async def test_readers_behind_nginx_are_rate_limited_by_their_own_address(deployed: Deployment) -> None:
    deployed.fake.default = ok("Short [1].")
    ask = {"question": QUESTION}  # RATE_LIMIT_ANON is 1/hour in this deployment
    async with reader(deployed.proxy, "127.0.0.3") as first, reader(deployed.proxy, "127.0.0.4") as second:
        first_ask = await first.post("/api/chat/messages", json=ask)
        first_again = await first.post("/api/chat/messages", json=ask)
        # A forged header names the first reader; nginx appends the real peer, which the app believes.
        second_ask = await second.post("/api/chat/messages", json=ask, headers={"X-Forwarded-For": "127.0.0.3"})
        second_again = await second.post("/api/chat/messages", json=ask)

    assert [first_ask.status_code, first_again.status_code] == [202, 429]
    assert [second_ask.status_code, second_again.status_code] == [202, 429]
    assert first_again.json()["error"]["code"] == "rate_limited"


def test_the_compose_scale_profile_puts_this_nginx_config_in_front_of_the_workers() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    scaled = {name for name, service in services.items() if "scale" in service.get("profiles", [])}
    assert {"nginx", "worker", "migrate"} <= scaled
    assert "./deploy/nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]
    assert "worker" in services["nginx"]["depends_on"]
    worker_env = services["worker"]["environment"]
    assert worker_env["QDRANT_URL"].startswith("http://") and worker_env["REDIS_URL"].startswith("redis://")
    # The workers believe X-Forwarded-For only from nginx's fixed address.
    nginx_address = services["nginx"]["networks"]["edge"]["ipv4_address"]
    assert worker_env["TRUSTED_PROXIES"] == f"{nginx_address}/32"
    assert re.search(r"server worker:8000\b", NGINX_CONF.read_text())
