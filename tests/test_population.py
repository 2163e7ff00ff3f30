"""Tests for sim.clients.population: Zipf latencies and the seeded assignment of ranks to clients.

The i-th slowest of N devices sits at ``u_i = (i^-a - N^-a) / (1 - N^-a)`` (1 for the slowest, 0 for the
fastest). Its compute slow-down is ``L_fast + (L_slow - L_fast) u_i``; its per-megabit time is scaled the
same way between ``1/high`` and ``1/low``, i.e. its bandwidth is ``low * high / (low + (high - low) u_i)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.clients.population import Population, zipf_bandwidths, zipf_latencies
from sim.keyed import ROUNDS, KeyedPermutation, stream_keys
from sim.scenario.types import BandwidthProfile, Clients, ZipfProfile
from sim.seeds import Stream

# ------------------------------------------------------------------------------------------- helpers


def _clients(lo_mbps: float = 21.0, hi_mbps: float = 210.0, slowdown: tuple[float, float] = (1.0, 3.0)) -> Clients:
    """The scenario defaults: compute Zipf 1.2 over slow-downs [1, 3], bandwidth Zipf 1.2 over [21, 210] Mbps."""
    return Clients(
        compute=ZipfProfile(1.2, slowdown[0], slowdown[1]),
        bandwidth=BandwidthProfile(1.2, lo_mbps, hi_mbps),
    )


def _ranks(values: np.ndarray, slowest_first_descending: bool) -> np.ndarray:
    """Rank (0 = slowest) of each client's value; values are distinct."""
    order = np.argsort(-values if slowest_first_descending else values, kind="stable")
    ranks = np.empty_like(order)
    ranks[order] = np.arange(order.shape[0])
    return ranks


# ---------------------------------------------------------------------------------- zipf_latencies


def test_zipf_latencies_known_answer_n3_a1() -> None:
    profile = ZipfProfile(zipf_a=1.0, fastest=1.0, slowest=3.0)
    latencies = zipf_latencies(3, profile)
    # i^-1 = 1, 1/2, 1/3; N^-a = 1/3; 1 - N^-a = 2/3
    # L_1 = 1 + 2 * (1 - 1/3) / (2/3) = 3;  L_2 = 1 + 2 * (1/2 - 1/3) / (2/3) = 1 + 2 * 1/4 = 1.5;  L_3 = 1
    assert latencies.dtype == np.float64
    assert latencies[0] == 3.0
    assert latencies[1] == pytest.approx(1.5, rel=1e-12)
    assert latencies[2] == 1.0


def test_zipf_latencies_known_answer_n4_a2() -> None:
    profile = ZipfProfile(zipf_a=2.0, fastest=2.0, slowest=17.0)
    # i^-2 = 1, 1/4, 1/9, 1/16; 1 - 1/16 = 15/16; slowest - fastest = 15
    # L_2 = 2 + 15 * (1/4 - 1/16) / (15/16) = 2 + 16 * 3/16 = 5
    # L_3 = 2 + 16 * (1/9 - 1/16) = 2 + 16 * 7/144 = 2 + 7/9
    assert zipf_latencies(4, profile) == pytest.approx([17.0, 5.0, 2.0 + 7.0 / 9.0, 2.0], rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 2000),
    a=st.floats(0.01, 4.0),
    fastest=st.floats(0.01, 10.0),
    extra=st.floats(0.0, 100.0),
)
def test_zipf_latencies_endpoints_and_monotone(n: int, a: float, fastest: float, extra: float) -> None:
    profile = ZipfProfile(a, fastest, fastest + extra)
    latencies = zipf_latencies(n, profile)
    assert latencies.shape == (n,)
    assert latencies[0] == pytest.approx(profile.slowest, rel=1e-12)
    assert latencies[-1] == profile.fastest
    assert np.all(np.diff(latencies) <= 0)
    assert np.all(latencies >= profile.fastest)
    assert np.all(latencies <= profile.slowest * (1 + 1e-12))


def test_zipf_latencies_exact_endpoints_with_exact_profile() -> None:
    latencies = zipf_latencies(1000, ZipfProfile(1.2, 1.0, 3.0))
    # (1 - N^-a) / (1 - N^-a) is exactly 1 for the slowest, 0 for the fastest: 1 + 2 * 1 = 3 and 1 + 2 * 0 = 1
    assert (latencies[0], latencies[-1]) == (3.0, 1.0)


