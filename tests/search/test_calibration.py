"""The calibration a book gives itself: the rule, derived at ingest, kept with the index, re-derived when the book
changes, overridable by an operator's own questions, and what serve uses."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from tests.conftest import DEMO_BOOK, copy_index
from textbook_chat.cli import main
from textbook_chat.core import onnx_minilm
from textbook_chat.core.settings import Settings
from textbook_chat.search import calibration
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.retrieval import Retriever
from textbook_chat.web.services import open_services

PRIOR = Calibration(decline=0.287, low=0.486, high=0.735)
SENTINEL = Calibration(decline=0.11, low=0.22, high=0.33)


def test_decline_sits_just_above_what_unrelated_questions_score_against_the_book() -> None:
    outside = [0.0] * 10 + [0.1] * 25 + [0.2, 0.25, 0.3, 0.3, 0.3]
    inside = [0.4 + i * 0.01 for i in range(50)]
    derived = calibration.rule(outside, inside, PRIOR)
    assert derived.decline == round(calibration.quantile(sorted(outside), 0.95) + calibration.DECLINE_MARGIN, 3)
    assert derived.low == round(calibration.quantile(inside, 0.5) - calibration.LOW_MARGIN, 3)
    assert derived.high == pytest.approx(derived.low + (PRIOR.high - PRIOR.low), abs=0.001)  # the embedder's span


def test_a_book_whose_own_sections_score_low_keeps_answering_them() -> None:
    outside = [0.3] * 40  # a background as high as the book's weaker sections
    inside = [0.25 + i * 0.01 for i in range(40)]
    derived = calibration.rule(outside, inside, PRIOR)
    assert derived.decline == round(calibration.quantile(inside, 0.10), 3)  # below 90 % of its sections
    assert derived.decline < 0.3 + calibration.DECLINE_MARGIN


def test_a_book_too_small_to_probe_keeps_the_embedders_defaults() -> None:
    assert calibration.rule([0.1] * 40, [0.5, 0.6, 0.7, 0.8], PRIOR) == PRIOR


def _settings(data_dir: Path) -> Settings:
    return Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local"})


async def _stored(data_dir: Path) -> tuple[Calibration | None, str | None]:
    async with open_services(_settings(data_dir), retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        return await calibration.stored(services.index, services.embedder), await calibration.source(services.index)


async def _save(data_dir: Path, kept: Calibration, source: calibration.Source) -> None:
    async with open_services(_settings(data_dir), retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        await calibration.save(services.index, services.embedder, kept, source)


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DEMO_BOOK, tmp_path / "book"))


def _change(book: Path) -> None:
    page = sorted((book / "docs").rglob("*.md"))[0]
    page.write_text(page.read_text() + "\n\n## A new section\n\nWhat this new section adds to the chapter.\n")


def _ingest(book: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("DATA_DIR", str(data_dir))
    monkeypatch.setenv("EMBEDDER", "local")
    assert main(["ingest", str(book)]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_ingest_derives_the_calibration_and_re_derives_it_only_when_the_book_changes(
    book: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    out = _ingest(book, data_dir, monkeypatch, capsys)
    derived, source = asyncio.run(_stored(data_dir))
    assert derived is not None and source == "book"
    assert f"confidence calibration: {calibration.points(derived)}" in out
    assert onnx_minilm.cached_model(data_dir).query_check.is_file()  # the question graph, decided at ingest too

    asyncio.run(_save(data_dir, SENTINEL, "book"))  # mark what is stored, to see whether it is re-derived
    _ingest(book, data_dir, monkeypatch, capsys)  # the same book: nothing to re-derive
    assert asyncio.run(_stored(data_dir)) == (SENTINEL, "book")

    _change(book)
    _ingest(book, data_dir, monkeypatch, capsys)
    again, source = asyncio.run(_stored(data_dir))
    assert again not in (None, SENTINEL) and source == "book"


@pytest.mark.slow
def test_a_calibration_derived_with_another_query_model_is_derived_again_at_the_next_ingest(
    book: Path,
    demo_index_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = copy_index(demo_index_dir, tmp_path / "data")  # this book, ingested as the first test does
    asyncio.run(_save(data_dir, SENTINEL, "book"))
    asyncio.run(_forget_query_model(data_dir))  # as stored before questions were embedded in int8
    assert asyncio.run(_stored(data_dir)) == (SENTINEL, "book")  # still served until then
    _ingest(book, data_dir, monkeypatch, capsys)  # the same book
    again, source = asyncio.run(_stored(data_dir))
    assert again not in (None, SENTINEL) and source == "book"


async def _forget_query_model(data_dir: Path) -> None:
    async with open_services(_settings(data_dir), retrieval=True) as services:
        assert services.index is not None
        record = dict((await services.index.read_metadata())["calibration"])
        del record["query_model"]
        await services.index.write_metadata(calibration=record)


@pytest.mark.slow
def test_an_operators_calibration_survives_a_re_ingest_until_calibrate_derives_one_from_the_book(
    book: Path,
    demo_index_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data_dir = copy_index(demo_index_dir, tmp_path / "data")  # this book, ingested as the first test does
    _ingest(book, data_dir, monkeypatch, capsys)  # the book's copy: unchanged, so nothing is re-derived
    questions = DEMO_BOOK / "questions.jsonl"
    assert main(["eval", str(questions), "--calibrate", "--save"]) == 0
    saved, source = asyncio.run(_stored(data_dir))
    assert source == "questions" and saved is not None
    assert f"saved with the index: {calibration.points(saved)}" in capsys.readouterr().out

    _change(book)
    _ingest(book, data_dir, monkeypatch, capsys)
    assert asyncio.run(_stored(data_dir)) == (saved, "questions")  # kept across the re-ingest

    assert main(["calibrate"]) == 0
    report = capsys.readouterr().out
    assert "out-of-scope probes:    40 probes" in report and "in-scope probes:" in report
    assert "second opinion:         asked at confidence 0.10-0.35" in report  # its thresholds, shown and kept
    assert "best logit of the 10 closest out-of-scope probes" in report
    assert asyncio.run(_stored(data_dir))[1] == "book"


def test_save_without_calibrate_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert main(["eval", str(DEMO_BOOK / "questions.jsonl"), "--save"]) == 2


@pytest.mark.slow
async def test_the_derivation_is_deterministic_and_serve_answers_with_what_is_stored(
    demo_index_dir: Path, tmp_path: Path
) -> None:
    data_dir = copy_index(demo_index_dir, tmp_path / "data")
    async with open_services(_settings(data_dir), retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        retriever = Retriever(services.index, services.embedder)
        first = await calibration.derive(retriever, services.index)
        second = await calibration.derive(retriever, services.index)
        assert (first.calibration, first.in_scope, first.out_of_scope) == (
            second.calibration,
            second.in_scope,
            second.out_of_scope,
        )
        assert len(first.out_of_scope) == len(calibration.OUT_OF_SCOPE_PROBES) and len(first.in_scope) >= 5
        await calibration.save(services.index, services.embedder, SENTINEL, "book")
    async with open_services(_settings(data_dir), chat=True) as services:
        assert services.chat is not None and services.chat.retriever is not None
        assert services.chat.retriever.calibration == SENTINEL
