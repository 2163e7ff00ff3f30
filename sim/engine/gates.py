"""Resources of a pipelined round: each runs one chunk's stage at a time (Dordis Figure 6).

A :class:`StageGate` guards one resource of one party (a client's CPU or link, the server's CPU) for the
stages of a pipelined round that use it. It admits stage s of chunk c when

- chunk c-1 has finished stage s on it (chunks go through a stage in order), and
- every chunk has finished every earlier stage that uses it (Hyades appendix F, eq. 19: r(s, 0) = f(q, m-1)),

which is the recurrence of :mod:`sim.pipeline.recurrence` in SimPy: with equal stage times the admitted
spans reproduce its completion times exactly. A stage is held from admission to :meth:`StageGate.release`,
including any waiting inside it. A chunk a party leaves (it dropped, the chunk's round aborted) is
:meth:`StageGate.abandon`-ed so that later chunks do not wait for it.

A :class:`Processor` makes a party compute one operation at a time: the small work that answers another
party's request outside the gated stages (a client's unmasking shares, the server's key routing) goes
first, but never preempts an operation that has started. The server's has a second lane for that work
(``lanes=2``): a server machine has cores to spare for its messaging while one computes a chunk's sum,
whereas a client device is one processor. On a testbed (:mod:`sim.engine.host`) each lane's operation is
a job on the host's shared cores.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

SIDE = 0
"""Processor priority of work outside the gated stages."""
STAGED = 1
"""Processor priority of a gated stage's work."""


class StageGate:
    """Admission of (stage, chunk) tasks to one resource; ``stages`` are the stages that use it."""

    def __init__(self, env: simpy.Environment, name: str, stages: tuple[int, ...], chunks: int) -> None:
        self.env = env
        self.name = name
        self.stages = tuple(sorted(stages))
        self.chunks = chunks
        self.done: set[tuple[int, int]] = set()
        self.waiting: dict[tuple[int, int], simpy.Event] = {}
        self.admitted: dict[tuple[int, int], float] = {}
        self.spans: list[tuple[int, int, float, float]] = []
        """``(stage, chunk, admitted, released)`` of every task that ran, in release order (seconds)."""

    def _ready(self, stage: int, chunk: int) -> bool:
        if chunk > 0 and (stage, chunk - 1) not in self.done:
            return False
        return all((q, c) in self.done for q in self.stages if q < stage for c in range(self.chunks))

    def admit(self, stage: int, chunk: int) -> simpy.Event:
        """An event that fires when the task may start (at once if it may start now)."""
        if stage not in self.stages:
            raise ValueError(f"{self.name} serves stages {self.stages}, not {stage}")
        key = (stage, chunk)
        event = self.env.event()
        if key in self.done:
            raise ValueError(f"{self.name}: stage {stage} of chunk {chunk} already ran")
        if self._ready(stage, chunk):
            self.admitted[key] = self.env.now
            event.succeed()
        else:
            self.waiting[key] = event
        return event

    def release(self, stage: int, chunk: int) -> None:
        """The task is over: record its span and admit whoever may start now."""
        key = (stage, chunk)
        if key in self.done:
            return
        self.done.add(key)
        start = self.admitted.pop(key, None)
        if start is not None:
            self.spans.append((stage, chunk, start, self.env.now))
        self._wake()

    def abandon(self, chunk: int) -> None:
        """Chunk ``chunk`` will not use this resource again: its remaining stages count as finished (and,
        cut short or never started, are not recorded as spans)."""
        for stage in self.stages:
            key = (stage, chunk)
            if key in self.done:
                continue
            self.waiting.pop(key, None)
            self.admitted.pop(key, None)
            self.release(stage, chunk)

    def _wake(self) -> None:
        for key in sorted(self.waiting):
            if self._ready(*key):
                self.admitted[key] = self.env.now
                self.waiting.pop(key).succeed()


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
        cores and the slow-down sleep: :meth:`sim.engine.host.SharedCores.compute`); the seconds worked are
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
