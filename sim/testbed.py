"""The kernel testbed's arithmetic, shared by the deployment that builds it and the simulator that models it.

On a kernel testbed (``testbed: {emulation: kernel}``, docs/deploy.md) every party runs in a CPU cgroup of
its own whose CFS quota is its share of a reference core, and the simulator charges each party's compute
against that share (:class:`sim.engine.host.PartyQuotas`, docs/time-model.md). Both take the shares, the
time dilation and the CFS periods from here, so that they cannot disagree:

- a client of slow-down ``s`` gets ``f / s`` of a core, the server ``f`` times its speed;
- ``f <= 1`` (:func:`dilation`) is the largest factor with which all the quotas of any round fit in the
  host's cores (``testbed.cores``), so that no party waits for another's core;
- each quota's CFS period is :data:`PERIOD_US`, or longer where a small quota would fall under the
  kernel's minimum of :data:`MIN_QUOTA_US` per period (:func:`cfs_period_us`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sim.scenario.types import Scenario

PERIOD_US = 10_000
"""CFS period of a party's quota (microseconds). The kernel's default of 100 ms would let a quarter-core
party run a 25 ms burst at full speed and then sit out 75 ms: a sub-millisecond operation would take either
its CPU time or tens of milliseconds, depending on where in the period it fell. 10 ms keeps the bursts and
the throttled stretches short against a round's steps; ``tests/test_kernel_testbed.py`` measures the rate
a quota gives, for long and for 0.2 ms operations."""

MIN_QUOTA_US = 1_000
"""The smallest quota the kernel accepts (1 ms per period)."""

MAX_PERIOD_US = 1_000_000
"""The longest CFS period the kernel accepts (1 s)."""

MTU_BYTES = 1500
"""The MTU of the kernel testbed's loopback (an Ethernet's), with segmentation offload off: every packet
htb shapes is one frame, so a link's burst is one frame, not the 64 KiB of loopback's own MTU (measured on
this project's machine: with 64 KiB packets, 100 kB crossed an idle 21 Mbps link in 0.2 ms instead of
38 ms)."""

FRAME_BYTES = MTU_BYTES + 14
"""Bytes htb counts for a full packet: the MTU and the Ethernet header the loopback device adds."""

MSS_BYTES = MTU_BYTES - 20 - 20 - 12
"""TCP payload per full packet: the MTU less the IP and TCP headers and TCP's timestamp option."""

PAYLOAD_FRACTION = MSS_BYTES / FRAME_BYTES
"""Bytes of a message per byte a shaped link carries (1448 / 1514 = 0.956): a kernel testbed's link of
rate r moves a message's bytes at r times this (measured: 100 kB to 2.5 MB at 21, 60 and 210 Mbps took
1.045 times n * 8 / r)."""

KERNEL = "kernel"
"""``testbed.emulation`` of the kernel testbed."""
ENGINE = "engine"
"""``testbed.emulation`` of the cost profile's own simulation engine (simulated only: :mod:`sim.engine.actors`)."""


KERNEL_PROFILE = Path(__file__).resolve().parent / "costs" / "kernel.json"
"""The cost profile of the kernel testbed on this project's machine: the shipped profile calibrated by
``dropsim calibrate`` on the calibration half of ``benchmarks/validate.py --testbed kernel`` (its
provenance is inside). A kernel testbed's scenario without ``costs.profile`` is simulated with it."""


def is_kernel(scenario: Scenario) -> bool:
    """Whether ``scenario`` runs on (or models) the kernel testbed."""
    return scenario.testbed is not None and scenario.testbed.emulation == KERNEL


def is_engine(scenario: Scenario) -> bool:
    """Whether ``scenario`` models the cost profile's own simulation engine (``testbed.emulation: engine``)."""
    return scenario.testbed is not None and scenario.testbed.emulation == ENGINE


def cost_profile(scenario: Scenario) -> str | Path | None:
    """The cost profile ``scenario`` is simulated with: its ``costs.profile``, else on the kernel testbed
    :data:`KERNEL_PROFILE`, else None (the shipped default)."""
    if scenario.cost_profile is not None:
        return scenario.cost_profile
    return KERNEL_PROFILE if is_kernel(scenario) else None


def cfs_period_us(cores: float) -> int:
    """The CFS period (microseconds) of a quota of ``cores`` cores: :data:`PERIOD_US`, lengthened so that the
    quota per period is at least :data:`MIN_QUOTA_US` (a quota of 0.05 cores runs on 20 ms periods)."""
    if not (math.isfinite(cores) and cores > 0):
        raise ValueError(f"a CPU quota must be a finite number > 0 of cores, not {cores!r}")
    return min(MAX_PERIOD_US, max(PERIOD_US, math.ceil(MIN_QUOTA_US / cores)))


def quota_us(cores: float) -> tuple[int, int]:
    """(quota, period) in microseconds of a CFS quota of ``cores`` cores."""
    period = cfs_period_us(cores)
    return max(MIN_QUOTA_US, round(cores * period)), period


def dilation(cores: float, server_speed: float, slowdowns: Sequence[float] | np.ndarray) -> float:
    """f <= 1, the time dilation of a kernel testbed on ``cores`` cores whose rounds play clients of
    ``slowdowns``: the largest f with the server's quota (f times ``server_speed``) and the clients' (f / s)
    summing to at most ``cores``."""
    s = np.asarray(slowdowns, dtype=np.float64)
    if not cores > 0 or not server_speed > 0 or not bool(np.all(s >= 1)):
        raise ValueError(f"cores {cores!r} and speed {server_speed!r} must be > 0, slow-downs >= 1")
    demand = server_speed + float(np.sum(1.0 / s))
    return min(1.0, cores / demand)


def clients_per_round(scenario: Scenario) -> int:
    """Most clients a round of ``scenario`` samples: its ``clients_per_round``, else (a rate, Poisson or
    none) the whole population."""
    n = scenario.sampling.clients_per_round
    return scenario.population if n is None else min(n, scenario.population)


def run_dilation(scenario: Scenario, slowdown: np.ndarray) -> float:
    """The f of a run of ``scenario`` on its kernel testbed, one for all its rounds: the quotas of the
    :func:`clients_per_round` fastest clients of the population (``slowdown``: every client's) fit, so those
    of any round's sample do."""
    testbed = scenario.testbed
    if testbed is None:
        raise ValueError(f"{scenario.name}: no testbed section: no time dilation")
    n = clients_per_round(scenario)
    fastest = np.partition(slowdown, n - 1)[:n] if n < slowdown.shape[0] else slowdown
    return dilation(testbed.cores, scenario.server.speed, fastest)


def client_cores(f: float, slowdown: float) -> float:
    """A client's quota on the kernel testbed: f / s cores."""
    return f / slowdown


def server_cores(f: float, speed: float) -> float:
    """The server's quota on the kernel testbed: f times its speed, in cores."""
    return f * speed
