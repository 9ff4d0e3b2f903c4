"""The output check's error measure (output_check.row_error): the largest row error relative to the
largest row norm, rows along the last axis; NaN and infinities where the original has them."""

import numpy as np
import pytest

from tf_dietcode import output_check


def _error(expected, actual) -> float:
    return output_check._error("serving_default", "out", np.asarray(expected), np.asarray(actual), "x [2]").error


def test_a_rotation_of_unit_rows_reads_the_chord_of_its_angle(rng):
    """Unit rows turned by angle a (in a random plane each): sqrt(2 (1 - cos a)), the worst row's."""
    rows = rng.normal(size=(5, 384))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    angles = np.array([0.01, 0.02, 0.1, 0.03, 0.0])
    other = rng.normal(size=rows.shape)
    other -= np.sum(other * rows, axis=1, keepdims=True) * rows  # orthogonal to each row
    other /= np.linalg.norm(other, axis=1, keepdims=True)
    turned = np.cos(angles)[:, None] * rows + np.sin(angles)[:, None] * other
    assert output_check.row_error(rows, turned) == pytest.approx(np.sqrt(2 * (1 - np.cos(0.1))), rel=1e-9)
    assert _error(rows.astype(np.float32), turned.astype(np.float32)) == pytest.approx(0.0999, abs=1e-4)


def test_a_tiny_row_does_not_dominate():
    """A row 1e-6 the size of the others, all of it wrong: its error counts against the largest row."""
    expected = np.array([[3.0, 4.0], [1e-6, 0.0]])
    actual = np.array([[3.0, 4.0], [-1e-6, 0.0]])
    assert output_check.row_error(expected, actual) == pytest.approx(2e-6 / 5)


def test_an_element_error_counts_against_its_row_norm_not_the_largest_element():
    """One element of a 4-wide row off by 0.1 of the row's largest: 0.1 x 1 / 2 (the row's norm)."""
    assert output_check.row_error(np.array([[1.0, 1.0, 1.0, 1.0]]), np.array([[1.1, 1.0, 1.0, 1.0]])) == \
        pytest.approx(0.05)


@pytest.mark.parametrize("expected, actual, error", [
    (2.0, 2.5, 0.25),                              # a scalar is one row
    ([3.0, 4.0], [3.0, 4.5], 0.1),                 # rank 1: one row
    (np.zeros((2, 0)), np.zeros((2, 0)), 0.0),     # empty
    (np.zeros((2, 3)), np.zeros((2, 3)), 0.0),     # all zeros
])
def test_shapes(expected, actual, error):
    assert output_check.row_error(np.asarray(expected), np.asarray(actual)) == pytest.approx(error)


def test_nan_and_infinities_must_be_where_the_original_has_them():
    expected = np.array([[np.nan, 1.0], [np.inf, 2.0]], np.float32)
    assert _error(expected, expected.copy()) == 0.0
    assert _error(expected, np.array([[np.nan, 1.1], [np.inf, 2.0]], np.float32)) == pytest.approx(0.05, rel=1e-5)
    assert _error(expected, np.array([[0.0, 1.0], [np.inf, 2.0]], np.float32)) == np.inf        # a NaN lost
    assert _error(expected, np.array([[np.nan, 1.0], [-np.inf, 2.0]], np.float32)) == np.inf    # -inf for inf
    assert _error(np.ones((2, 2), np.float32), np.array([[1, np.nan], [1, 1]], np.float32)) == np.inf
    assert _error(np.ones((2, 2)), np.ones((2, 3))) == np.inf                                   # shapes differ


def test_other_dtypes_read_the_share_that_differs_and_are_not_checked():
    error = output_check._error("s", "ids", np.array([1, 2, 3, 4]), np.array([1, 2, 0, 4]), "x [4]")
    assert (error.error, error.checked) == (0.25, False)
