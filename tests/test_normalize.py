"""The one L2 normalisation of numpy rows (it was written about eleven times, with three different epsilons and
dtype rules)."""

from __future__ import annotations

import numpy as np
import pytest

from lmembed.pooling.normalize import unit_rows


def test_rows_get_unit_length_and_a_zero_row_stays_zero():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-30, 0.0]], dtype=np.float32)
    out = unit_rows(x)
    np.testing.assert_allclose(out[0], [0.6, 0.8], rtol=1e-6)
    assert (out[1] == 0).all() and np.isfinite(out).all()
    assert out.dtype == np.float32 and out.flags.c_contiguous
    assert x[0, 0] == 3.0  # the input is not changed


def test_precision_is_float32_unless_the_caller_keeps_its_own():
    x = np.random.default_rng(0).normal(size=(4, 8))
    assert unit_rows(x).dtype == np.float32
    assert unit_rows(x, dtype=None).dtype == np.float64
    assert unit_rows(np.arange(6).reshape(3, 2), dtype=None).dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(unit_rows(x, dtype=None), axis=1), 1.0, rtol=1e-12)


def test_a_vector_that_is_not_a_matrix_is_refused():
    with pytest.raises(ValueError, match=r"2-D matrix, got shape \(3,\)"):
        unit_rows(np.ones(3))
