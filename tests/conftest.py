"""Shared fixtures: a scratch Postgres database per test run, a Redis DB number, and app servers.

The tests use the machine's real Postgres and Redis (no mocks). They create and drop their own
database ``textbook_test_<random>`` and never touch other data.

The suite runs in parallel (pytest-xdist, ``scripts/test.sh`` passes ``-n``): each worker has its own Postgres
database and its own Redis DB number (some tests empty theirs), and the books' indexes are built once per run,
by whichever worker asks first, then copied by every test that opens one.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from alembic import command
from alembic.config import Config
from filelock import FileLock

from tests.fake_openai import FakeOpenAI
from tests.servers import serving
from textbook_chat.core.settings import Settings
from textbook_chat.store.sessions import Store
from textbook_chat.web.app import create_app
from textbook_chat.web.services import Services, open_services

ROOT = Path(__file__).resolve().parents[1]
SHARED_BOOK = ROOT.parent / "shared" / "corpora" / "rizsheik-humanoid-course"
DEMO_BOOK = ROOT / "examples" / "textbook"
# A command the tests start (python -m textbook_chat ...) runs this checkout's code, whatever the venv's .pth
# points at (scripts/setup.sh writes one for the checkout it ran in; a git worktree shares that venv).
_inherited = os.environ.get("PYTHONPATH")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT / "server"), str(ROOT), _inherited)))
PG_ADMIN_URL = os.environ.get("TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
# pytest-xdist names its workers gw0, gw1, ...; a run without it is one worker, number 0.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def worker_redis_url(base: str) -> str:
    """``base`` with its DB number raised by this worker's number: workers never share (or flush) a Redis DB."""
    match = re.fullmatch(r"(.*/)(\d+)", base)
    if match is None:
        raise ValueError(f"TEST_REDIS_URL must end in a DB number (redis://host:port/N), not {base!r}")
    number = int(match[2]) + WORKER
    if number > 15:
        raise ValueError(f"worker {WORKER} would use Redis DB {number}: lower TEST_REDIS_URL's DB or run fewer workers")
    return f"{match[1]}{number}"


TEST_REDIS_URL = worker_redis_url(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
CLOSED_PORT_PG_URL = "postgresql://postgres@127.0.0.1:1/postgres"


E2E_DIR = ROOT / "tests" / "e2e"
# Fixtures that make a test slow by themselves: the shared book, 54 pages, is ingested (by the fake embedder).
SLOW_FIXTURES = frozenset({"shared_index_dir"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whole-system tests (tests/e2e/: browsers, drills, deploy) and tests on the shared book are marked slow, besides
    those marked one by one, so ``scripts/test.sh --quick`` (``-m "not slow and not wheel"``) leaves them out.

    Files then run whole-system ones first, then in order of how many slow tests they hold (each file keeps its own
    order): parallel workers take a file at a time, so the long ones start early and the short ones even out the end."""
    slow_in_file: dict[Path, int] = {}
    for item in items:
        in_e2e = item.path.is_relative_to(E2E_DIR)
        if in_e2e or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        slow = item.get_closest_marker("slow") is not None or item.get_closest_marker("wheel") is not None
        slow_in_file[item.path] = slow_in_file.get(item.path, 0) + slow
    # A stable sort: a file's tests keep their order.
    items.sort(key=lambda item: (not item.path.is_relative_to(E2E_DIR), -slow_in_file[item.path]))


def alembic_config(database_url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", database_url)
    return config


def create_database(prefix: str = "textbook_test") -> str:
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    url = create_database()
    command.upgrade(alembic_config(url), "head")
    yield url
    drop_database(url)


@pytest.fixture
def clean_db(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE chat_sessions, chat_messages, source_citations, question_vectors, "
            "gap_topics, gap_topic_days, question_days"
        )
    return database_url


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings with nothing configured: every optional dependency off, state under tmp_path."""
    return Settings.from_env({"DATA_DIR": str(tmp_path / "data"), "LOG_FORMAT": "text"})


@pytest.fixture
async def store(clean_db: str) -> AsyncIterator[Store]:
    settings = Settings.from_env({"DATABASE_URL": clean_db})
    async with open_services(settings) as services:
        assert services.store is not None
        yield services.store


@pytest.fixture
async def services_with_db(clean_db: str) -> AsyncIterator[Services]:
    async with open_services(Settings.from_env({"DATABASE_URL": clean_db, "REDIS_URL": TEST_REDIS_URL})) as services:
        yield services


Chat = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, FakeOpenAI]]]


@pytest.fixture
def chat_server(demo_index_dir: Path, tmp_path: Path, clean_db: str) -> Chat:
    """``async with chat_server(llm=True, **env) as (client, fake)``: the app with the demo index."""

    @asynccontextmanager
    async def start(*, llm: bool = False, **env: str) -> AsyncIterator[tuple[httpx.AsyncClient, FakeOpenAI]]:
        fake = FakeOpenAI()
        async with serving(fake.app()) as llm_url:
            values = {
                **demo_env(demo_index_dir, tmp_path, clean_db, llm_url if llm else None),
                "STREAM_GRACE_S": "0",
                "LLM_TIMEOUT_S": "1",
                **env,
            }
            app = create_app(Settings.from_env(values))
            async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
                yield client, fake

    return start


