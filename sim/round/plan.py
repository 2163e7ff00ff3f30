"""A round's plan: everything decided before a driver plays it.

The runner (:mod:`sim.runner.experiment`) plans each round from the scenario's seeded streams, whatever
driver then plays it: who is sampled, who drops out before which stage, who goes offline when (trace
replay), the round's privacy plan, and how many chunks it is cut into. A driver
(:class:`sim.round.driver.Driver`) plays the plan and returns the round's record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sim.protocol.private import PrivateRound


@dataclass(frozen=True)
class RoundPlan:
    """Round ``number`` as planned."""

    number: int
    """Numbered from 1."""
    sampled: tuple[int, ...]
    """The sampled clients, in sample order (population indices)."""
    drops: Mapping[int, str] = field(default_factory=dict)
    """Client -> the ``dropout.stage`` before which it leaves (planned dropouts)."""
    private: PrivateRound | None = None
    """The round's distributed-DP plan (noise, encoding), or None without distributed DP."""
    refused: str = ""
    """Why the round cannot run (it aborts at once with this reason), or empty."""
    offline: Mapping[int, float] = field(default_factory=dict)
    """Sampled client -> the time its availability ends (trace replay; seconds on the driver's clock)."""
    rate: float | None = None
    """The round's sampling rate when it differs from the planned one (sampling among the clients online),
    else None."""
    chunks: int | None = None
    """Pipelined: the number of chunks, one protocol instance each (None: not pipelined)."""
