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
permutation, independently per resource. Only two float64 arrays of N entries are held: a million clients
cost 16 MB.

The rule ranks the whole population, so its shape depends on N: with a = 1.2 only about 46 devices are
more than 1% of the range away from the fast end, whatever N is (i^-1.2 > 0.01 for i < 46). A population
of 100,000 is therefore almost uniform, with a tail of a few dozen stragglers. ``ranks: R`` ranks R
devices instead and gives each rank to N / R clients (client k gets rank ``perm(N)[k] mod R``), which
keeps the distribution's shape as N grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scenario.types import BandwidthProfile, Clients, ZipfProfile
from sim.seeds import Stream, generator

MBPS = 1e6
"""Bits per second in one Mbps (bandwidths are in Mbps)."""


def zipf_positions(n: int, zipf_a: float) -> np.ndarray:
    """``u_i`` of the 1st..n-th slowest device (slowest first): 1 down to 0.

    With ``n == 1`` or ``zipf_a == 0`` there is no skew and every device is at 0 (the fast end).
    """
    i = np.arange(1, n + 1, dtype=np.float64)
    z = i ** (-zipf_a)
    span = z[0] - z[-1]
    if span <= 0:
        return np.zeros(n, dtype=np.float64)
    return (z - z[-1]) / span


def zipf_latencies(n: int, profile: ZipfProfile) -> np.ndarray:
    """Compute slow-down factors of the 1st..n-th slowest device (slowest first)."""
    return profile.fastest + (profile.slowest - profile.fastest) * zipf_positions(n, profile.zipf_a)


def zipf_bandwidths(n: int, profile: BandwidthProfile) -> np.ndarray:
    """Bandwidths in Mbps of the 1st..n-th slowest link (slowest first)."""
    lo, hi = profile.low_mbps, profile.high_mbps
    u = zipf_positions(n, profile.zipf_a)
    bandwidth = np.clip(lo * hi / (lo + (hi - lo) * u), lo, hi)  # lo * hi may round: keep inside the range
    bandwidth[u == 0.0] = hi
    bandwidth[u == 1.0] = lo
    return bandwidth


@dataclass(frozen=True)
class Population:
    """Per-client device profile, indexed by client (0..size-1)."""

    slowdown: np.ndarray
    """Compute slow-down factor (>= 1 is slower than the reference device)."""
    bandwidth_mbps: np.ndarray
    """Link bandwidth in Mbps, the same up and down."""

    @property
    def size(self) -> int:
        return int(self.slowdown.shape[0])

    @classmethod
    def build(cls, size: int, clients: Clients, seed: int) -> Population:
        """Zipf profiles for ``size`` clients, ranks permuted by the ``PROFILES`` stream of ``seed``."""
        r_compute = clients.compute.ranks or size
        r_bandwidth = clients.bandwidth.ranks or size
        compute = zipf_latencies(r_compute, clients.compute)
        bandwidth = zipf_bandwidths(r_bandwidth, clients.bandwidth)
        slowdown = compute[generator(seed, Stream.PROFILES, 0).permutation(size) % r_compute]
        mbps = bandwidth[generator(seed, Stream.PROFILES, 1).permutation(size) % r_bandwidth]
        return cls(slowdown=slowdown, bandwidth_mbps=mbps)

    def with_capacity(self, clients: np.ndarray, compute_ms: np.ndarray | None, kbps: np.ndarray | None) -> Population:
        """This population with the device capacity a trace gives for ``clients`` (NaN: keep the Zipf value).

        Bandwidth is ``kbps / 1000`` Mbit/s. Compute: the slow-down is the device's ms per sample over the
        fastest traced device's, so the fastest device trains at the speed the cost model measured here.
        """
        slowdown, mbps = self.slowdown.copy(), self.bandwidth_mbps.copy()
        inside = clients < self.size
        if compute_ms is not None:
            known = inside & np.isfinite(compute_ms)
            if known.any():
                slowdown[clients[known]] = compute_ms[known] / compute_ms[known].min()
        if kbps is not None:
            known = inside & np.isfinite(kbps)
            mbps[clients[known]] = kbps[known] / 1000.0
        return Population(slowdown=slowdown, bandwidth_mbps=mbps)
