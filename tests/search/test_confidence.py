"""Confidence levels and the adaptive module filter, as tables (docs/evaluation.md, "How confidence is computed")."""

from __future__ import annotations

import pytest

from textbook_chat.search.confidence import (
    CALIBRATIONS,
    Calibration,
    filter_decision,
    known_share,
    level,
    name_factor,
    score,
    weighted_similarity,
)

IDENTITY = Calibration(decline=0.2, low=0.3, high=0.7)


def test_the_weighted_mean_uses_the_design_weights_best_first() -> None:
    assert weighted_similarity([0.5, 0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.5)
    assert weighted_similarity([0.0, 0.0, 0.0, 0.0, 1.0]) == pytest.approx(0.4)  # sorted: the 1.0 is the best
    assert weighted_similarity([1.0, 0.0, 0.0, 0.0, 0.0]) == pytest.approx(0.4)
    assert weighted_similarity([0.9, 0.8, 0.7, 0.6, 0.5, 0.99]) == pytest.approx(
        0.4 * 0.99 + 0.25 * 0.9 + 0.15 * 0.8 + 0.1 * 0.7 + 0.1 * 0.6
    )


def test_missing_results_count_as_zero_and_negative_similarities_as_zero() -> None:
    assert weighted_similarity([0.8]) == pytest.approx(0.32)
    assert weighted_similarity([]) == 0.0
    assert weighted_similarity([-0.3, -0.1]) == 0.0


@pytest.mark.parametrize(
    ("confidence", "expected"),
    [(0.0, "none"), (0.199, "none"), (0.2, "low"), (0.299, "low"), (0.3, "medium"), (0.699, "medium"),
     (0.7, "high"), (1.0, "high")],
)  # fmt: skip
def test_levels(confidence: float, expected: str) -> None:
    assert level(confidence) == expected


@pytest.mark.parametrize(
    ("raw", "common"),
    [(0.0, 0.0), (0.2, 0.1), (0.4, 0.2), (0.45, 0.25), (0.5, 0.3), (0.65, 0.5), (0.8, 0.7), (0.9, 0.85), (1.0, 1.0)],
)
def test_a_calibration_maps_its_points_onto_the_design_thresholds_linearly_between(raw: float, common: float) -> None:
    calibration = Calibration(decline=0.4, low=0.5, high=0.8)
    assert calibration.to_common(raw) == pytest.approx(common)
    assert score([raw] * 5, calibration) == pytest.approx(common, abs=1e-4)
    assert IDENTITY.to_common(raw) == pytest.approx(raw)


def test_the_local_calibration_declines_below_its_decline_point_and_answers_above() -> None:
    local = CALIBRATIONS["local"]
    assert level(local.to_common(local.decline - 0.01)) == "none"
    assert level(local.to_common(local.decline + 0.01)) == "low"
    assert level(local.to_common(local.low + 0.01)) == "medium"
    assert level(local.to_common(local.high)) == "high"


@pytest.mark.parametrize(
    ("names", "unknown", "share"),
    [((), (), 1.0), (("moveit",), ("moveit",), 0.0), (("ethercat", "ros2_control"), ("ethercat",), 0.5),
     (("isaac", "ros"), (), 1.0)],
)  # fmt: skip
def test_known_share_is_the_share_of_named_things_the_book_mentions(
    names: tuple[str, ...], unknown: tuple[str, ...], share: float
) -> None:
    assert known_share(names, unknown) == pytest.approx(share)


def test_unknown_names_scale_the_evidence_down_before_calibration() -> None:
    similarities = [0.8, 0.7, 0.7, 0.6, 0.6]
    one_of_two = name_factor(["ethercat", "ros2_control"], ["ethercat"])
    assert one_of_two == pytest.approx(0.25)  # squared: the question asks about both
    assert name_factor([], []) == 1.0 and name_factor(["moveit"], ["moveit"]) == 0.0
    assert score(similarities, IDENTITY, known=1.0) == pytest.approx(weighted_similarity(similarities), abs=1e-4)
    assert score(similarities, IDENTITY, known=one_of_two) == pytest.approx(
        weighted_similarity(similarities) / 4, abs=1e-4
    )
    assert level(score(similarities, IDENTITY, known=0.0)) == "none"


def test_calibrations_are_monotonic_and_exist_for_both_embedders() -> None:
    assert set(CALIBRATIONS) == {"openai", "local"}
    for calibration in CALIBRATIONS.values():
        values = [calibration.to_common(x / 100) for x in range(101)]
        assert values == sorted(values) and values[0] == 0.0 and values[-1] == 1.0
    with pytest.raises(ValueError):
        Calibration(decline=0.5, low=0.4, high=0.7)


@pytest.mark.parametrize(
    ("filtered", "unfiltered", "decision"),
    [
        (0.85, None, "strict"),
        (0.7, None, "strict"),
        (0.55, None, "partial"),
        (0.4, None, "partial"),
        (0.3, 0.6, "widened"),  # everything else is clearly better
        (0.3, 0.5, "limited"),  # better, but not by more than the margin
        (0.1, 0.25, "limited"),
        (0.39, None, "limited"),
    ],
)
def test_the_adaptive_module_filter(filtered: float, unfiltered: float | None, decision: str) -> None:
    assert filter_decision(filtered, unfiltered) == decision
