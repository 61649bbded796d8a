"""The second opinion: asked only where confidence is in doubt, it declines an answer the passages do not give
and overturns a decline the passages do answer, with the real cross-encoder on the demo book; without the
cross-encoder's files, retrieval answers as before and says so once."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import copy_index
from textbook_chat.core import crossencoder
from textbook_chat.core.crossencoder import CrossEncoder
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search import calibration, confidence
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.retrieval import Retriever
from textbook_chat.search.second_opinion import SecondOpinion, Thresholds
from textbook_chat.web.services import open_services

# A question the demo book does not answer, whose passages (walking robots, learning) are close enough for retrieval
# alone to answer it at low confidence.
DOG = "How do I teach a robot dog to fetch a ball?"
# An answerable question (demo questions.jsonl) whose passage the cross-encoder finds clearly answering.
SPIN = "What does rclpy.spin() actually do?"


@pytest.mark.parametrize(
    ("score", "unscaled", "in_doubt"),
    [
        (0.05, 0.05, False),  # far below the decline point: clearly not in the book
        (0.12, 0.12, True),  # just below it
        (0.25, 0.25, True),  # answered at low confidence
        (0.34, 0.34, True),
        (0.36, 0.36, False),  # confident enough: pays nothing
        (0.9, 0.9, False),
        (0.0, 0.5, True),  # declined by the names / terms rules although the passages looked close
        (0.0, 0.15, False),  # the passages alone would have declined too
    ],
)
def test_it_is_asked_only_in_its_band_or_on_a_decline_the_rules_caused(
    score: float, unscaled: float, in_doubt: bool
) -> None:
    assert Thresholds().in_doubt(score, unscaled) is in_doubt


def test_thresholds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        Thresholds(decline_below=2.0, overturn_above=1.0)
    with pytest.raises(ValueError):
        Thresholds(band_low=0.4, band_high=0.3)


@dataclass
class Book:
    index: VectorIndex
    embedder: Embedder
    calibration: Calibration
    opinion: SecondOpinion


@pytest.fixture(scope="module")
async def book(demo_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Book]:
    """The demo book's index with its calibration and second-opinion thresholds derived as ingest derives them."""
    data_dir = copy_index(demo_index_dir, tmp_path_factory.mktemp("second-opinion") / "data")
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        opinion = SecondOpinion.load()
        derived = await calibration.derive(Retriever(services.index, services.embedder, None, opinion), services.index)
        assert derived.thresholds is not None
        opinion.thresholds = derived.thresholds
        yield Book(services.index, services.embedder, derived.calibration, opinion)
        opinion.close()


async def test_it_declines_an_answer_whose_passages_do_not_answer(book: Book) -> None:
    without = await Retriever(book.index, book.embedder, book.calibration).retrieve(DOG)
    assert not without.declined and without.level == "low"  # the book's calibration alone answers it

    result = await Retriever(book.index, book.embedder, book.calibration, book.opinion).retrieve(DOG)
    assert result.second_opinion is not None and result.second_opinion.change == "declined"
    assert result.second_opinion.score < book.opinion.thresholds.decline_below
    assert result.declined and result.sources == () and result.confidence < confidence.DECLINE
    assert result.related  # a decline still suggests the closest sections
    assert all(n.code != "low_confidence" for n in result.notices)


async def test_it_overturns_a_decline_whose_passage_clearly_answers(book: Book) -> None:
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(SPIN)
    assert not plain.declined and plain.second_opinion is None  # confident: never asked
    # A book whose calibration puts this question's evidence at 0.15, inside the band but below the decline point.
    decline = plain.similarity / 0.75
    strict = Calibration(decline=decline, low=decline + 0.1, high=min(decline + 0.2, 0.99))
    assert strict.to_common(plain.similarity) == pytest.approx(0.15, abs=0.001)
    assert (await Retriever(book.index, book.embedder, strict).retrieve(SPIN)).declined

    result = await Retriever(book.index, book.embedder, strict, book.opinion).retrieve(SPIN)
    assert result.second_opinion is not None and result.second_opinion.change == "answered"
    assert result.second_opinion.score > book.opinion.thresholds.overturn_above
    assert not result.declined and result.level == "low" and result.sources
    assert [n.code for n in result.notices] == ["low_confidence"]
    assert [s.n for s in result.sources] == list(range(1, len(result.sources) + 1))
    assert result.sources[0].file_path == "02-ros2/01-nodes-and-topics.md"


