"""Where a party's compute charge runs in virtual time: on its own processor, or on the testbed host's CPUs.

A round (:class:`sim.engine.virtual_round.Round`) charges each computation in reference seconds (seconds on one core
of the profiled machine). Without a testbed each party has a processor of its own: a client's charge lasts
its reference seconds times its slow-down, the server's its reference seconds over its speed
(docs/time-model.md, "Compute"). On a testbed (scenario ``testbed``) every charge is a job on the
host's CPUs (:mod:`sim.engine.host`): the process testbed's shared cores followed for a client by the sleep
that emulates its slow-down, or the kernel testbed's per-party quotas; each charge then also costs the hand-over
to the party's compute thread (``call_s``, the cost profile's ``deploy.call``), and each transfer the framing
and copying at both of its ends (:data:`sim.world.TRANSPORT_OPS`).

:class:`OwnProcessors` and :class:`HostCores` answer the same questions, so the round never asks which one
it has.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

import simpy

from sim.costs.model import CostModel, role
from sim.protocol.machine import SERVER
from sim.world import TRANSPORT_OPS

if TYPE_CHECKING:
    from sim.engine.host import Job, PartyQuotas, SharedHost

Hold = Callable[[], Generator[simpy.Event, Any, Any]]
"""What a computation yields until it is done, in place of a plain wait of its seconds."""


class Charges(Protocol):
    """Where the parties' compute charges run."""

    def overhead(self, party: int) -> float:
        """Reference seconds added to each of ``party``'s nonzero charges (the hand-over to its thread)."""
        ...

    def hold(self, reference: float, slowdown: float, party: int) -> Hold | None:
        """How a charge of ``reference`` seconds (overhead included; the server's divided by its speed) of a
        party of ``slowdown`` runs; None: a plain wait of its seconds."""
        ...

    def train(self, env: simpy.Environment, cost: float, slowdown: float, c: int) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s local training of ``cost`` reference seconds."""
        ...

    def transport_jobs(self, costs: CostModel, nbytes: int, sender: int, to: int) -> list[Job]:
        """The CPU work of carrying ``nbytes`` from ``sender`` to ``to`` at both ends, started now."""
        ...

    def cancel(self, jobs: list[Job]) -> None:
        """Cancel ``jobs`` (a transfer cut short)."""
        ...


class OwnProcessors:
    """Each party computes on a processor of its own: a charge is a wait of its seconds."""

    def overhead(self, party: int) -> float:
        return 0.0

    def hold(self, reference: float, slowdown: float, party: int) -> Hold | None:
        return None

    def train(self, env: simpy.Environment, cost: float, slowdown: float, c: int) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(slowdown * cost)

    def transport_jobs(self, costs: CostModel, nbytes: int, sender: int, to: int) -> list[Job]:
        return []

    def cancel(self, jobs: list[Job]) -> None:
        return None


class HostCores:
    """The testbed host's CPUs (:mod:`sim.engine.host`), shared by every party's charges."""

    def __init__(self, host: SharedHost | PartyQuotas, call_s: float, server_call_s: float) -> None:
        self.host = host
        self.call_s = call_s
        """Reference seconds of handing a computation to a client's compute thread (``deploy.call``)."""
        self.server_call_s = server_call_s
        """The same at the server."""

    def overhead(self, party: int) -> float:
        return self.server_call_s if party == SERVER else self.call_s

    def hold(self, reference: float, slowdown: float, party: int) -> Hold | None:
        host = self.host
        if party == SERVER:
            return lambda: host.compute(reference)
        return lambda: host.compute(reference, slowdown, party)

    def train(self, env: simpy.Environment, cost: float, slowdown: float, c: int) -> Generator[simpy.Event, Any, None]:
        yield from self.host.compute(cost + self.call_s, slowdown, c)

    def transport_jobs(self, costs: CostModel, nbytes: int, sender: int, to: int) -> list[Job]:
        """The testbed's sockets: framing and copying at both ends, while the message flows."""
        return [
            self.host.start(costs.seconds(op, {"bytes": nbytes}, role(party)), party)
            for op, party in zip(TRANSPORT_OPS, (sender, to), strict=True)
        ]

    def cancel(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.host.cancel(job)
