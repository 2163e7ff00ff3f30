"""Noise plans (Dordis section 3.2, Hyades Definition 4, Baek et al.): exact residuals for every dropout
count, with the worked example of Dordis Figure 4 pinned."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.dp.strategies import STRATEGIES, RoundNoise

TARGET = 1.5


@st.composite
def rounds(draw):
    n = draw(st.integers(2, 60))
    t = draw(st.integers(0, n - 1))
    return n, t


def test_dordis_figure_4_example():
    """|U| = 4, T = 2, sigma*^2 = 1: components 1/4, 1/12, 1/6; remove 1/12 + 1/6 with no dropout, 1/6 with one."""
    plan = RoundNoise("xnoise", 1.0, 4, 2)
    assert plan.components == (Fraction(1, 4), Fraction(1, 12), Fraction(1, 6))
    assert plan.added == Fraction(1, 2)  # sigma*^2 / (|U| - T)
    assert plan.removed(0) == (1, 2) and plan.removed(1) == (2,) and plan.removed(2) == ()
    assert [plan.residual(d) for d in range(3)] == [1, 1, 1]
    assert plan.residual(3) == Fraction(1, 2)  # beyond the tolerance: (|U|-|D|)/(|U|-T) sigma*^2


@given(rounds())
def test_xnoise_residual_is_exactly_the_target_within_tolerance(nt):
    n, t = nt
    plan = RoundNoise("xnoise", TARGET, n, t)
    assert plan.added == Fraction(TARGET) / (n - t)
    for d in range(n):
        expected = Fraction(TARGET) if d <= t else Fraction(TARGET) * (n - d) / (n - t)
        assert plan.residual(d) == expected
        assert plan.accounted(d) == expected


@given(rounds())
def test_xnoise_appr_stays_within_its_bound(nt):
    n, t = nt
    plan = RoundNoise("xnoise-appr", TARGET, n, t)
    assert plan.added == Fraction(TARGET) / (n - t)
    assert plan.removable == (plan.tau + 1 if t else 0)
    for d in range(t + 1):
        assert Fraction(TARGET) <= plan.residual(d) <= Fraction(TARGET) * (1 + Fraction(1, n - t))
    for d in range(t + 1, n):
        assert plan.residual(d) == Fraction(TARGET) * (n - d) / (n - t) < TARGET


@given(rounds(), st.sampled_from(["orig", "early", "con", "committee", "rebasing", "central", "local"]))
def test_baselines(nt, strategy):
    n, t = nt
    plan = RoundNoise(strategy, TARGET, n, t, guessed_dropout=0.25)
    sigma = Fraction(TARGET)
    for d in range(n):
        m = n - d
        expected = {
            "orig": sigma * m / n,
            "early": sigma * m / n,
            "con": sigma * m / math.floor(n * 0.75),
            "committee": sigma * m / (n - t),
            "rebasing": sigma,
            "central": sigma,
            "local": sigma * m,
        }[strategy]
        assert plan.residual(d) == expected
        assert plan.removed(d) == ()
    assert plan.accounted(n - 1) == (sigma if strategy == "local" else plan.residual(n - 1))


def test_orig_falls_below_the_target_with_every_dropout():
    plan = RoundNoise("orig", TARGET, 10, 5)
    assert [plan.residual(d) for d in (0, 2, 4)] == [
        Fraction(TARGET),
        Fraction(TARGET) * 8 / 10,
        Fraction(TARGET) * 6 / 10,
    ]


def test_largest_residual_bounds_every_dropout_count():
    for strategy in STRATEGIES:
        plan = RoundNoise(strategy, TARGET, 12, 6, guessed_dropout=0.5)
        assert all(plan.residual(d) <= plan.largest_residual for d in range(12))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "magic"}, "unknown strategy"),
        ({"tolerance": 10}, "tolerance < sampled"),
        ({"collusion": 3, "threshold": 3}, "below the threshold"),
    ],
)
def test_bad_plans_are_refused(kwargs, message):
    args = {"strategy": "orig", "target": 1.0, "sampled": 10, "tolerance": 5} | kwargs
    with pytest.raises(ValueError, match=message):
        RoundNoise(**args)


def test_con_with_fewer_clients_than_its_guess_leaves_still_divides_by_one():
    plan = RoundNoise("con", TARGET, 1, 0, guessed_dropout=0.5)
    assert plan.components == (Fraction(TARGET),)


def test_a_survivor_set_larger_than_the_sample_is_refused():
    plan = RoundNoise("xnoise", TARGET, 8, 4)
    with pytest.raises(ValueError, match="larger than the sample"):
        plan.removed(-3)