def demo_env(demo_index_dir: Path, tmp_path: Path, database_url: str, llm_url: str | None) -> dict[str, str]:
    """What every test server over the demo index is given: its own copy of the index, the test database,
    the local embedder, the demo book's own FAQ (as ``serve --book`` reads it), text logs and, with ``llm_url``,
    the fake model."""
    return {
        "DATA_DIR": str(copy_index(demo_index_dir, tmp_path / f"data-{uuid.uuid4().hex[:6]}")),
        "BOOK_FAQ_PATH": str(DEMO_BOOK / "faq.json"),
        "DATABASE_URL": database_url,
        "LOG_FORMAT": "text",
        "EMBEDDER": "local",
        **({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{llm_url}/v1"} if llm_url else {}),
    }


def worker_envs(
    demo_index_dir: Path, tmp_path: Path, database_url: str, llm_url: str, **settings: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Two server processes sharing Postgres and Redis, as behind a load balancer: each is ``demo_env`` (so its
    own copy of the index) with Redis, a stream grace period, quiet logs and ``settings``."""
    shared = {"REDIS_URL": TEST_REDIS_URL, "STREAM_GRACE_S": "5", "LOG_LEVEL": "warning", **settings}
    first, second = (demo_env(demo_index_dir, tmp_path, database_url, llm_url) for _ in range(2))
    return {**first, **shared}, {**second, **shared}


def new_id() -> uuid.UUID:
    return uuid.uuid4()


async def _ingest_into(book: Path, data_dir: Path, env: dict[str, str]) -> Path:
    from textbook_chat.index import ingest

    settings = Settings.from_env({"DATA_DIR": str(data_dir), **env})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        await ingest.run(book, services.index, services.embedder, base_url=settings.book_base_url)
    return data_dir


def fake_embedder_env(llm_url: str) -> dict[str, str]:
    """Settings for the OpenAI embedder served by the fake model (``tests/fake_openai.py``: deterministic
    bag-of-words vectors, so every fake server embeds a text alike)."""
    return {"EMBEDDER": "openai", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": f"{llm_url}/v1"}


async def _index_once(
    book: Path, name: str, tmp_path_factory: pytest.TempPathFactory, *, fake_embedder: bool = False
) -> Path:
    """The DATA_DIR holding ``book``'s index, built once per run: the first worker to ask builds it under a file
    lock in the run's temporary folder (shared by every xdist worker); the others wait for it, then reuse it.
    ``fake_embedder``: embedded by the OpenAI path against a fake model server (``fake_embedder_env``), not MiniLM."""
    run_root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        run_root = run_root.parent  # each worker's basetemp is popen-gwN inside the run's
    data_dir, done = run_root / name, run_root / f"{name}.done"
    with FileLock(str(run_root / f"{name}.lock")):
        if not done.exists():
            data_dir.mkdir()
            if fake_embedder:
                async with serving(FakeOpenAI().app()) as llm_url:
                    await _ingest_into(book, data_dir, fake_embedder_env(llm_url))
            else:
                await _ingest_into(book, data_dir, {"EMBEDDER": "local"})
            done.touch()
    return data_dir


@pytest.fixture(scope="session")
async def demo_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DATA_DIR holding the demo book's embedded index (built once per run); copy it before opening it."""
    return await _index_once(DEMO_BOOK, "demo-index", tmp_path_factory)


@pytest.fixture(scope="session")
async def shared_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DATA_DIR holding the shared real book's index (built once per run); copy it before opening it. Its tests
    check that a real book of 54 pages is indexed whole and served, not what MiniLM makes of it: it is embedded by
    the fake model (``fake_embedder_env``; serve it with one), which takes seconds where MiniLM took two to three
    minutes of the suite (``bench.ingest`` measures MiniLM on this book)."""
    return await _index_once(SHARED_BOOK, "shared-index", tmp_path_factory, fake_embedder=True)


def copy_index(src: Path, dst: Path) -> Path:
    """A private copy of an index DATA_DIR: embedded Qdrant allows one opener per storage folder.

    Disk, not time, is what this costs: Qdrant Edge preallocates its pages and WAL as sparse files (165 MB
    apparent, 1 MB on disk for the demo book), which a plain copy fills with zeros, and the converted model
    is 87 MB. So the index is copied sparse and the model files, only ever read, are hard links: 250 MB per
    test server became about 1 MB, and a whole run no longer fills a small disk."""
    dst.mkdir(parents=True)
    for entry in src.iterdir():
        how = ["-al"] if entry.name == "models" else ["-a", "--sparse=always"]
        subprocess.run(["cp", *how, str(entry), str(dst / entry.name)], check=True)
    return dst