@pytest.mark.parametrize(("n", "a"), [(1, 1.2), (1, 0.0), (5, 0.0), (1000, 0.0)])
def test_no_skew_gives_every_device_fastest(n: int, a: float) -> None:
    latencies = zipf_latencies(n, ZipfProfile(a, 1.5, 4.0))
    assert latencies.tolist() == [1.5] * n


# --------------------------------------------------------------------------------- zipf_bandwidths


def test_zipf_bandwidths_known_answer_n3_a1() -> None:
    bandwidths = zipf_bandwidths(3, BandwidthProfile(1.0, 21.0, 210.0))
    # u = 1, 1/4, 0; b = 21 * 210 / (21 + 189 u) = 4410 / 210, 4410 / 68.25, 4410 / 21
    assert bandwidths[0] == 21.0
    assert bandwidths[1] == pytest.approx(4410 / 68.25, rel=1e-12)
    assert bandwidths[2] == 210.0
    # the per-megabit times are the Zipf latencies between 1/210 and 1/21
    assert 1 / bandwidths[1] == pytest.approx(1 / 210 + (1 / 21 - 1 / 210) / 4, rel=1e-12)


@pytest.mark.parametrize(("n", "a"), [(1, 1.2), (4, 0.0)])
def test_zipf_bandwidths_no_skew_gives_every_link_high(n: int, a: float) -> None:
    assert zipf_bandwidths(n, BandwidthProfile(a, 21.0, 210.0)).tolist() == [210.0] * n


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 2000), a=st.floats(0.01, 4.0), lo=st.integers(1, 10_000), extra=st.integers(1, 10_000))
def test_zipf_bandwidths_integer_range_is_exact_and_monotone(n: int, a: float, lo: int, extra: int) -> None:
    hi = lo + extra
    bandwidths = zipf_bandwidths(n, BandwidthProfile(a, float(lo), float(hi)))
    # integer Mbps: lo * hi is exact, so lo * hi / hi and lo * hi / lo are exactly lo and hi
    assert (bandwidths[0], bandwidths[-1]) == (lo, hi)
    assert np.all(np.diff(bandwidths) >= 0)
    assert np.all((bandwidths >= lo) & (bandwidths <= hi))


@pytest.mark.parametrize(("lo", "hi"), [(0.6, 14.0), (254.4, 783.96)])
def test_zipf_bandwidths_decimal_range_ends_exact(lo: float, hi: float) -> None:
    bandwidths = zipf_bandwidths(50, BandwidthProfile(1.2, lo, hi))
    assert np.all((bandwidths >= lo) & (bandwidths <= hi))
    assert (bandwidths[0], bandwidths[-1]) == (lo, hi)


# -------------------------------------------------------------------------------- Population.build


def test_build_profiles_are_permutations_of_the_zipf_arrays() -> None:
    clients = _clients()
    population = Population.build(500, clients, seed=11)
    assert population.size == 500
    assert population.slowdown.shape == population.bandwidth_mbps.shape == (500,)
    # the multiset of slow-downs is exactly zipf_latencies (slowest first when sorted descending)
    assert np.array_equal(np.sort(population.slowdown.values())[::-1], zipf_latencies(500, clients.compute))
    assert np.array_equal(np.sort(population.bandwidth_mbps.values()), zipf_bandwidths(500, clients.bandwidth))


def test_build_uses_the_profiles_streams() -> None:
    clients = _clients()
    population = Population.build(64, clients, seed=5)
    compute = zipf_latencies(64, clients.compute)
    bandwidth = zipf_bandwidths(64, clients.bandwidth)
    ids = np.arange(64)
    compute_perm = KeyedPermutation(64, stream_keys(5, Stream.PROFILES, 0, count=ROUNDS))
    bandwidth_perm = KeyedPermutation(64, stream_keys(5, Stream.PROFILES, 1, count=ROUNDS))
    assert np.array_equal(population.slowdown.values(), compute[compute_perm(ids)])
    assert np.array_equal(population.bandwidth_mbps.values(), bandwidth[bandwidth_perm(ids)])


@pytest.mark.parametrize(("lo", "hi"), [(21.0, 210.0), (1.0, 1000.0), (8.0, 64.0), (93.0, 98.0)])
def test_bandwidths_lie_in_range_with_both_endpoints_attained(lo: float, hi: float) -> None:
    bandwidth = Population.build(300, _clients(lo, hi), seed=3).bandwidth_mbps.values()
    assert np.all((bandwidth >= lo) & (bandwidth <= hi))
    assert (bandwidth.min(), bandwidth.max()) == (lo, hi)


