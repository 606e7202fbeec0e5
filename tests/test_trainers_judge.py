"""The trainers' judge (support.trainers.compare) itself, without the trainers: a row that
differs beyond the one named difference, or one regen wrote that never reached the trainer, is
counted, never passed, so tests/trainers and benches/trainers.py can fail."""

from __future__ import annotations

import pytest

from support.trainers import Row, compare, without_prefix

NL = 198
OURS: list[Row] = [((1, 2, 3), (0, 1, 1)), ((4, 5), (0, 1))]


def test_equal_rows_and_the_trained_trailing_newline() -> None:
    theirs: list[Row] = [((1, 2, 3), (0, 1, 1)), ((4, 5, NL), (0, 1, 1))]
    result = compare(theirs, OURS, NL)
    assert (result.accepted, result.equal, result.newline_only) == (2, 1, 1)
    assert result.other == [] and result.unmatched == 0


@pytest.mark.parametrize(
    ("theirs", "newline", "other"),
    [
        ([((1, 2, 3), (0, 1, 1)), ((4, 5, NL), (0, 1, 1))], None, "matches none"),
        ([((1, 2, 3), (0, 1, 1)), ((4, 5, NL), (0, 1, 0))], NL, "not trained"),
        ([((1, 2, 3), (0, 0, 1)), ((4, 5), (0, 1))], NL, "matches none"),
        ([((1, 2, 3), (0, 1, 1)), ((4, 6), (0, 1))], NL, "matches none"),
    ],
)
def test_any_other_difference_is_counted(
    theirs: list[Row], newline: int | None, other: str
) -> None:
    result = compare(theirs, OURS, newline)
    assert len(result.other) == 1 and other in result.other[0]
    assert result.unmatched == (0 if "not trained" in other else 1)


def test_a_row_that_never_reached_the_trainer() -> None:
    result = compare(OURS[:1], OURS)
    assert (result.equal, result.unmatched) == (1, 1)


def test_regens_rows_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="not distinct"):
        compare([], [OURS[0], OURS[0]])


def test_without_prefix_cuts_only_rows_that_start_with_it() -> None:
    rows: list[Row] = [((7, 8, 1, 2, 3), (0, 0, 0, 1, 1)), ((4, 5), (0, 1))]
    cut, prefixed = without_prefix(rows, (7, 8))
    assert cut == [((1, 2, 3), (0, 1, 1)), ((4, 5), (0, 1))]
    assert prefixed == rows[:1]
