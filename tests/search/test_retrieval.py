"""Retrieval on small indexes built in the test: ranking, budget, declines, the adaptive module filter, selection.

Most tests use ``WordEmbedder``, a real (if simple) embedder whose similarities follow word overlap, so each
branch can be reached on purpose; the last ones use the local MiniLM index of the demo book.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from qdrant_client import AsyncQdrantClient

from tests.conftest import DEMO_BOOK, copy_index
from textbook_chat.core import rarity
from textbook_chat.core.settings import Settings
from textbook_chat.core.tokens import TokenCounter
from textbook_chat.index import ingest, sparse
from textbook_chat.index.qdrant_server import ServerCollection
from textbook_chat.index.vectors import VectorIndex
from textbook_chat.search import evaluate
from textbook_chat.search.confidence import Calibration
from textbook_chat.search.context import Asked, Earlier
from textbook_chat.search.retrieval import CONTEXT_BUDGET_TOKENS, Retriever, excerpt
from textbook_chat.web.services import open_services

# WordEmbedder's similarities for a matching section sit around 0.35-0.6 (breadcrumbs and filler dilute them).
SCALE = Calibration(decline=0.1, low=0.15, high=0.5)
GEAR = "gearbox torque ratio"


class WordCounter:
    name = "words"
    exact = True

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, max_tokens: int) -> str:
        return " ".join(text.split()[:max_tokens])


class WordEmbedder:
    """Bag of keyword terms hashed into 256 dimensions, L2-normalised: cosine follows shared words."""

    name = "words"
    model = query_model = "words-256"
    dim = 256
    counter: TokenCounter = WordCounter()
    chunk_tokens = 2000
    chunk_overlap = 0

    async def embed_documents(self, texts: Sequence[str], *, background: bool = False) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        return self._embed(text)

    def prepare_queries(self) -> None:
        return None

    def release_batches(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _embed(self, text: str) -> list[float]:
        vector = [0.0] * self.dim
        for term in sparse.terms(text):
            vector[int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "big") % self.dim] += 1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return [v / norm for v in vector]


def _section(heading: str, *words: str) -> str:
    return f"## {heading}\n\n{' '.join(words)}.\n"


def _filler(tag: str, n: int = 4) -> list[str]:
    return [f"{tag}{chr(97 + i)}word" for i in range(n)]


def _write_book(root: Path) -> Path:
    """m1: five sections on gearboxes; m2: two on gearboxes among three on sensors; m3: walking, one zebra."""
    docs = root / "docs"
    files = {
        "m1-gears/gears.md": [_section(f"Gears {i}", GEAR, *_filler(f"g{i}")) for i in range(5)],
        "m2-sensors/sensors.md": [_section(f"Gear note {i}", GEAR, *_filler(f"n{i}")) for i in range(2)]
        + [_section(f"Sensor {i}", "camera lidar imu", *_filler(f"s{i}")) for i in range(3)],
        "m3-walking/walking.md": [_section(f"Gait {i}", "footstep balance gait", *_filler(f"w{i}")) for i in range(4)]
        + [_section("Stripes", "zebra stripes", *_filler("z", 40))],
    }
    for name, sections in files.items():
        path = docs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.stem.title()}\n\n" + "\n".join(sections), encoding="utf-8")
    return root


@pytest.fixture
async def small_index(tmp_path: Path) -> AsyncIterator[VectorIndex]:
    settings = Settings.from_env({"DATA_DIR": str(tmp_path / "data")})
    book = _write_book(tmp_path / "book")
    index = VectorIndex.from_settings(settings)
    await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
    yield index
    await index.close()


@pytest.fixture
def retriever(small_index: VectorIndex) -> Retriever:
    return Retriever(small_index, WordEmbedder(), SCALE)


# -- ranking, budget, confidence -------------------------------------------------------------------


async def test_the_best_matching_sections_come_first_numbered_from_one(retriever: Retriever) -> None:
    result = await retriever.retrieve("What is a gearbox torque ratio?")
    assert [s.n for s in result.sources] == list(range(1, len(result.sources) + 1))
    assert 1 <= len(result.sources) <= 5
    assert all(GEAR in s.text for s in result.sources[:5])
    assert result.level in ("medium", "high") and not result.declined
    assert result.sources[0].url.startswith("http://book.test/docs/")


async def test_near_duplicate_chunks_do_not_crowd_out_the_rest(tmp_path: Path) -> None:
    book = tmp_path / "book"
    same = " ".join([GEAR, *_filler("dup", 12)])
    sections = [_section(f"Copy {i}", same) for i in range(4)] + [_section("Other", GEAR, *_filler("o", 3))]
    (book / "docs" / "m1").mkdir(parents=True)
    (book / "docs" / "m1" / "a.md").write_text("# A\n\n" + "\n".join(sections), encoding="utf-8")
    index = VectorIndex.from_settings(Settings.from_env({"DATA_DIR": str(tmp_path / "data")}))
    try:
        await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
        result = await Retriever(index, WordEmbedder(), SCALE).retrieve(GEAR)
    finally:
        await index.close()
    copies = [s for s in result.candidates if "dupaword" in s.text]
    assert len(copies) == 1
    assert any(s.heading_path[-1] == "Other" for s in result.candidates)


async def test_the_chapter_that_teaches_outranks_the_quiz_that_restates_the_question(tmp_path: Path) -> None:
    book = tmp_path / "book"
    (book / "docs" / "m1").mkdir(parents=True)
    (book / "docs" / "m1" / "gears.md").write_text(
        "# Gears\n\n" + _section("Ratios", GEAR, "multiplies output force", *_filler("t", 2)), encoding="utf-8"
    )
    quiz = "# Quiz\n\n## Question 1\n\nWhat does a gearbox torque ratio do?\na) gearbox torque\nb) ratio torque\n"
    (book / "docs" / "m1" / "quiz.md").write_text(quiz, encoding="utf-8")
    index = VectorIndex.from_settings(Settings.from_env({"DATA_DIR": str(tmp_path / "data")}))
    try:
        await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
        retriever = Retriever(index, WordEmbedder(), SCALE)
        taught = await retriever.retrieve("What does a gearbox torque ratio do?")
        practised = await retriever.retrieve("Which quiz asks what a gearbox torque ratio does?")
    finally:
        await index.close()
    assert taught.candidates[1].kind == "assessment"
    assert taught.candidates[1].score > taught.candidates[0].score  # closer in meaning, yet second
    assert taught.candidates[0].title == "Ratios"
    assert practised.candidates[0].kind == "assessment"  # a reader who asks for the quiz gets it


async def test_sources_fit_the_context_budget_best_first(tmp_path: Path) -> None:
    book = tmp_path / "book"
    (book / "docs" / "m1").mkdir(parents=True)
    long_words = [f"{GEAR} " + " ".join(f"w{i}x{j}" for j in range(1400)) for i in range(4)]
    sections = [_section(f"Long {i}", text) for i, text in enumerate(long_words)]
    (book / "docs" / "m1" / "a.md").write_text("# A\n\n" + "\n".join(sections), encoding="utf-8")
    index = VectorIndex.from_settings(Settings.from_env({"DATA_DIR": str(tmp_path / "data")}))
    try:
        await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
        result = await Retriever(index, WordEmbedder(), Calibration(decline=0.01, low=0.02, high=0.9)).retrieve(GEAR)
    finally:
        await index.close()
    assert len(result.candidates) == 4
    assert 1 <= len(result.sources) < 4
    assert sum(s.token_count for s in result.sources) <= CONTEXT_BUDGET_TOKENS
    assert result.sources[0].chunk_id == result.candidates[0].chunk_id


async def test_a_question_the_book_does_not_cover_is_declined_with_three_related_sections(
    retriever: Retriever,
) -> None:
    result = await retriever.retrieve("What should I cook for dinner tonight?")
    assert result.declined and result.level == "none"
    assert result.sources == ()
    assert 1 <= len(result.related) <= 3
    assert len({s.url for s in result.related}) == len(result.related)


async def test_a_question_naming_something_the_book_never_mentions_is_declined(retriever: Retriever) -> None:
    result = await retriever.retrieve("How do I tune the gearbox torque ratio in MoveIt?")
    assert result.unknown_terms == ("moveit",)
    assert result.declined
    named_and_known = await retriever.retrieve("How do I tune the gearbox torque ratio in Gears?")
    assert named_and_known.unknown_terms == () and not named_and_known.declined


@pytest.mark.parametrize(
    ("question", "level"),
    [("footstep balance gait", "high"), ("camera", "medium"), ("What should I cook for dinner tonight?", "none")],
)
async def test_confidence_levels_follow_the_evidence(retriever: Retriever, question: str, level: str) -> None:
    result = await retriever.retrieve(question)
    assert result.level == level
    assert bool(result.sources) == (level != "none")
    assert "low_confidence" not in [n.code for n in result.notices]


async def test_weak_evidence_answers_with_a_low_confidence_notice(small_index: VectorIndex) -> None:
    lenient = Retriever(small_index, WordEmbedder(), Calibration(decline=0.05, low=0.6, high=0.9))
    result = await lenient.retrieve("zebra stripes")
    assert result.level == "low"
    assert [n.code for n in result.notices] == ["low_confidence"]
    assert result.sources and result.sources[0].heading_path[-1] == "Stripes"


# -- the adaptive module filter (docs/evaluation.md) --------------------------------------------------------


async def test_a_module_that_answers_well_keeps_the_filter_strictly(retriever: Retriever) -> None:
    result = await retriever.retrieve(GEAR, module="m1-gears")
    assert result.scope.decision == "strict" and result.scope.searched == "module"
    assert result.notices == () and result.scope.event()["note"] is None
    assert {s.module for s in result.sources} == {"m1-gears"}


async def test_a_module_that_answers_partly_keeps_the_filter_with_a_partial_notice(retriever: Retriever) -> None:
    result = await retriever.retrieve(GEAR, module="m2-sensors")
    assert result.scope.decision == "partial" and result.scope.searched == "module"
    assert [n.code for n in result.notices] == ["scope_partial"]
    assert {s.module for s in result.sources} == {"m2-sensors"}


async def test_a_module_without_the_answer_is_widened_to_the_whole_book(retriever: Retriever) -> None:
    result = await retriever.retrieve(GEAR, module="m3-walking")
    assert result.scope.decision == "widened" and result.scope.searched == "all"
    assert [n.code for n in result.notices] == ["scope_widened"]
    assert result.scope.event() == {
        "requested_module": "m3-walking",
        "searched": "all",
        "note": result.notices[0].message,
    }
    assert result.sources[0].module in ("m1-gears", "m2-sensors")
    title = {m.id: m.title for m in await retriever.index.modules()}["m3-walking"]
    assert title in result.notices[0].message and "m3-walking" not in result.notices[0].message  # a title, not an id


async def test_when_no_module_does_better_the_filter_stays_and_suggests_removing_it(retriever: Retriever) -> None:
    result = await retriever.retrieve("zebra stripes", module="m3-walking")
    assert result.scope.decision == "limited" and result.scope.searched == "module"
    assert "scope_limited" in [n.code for n in result.notices]
    assert "Remove the module filter" in (result.scope.note or "")


# -- selection mode --------------------------------------------------------------------------------


async def test_selection_mode_cites_the_chunk_holding_the_selection_first(retriever: Retriever) -> None:
    selection = "zebra stripes " + " ".join(_filler("z", 40))
    result = await retriever.retrieve("What does this say?", selected_text=selection)
    assert result.mode == "selection" and not result.declined
    assert 1 <= len(result.sources) <= 3
    assert result.sources[0].heading_path[-1] == "Stripes"


async def test_a_selection_spanning_two_chunks_cites_both_even_below_the_citation_threshold(
    small_index: VectorIndex,
) -> None:
    # So strict that no chunk is cited on similarity alone: only holding the selection gets a chunk cited.
    strict = Retriever(small_index, WordEmbedder(), Calibration(decline=0.9, low=0.95, high=0.98))
    selection = "\n\n".join(f"Gait {i}\n\nfootstep balance gait {' '.join(_filler(f'w{i}'))}." for i in (1, 2))
    result = await strict.retrieve("Summarise this", selected_text=selection)
    assert {s.heading_path[-1] for s in result.sources} == {"Gait 1", "Gait 2"}


async def test_selection_mode_never_declines_even_when_the_book_has_nothing_similar(retriever: Retriever) -> None:
    result = await retriever.retrieve("Explain this", selected_text="Completely unrelated prose about cooking pasta.")
    assert result.mode == "selection" and not result.declined and result.level != "none"


# -- the in-process copy and the server path -------------------------------------------------------


async def test_retrieval_sees_what_was_ingested_after_its_first_question(tmp_path: Path) -> None:
    book = _write_book(tmp_path / "book")
    index = VectorIndex.from_settings(Settings.from_env({"DATA_DIR": str(tmp_path / "data")}))
    try:
        await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
        retriever = Retriever(index, WordEmbedder(), SCALE)
        assert (await retriever.retrieve("quantum flux capacitor")).declined
        extra = book / "docs" / "m3-walking" / "flux.md"
        extra.write_text("# Flux\n\n" + _section("Capacitors", "quantum flux capacitor", *_filler("q")), "utf-8")
        await ingest.run(book, index, WordEmbedder(), base_url="http://book.test")
        after = await retriever.retrieve("quantum flux capacitor")
    finally:
        await index.close()
    assert not after.declined and after.sources[0].file_path == "m3-walking/flux.md"


def _server_api_index(path: Path) -> VectorIndex:
    """The server code path (qdrant-client) on its local mode: the stand-in for a Qdrant server in tests."""
    return VectorIndex(ServerCollection(AsyncQdrantClient(path=str(path)), "textbook"), timeout_s=30)


async def test_the_server_path_ranks_like_the_embedded_engine(tmp_path: Path, small_index: VectorIndex) -> None:
    server_index = _server_api_index(tmp_path / "server-api")
    try:
        await ingest.run(_write_book(tmp_path / "book2"), server_index, WordEmbedder(), base_url="http://book.test")
        embedded, remote = Retriever(small_index, WordEmbedder(), SCALE), Retriever(server_index, WordEmbedder(), SCALE)
        for question, module in ((GEAR, None), (GEAR, "m3-walking"), ("How do I tune the gearbox in MoveIt?", None)):
            local = await embedded.retrieve(question, module=module)
            served = await remote.retrieve(question, module=module)
            # Many sections tie exactly with this embedder, so compare what was found, not the order among equals.
            assert sorted(round(s.score, 4) for s in served.candidates) == sorted(
                round(s.score, 4) for s in local.candidates
            )
            assert served.confidence == pytest.approx(local.confidence, abs=0.01)
            assert (served.level, served.scope.decision, served.unknown_terms) == (
                local.level,
                local.scope.decision,
                local.unknown_terms,
            )
    finally:
        await server_index.close()


@pytest.fixture(scope="module")
async def demo_server_retriever(
    demo_retriever: Retriever, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Retriever]:
    index = _server_api_index(tmp_path_factory.mktemp("demo-server-api"))
    await ingest.run(DEMO_BOOK, index, demo_retriever.embedder, base_url=Settings.from_env({}).book_base_url)
    yield Retriever(index, demo_retriever.embedder)
    await index.close()


@pytest.mark.slow
async def test_the_embedded_and_server_engines_answer_the_same_hybrid_query_on_the_demo_book(
    demo_retriever: Retriever, demo_server_retriever: Retriever
) -> None:
    # The real MiniLM index of the demo book in both engines: the same Prefetch + RRF query, the same points.
    same_order = cases = 0
    for question in evaluate.load_questions(DEMO_BOOK / "questions.jsonl"):
        for module in {None, question.module}:
            dense = await demo_retriever.embedder.embed_query(question.question)
            keywords = sparse.query_vector(question.question)
            local = await demo_retriever.index.hybrid_search(dense, keywords, limit=10, module=module)
            remote = await demo_server_retriever.index.hybrid_search(dense, keywords, limit=10, module=module)
            cases += 1
            same_order += [h.id for h in local] == [h.id for h in remote]
            assert local[0].id == remote[0].id, (question.id, module)
            assert len({h.id for h in local} & {h.id for h in remote}) >= 9, (question.id, module)
            cosines = {h.id: h.dense_score for h in remote}
            assert all(h.dense_score == pytest.approx(cosines[h.id], abs=1e-4) for h in local if h.id in cosines)
    assert cases >= 30 and same_order >= 0.9 * cases


async def test_the_server_path_retrieves_what_the_embedded_path_does_on_a_real_index(
    demo_retriever: Retriever, demo_server_retriever: Retriever
) -> None:
    for question in evaluate.load_questions(DEMO_BOOK / "questions.jsonl"):
        module = question.module if question.kind == "module_filter" else None
        local = await demo_retriever.retrieve(question.question, module=module, selected_text=question.selected_text)
        remote = await demo_server_retriever.retrieve(
            question.question, module=module, selected_text=question.selected_text
        )
        assert remote.candidates[0].chunk_id == local.candidates[0].chunk_id, question.id
        assert remote.confidence == pytest.approx(local.confidence, abs=0.02), question.id
        assert (remote.level, remote.scope, remote.unknown_terms) == (local.level, local.scope, local.unknown_terms)


async def test_the_same_question_gets_the_same_sources_in_the_same_order_every_time(
    demo_retriever: Retriever,
) -> None:
    questions = [q for q in evaluate.load_questions(DEMO_BOOK / "questions.jsonl")][:5]
    for question in questions:
        first = await demo_retriever.retrieve(question.question, module=question.module)
        for _ in range(10):
            again = await demo_retriever.retrieve(question.question, module=question.module)
            assert [s.chunk_id for s in again.candidates] == [s.chunk_id for s in first.candidates]


class CountingWordEmbedder(WordEmbedder):
    """WordEmbedder, counting the questions it embeds."""

    questions = 0

    async def embed_query(self, text: str) -> list[float]:
        self.questions += 1
        await asyncio.sleep(0.01)  # as a model's run would: the others ask meanwhile
        return await super().embed_query(text)


async def test_readers_asking_the_same_first_question_at_once_share_one_retrieval(small_index: VectorIndex) -> None:
    embedder = CountingWordEmbedder()
    retriever = Retriever(small_index, embedder, SCALE)
    results = await asyncio.gather(*(retriever.retrieve(GEAR) for _ in range(5)))
    assert embedder.questions == 1 and all(r == results[0] for r in results) and results[0].sources
    await asyncio.gather(retriever.retrieve(GEAR), retriever.retrieve(GEAR, module="m1-gears"))
    assert embedder.questions == 3  # asked again once it was answered, and with a module filter: its own
    earlier = [Earlier("What is a gearbox?")]
    await asyncio.gather(*(retriever.retrieve("And how is it oiled?", earlier=earlier) for _ in range(2)))
    assert embedder.questions > 3  # a follow-up is read in its own session's context: never shared


def test_exact_ties_are_broken_by_cosine_then_id() -> None:
    class Tied:
        embedded = True
        upsert_batch = 64

        async def hybrid(self, *args: object, **kwargs: object) -> list[tuple[str, float, dict[str, str], list[float]]]:
            return [("b", 0.5, {}, [1.0, 0.0]), ("c", 0.5, {}, [0.6, 0.8]), ("a", 0.5, {}, [1.0, 0.0])]

    index = VectorIndex(Tied(), timeout_s=1)  # type: ignore[arg-type]
    hits = asyncio.run(index.hybrid_search([1.0, 0.0], sparse.Sparse((), ()), limit=3))
    assert [h.id for h in hits] == ["a", "b", "c"]


# -- helpers ---------------------------------------------------------------------------------------


def test_an_excerpt_is_plain_prose_cut_at_a_word() -> None:
    text = (
        "## Heading\n\n**Bold** and `code` with a [link](http://x.test).\n\n```python\nprint(1)\n```\n" + "word " * 80
    )
    result = excerpt(text, limit=60)
    assert "```" not in result and "**" not in result and "](" not in result
    assert result.endswith("…") and len(result) <= 61


# -- the real local embedder on the demo book ------------------------------------------------------


@pytest.fixture(scope="module")
async def demo_retriever(demo_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Retriever]:
    data = copy_index(demo_index_dir, tmp_path_factory.mktemp("demo-retrieval") / "data")
    async with open_services(Settings.from_env({"DATA_DIR": str(data), "EMBEDDER": "local"}), retrieval=True) as s:
        assert s.index is not None and s.embedder is not None
        yield Retriever(s.index, s.embedder)


async def test_a_question_joined_to_chatter_is_answered_from_its_part_the_book_answers(
    demo_retriever: Retriever,
) -> None:
    """The whole reads as nothing the book answers (one vector for holidays and simulation); its question alone
    does. Two questions the book answers neither of stay declined."""
    joined = "I have a long question about my holidays and my family. What is domain randomisation?"
    whole = await demo_retriever._textbook(Asked(joined), None)  # noqa: SLF001 -- the whole, as it used to be read
    assert whole.declined
    result = await demo_retriever.retrieve(joined)
    assert not result.declined and result.confidence > whole.confidence
    assert result.sources[0].file_path == "03-simulation-and-learning/02-sim-to-real-and-rl.md"
    assert (await demo_retriever.retrieve("How do I cook pasta, and what is the best pizza in Naples?")).declined


async def test_a_hyphenated_name_is_the_books_where_each_of_its_parts_is(demo_retriever: Retriever) -> None:
    """The same compound written another way ("Zero-Moment Point" in a book of "Zero Moment Point") is not a thing
    the book never mentions; one with a part the book never uses ("micro-ROS") still is."""
    written_apart = await demo_retriever.retrieve("How does the Zero-Moment Point keep a humanoid upright?")
    assert written_apart.unknown_terms == () and not written_apart.declined
    other = await demo_retriever.retrieve("How do I flash micro-ROS firmware onto an ESP32?")
    assert "micro-ros" in other.unknown_terms and other.declined


async def test_minilm_finds_the_section_of_a_paraphrased_question(demo_retriever: Retriever) -> None:
    result = await demo_retriever.retrieve("Why is simply cutting motor power a bad way to stop a walking humanoid?")
    assert not result.declined
    assert result.sources[0].file_path.startswith("03-simulation-and-learning/")


async def test_minilm_declines_a_near_miss_and_an_unrelated_question(demo_retriever: Retriever) -> None:
    near_miss = await demo_retriever.retrieve("How do I configure MoveIt 2 to plan motions for a robot arm?")
    unrelated = await demo_retriever.retrieve("How long should I boil an egg to get a soft yolk?")
    assert near_miss.declined and near_miss.unknown_terms[0] == "moveit"  # the name first, then specific terms
    # Declined on its passages alone, whatever words of it the book lacks ("yolk" is spelled yo+lk: a fragment).
    assert unrelated.declined and unrelated.unscaled < 0.2
    assert len(unrelated.related) == 3


@pytest.mark.parametrize(
    "asked",
    [
        "WHY USE A TEACHER-STUDENT SCHEME FOR LOCOMOTION POLICIES?",  # caps lock
        "Why use a Teacher-Student scheme for locomotion policies?",  # the book writes "Teacher–Student"
    ],
)
async def test_a_question_is_answered_as_its_lowercase_twin_whatever_its_capitals(
    demo_retriever: Retriever, asked: str
) -> None:
    twin = await demo_retriever.retrieve(asked.lower())
    result = await demo_retriever.retrieve(asked)
    assert not twin.declined and not result.declined
    assert result.confidence == pytest.approx(twin.confidence, abs=0.02)
    assert result.sources[0].url == twin.sources[0].url


# -- informative terms the book never uses ---------------------------------------------------------


def test_a_questions_specific_terms_are_the_rare_ones_not_its_phrasing() -> None:
    specific = sparse.informative("How is the LQR feedback gain obtained for a quadcopter actuator?", exclude=["lqr"])
    assert set(specific) == {"quadcopter", "actuator"}  # "obtained", "feedback", "gain" are everyday words
    assert sparse.informative("In the two-link leg example, where does the ankle end up?") == {}


@pytest.mark.parametrize(
    ("word", "specific"),
    [
        ("strace", True),  # rare in English (wordfreq), as commands and tools are
        ("grep", True),
        ("gdb", True),
        ("cron", True),
        ("conda", True),  # one word piece: the word-piece rule missed it
        ("gripper", False),  # a form of "grip"
        ("gait", False),  # technical-sounding, but everyday English
        ("blindly", False),
        ("launch", False),
    ],
)
def test_a_lowercase_command_is_a_specific_term_and_an_everyday_word_is_not(word: str, specific: bool) -> None:
    assert sparse.specific(word) is specific


@pytest.mark.parametrize(("word", "specific"), [("strace", True), ("rsync", True), ("setpoint", False)])
def test_without_the_word_list_word_pieces_stand_in_for_rarity(
    word: str, specific: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rarity, "rare", lambda *_: None)
    assert sparse.specific(word) is specific


async def test_a_command_the_book_never_mentions_declines_and_one_it_uses_does_not(
    demo_retriever: Retriever,
) -> None:
    unknown = await demo_retriever.retrieve("How do I use strace to see which system calls my robot's driver makes?")
    assert unknown.declined and unknown.unknown_terms == ("strace",)
    # "urdf" is as fragmentary (ur + df), and the demo book explains it: the question is answered.
    known = await demo_retriever.retrieve("What does a urdf file describe about the robot?")
    assert not known.declined and "urdf" not in known.unknown_terms
    assert known.sources[0].file_path == "02-ros2/03-launch-urdf-tf2.mdx"


def test_the_unknown_share_of_specific_terms_scales_the_evidence_squared() -> None:
    from textbook_chat.search.confidence import term_factor

    assert term_factor({}, []) == 1.0
    assert term_factor({"quadcopter": 1.0}, ["quadcopter"]) == 0.0
    assert term_factor({"quadcopter": 1.0, "actuator": 1.0}, ["quadcopter"]) == pytest.approx(0.25)


async def test_a_near_domain_question_whose_key_term_the_book_never_uses_is_declined_with_sections(
    demo_retriever: Retriever,
) -> None:
    result = await demo_retriever.retrieve("How do I tune the attitude controller of a quadcopter?")
    assert result.declined and "quadcopter" in result.unknown_terms
    assert result.related  # the decline still offers the closest sections


async def test_a_paraphrase_of_an_answerable_question_is_not_declined(demo_retriever: Retriever) -> None:
    for question in (
        "Where does the ankle end up in the two-link leg example when the hip and knee angles are zero?",
        "Why shouldn't you just cut the motor power to stop a walking humanoid?",
    ):
        result = await demo_retriever.retrieve(question)
        assert not result.declined, (question, result.unknown_terms, result.confidence)


def test_a_follow_up_loses_evidence_by_the_square_of_its_own_words_the_book_never_uses() -> None:
    """One word of three the book does not use is a paraphrase ("how does it talk to ROS 2?"): most evidence
    stays. A question that does not point back loses all of it when none of its words is the book's ("what is
    the best way to store fresh herbs?"). One that points back weighs each absent word by how specific it is
    (``sparse.specificity``): "cook pasta" still loses most, everyday words ("put up a wall against that") little."""
    from textbook_chat.index.sparse import specificity
    from textbook_chat.search import context
    from textbook_chat.search.context import Earlier, known
    from textbook_chat.search.rerank import Query

    earlier = [Earlier("What is Gazebo Harmonic?")]
    paraphrase = context.read("How does it exchange messages with ROS?", earlier)
    exchange = specificity("exchange")
    assert known(Query(paraphrase.question), ["exchange"], paraphrase) == pytest.approx(1 - (exchange / 3) ** 2)
    herbs = context.read("What is the best way to store fresh herbs?", earlier).contextual()
    assert known(Query(herbs.question), list(herbs.own_terms), herbs) == 0.0
    other_subject = context.read("And how do I cook pasta?", earlier)
    assert known(Query(other_subject.question), [], other_subject) == 1.0
    pasta = known(Query(other_subject.question), ["cook", "pasta"], other_subject)
    wall = context.read("How would I put up a wall against that?", earlier)
    assert pasta < 0.6 < 0.8 < known(Query(wall.question), ["put", "wall"], wall)