def test_build_same_seed_identical_other_seed_permuted_differently() -> None:
    clients = _clients()
    a = Population.build(200, clients, seed=42)
    b = Population.build(200, clients, seed=42)
    c = Population.build(200, clients, seed=43)
    assert np.array_equal(a.slowdown.values(), b.slowdown.values())
    assert np.array_equal(a.bandwidth_mbps.values(), b.bandwidth_mbps.values())
    assert not np.array_equal(a.slowdown.values(), c.slowdown.values())
    assert not np.array_equal(a.bandwidth_mbps.values(), c.bandwidth_mbps.values())
    # same multisets, other assignment
    assert np.array_equal(np.sort(a.slowdown.values()), np.sort(c.slowdown.values()))
    assert np.array_equal(np.sort(a.bandwidth_mbps.values()), np.sort(c.bandwidth_mbps.values()))


@pytest.mark.parametrize("seed", [0, 1, 2, 12345])
def test_compute_and_bandwidth_ranks_are_assigned_independently(seed: int) -> None:
    population = Population.build(200, _clients(), seed=seed)
    compute_rank = _ranks(population.slowdown.values(), slowest_first_descending=True)  # large slow-down = slow
    bandwidth_rank = _ranks(population.bandwidth_mbps.values(), slowest_first_descending=False)  # low Mbps = slow
    assert not np.array_equal(compute_rank, bandwidth_rank)
    # independent permutations of 200 have a small rank correlation (|rho| < 4 / sqrt(199) ~ 0.28)
    rho = np.corrcoef(compute_rank, bandwidth_rank)[0, 1]
    assert abs(rho) < 4 / np.sqrt(199)


def test_build_single_client_gets_fastest_profile() -> None:
    population = Population.build(1, _clients(), seed=0)
    assert population.slowdown.values().tolist() == [1.0]
    assert population.bandwidth_mbps.values().tolist() == [210.0]


def test_ranks_keep_the_distribution_shape_as_the_population_grows() -> None:
    ranked = Clients(
        compute=ZipfProfile(1.2, 1.0, 3.0, ranks=100),
        bandwidth=BandwidthProfile(1.2, 21.0, 210.0, ranks=100),
    )
    small = Population.build(100, ranked, seed=1)
    large = Population.build(100_000, ranked, seed=1)
    # Each of the 100 ranks is held by exactly 1000 of the 100,000 clients.
    assert np.array_equal(np.sort(np.unique(large.slowdown.values())), np.sort(small.slowdown.values()))
    assert (np.unique(large.slowdown.values(), return_counts=True)[1] == 1000).all()
    assert np.quantile(large.bandwidth_mbps.values(), 0.1) == pytest.approx(
        np.quantile(small.bandwidth_mbps.values(), 0.1), rel=0.05
    )
    # Without ranks the Zipf rule spans the whole population: almost every device sits at the fast end.
    plain = Population.build(100_000, _clients(), seed=1)
    assert np.mean(plain.slowdown.values() < 1.02) > 0.999 and np.mean(large.slowdown.values() < 1.02) < 0.7


# ------------------------------------------------------------------------- profiles computed from ids


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1), context=st.integers(0, 3))
def test_keyed_permutation_is_a_bijection(size: int, seed: int, context: int) -> None:
    permutation = KeyedPermutation(size, stream_keys(seed, Stream.PROFILES, context, count=ROUNDS))
    images = permutation(np.arange(size))
    assert images.dtype == np.int64
    assert np.array_equal(np.sort(images), np.arange(size))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 2000),
    seed=st.integers(0, 1000),
    ranks=st.one_of(st.none(), st.integers(1, 50)),
    data=st.data(),
)
def test_a_clients_profile_depends_only_on_its_id(size: int, seed: int, ranks: int | None, data: st.DataObject) -> None:
    """Whatever ids are asked for together, in whatever order, each client gets the value it has in the
    whole population's table: per-client determinism."""
    clients = Clients(ZipfProfile(1.2, 1.0, 3.0, ranks=ranks), BandwidthProfile(0.8, 21.0, 210.0, ranks=ranks))
    population = Population.build(size, clients, seed)
    slow, mbps = population.slowdown.values(), population.bandwidth_mbps.values()
    ids = np.array(data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=40)), dtype=np.int64)
    assert np.array_equal(population.slowdown[ids], slow[ids])
    assert np.array_equal(population.bandwidth_mbps[ids], mbps[ids])
    assert population.slowdown[int(ids[0])] == slow[ids[0]]
    assert isinstance(population.bandwidth_mbps[int(ids[0])], float)
    again = Population.build(size, clients, seed)  # built anew: the same values
    assert np.array_equal(again.slowdown[ids], slow[ids])


