"""Resources of a pipelined round: each runs one chunk's stage at a time (Dordis Figure 6).

A :class:`StageGate` guards one resource of one party (a client's CPU or link, the server's CPU) for the
stages of Dordis Table 1 (:mod:`sim.round.stages`) that use it. It admits stage s of chunk c when

- chunk c-1 has finished stage s on it (chunks go through a stage in order), and
- every chunk has finished every earlier stage that uses it (Hyades appendix F, eq. 19: r(s, 0) = f(q, m-1)),

which is the recurrence of :mod:`sim.pipeline.recurrence` run by events: with equal stage times the
admitted spans reproduce its completion times exactly. A stage is held from admission to
:meth:`StageGate.release`, including any waiting inside it. A chunk a party leaves (it dropped, the chunk's
round aborted) is :meth:`StageGate.abandon`-ed so that later chunks do not wait for it.

A gate reads time and makes events through a :class:`Clock`: the SimPy environment in the simulator
(whose events a process yields), the asyncio loop in a deployment (:class:`sim.deploy.loopclock.LoopClock`,
whose events are awaited). Within a party, work outside the gated stages (a client's unmasking shares,
the server's key routing) goes first: :data:`SIDE` before :data:`STAGED`, in both drivers' processors.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

SIDE = 0
"""Processor priority of work outside the gated stages."""
STAGED = 1
"""Processor priority of a gated stage's work."""


class Event(Protocol):
    """What a gate hands out: fired once by :meth:`succeed`."""

    def succeed(self, value: object = None) -> object: ...


E = TypeVar("E", bound=Event)
E_co = TypeVar("E_co", bound=Event, covariant=True)


class Clock(Protocol[E_co]):
    """Time in seconds and a source of fresh events."""

    @property
    def now(self) -> float: ...

    def event(self) -> E_co: ...


class StageGate(Generic[E]):
    """Admission of (stage, chunk) tasks to one resource; ``stages`` are the stages that use it."""

    def __init__(self, clock: Clock[E], name: str, stages: tuple[int, ...], chunks: int) -> None:
        self.clock = clock
        self.name = name
        self.stages = tuple(sorted(stages))
        self.chunks = chunks
        self.done: set[tuple[int, int]] = set()
        self.waiting: dict[tuple[int, int], E] = {}
        self.admitted: dict[tuple[int, int], float] = {}
        self.spans: list[tuple[int, int, float, float]] = []
        """``(stage, chunk, admitted, released)`` of every task that ran, in release order (seconds)."""

    def _ready(self, stage: int, chunk: int) -> bool:
        if chunk > 0 and (stage, chunk - 1) not in self.done:
            return False
        return all((q, c) in self.done for q in self.stages if q < stage for c in range(self.chunks))

    def admit(self, stage: int, chunk: int) -> E:
        """An event that fires when the task may start (at once if it may start now)."""
        if stage not in self.stages:
            raise ValueError(f"{self.name} serves stages {self.stages}, not {stage}")
        key = (stage, chunk)
        event = self.clock.event()
        if key in self.done:
            raise ValueError(f"{self.name}: stage {stage} of chunk {chunk} already ran")
        if self._ready(stage, chunk):
            self.admitted[key] = self.clock.now
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
            self.spans.append((stage, chunk, start, self.clock.now))
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
                self.admitted[key] = self.clock.now
                self.waiting.pop(key).succeed()
