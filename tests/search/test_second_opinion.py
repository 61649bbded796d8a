"""The second opinion: asked only where confidence is in doubt, it declines an answer the passages do not give
and overturns a decline the passages do answer, with the real cross-encoder on the demo book; without the
cross-encoder's files, retrieval answers as before and says so once."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import copy_index
from textbook_chat.core import crossencoder
from textbook_chat.core.crossencoder import CrossEncoder
from textbook_chat.core.settings import Settings
from textbook_chat.index.embeddings import Embedder
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search import calibration, confidence
from textbook_chat.search.calibration import Derived
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.context import Earlier
from textbook_chat.search.retrieval import Retriever
from textbook_chat.search.second_opinion import (
    LIFT_MARGIN,
    MAX_PAIRS,
    NAMED_MARGIN,
    Evidence,
    SecondOpinion,
    Thresholds,
    lifted,
    nearest,
    plan,
    settled,
)
from textbook_chat.web.services import open_services

# A question the demo book does not answer, whose passages (walking robots, learning) are close enough for retrieval
# alone to answer it at low confidence.
DOG = "How do I teach a robot dog to fetch a ball?"
# An answerable question (demo questions.jsonl) whose passage the cross-encoder finds clearly answering.
SPIN = "What does rclpy.spin() actually do?"


WEAK = Thresholds().weak_below


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (Evidence(0.9, 0.9, unknown_rare=False), "answer"),  # confident: pays nothing
        (Evidence(0.34, 0.34, unknown_rare=False), "answer"),  # in the band, but nothing else doubts it
        (Evidence(0.34, 0.34, unknown_rare=False, absent=0.6), "ask"),  # most of its words are not the book's
        # Barely above the decline point: weak passages are what the cross-encoder reads again, no evidence alone;
        # with a third of the question's words absent from the book, they are.
        (Evidence(WEAK - 0.01, WEAK - 0.01, unknown_rare=False), "answer"),
        (Evidence(WEAK - 0.01, WEAK - 0.01, unknown_rare=False, absent=0.4), "ask"),
        (Evidence(WEAK + 0.01, WEAK + 0.01, unknown_rare=False, absent=0.4), "answer"),
        (Evidence(0.3, 0.3, unknown_rare=True), "ask"),  # a rare word the book never uses
        (Evidence(0.3, 0.3, unknown_rare=False, unknown_name=True), "ask"),  # a name it never uses ("GitHub Sponsors")
        (Evidence(0.36, 0.36, unknown_rare=True), "answer"),  # above the band: retrieval is sure enough
        (Evidence(0.12, 0.12, unknown_rare=False), "ask"),  # declined by the passages, within the band
        (Evidence(0.05, 0.05, unknown_rare=False), "decline"),  # far below: clearly not in the book
        (Evidence(0.0, 0.5, unknown_rare=True), "ask"),  # the rules declined what the passages would answer
        (Evidence(0.0, 0.25, unknown_rare=True), "decline"),  # a rare unknown word and weak passages agree
        (Evidence(0.0, 0.15, unknown_rare=False), "decline"),  # the passages alone would have declined too
    ],
)
def test_it_is_asked_only_where_the_first_stage_and_the_term_evidence_disagree(
    evidence: Evidence, expected: str
) -> None:
    assert plan(Thresholds(), evidence) == expected


@pytest.mark.parametrize(
    ("scores", "order"),
    [
        ([1.0, 1.0 + LIFT_MARGIN], (0, 1)),  # preferred, but not by the margin: the first stage's order stays
        ([1.0, 1.1 + LIFT_MARGIN, -3.0], (1, 0, 2)),
        ([-9.0, -8.0, 9.0], (2, 0, 1)),  # clearly the answer: lifted past both
        ([-9.0, None, 9.0, None], (0, 1, 2, 3)),  # a passage it did not read keeps its place, and blocks
    ],
)
def test_it_lifts_a_passage_only_by_a_reliable_margin(scores: list[float | None], order: tuple[int, ...]) -> None:
    assert lifted(scores) == order


@pytest.mark.parametrize(
    ("scores", "declined", "expected"),
    [
        ([None, None, None], False, False),  # nothing read yet
        ([-6.0, None, None], False, True),  # an answer: one passage not clearly off, so it cannot be declined
        ([-9.0, None, None], False, False),  # ... but a decline needs every pair read low
        ([-9.0, -9.5, -8.0], False, False),  # all low: the caller has read its pairs and may decline
        ([-9.0, -2.0, None], False, True),  # the second passage saves the answer
        ([-10.0, -9.5, None], False, True),  # two far below the decline logit: the third is not read
        ([-10.0, -8.5, None], False, False),  # ... one within the margin: the third may save it
        ([2.0, None, None], True, True),  # a decline: the best passage clearly answers
        ([-9.0, None, None], True, True),  # ... the best passage clearly does not: the two stages agree
        ([-3.0, None, None], True, False),  # ... in between: the next passages may answer
        ([-3.0, -4.0, 2.0], True, True),
        ([None, 2.0, None], True, True),  # a cached later passage that answers settles it
    ],
)
def test_it_stops_reading_pairs_once_the_rest_cannot_change_the_decision(
    scores: list[float | None], declined: bool, expected: bool
) -> None:
    thresholds = Thresholds(decline_below=-7.0, overturn_above=1.0)
    assert settled(scores, declined=declined, thresholds=thresholds) is expected


def test_an_answer_naming_a_thing_the_book_never_mentions_is_settled_only_by_a_passage_that_clearly_answers() -> None:
    thresholds = Thresholds(decline_below=-7.0, overturn_above=1.0)  # clearly: over 1.0 + NAMED_MARGIN
    cases = (([-6.0, None, None], False), ([-6.0, -2.0, -3.0], False), ([-6.0, 2.0, None], False), ([-6, 3.5], True))
    for scores, expected in cases:
        assert settled(scores, declined=False, thresholds=thresholds, confirming=True) is expected


def test_a_pair_holds_the_passages_sentences_nearest_the_question() -> None:
    passage = (
        "Walking > Balance\nRobots walk on two legs. Many people find this impressive.\n"
        "The zero moment point must stay inside the support polygon.\n```python\nx = 1\n```\nThe end."
    )
    pair = nearest("Why must the zero moment point stay inside the support polygon?", passage, words=10)
    assert pair == "Walking > Balance\nThe zero moment point must stay inside the support polygon."
    assert nearest("unrelated words", passage, words=5) == "Walking > Balance\nRobots walk on two legs."


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
    derived: Derived


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
        yield Book(services.index, services.embedder, derived.calibration, opinion, derived)
        opinion.close()


@pytest.mark.slow
async def test_it_declines_an_answer_whose_passages_do_not_answer(book: Book) -> None:
    without = await Retriever(book.index, book.embedder, book.calibration).retrieve(DOG)
    assert not without.declined and without.level == "low"  # the book's calibration alone answers it

    result = await Retriever(book.index, book.embedder, book.calibration, book.opinion).retrieve(DOG)
    assert result.second_opinion is not None and result.second_opinion.change == "declined"
    assert result.second_opinion.score < book.opinion.thresholds.decline_below
    assert result.declined and result.sources == () and result.confidence < confidence.DECLINE
    assert result.related  # a decline still suggests the closest sections
    assert all(n.code != "low_confidence" for n in result.notices)


async def test_a_follow_up_on_another_subject_is_judged_by_its_own_words_not_the_subject_it_took(book: Book) -> None:
    """ "last" points back, so the question is read with the earlier subject ("ROS 2 action"), whose words the book
    uses: counted in the standalone form, the absent words would fall under a third and nothing would doubt it."""
    question, earlier = "Who won the last football World Cup?", [Earlier("What is a ROS 2 action?")]
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(question, earlier=earlier)
    assert plain.standalone is not None and "ROS 2" in plain.standalone
    # A calibration that puts its evidence just above the decline point and under the weak point, whatever this
    # CPU's int8 kernels make of it: only the words the book never uses can then call the cross-encoder in.
    common = (confidence.DECLINE + WEAK) / 2
    decline = plain.similarity * 0.9
    low = decline + (plain.similarity - decline) * (confidence.LOW - confidence.DECLINE) / (common - 0.2)
    placed = Calibration(decline=decline, low=low, high=min(low + 0.2, 0.95))
    first_stage = await Retriever(book.index, book.embedder, placed).retrieve(question, earlier=earlier)
    assert first_stage.confidence == pytest.approx(common, abs=0.002) and not first_stage.declined
    result = await Retriever(book.index, book.embedder, placed, book.opinion).retrieve(question, earlier=earlier)
    assert result.second_opinion is not None and result.declined


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


async def test_a_decline_on_weak_passages_alone_is_answered_above_the_midpoint_and_one_with_a_rare_word_is_not(
    book: Book,
) -> None:
    """Between its two logits the cross-encoder lifts only a decline that nothing but weak passages caused."""
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(SPIN)
    passages = [(s.chunk_id, s.passage) for s in plain.candidates]
    first = await book.opinion.judge(SPIN, passages, Evidence(0.15, 0.15, unknown_rare=False))
    assert first is not None
    best = first.score
    between = SecondOpinion(book.opinion.encoder, Thresholds(decline_below=best - 6, overturn_above=best + 2))
    assert between.thresholds.midpoint < best < between.thresholds.overturn_above
    weak = await between.judge(SPIN, passages, Evidence(0.15, 0.15, unknown_rare=False))
    assert weak is not None and weak.change == "answered"
    for doubted in (
        Evidence(0.15, 0.15, unknown_rare=True),  # a rare unknown word
        Evidence(0.15, 0.15, unknown_rare=False, unknown_name=True),  # a name the book never uses
        Evidence(0.15, 0.45, unknown_rare=False),  # a names rule's decline
    ):
        verdict = await between.judge(SPIN, passages, doubted)
        assert verdict is not None and verdict.change is None


async def test_an_answer_naming_a_thing_the_book_never_mentions_needs_a_passage_that_answers(book: Book) -> None:
    """Between its two logits the cross-encoder keeps an answer it doubts, unless the question names a thing the
    book never mentions ("How do MobX observables compare with RxJS?"): passages about its neighbours are not about
    it, so the answer stands only where a passage clearly answers: ``NAMED_MARGIN`` above the logit that says a
    passage answers, as a decline the names rule caused is lifted (a follow-up's subject, read with the question,
    made the book's own SDK pages answer "how would I do the same with the Zoom Video SDK?" at overturn + 1.2)."""
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(SPIN)
    passages = [(s.chunk_id, s.passage) for s in plain.candidates]
    # The best of every pair it may read, whatever this CPU's int8 kernels make of each: thresholds placed around it.
    read = await book.opinion.scores(SPIN, [passage for _, passage in passages[:MAX_PAIRS]])
    assert read is not None
    best = max(read)
    between = SecondOpinion(book.opinion.encoder, Thresholds(decline_below=best - 6, overturn_above=best + 2))
    doubted = await between.judge(SPIN, passages, Evidence(0.3, 0.3, unknown_rare=True))
    assert doubted is not None and doubted.change is None  # a rare word alone: kept between the two logits
    named = Evidence(0.3, 0.3, unknown_rare=False, unknown_name=True)
    unconfirmed = await between.judge(SPIN, passages, named)
    assert unconfirmed is not None and unconfirmed.change == "declined"
    barely = SecondOpinion(book.opinion.encoder, Thresholds(decline_below=best - 8, overturn_above=best - 1))
    assert barely.thresholds.overturn_above < best < barely.thresholds.lifts_above(named=True)
    not_clearly = await barely.judge(SPIN, passages, named)
    assert not_clearly is not None and not_clearly.change == "declined"
    clearly = Thresholds(decline_below=best - 10, overturn_above=best - NAMED_MARGIN - 1)
    confirmed = await SecondOpinion(book.opinion.encoder, clearly).judge(SPIN, passages, named)
    assert confirmed is not None and confirmed.change is None


async def test_a_decline_of_a_question_naming_a_thing_the_book_never_mentions_is_lifted_only_by_a_clear_answer(
    book: Book,
) -> None:
    """The names rule declined it (its passages alone would have answered): a passage just above the overturn logit
    is a neighbour's ("the scan operator" read against the passage on reduce); one well above it answers."""
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(SPIN)
    passages = [(s.chunk_id, s.passage) for s in plain.candidates]
    read = await book.opinion.scores(SPIN, [passage for _, passage in passages[:MAX_PAIRS]])
    assert read is not None
    best = max(read)
    named = Evidence(0.0, 0.5, unknown_rare=False, unknown_name=True)
    just_above = SecondOpinion(book.opinion.encoder, Thresholds(decline_below=best - 9, overturn_above=best - 1))
    kept = await just_above.judge(SPIN, passages, named)
    assert kept is not None and kept.change is None  # still declined
    unnamed = await just_above.judge(SPIN, passages, replace(named, unknown_name=False))
    assert unnamed is not None and unnamed.change == "answered"  # what any other names-rule decline gets
    clear = SecondOpinion(
        book.opinion.encoder, Thresholds(decline_below=best - 14, overturn_above=best - NAMED_MARGIN - 1)
    )
    lifted_ = await clear.judge(SPIN, passages, named)
    assert lifted_ is not None and lifted_.change == "answered"


async def test_where_it_is_asked_it_reads_few_pairs_and_keeps_the_first_stages_order_within_its_margin(
    book: Book,
) -> None:
    opinion = SecondOpinion(book.opinion.encoder, book.opinion.thresholds)  # its own cache: it reads every pair
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(DOG)
    result = await Retriever(book.index, book.embedder, book.calibration, opinion).retrieve(DOG)
    verdict = result.second_opinion
    assert verdict is not None and 1 <= verdict.pairs <= MAX_PAIRS
    assert [s.n for s in result.candidates] == list(range(1, len(result.candidates) + 1))
    assert {s.chunk_id for s in result.candidates} == {s.chunk_id for s in plain.candidates}
    assert book.opinion.encoder is not None
    read = [nearest(DOG, s.passage) for s in plain.candidates[: verdict.pairs]]
    scores = [float(x) for x in book.opinion.encoder.score(DOG, read)]
    expected = lifted([*scores, *[None] * (len(plain.candidates) - len(scores))])
    assert [s.chunk_id for s in result.candidates] == [plain.candidates[i].chunk_id for i in expected]


async def test_a_question_asked_again_is_judged_from_the_cache_whatever_its_case_or_spacing(book: Book) -> None:
    retriever = Retriever(book.index, book.embedder, book.calibration, SecondOpinion(book.opinion.encoder))
    first = await retriever.retrieve(DOG)
    assert first.second_opinion is not None and first.second_opinion.pairs
    again = await retriever.retrieve("  " + DOG.upper().replace(" ", "  "))
    assert first.second_opinion is not None and again.second_opinion is not None
    assert again.second_opinion.pairs == 0 and again.second_opinion.score == first.second_opinion.score


async def test_a_strong_agreeing_retrieval_is_never_declined_by_the_cross_encoder_alone(book: Book) -> None:
    """Thresholds under which the cross-encoder would decline everything: without evidence about the question's
    words it is not asked, however weak the first stage (weak passages are what it would read again)."""
    doubting = replace(book.opinion.thresholds, decline_below=9.5, overturn_above=10.0)
    opinion = SecondOpinion(book.opinion.encoder, doubting)
    plain = await Retriever(book.index, book.embedder, book.calibration).retrieve(SPIN)
    # Calibrations that put SPIN's evidence in the band: above the weak point, then below it.
    for common in (0.3, WEAK - 0.005):
        decline = plain.similarity * 0.9
        low = decline + (plain.similarity - decline) * (confidence.LOW - confidence.DECLINE) / (common - 0.2)
        placed = Calibration(decline=decline, low=low, high=min(low + 0.2, 0.95))
        first_stage = await Retriever(book.index, book.embedder, placed).retrieve(SPIN)
        assert first_stage.confidence == pytest.approx(common, abs=0.002) and not first_stage.declined
        result = await Retriever(book.index, book.embedder, placed, opinion).retrieve(SPIN)
        assert result.second_opinion is None and not result.declined


async def test_a_burst_of_questions_it_reads_runs_off_the_event_loop_with_bounded_concurrency(
    book: Book, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = CrossEncoder(max_tokens=80, batch_size=1, workers=2)
    opinion = SecondOpinion(encoder, book.opinion.thresholds)
    retriever = Retriever(book.index, book.embedder, book.calibration, opinion)
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    running = most = 0
    lock = threading.Lock()
    score = encoder.score

    def watched(question: str, passages: Sequence[str]) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.get_ident())
        try:
            return score(question, passages)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(encoder, "score", watched)
    try:
        results = await asyncio.gather(*(retriever.retrieve(f"{DOG} ({n})") for n in range(6)))
    finally:
        encoder.close()
    assert all(r.second_opinion is not None and r.second_opinion.pairs for r in results)
    assert loop_thread not in threads and most <= 2  # the model's two worker threads, never the loop


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


@pytest.mark.slow
async def test_the_thresholds_are_derived_deterministically_kept_with_the_index_and_used_by_serve(
    book: Book, demo_index_dir: Path, tmp_path: Path
) -> None:
    data_dir = copy_index(demo_index_dir, tmp_path / "data")
    settings = Settings.from_env({"DATA_DIR": str(data_dir), "EMBEDDER": "local"})
    async with open_services(settings, retrieval=True) as services:
        assert services.index is not None and services.embedder is not None
        opinion = SecondOpinion.load()
        try:
            first = await calibration.derive(
                Retriever(services.index, services.embedder, None, opinion), services.index
            )
        finally:
            opinion.close()
        second = book.derived  # the same book's derivation, on another copy of its index
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


def test_in_scope_probes_that_score_low_pull_the_decline_point_between_the_two_distributions() -> None:
    out_of_scope = [-11.3, -10.0]
    assert calibration.opinion_rule(out_of_scope, [8.0] * 10).decline_below == pytest.approx(-7.0)
    # A book whose own paraphrases score low: halfway from the unrelated probes' best to their 10th percentile.
    low = calibration.opinion_rule(out_of_scope, [-9.0, *[-7.0] * 9])
    assert low.decline_below == pytest.approx(-8.0)  # (-10.0 + -7.2) / 2, floored by the window


def test_a_heading_free_paraphrase_probe_keeps_the_opening_sentence_without_the_headings_words() -> None:
    text = "```bash\nls\n```\nThe zero moment point must stay inside the support polygon of the feet."
    probe = calibration.without_heading_words("Zero Moment Point", text)
    assert probe == "The must stay inside the support polygon of the feet."
    assert calibration.without_heading_words("Zero Moment Point", "Zero moment point.") == ""
