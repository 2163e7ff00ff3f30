"""Device profiles of the client population: Zipf-skewed compute and bandwidth.

Dordis section 6.1: "the end-to-end latency of the i-th slowest client is proportional to i^-a" with
a = 1.2, and an independent Zipf for bandwidth within [21, 210] Mbps. dropsim applies the same rule to
both resources. The i-th slowest of N devices (i = 1..N) sits at the Zipf position

    u_i = (i^-a - N^-a) / (1 - N^-a)        (1 for the slowest, 0 for the fastest),

and its latency is min-max scaled by it: ``L_i = L_fast + (L_slow - L_fast) u_i``. For compute, L is the
slow-down factor against the profiled reference device. For bandwidth, L is the time per megabit, scaled
between 1/high and 1/low Mbps, which gives the bandwidth ``low * high / (low + (high - low) u_i)``
(both ends of the range are attained exactly, and no value leaves it through round-off). Most devices
are near the fast end, with a Zipf tail of stragglers. Ranks are assigned to client indices by a seeded
permutation, independently per resource.

Nothing of the population's size is held. The permutation is a keyed bijection evaluated per id
(:class:`sim.keyed.KeyedPermutation`), and ``u_i`` has the closed form above, so a client's
profile is computed from its id when it is needed: ``population.slowdown[ids]`` for an array of ids (or one
id). A population of a billion costs what one of ten does. A trace's device capacity replaces the Zipf
values of the trace's clients only, and only those are stored.

The rule ranks the whole population, so its shape depends on N: with a = 1.2 only about 46 devices are
more than 1% of the range away from the fast end, whatever N is (i^-1.2 > 0.01 for i < 46). A population
of 100,000 is therefore almost uniform, with a tail of a few dozen stragglers. ``ranks: R`` ranks R
devices instead and gives each rank to N / R clients (client k gets rank ``perm(N)[k] mod R``), which
keeps the distribution's shape as N grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import overload

import numpy as np

from sim.keyed import ROUNDS, KeyedPermutation, stream_keys
from sim.scenario.types import BandwidthProfile, Clients, ZipfProfile
from sim.seeds import Stream

MBPS = 1e6
"""Bits per second in one Mbps (bandwidths are in Mbps)."""


def zipf_position(i: np.ndarray, n: int, zipf_a: float) -> np.ndarray:
    """``u_i`` of the ``i``-th slowest of ``n`` devices (``i``: ints in 1..n): 1 for the slowest, 0 for the
    fastest.

    With ``n == 1`` or ``zipf_a == 0`` there is no skew and every device is at 0 (the fast end).
    """
    first, last = np.array([1.0, n], dtype=np.float64) ** (-zipf_a)  # as numpy computes each element of z
    span = first - last
    if span <= 0:
        return np.zeros(np.shape(i), dtype=np.float64)
    z = np.asarray(i, dtype=np.float64) ** (-zipf_a)
    return (z - last) / span


def zipf_positions(n: int, zipf_a: float) -> np.ndarray:
    """``u_i`` of the 1st..n-th slowest device (slowest first): 1 down to 0."""
    return zipf_position(np.arange(1, n + 1), n, zipf_a)


def compute_latency(u: np.ndarray, profile: ZipfProfile) -> np.ndarray:
    """Slow-down factors at Zipf positions ``u``."""
    return profile.fastest + (profile.slowest - profile.fastest) * u


def link_bandwidth(u: np.ndarray, profile: BandwidthProfile) -> np.ndarray:
    """Bandwidths in Mbps at Zipf positions ``u``: both ends of the range exactly at ``u`` 0 and 1."""
    lo, hi = profile.low_mbps, profile.high_mbps
    bandwidth = np.clip(lo * hi / (lo + (hi - lo) * u), lo, hi)  # lo * hi may round: keep inside the range
    bandwidth[u == 0.0] = hi
    bandwidth[u == 1.0] = lo
    return bandwidth


def zipf_latencies(n: int, profile: ZipfProfile) -> np.ndarray:
    """Compute slow-down factors of the 1st..n-th slowest device (slowest first)."""
    return compute_latency(zipf_positions(n, profile.zipf_a), profile)


def zipf_bandwidths(n: int, profile: BandwidthProfile) -> np.ndarray:
    """Bandwidths in Mbps of the 1st..n-th slowest link (slowest first)."""
    return link_bandwidth(zipf_positions(n, profile.zipf_a), profile)


MATERIALISE_LIMIT = 10_000_000
"""The most clients whose profiles :meth:`Profile.values` computes at once (80 MB of float64)."""


class Profile:
    """One resource's value for every client, computed from ids: ``profile[ids]`` (an array of ids, or one
    id for a float). ``np.asarray(profile)`` computes all of them, for populations up to
    :data:`MATERIALISE_LIMIT`."""

    def __init__(
        self,
        size: int,
        ranks: int,
        permutation: KeyedPermutation,
        value: Callable[[np.ndarray], np.ndarray],
        override: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.size = size
        self.ranks = ranks
        """R: distinct Zipf ranks (client k holds rank ``perm(k) mod R``)."""
        self._permutation = permutation
        self._value = value
        """Ranks (0: the slowest) -> this resource's values."""
        self._override = override
        """(sorted client ids, their values; NaN: keep the Zipf value), from a trace, or None."""

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, ids: int | np.integer) -> float: ...
    @overload
    def __getitem__(self, ids: np.ndarray) -> np.ndarray: ...
    def __getitem__(self, ids: int | np.integer | np.ndarray) -> float | np.ndarray:
        if isinstance(ids, (int, np.integer)):
            return float(self.of(np.array([ids], dtype=np.int64))[0])
        return self.of(np.asarray(ids))

    def of(self, ids: np.ndarray) -> np.ndarray:
        """The values (float64) of clients ``ids`` (ints in 0..size-1), in their shape."""
        shape = np.shape(ids)
        flat = np.asarray(ids).ravel()
        if flat.size == 0:
            return np.zeros(shape, dtype=np.float64)
        rank = self._permutation(flat) % self.ranks  # 0: the slowest
        values = self._value(rank)
        if self._override is not None:
            values = self._overridden(flat, *self._override, values)
        return values.reshape(shape)

    def replaced(self, clients: np.ndarray, given: np.ndarray) -> Profile:
        """This profile with the values ``given`` for ``clients`` (sorted unique ids; NaN or inf: keep)."""
        if self._override is not None:  # merge: the new values first, the former ones where none is given
            ids = np.union1d(clients, self._override[0])
            merged = self._overridden(ids, *self._override, np.full(ids.shape, np.nan))
            given = self._overridden(ids, clients, given, merged)
            clients = ids
        return Profile(self.size, self.ranks, self._permutation, self._value, (clients, given))

    @staticmethod
    def _overridden(ids: np.ndarray, clients: np.ndarray, given: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` with ``given``'s finite values for those of ``ids`` among ``clients`` (sorted)."""
        if not clients.size:
            return values
        at = np.minimum(np.searchsorted(clients, ids), clients.shape[0] - 1)
        hit = (clients[at] == ids) & np.isfinite(given[at])
        return np.where(hit, given[at], values)

    def values(self) -> np.ndarray:
        """Every client's value, in id order."""
        if self.size > MATERIALISE_LIMIT:
            raise MemoryError(
                f"the profiles of {self.size:,} clients would be computed at once (at most {MATERIALISE_LIMIT:,})"
            )
        return self.of(np.arange(self.size, dtype=np.int64))

    def smallest(self, n: int) -> np.ndarray:
        """The ``n`` smallest values of the population, ascending, without computing every client's (the
        multiset of ranks is ``m mod R`` for m in 0..size-1, whatever the permutation; with a trace's values
        the profile of every client is computed, up to :data:`MATERIALISE_LIMIT`)."""
        n = min(n, self.size)
        if self._override is not None or self.size <= MATERIALISE_LIMIT:
            return np.sort(np.partition(self.values(), n - 1)[:n]) if n else np.zeros(0)
        held = min(self.ranks, self.size)
        ends = np.unique(np.concatenate([np.arange(min(n, held)), np.arange(max(held - n, 0), held)]))
        counts = (self.size - 1 - ends) // self.ranks + 1  # clients holding each rank
        return np.sort(np.repeat(self._value(ends), counts))[:n]

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        values = self.values()
        return values if dtype is None else values.astype(dtype)


@dataclass(frozen=True)
class Population:
    """Per-client device profiles, indexed by client (0..size-1) and computed from the id on demand."""

    slowdown: Profile
    """Compute slow-down factor (>= 1 is slower than the reference device)."""
    bandwidth_mbps: Profile
    """Link bandwidth in Mbps, the same up and down."""

    @property
    def size(self) -> int:
        return self.slowdown.size

    @classmethod
    def build(cls, size: int, clients: Clients, seed: int) -> Population:
        """Zipf profiles for ``size`` clients, ranks permuted by keys from the ``PROFILES`` stream of
        ``seed`` (context 0: compute, 1: bandwidth)."""
        compute, link = clients.compute, clients.bandwidth
        r_compute = compute.ranks or size
        r_bandwidth = link.ranks or size

        def slowdowns(rank: np.ndarray) -> np.ndarray:
            return compute_latency(zipf_position(rank + 1, r_compute, compute.zipf_a), compute)

        def bandwidths(rank: np.ndarray) -> np.ndarray:
            return link_bandwidth(zipf_position(rank + 1, r_bandwidth, link.zipf_a), link)

        return cls(
            slowdown=Profile(size, r_compute, _permutation(size, seed, 0), slowdowns),
            bandwidth_mbps=Profile(size, r_bandwidth, _permutation(size, seed, 1), bandwidths),
        )

    def with_capacity(self, clients: np.ndarray, compute_ms: np.ndarray | None, kbps: np.ndarray | None) -> Population:
        """This population with the device capacity a trace gives for ``clients`` (NaN: keep the Zipf value).

        Bandwidth is ``kbps / 1000`` Mbit/s. Compute: the slow-down is the device's ms per sample over the
        fastest traced device's, so the fastest device trains at the speed the cost model measured here.
        Only the trace's clients inside the population are stored.
        """
        inside = clients < self.size
        ids = clients[inside].astype(np.int64)
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        slowdown, mbps = self.slowdown, self.bandwidth_mbps
        if compute_ms is not None:
            ms = compute_ms[inside][order].astype(np.float64)
            known = np.isfinite(ms)
            if known.any():
                slowdown = slowdown.replaced(ids, ms / ms[known].min())
        if kbps is not None:
            mbps = mbps.replaced(ids, kbps[inside][order].astype(np.float64) / 1000.0)
        return Population(slowdown=slowdown, bandwidth_mbps=mbps)


def _permutation(size: int, seed: int, context: int) -> KeyedPermutation:
    return KeyedPermutation(size, stream_keys(seed, Stream.PROFILES, context, count=ROUNDS))
