"""Device profiles of the client population: Zipf-skewed compute and bandwidth.

Dordis section 6.1: "the end-to-end latency of the i-th slowest client is proportional to i^-a" with
a = 1.2, and an independent Zipf for bandwidth within [21, 210] Mbps. dropsim applies the same rule to
both resources: the i-th slowest of N devices (i = 1..N) gets the latency

    L_i = L_fast + (L_slow - L_fast) * (i^-a - N^-a) / (1 - N^-a),

so the slowest device has ``L_slow`` and the fastest ``L_fast``. For compute, L is the slow-down factor
against the profiled reference device; for bandwidth, L is the time per megabit (1 / Mbps), so the
bandwidths span ``[1/L_slow, 1/L_fast]`` and most devices are near the fast end, with a Zipf tail of
stragglers. Ranks are assigned to client indices by a seeded permutation, independently per resource.
Only two float64 arrays of N entries are held: a million clients cost 16 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.scenario.schema import Clients, ZipfProfile
from sim.seeds import Stream, generator


def zipf_latencies(n: int, profile: ZipfProfile) -> np.ndarray:
    """Latencies of the 1st..n-th slowest device (slowest first), scaled into the profile's range.

    With ``n == 1`` or ``zipf_a == 0`` there is no skew to scale and every device gets ``fastest``.
    """
    i = np.arange(1, n + 1, dtype=np.float64)
    z = i ** (-profile.zipf_a)
    span = z[0] - z[-1]
    if span <= 0:
        return np.full(n, profile.fastest, dtype=np.float64)
    return profile.fastest + (profile.slowest - profile.fastest) * (z - z[-1]) / span


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
        compute = zipf_latencies(size, clients.compute)
        per_megabit = zipf_latencies(size, clients.bandwidth)
        slowdown = compute[generator(seed, Stream.PROFILES, 0).permutation(size)]
        bandwidth = 1.0 / per_megabit[generator(seed, Stream.PROFILES, 1).permutation(size)]
        return cls(slowdown=slowdown, bandwidth_mbps=bandwidth)
