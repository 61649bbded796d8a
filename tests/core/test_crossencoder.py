"""The cross-encoder reads a question with each passage and scores the one that answers it far above the rest."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from textbook_chat.core import crossencoder
from textbook_chat.core.crossencoder import CrossEncoder

PID = (
    "A PID controller computes its output from the proportional, integral and derivative terms of the error "
    "between the setpoint and the measured value."
)
BREAD = "Feed a sourdough starter with equal weights of flour and water once a day."


@pytest.fixture(scope="module")
def model() -> CrossEncoder:
    return CrossEncoder()


def test_the_passage_that_answers_scores_high_and_an_unrelated_one_low(model: CrossEncoder) -> None:
    scores = model.score("What does a PID controller compute?", [BREAD, PID])
    assert scores.shape == (2,)
    assert scores[1] > 5 > -5 > scores[0]


def test_scores_keep_the_order_passages_were_given_in_whatever_their_lengths(model: CrossEncoder) -> None:
    question = "What does a PID controller compute?"
    long_padding = PID + " " + " ".join(["The robot arm moves."] * 40)
    alone = [float(model.score(question, [p])[0]) for p in (BREAD, long_padding, PID)]
    together = model.score(question, [BREAD, long_padding, PID])
    # Padding to the longest pair moves an int8 logit a little, never the verdict.
    assert together == pytest.approx(alone, abs=0.75)


def test_a_pair_longer_than_the_model_reads_is_cut_not_refused(model: CrossEncoder) -> None:
    scores = model.score("word " * 700, ["passage " * 700, "short"])
    assert scores.shape == (2,)


def test_no_passages_gives_no_scores(model: CrossEncoder) -> None:
    assert model.score("anything", []).shape == (0,)


async def test_ascore_runs_off_the_event_loop(model: CrossEncoder) -> None:
    scores = await asyncio.gather(*(model.ascore("What does a PID controller compute?", [PID]) for _ in range(3)))
    assert all(s[0] > 5 for s in scores)


class CountingCrossEncoder(CrossEncoder):
    """The cross-encoder, counting its runs."""

    runs = 0

    def score(self, question: str, passages: Sequence[str]) -> npt.NDArray[np.float32]:
        self.runs += 1
        return super().score(question, passages)


async def test_readers_asking_the_same_at_once_share_one_run_and_other_passages_get_their_own() -> None:
    counting = CountingCrossEncoder()
    question = "What does a PID controller compute?"
    same = await asyncio.gather(*(counting.ascore(question, [PID, BREAD]) for _ in range(4)))
    assert counting.runs == 1 and all(list(s) == list(same[0]) for s in same) and same[0][0] > 5
    await asyncio.gather(counting.ascore(question, [PID]), counting.ascore(question, [BREAD]))
    assert counting.runs == 3
    counting.close()


def test_the_installed_files_are_the_pinned_ones() -> None:
    folder = crossencoder.verified_dir()
    assert (folder / "model.onnx").stat().st_size > 30_000_000
    assert crossencoder.available()


@pytest.mark.parametrize("max_tokens", [256, 128, 20, 5])
@pytest.mark.slow
def test_pairs_are_what_the_models_own_tokenizer_makes_of_them(max_tokens: int) -> None:
    from tokenizers import Tokenizer

    own = Tokenizer.from_file(str(crossencoder.verified_dir() / "tokenizer.json"))
    own.no_padding()
    own.enable_truncation(max_length=max_tokens, strategy="longest_first")
    question = "What does rclpy.spin() do while the naïve über-controller keeps the ZMP at x_y-z 42?"
    passages = ["", "short", PID, " ".join([PID, BREAD] * 12), question * 3]
    for q in (question, question * 8, "spin"):
        expected = [(e.ids, e.type_ids) for e in own.encode_batch([(q, p) for p in passages])]
        assert CrossEncoder(max_tokens=max_tokens).pairs(q, passages) == expected


def test_the_word_table_it_maps_from_the_file_is_the_models_own() -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(crossencoder.verified_dir() / "model.onnx"))
    table = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == crossencoder._WORD_TABLE)
    _, mapped = crossencoder._map_word_table(crossencoder.verified_dir() / "model.onnx")
    assert table.dtype == np.uint8 and np.array_equal(table, mapped)