async def test_where_it_is_asked_the_candidates_follow_its_scores(book: Book) -> None:
    result = await Retriever(book.index, book.embedder, book.calibration, book.opinion).retrieve(DOG)
    assert result.second_opinion is not None
    assert list(result.second_opinion.order) != [] and [s.n for s in result.candidates] == [1, 2, 3, 4, 5]
    assert book.opinion.encoder is not None
    scores = [float(x) for x in book.opinion.encoder.score(DOG, [s.passage for s in result.candidates])]
    assert scores == sorted(scores, reverse=True)


async def test_without_the_cross_encoder_retrieval_answers_as_before_and_logs_once(
    book: Book, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    crossencoder.verified_dir.cache_clear()
    monkeypatch.setattr(crossencoder, "PACKAGE", "no_such_package_for_the_cross_encoder")
    try:
        with caplog.at_level(logging.WARNING, logger="textbook_chat.search.second_opinion"):
            missing = SecondOpinion.load(book.opinion.thresholds)
            assert not missing.available
            # An encoder whose files go missing after start: the first question finds out, the rest do not ask.
            broken = SecondOpinion(CrossEncoder(max_tokens=128, batch_size=1), book.opinion.thresholds)
            plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(DOG)
            for opinion in (missing, broken, broken):
                result = await Retriever(book.index, book.embedder, book.calibration, opinion).retrieve(DOG)
                assert result.second_opinion is None
                assert (result.level, result.confidence, result.sources) == (
                    plain.level,
                    plain.confidence,
                    plain.sources,
                )
        warnings = [r for r in caplog.records if r.name == "textbook_chat.search.second_opinion"]
        assert len(warnings) == 2  # one for the missing package at start, one for the encoder that failed
        assert "no_such_package_for_the_cross_encoder" in warnings[0].getMessage()
    finally:
        crossencoder.verified_dir.cache_clear()


async def test_the_thresholds_are_derived_deterministically_kept_with_the_index_and_used_by_serve(
    demo_index_dir: Path, tmp_path: Path
) -> None:
    data_dir = copy_index(demo_index_dir, tmp_path / "data")
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        opinion = SecondOpinion.load()
        try:
            retriever = Retriever(services.index, services.embedder, None, opinion)
            first = await calibration.derive(retriever, services.index)
            second = await calibration.derive(retriever, services.index)
        finally:
            opinion.close()
        assert first.thresholds is not None and first.thresholds == second.thresholds
        assert first.opinion_probes == second.opinion_probes
        assert len(first.opinion_probes) == calibration.OPINION_PROBES
        assert first.thresholds == calibration.opinion_rule(first.opinion_probes)
        report = calibration.report(first, confidence.CALIBRATIONS["local"])
        assert f"second opinion:         {first.thresholds.describe()}" in report
        await calibration.save(services.index, services.embedder, first.calibration, "book", first.thresholds)
        assert await calibration.stored_thresholds(services.index, services.embedder) == first.thresholds
    async with open_services(settings, chat=True) as services:
        assert services.chat is not None and services.chat.retriever is not None
        served = services.chat.retriever.second_opinion
        assert served is not None and served.thresholds == first.thresholds


@pytest.mark.parametrize(
    ("logits", "decline", "overturn"),
    [
        ([-11.3, -11.2, -10.6], -7.6, 0.4),  # the best unrelated probe + the margin
        ([-11.3, -9.1], -6.1, 1.9),
        ([-11.3, -11.3], -8.0, 0.0),  # a book no probe comes near: the window's floor
        ([-11.3, -4.0], -6.0, 2.0),  # probes that score high: never above the window's ceiling
    ],
)
def test_the_thresholds_rule(logits: list[float], decline: float, overturn: float) -> None:
    derived = calibration.opinion_rule(logits)
    assert derived.decline_below == pytest.approx(decline)
    assert derived.overturn_above == pytest.approx(overturn)
