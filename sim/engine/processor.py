"""A party's compute and a resource's busy time in virtual time.

A :class:`Processor` makes a party compute one operation at a time: the small work that answers another
party's request outside the gated stages of a pipelined round (a client's unmasking shares, the server's
key routing; :data:`sim.round.gates.SIDE`) goes first, but never preempts an operation that has started.
The server's has a second lane for that work (``lanes=2``): a server machine has cores to spare for its
messaging while one computes a chunk's sum, whereas a client device is one processor. On a testbed
(:mod:`sim.engine.host`) each lane's operation is a job on the host's shared cores. A :class:`BusyMeter`
adds up the seconds during which a resource (a link) had at least one activity under way.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from sim.round.gates import SIDE


class Processor:
    """One party's compute: one operation at a time per lane; tracks the seconds it was busy."""

    def __init__(self, env: simpy.Environment, lanes: int = 1) -> None:
        if lanes not in (1, 2):
            raise ValueError(f"a processor has 1 lane, or 2 (stage work and side work apart), not {lanes}")
        self.env = env
        self.resource = simpy.PriorityResource(env, capacity=1)
        self.side = simpy.PriorityResource(env, capacity=1) if lanes == 2 else self.resource
        self.busy_s = 0.0
        """Seconds of work done, summed over the lanes."""
        self.meter = BusyMeter(env)
        """Seconds during which at least one lane worked."""

    def run(
        self,
        seconds: float,
        priority: int,
        charge: Callable[[float], None] | None = None,
        hold: Callable[[], Generator[simpy.Event, Any, Any]] | None = None,
    ) -> Generator[simpy.Event, Any, None]:
        """Occupy the processor for ``seconds`` once it is free (``SIDE`` work is served first, or on its own
        lane); ``charge`` is told the seconds worked (all of them, or what was done when interrupted).

        ``hold`` replaces the plain ``seconds`` timeout by what it yields (on a testbed, a job on the shared
        cores and the slow-down sleep: :meth:`sim.engine.host.SharedHost.compute`); the seconds worked are
        then the virtual seconds it took."""
        if seconds <= 0:
            return
        resource = self.side if priority == SIDE else self.resource
        with resource.request(priority=priority) as request:
            yield request
            start = self.env.now
            self.meter.start()
            done = False
            try:
                if hold is None:
                    yield self.env.timeout(seconds)
                else:
                    yield from hold()
                done = True
            finally:
                self.meter.stop()
                worked = seconds if done and hold is None else self.env.now - start
                self.busy_s += worked
                if charge is not None:
                    charge(worked)


class BusyMeter:
    """Seconds during which at least one activity (a transfer on a link) was under way."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.active = 0
        self.since = 0.0
        self.busy_s = 0.0

    def start(self) -> None:
        if self.active == 0:
            self.since = self.env.now
        self.active += 1

    def stop(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.busy_s += self.env.now - self.since

    def total(self) -> float:
        """Busy seconds so far, counting an activity still under way up to now."""
        return self.busy_s + (self.env.now - self.since if self.active else 0.0)
