"""Tests for sim.clients.sampling and sim.clients.dropout: who is sampled and who drops, per seeded round.

Statistical checks use fixed seeds (so they are deterministic) and a 4-standard-error band.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.clients.dropout import DropoutModel
from sim.clients.sampling import sample_clients
from sim.scenario.types import Dropout, Sampling

# ------------------------------------------------------------------------------------------- helpers

AVAILABLE_SETS = st.sets(st.integers(0, 100_000), max_size=120).map(lambda s: np.array(sorted(s), dtype=np.int64))


def _dropout(
    mode: str,
    rate: float = 0.0,
    stage: str = "before_upload",
    high: float = 0.99,
    high_fraction: float = 0.5,
    low: tuple[float, float] = (0.0, 0.1),
) -> Dropout:
    return Dropout(mode, rate, stage, False, {"high": high, "high_fraction": high_fraction, "low": low})


# --------------------------------------------------------------------------------- sample_clients


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 20_000),
    sampling=st.one_of(
        st.integers(1, 300).map(lambda k: Sampling(clients_per_round=k, rate=None)),
        st.floats(0.0, 1.0).map(lambda q: Sampling(clients_per_round=None, rate=q)),
    ),
    seed=st.integers(0, 2**32),
    round_=st.integers(1, 100),
)
def test_everyone_by_size_draws_as_the_listed_population(n: int, sampling: Sampling, seed: int, round_: int) -> None:
    """A population given by its size (never listed) is sampled exactly as ``np.arange(size)``."""
    listed = sample_clients(np.arange(n, dtype=np.int64), sampling, seed, round_)
    assert np.array_equal(sample_clients(n, sampling, seed, round_), listed)


def test_a_billion_clients_are_sampled_without_listing_them() -> None:
    sampled = sample_clients(10**9, Sampling(clients_per_round=200, rate=None), seed=1, round=3)
    assert sampled.shape == (200,) and np.all(np.diff(sampled) > 0) and sampled[-1] < 10**9


@settings(max_examples=200, deadline=None)
@given(available=AVAILABLE_SETS, k=st.integers(1, 150), seed=st.integers(0, 2**63 - 1), round_=st.integers(1, 10_000))
def test_fixed_count_sample_is_sorted_unique_subset(available: np.ndarray, k: int, seed: int, round_: int) -> None:
    sample = sample_clients(available, Sampling(k, None), seed, round_)
    n = available.shape[0]
    assert sample.shape == (min(k, n),)
    assert np.all(np.diff(sample) > 0)  # sorted, unique
    assert np.all(np.isin(sample, available))
    if k >= n:
        assert np.array_equal(sample, available)


def test_fixed_count_all_when_k_covers_everyone() -> None:
    available = np.array([3, 8, 9, 40])
    assert sample_clients(available, Sampling(4, None), seed=1, round=1).tolist() == [3, 8, 9, 40]
    assert sample_clients(available, Sampling(10, None), seed=1, round=1).tolist() == [3, 8, 9, 40]
    assert sample_clients(available[:0], Sampling(10, None), seed=1, round=1).tolist() == []


def test_fixed_count_is_uniform_over_members() -> None:
    available = np.arange(0, 200, 2)  # 100 clients
    counts = np.zeros(200, dtype=np.int64)
    rounds = 400
    for r in range(1, rounds + 1):
        counts[sample_clients(available, Sampling(10, None), seed=9, round=r)] += 1
    assert counts[1::2].sum() == 0  # only available clients
    # each member is in with probability 10 / 100: mean 40 per client, sd sqrt(400 * 0.1 * 0.9) = 6
    member_counts = counts[0::2]
    assert member_counts.sum() == 10 * rounds
    assert np.all(np.abs(member_counts - 40) < 5 * 6)


def test_poisson_sample_sizes_have_mean_n_q() -> None:
    available = np.arange(1000)
    q = 0.1
    rounds = 400
    sizes = []
    for r in range(1, rounds + 1):
        sample = sample_clients(available, Sampling(None, q), seed=2024, round=r)
        assert np.all(np.diff(sample) > 0)
        assert np.all(np.isin(sample, available))
        sizes.append(sample.shape[0])
    n = available.shape[0]
    standard_error = math.sqrt(n * q * (1 - q) / rounds)  # sqrt(1000 * 0.1 * 0.9 / 400) ~ 0.47
    assert abs(np.mean(sizes) - n * q) < 4 * standard_error
    # a Binomial(1000, 0.1) varies: the sizes are not all the same
    assert len(set(sizes)) > 5


def test_poisson_rate_one_takes_everyone() -> None:
    available = np.array([2, 5, 7])
    assert sample_clients(available, Sampling(None, 1.0), seed=3, round=4).tolist() == [2, 5, 7]


@pytest.mark.parametrize("sampling", [Sampling(7, None), Sampling(None, 0.2)], ids=["fixed", "poisson"])
def test_sampling_is_deterministic_per_seed_and_round(sampling: Sampling) -> None:
    available = np.arange(5, 105)
    alone = sample_clients(available, sampling, seed=77, round=6)
    again = sample_clients(available, sampling, seed=77, round=6)
    assert np.array_equal(alone, again)
    # drawing other rounds first changes nothing for round 6
    for r in (1, 2, 3, 4, 5, 7, 100):
        sample_clients(available, sampling, seed=77, round=r)
    assert np.array_equal(sample_clients(available, sampling, seed=77, round=6), alone)
    # other rounds and other seeds draw other samples
    others = [sample_clients(available, sampling, seed=77, round=r) for r in (5, 7)]
    others.append(sample_clients(available, sampling, seed=78, round=6))
    assert all(not np.array_equal(alone, other) for other in others)


# ---------------------------------------------------------------------------- DropoutModel: fixed


@st.composite
def _sampled(draw: st.DrawFn, max_size: int = 200) -> np.ndarray:
    n = draw(st.integers(0, max_size))
    members = draw(st.sets(st.integers(0, 999), min_size=n, max_size=n))
    return np.array(sorted(members), dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.0, 1.0),
    sampled=_sampled(),
    seed=st.integers(0, 2**32),
    round_=st.integers(1, 1000),
    stage=st.sampled_from(["after_sampling", "before_upload"]),
)
def test_fixed_mode_drops_exactly_rounded_count_of_sampled(
    rate: float, sampled: np.ndarray, seed: int, round_: int, stage: str
) -> None:
    plan = DropoutModel(_dropout("fixed", rate, stage), population=1000, seed=seed).plan(round_, sampled)
    n = sampled.shape[0]
    assert len(plan) == math.floor(rate * n + 0.5)  # rounded half up
    assert set(plan) <= set(sampled.tolist())
    assert all(type(c) is int for c in plan)
    assert set(plan.values()) <= {stage}


@pytest.mark.parametrize(
    ("rate", "n", "dropped"),
    [
        (0.0, 10, 0),
        (0.1, 5, 1),  # 0.5 rounds up to 1
        (0.25, 2, 1),  # 0.5 -> 1
        (0.5, 3, 2),  # 1.5 -> 2
        (0.3, 10, 3),
        (0.34, 10, 3),  # 3.4 -> 3
        (0.36, 10, 4),  # 3.6 -> 4
        (1.0, 7, 7),
        (0.5, 0, 0),
    ],
)
def test_fixed_mode_known_counts(rate: float, n: int, dropped: int) -> None:
    sampled = np.arange(100, 100 + n)
    plan = DropoutModel(_dropout("fixed", rate), population=200, seed=1).plan(3, sampled)
    assert len(plan) == dropped


def test_fixed_mode_full_rate_drops_everyone_at_stage() -> None:
    sampled = np.array([4, 9, 16])
    plan = DropoutModel(_dropout("fixed", 1.0, "after_sampling"), population=20, seed=0).plan(1, sampled)
    assert plan == {4: "after_sampling", 9: "after_sampling", 16: "after_sampling"}


# ------------------------------------------------------------------------ DropoutModel: bernoulli


def test_bernoulli_empirical_rate() -> None:
    model = DropoutModel(_dropout("bernoulli", 0.3), population=1000, seed=5)
    assert model.probability is None
    sampled = np.arange(0, 1000, 2)  # 500 clients
    rounds = 100
    dropped = 0
    for r in range(1, rounds + 1):
        plan = model.plan(r, sampled)
        assert set(plan) <= set(sampled.tolist())
        assert set(plan.values()) <= {"before_upload"}
        dropped += len(plan)
    trials = sampled.shape[0] * rounds
    standard_error = math.sqrt(0.3 * 0.7 / trials)  # ~ 0.002
    assert abs(dropped / trials - 0.3) < 4 * standard_error


@pytest.mark.parametrize(("rate", "expected"), [(0.0, {}), (1.0, {3: "before_upload", 6: "before_upload"})])
def test_bernoulli_extreme_rates(rate: float, expected: dict[int, str]) -> None:
    assert DropoutModel(_dropout("bernoulli", rate), population=10, seed=2).plan(1, np.array([3, 6])) == expected


# ----------------------------------------------------------------------- DropoutModel: per_client


def test_per_client_probabilities() -> None:
    population = 20_000
    model = DropoutModel(_dropout("per_client", high=0.99, high_fraction=0.3, low=(0.0, 0.1)), population, seed=8)
    assert model.probability is not None
    assert model.probability.shape == (population,)
    p = model.probability[np.arange(population)]
    is_high = p == 0.99
    standard_error = math.sqrt(0.3 * 0.7 / population)  # ~ 0.0032
    assert abs(is_high.mean() - 0.3) < 4 * standard_error
    others = p[~is_high]
    assert np.all((others >= 0.0) & (others <= 0.1))
    # uniform in [0, 0.1]: mean 0.05, sd 0.1 / sqrt(12)
    assert abs(others.mean() - 0.05) < 4 * (0.1 / math.sqrt(12)) / math.sqrt(others.shape[0])


def test_per_client_plan_uses_each_clients_probability() -> None:
    # probability exactly 1 (high) or exactly 0 (low = [0, 0]): the plan is exactly the high clients
    model = DropoutModel(_dropout("per_client", high=1.0, high_fraction=0.5, low=(0.0, 0.0)), 100, seed=4)
    assert model.probability is not None
    high_clients = set(np.flatnonzero(model.probability[np.arange(100)] == 1.0).tolist())
    assert 0 < len(high_clients) < 100
    sampled = np.arange(0, 100, 3)
    for r in (1, 2, 3):
        plan = model.plan(r, sampled)
        assert plan == {c: "before_upload" for c in sampled.tolist() if c in high_clients}


def test_per_client_probabilities_fixed_for_the_run() -> None:
    config = _dropout("per_client")
    a = DropoutModel(config, 500, seed=10)
    a.plan(1, np.arange(500))
    b = DropoutModel(config, 500, seed=10)
    c = DropoutModel(config, 500, seed=11)
    assert a.probability is not None
    assert b.probability is not None
    assert c.probability is not None
    everyone = np.arange(500)
    assert np.array_equal(a.probability[everyone], b.probability[everyone])
    assert not np.array_equal(a.probability[everyone], c.probability[everyone])
    # a client's probability is its own, whichever clients are asked with it
    assert np.array_equal(a.probability[np.array([499, 3])], a.probability[everyone][[499, 3]])


# ---------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize(
    "config",
    [_dropout("fixed", 0.3), _dropout("bernoulli", 0.3), _dropout("per_client")],
    ids=["fixed", "bernoulli", "per_client"],
)
def test_dropout_plan_is_deterministic_per_seed_and_round(config: Dropout) -> None:
    sampled = np.arange(10, 210, 2)
    first = DropoutModel(config, 300, seed=99)
    alone = first.plan(4, sampled)
    assert first.plan(4, sampled) == alone
    second = DropoutModel(config, 300, seed=99)
    for r in (1, 2, 3, 5):
        second.plan(r, sampled)
    assert second.plan(4, sampled) == alone
    # another round or another seed drops other clients
    assert first.plan(5, sampled) != alone
    assert DropoutModel(config, 300, seed=100).plan(4, sampled) != alone
