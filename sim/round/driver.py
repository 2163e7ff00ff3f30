"""The interface every driver implements: play a round plan, return its record, close.

Three drivers ship: the simulator (:class:`sim.engine.simulator.Simulator`, SimPy, virtual time), the
deployment (:class:`sim.deploy.deployment.Deployment`, TCP sockets and worker processes, wall-clock
time) and the in-memory driver (:class:`sim.loopback.LoopbackDriver`, no clock: decisions only). The
runner (:mod:`sim.runner`) talks to a driver only through this interface; docs/architecture.md ("Add a
driver") walks through writing another.
"""

from __future__ import annotations

from typing import Protocol

from sim.round.plan import RoundPlan
from sim.round.records import RoundRecord


class Driver(Protocol):
    """Plays one round after another on one clock."""

    name: str
    """What the manifest's ``driver`` says (``simulate``, ``deploy``, ``loopback``)."""

    @property
    def now(self) -> float:
        """Seconds on the driver's clock (where the next round starts)."""
        ...

    def wait_until(self, t: float) -> None:
        """Let the clock run to ``t`` with nothing happening (the server waits for a client to come online)."""
        ...

    def play(self, plan: RoundPlan) -> RoundRecord:
        """Play ``plan`` and return its record (times on the driver's clock)."""
        ...

    def manifest_entries(self) -> dict[str, object]:
        """What this driver adds to the run's manifest."""
        ...

    def close(self) -> None:
        """Release what the driver holds (processes, sockets); safe to call twice."""
        ...
