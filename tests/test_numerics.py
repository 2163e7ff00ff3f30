"""Sums of squares without BLAS (sim.numerics): accurate, and the same bits whatever BLAS's thread count, so
that a clipped encoding (fixed point, DSkellam) does not change with the host's cores."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from threadpoolctl import threadpool_limits

from sim.dp.dskellam import DSkellamEncoding
from sim.numerics import BLOCK, l2_norm, sum_of_squares
from sim.protocol.encoding import FixedPoint

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float64, st.integers(0, 3 * BLOCK + 5), elements=finite))
def test_the_sum_of_squares_is_accurate(x):
    exact = math.fsum(float(v) * float(v) for v in x)
    assert sum_of_squares(x) == pytest.approx(exact, rel=1e-12, abs=1e-300)


@settings(max_examples=50, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 2 * BLOCK + 3), elements=st.floats(-1e3, 1e3, width=32)))
def test_a_float32_vector_sums_as_its_float64_copy(x):
    assert sum_of_squares(x) == sum_of_squares(x.astype(np.float64))


def _blas_differs(x: np.ndarray, threads: int) -> bool:
    """Whether np.dot's sum of squares of ``x`` changes between one BLAS thread and ``threads`` here."""
    with threadpool_limits(1, user_api="blas"):
        one = np.dot(x, x)
    with threadpool_limits(threads, user_api="blas"):
        more = np.dot(x, x)
    return bool(one != more)


@pytest.mark.parametrize("threads", [2, 4])
def test_the_value_does_not_depend_on_blas_threads(threads):
    """np.dot's value changes with OpenBLAS's thread count for vectors this long; ours does not."""
    x = np.random.default_rng(3).standard_normal(10**6 + 17)
    if not _blas_differs(x, threads):
        pytest.skip(f"this host's BLAS gives the same sum on 1 and {threads} threads")
    values = set()
    for limit in (1, threads):
        with threadpool_limits(limit, user_api="blas"):
            values.add(sum_of_squares(x))
    assert len(values) == 1
    assert l2_norm(x) == math.sqrt(values.pop())


def test_shapes_and_special_values():
    assert sum_of_squares(np.zeros(0)) == 0.0
    assert math.isnan(l2_norm(np.array([1.0, np.nan])))
    assert l2_norm(np.array([3.0, 4.0])) == 5.0
    assert sum_of_squares(np.array([1, 2, 3], dtype=np.int16)) == 14.0
    assert sum_of_squares(np.arange(10.0)[::3]) == 0 + 9 + 36 + 81
    with pytest.raises(ValueError, match="vector"):
        sum_of_squares(np.zeros((2, 2)))
    for bad in (np.array([1j, 1.0]), np.zeros(2, dtype=np.longdouble)):
        with pytest.raises(ValueError, match="real values"):
            sum_of_squares(bad)


@pytest.mark.parametrize("threads", [2, 4])
def test_a_clipped_encoding_does_not_depend_on_blas_threads(threads):
    """Updates whose norm exceeds the clip: the clipping factors, the clipped update and the fixed-point and
    DSkellam encodings made under one BLAS thread count are those made under another."""
    x = (np.random.default_rng(5).standard_normal(300_000) * 0.05).astype(np.float32)
    if not _blas_differs(x.astype(np.float64), threads):
        pytest.skip(f"this host's BLAS gives the same sum on 1 and {threads} threads")
    fixed = FixedPoint.for_clients(20, 1.0, 16)
    skellam = DSkellamEncoding(300_000, 20, 1.0, 300.0)
    assert fixed.clip_factor(x) < 1.0

    def made():
        return (
            np.float64(fixed.clip_factor(x)),
            skellam.clipped(x),
            fixed.encode(x, np.random.default_rng(1)),
            skellam.encode(x, bytes(32), np.random.default_rng(1)),
        )

    with threadpool_limits(1, user_api="blas"):
        expected = made()
    with threadpool_limits(threads, user_api="blas"):
        got = made()
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