@pytest.mark.parametrize("size", [10**9, 10**12, 2**62])
def test_a_huge_population_costs_nothing_until_asked(size: int) -> None:
    clients = Clients(ZipfProfile(1.2, 1.0, 3.0, ranks=100), BandwidthProfile(1.2, 21.0, 210.0))
    population = Population.build(size, clients, seed=1)
    assert population.size == size
    ids = np.array([0, 1, size // 2, size - 1], dtype=np.int64)
    slow, mbps = population.slowdown[ids], population.bandwidth_mbps[ids]
    assert np.all((slow >= 1.0) & (slow <= 3.0)) and np.all((mbps >= 21.0) & (mbps <= 210.0))
    # the 100 compute ranks are the 100-device Zipf values, whatever the population's size
    assert set(slow.tolist()) <= set(zipf_latencies(100, clients.compute).tolist())
    with pytest.raises(IndexError, match=f"clients 0..{size - 1}"):
        population.slowdown[np.array([size])]
    with pytest.raises(MemoryError, match="would be computed at once"):
        population.slowdown.values()


@pytest.mark.parametrize(("size", "ranks"), [(1, None), (7, None), (1000, None), (1000, 30), (1000, 5000), (997, 10)])
def test_the_smallest_values_come_from_the_ranks_alone(size: int, ranks: int | None, monkeypatch) -> None:
    import sim.clients.population as module

    clients = Clients(ZipfProfile(1.2, 1.0, 3.0, ranks=ranks), BandwidthProfile(1.2, 21.0, 210.0, ranks=ranks))
    population = Population.build(size, clients, seed=9)
    expected = {name: np.sort(getattr(population, name).values()) for name in ("slowdown", "bandwidth_mbps")}
    monkeypatch.setattr(module, "MATERIALISE_LIMIT", 0)  # as for a population too large to list
    for name, values in expected.items():
        for n in {1, 5, size}:
            assert np.array_equal(getattr(population, name).smallest(n), values[:n]), (name, n)


def test_the_zipf_shape_holds_over_a_sample_of_a_huge_population() -> None:
    """Ranks of a population of 10^9: a uniform sample of 200,000 ids holds each of 10 ranks about equally."""
    ranked = Clients(ZipfProfile(1.2, 1.0, 3.0, ranks=10), BandwidthProfile(1.2, 21.0, 210.0, ranks=10))
    population = Population.build(10**9, ranked, seed=4)
    ids = np.random.default_rng(0).choice(10**9, size=200_000, replace=False)
    values, counts = np.unique(population.slowdown[ids], return_counts=True)
    assert np.array_equal(values, np.sort(zipf_latencies(10, ranked.compute)))
    assert np.all(np.abs(counts / 200_000 - 0.1) < 4 * np.sqrt(0.1 * 0.9 / 200_000))


def test_trace_capacity_replaces_only_the_trace_clients() -> None:
    population = Population.build(1000, _clients(), seed=2)
    slow, mbps = population.slowdown.values(), population.bandwidth_mbps.values()
    traced = np.array([7, 3, 5000, 11])  # 5000 is outside the population: ignored
    given = population.with_capacity(
        traced, np.array([40.0, 20.0, 10.0, np.nan]), np.array([500.0, np.nan, 1.0, 9000.0])
    )
    new_slow, new_mbps = given.slowdown.values(), given.bandwidth_mbps.values()
    # ms per sample over the fastest traced device's (5000 is outside the population, so 20 ms is the fastest)
    assert (new_slow[7], new_slow[3], new_slow[11]) == (2.0, 1.0, slow[11])
    assert (new_mbps[7], new_mbps[3], new_mbps[11]) == (0.5, mbps[3], 9.0)
    others = np.setdiff1d(np.arange(1000), [3, 7, 11])
    assert np.array_equal(new_slow[others], slow[others]) and np.array_equal(new_mbps[others], mbps[others])
    assert np.array_equal(given.slowdown[np.array([11, 7])], [slow[11], 2.0])


def test_ids_of_any_shape_give_values_of_that_shape() -> None:
    population = Population.build(100, _clients(), seed=3)
    table = population.bandwidth_mbps.values()
    assert (
        population.bandwidth_mbps[np.array(5)].shape == () and float(population.bandwidth_mbps[np.array(5)]) == table[5]
    )
    assert population.slowdown[np.array([], dtype=np.int64)].shape == (0,)
    grid = np.array([[1, 2], [99, 0]])
    assert np.array_equal(population.bandwidth_mbps[grid], table[grid])
