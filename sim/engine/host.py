"""The testbed host: every party's compute shares K cores by processor sharing, in virtual time.

The ``testbed`` scenario section models the real-socket deployment, where the server and one OS process
per sampled client run on one host with K cores (``docs/time-model.md``, "The testbed model"). Each compute
charge is a job of ``work`` reference seconds (seconds on one core of the profiled reference machine). A job
is one thread, so it runs on at most one core: with n jobs in the pool each progresses at

    rate = min(1, K / n)    reference seconds of work per virtual second,

the egalitarian processor sharing of Kleinrock ("Time-shared systems: a theoretical treatment", JACM 1967)
with K servers, the fluid limit of a fair OS scheduler. A lone job of ``w`` takes exactly ``w`` seconds;
n equal jobs started together on one core all end after ``n w``.

Like :mod:`sim.engine.network`, the pool is event-driven: whenever a job starts, ends or is cancelled,
every job's remaining work is advanced at the old rate and one timer is set for the next completion (a
version counter voids the older timers). Jobs are kept in start order and end in that order when they end
together, so a run is deterministic.

A client of slow-down f >= 1 is emulated on the testbed by its process sleeping (f - 1) times the CPU
seconds of each computation after it, holding its own processor: :meth:`SharedCores.compute`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator
from typing import Any

import simpy

_EPS_S = 1e-15
"""Remaining reference seconds below which a job counts as done (float round-off of rate * time)."""


class Job:
    """One computation in the pool; ``done`` fires (with the job) when its last reference second is done."""

    __slots__ = ("done", "id", "remaining", "started", "work")

    def __init__(self, jid: int, work: float, done: simpy.Event, now: float) -> None:
        self.id = jid
        self.work = work
        """Reference seconds of CPU work (seconds on one reference core)."""
        self.remaining = work
        """Reference seconds still to do, as of the pool's last event."""
        self.started = now
        self.done = done

    @property
    def worked(self) -> float:
        """Reference seconds done (as of the pool's last event; exact once it has ended or was cancelled)."""
        return self.work - self.remaining


class SharedCores:
    """``cores`` cores shared by processor sharing among the jobs of one SimPy environment."""

    def __init__(self, env: simpy.Environment, cores: int) -> None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"a testbed host has a whole number >= 1 of cores, not {cores!r}")
        self.env = env
        self.cores = cores
        self.jobs: dict[int, Job] = {}
        """The jobs running now, in start order."""
        self._ids = itertools.count()
        self._last = env.now
        self._version = 0

    @property
    def rate(self) -> float:
        """Reference seconds of work each running job does per virtual second: min(1, K / n)."""
        return min(1.0, self.cores / len(self.jobs)) if self.jobs else 1.0

    def start(self, work: float) -> Job:
        """Put a job of ``work`` reference seconds in the pool; wait on its ``done`` event."""
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"a job needs a finite work >= 0 reference seconds, not {work}")
        self._advance()
        job = Job(next(self._ids), float(work), self.env.event(), self.env.now)
        if job.work <= _EPS_S:
            job.remaining = 0.0
            job.done.succeed(job)
            return job
        self.jobs[job.id] = job
        self._reschedule()
        return job

    def cancel(self, job: Job) -> float:
        """Take ``job`` out of the pool (its party stopped); its ``done`` never fires. Returns the reference
        seconds it had done (all of them if it had already ended)."""
        if job.id in self.jobs:
            self._advance()
            del self.jobs[job.id]
            job.remaining = max(job.remaining, 0.0)
            self._reschedule()
        return job.worked

    def run(self, work: float, charge: Callable[[float], None] | None = None) -> Generator[simpy.Event, Any, None]:
        """Compute ``work`` reference seconds in the pool (``yield from`` it in a SimPy process). ``charge`` is
        told the reference seconds done: all of them, or, if the process is interrupted, what was done by
        then (the job leaves the pool and the :class:`simpy.Interrupt` goes on to the caller)."""
        job = self.start(work)
        if job.id in self.jobs:
            try:
                yield job.done
            except simpy.Interrupt:
                self.cancel(job)
                if charge is not None:
                    charge(job.worked)
                raise
        if charge is not None:
            charge(job.work)

    def compute(self, work: float, slowdown: float = 1.0) -> Generator[simpy.Event, Any, None]:
        """A party's compute charge on the testbed: ``work`` reference seconds in the pool, then a sleep of
        ``(slowdown - 1) * work`` seconds (the slow device is busy; a testbed process cannot run faster than
        a core, so a slow-down below 1 sleeps 0). The caller holds its own processor throughout."""
        yield from self.run(work)
        idle = (slowdown - 1.0) * work
        if idle > 0:
            yield self.env.timeout(idle)

    # -- internals --------------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0 and self.jobs:
            rate = self.rate
            for job in self.jobs.values():
                job.remaining -= rate * dt
        self._last = self.env.now

    def _reschedule(self) -> None:
        self._version += 1
        if not self.jobs:
            return
        first = min(self.jobs.values(), key=lambda j: j.remaining)
        timer = self.env.timeout(max(first.remaining, 0.0) / self.rate)
        version = self._version
        timer.callbacks.append(lambda _ev: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        # Every job progresses at the same rate, so the job the timer was set for has the least work left;
        # jobs level with it (to round-off) end with it, in start order.
        least = min(job.remaining for job in self.jobs.values())
        finished = [j for j in self.jobs.values() if j.remaining - least <= _EPS_S + 1e-12 * j.work]
        for job in finished:
            job.remaining = 0.0
            del self.jobs[job.id]
        self._reschedule()
        for job in finished:
            job.done.succeed(job)
