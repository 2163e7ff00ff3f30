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

The kernel testbed (``testbed: {emulation: kernel}``) gives every party a CPU cgroup of its own instead:
:class:`PartyQuotas` charges each party's compute on a :class:`QuotaCores` of its quota (f / s cores for a
client of slow-down s, f times its speed for the server: :mod:`sim.testbed`), with CFS's burst after idle
(docs/time-model.md, "The kernel testbed").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from sim.protocol.machine import SERVER
from sim.testbed import burst_s, client_cores, server_cores

_EPS_S = 1e-15
"""Remaining reference seconds below which a job counts as done (float round-off of rate * time)."""


class Job:
    """One computation in the pool; ``done`` fires (with the job) when its last reference second is done."""

    __slots__ = ("done", "id", "pool", "remaining", "started", "work")

    def __init__(self, jid: int, work: float, done: simpy.Event, now: float, pool: Any = None) -> None:
        self.id = jid
        self.pool = pool
        """The pool it runs in."""
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

    def start(self, work: float, party: int = SERVER) -> Job:
        """Put a job of ``work`` reference seconds in the pool (whoever's: ``party`` is for
        :class:`PartyQuotas`); wait on its ``done`` event."""
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

    def compute(self, work: float, slowdown: float = 1.0, party: int = SERVER) -> Generator[simpy.Event, Any, None]:
        """A party's compute charge on the testbed: ``work`` reference seconds in the pool, then a sleep of
        ``(slowdown - 1) * work`` seconds (the slow device is busy; a testbed process cannot run faster than
        a core, so a slow-down below 1 sleeps 0). The caller holds its own processor throughout (``party``
        is for :class:`PartyQuotas`)."""
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


class QuotaCores:
    """One party's CPU cgroup on the kernel testbed: its threads' jobs share ``quota`` cores (a CFS quota),
    one core per job at most, by processor sharing.

    CFS hands a group its quota afresh every period and carries none over, so a group that was idle may
    run at full speed until it has used one period's quota (``burst`` seconds of CPU). The pool models
    that as a token bucket of ``burst`` CPU seconds refilled at ``quota`` per second: while it holds
    credit, each job runs at one core (the credit draining at ``n - quota`` per second with ``n`` jobs);
    once it is empty, the jobs share the quota, ``min(1, quota / n)`` each. A lone job of ``w`` seconds
    after a long idle takes ``w`` if ``w`` is within the burst, else about ``w / quota - period``.
    """

    def __init__(self, env: simpy.Environment, quota: float, burst: float) -> None:
        if not (math.isfinite(quota) and quota > 0 and math.isfinite(burst) and burst >= 0):
            raise ValueError(f"a quota of {quota!r} cores with a burst of {burst!r} s")
        self.env = env
        self.quota = quota
        self.burst = burst
        self.credit = burst
        """CPU seconds the group may still run at full speed (as of the pool's last event)."""
        self.jobs: dict[int, Job] = {}
        self._ids = itertools.count()
        self._last = env.now
        self._version = 0

    @property
    def rate(self) -> float:
        """Reference seconds of work each running job does per virtual second."""
        if not self.jobs or self.credit > _EPS_S:
            return 1.0
        return min(1.0, self.quota / len(self.jobs))

    def start(self, work: float, party: int = SERVER) -> Job:
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"a job needs a finite work >= 0 reference seconds, not {work}")
        self._advance()
        job = Job(next(self._ids), float(work), self.env.event(), self.env.now, self)
        if job.work <= _EPS_S:
            job.remaining = 0.0
            job.done.succeed(job)
            return job
        self.jobs[job.id] = job
        self._reschedule()
        return job

    def cancel(self, job: Job) -> float:
        if job.id in self.jobs:
            self._advance()
            del self.jobs[job.id]
            job.remaining = max(job.remaining, 0.0)
            self._reschedule()
        return job.worked

    def run(self, work: float) -> Generator[simpy.Event, Any, None]:
        job = self.start(work)
        if job.id in self.jobs:
            try:
                yield job.done
            except simpy.Interrupt:
                self.cancel(job)
                raise

    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0:
            return
        n = len(self.jobs)
        if n == 0:
            self.credit = min(self.burst, self.credit + self.quota * dt)
            return
        rate = self.rate
        for job in self.jobs.values():
            job.remaining -= rate * dt
        if self.credit > _EPS_S:
            self.credit = min(self.burst, max(0.0, self.credit + (self.quota - n) * dt))

    def _reschedule(self) -> None:
        self._version += 1
        if not self.jobs:
            return
        n, rate = len(self.jobs), self.rate
        least = min(job.remaining for job in self.jobs.values())
        wait, emptied = max(least, 0.0) / rate, False
        if self.credit > _EPS_S and n > self.quota:
            until_empty = self.credit / (n - self.quota)
            if until_empty < wait:
                wait, emptied = until_empty, True
        timer = self.env.timeout(wait)
        version = self._version
        timer.callbacks.append(lambda _ev: self._on_timer(version, emptied))

    def _on_timer(self, version: int, emptied: bool) -> None:
        if version != self._version:
            return
        self._advance()
        if emptied:
            self.credit = 0.0
            self._reschedule()
            return
        least = min(job.remaining for job in self.jobs.values())
        finished = [j for j in self.jobs.values() if j.remaining - least <= _EPS_S + 1e-12 * j.work]
        for job in finished:
            job.remaining = 0.0
            del self.jobs[job.id]
        self._reschedule()
        for job in finished:
            job.done.succeed(job)


class PartyQuotas:
    """The kernel testbed's CPUs: a :class:`QuotaCores` per party, of f / s cores for client ``c`` (``s`` its
    slow-down) and f times ``server_speed`` for the server (:mod:`sim.testbed`). A party's slow-down is in
    its quota, so no sleep follows its computations; parties never wait for each other's cores (their
    quotas fit in the host's)."""

    def __init__(self, env: simpy.Environment, f: float, server_speed: float, slowdown: np.ndarray) -> None:
        self.env = env
        self.f = f
        self.server_speed = server_speed
        self.slowdown = slowdown
        self.pools: dict[int, QuotaCores] = {}

    def pool(self, party: int) -> QuotaCores:
        """``party``'s cgroup (a client's keeps its quota: a worker plays one client a round)."""
        pool = self.pools.get(party)
        if pool is None:
            if party == SERVER:
                cores = server_cores(self.f, self.server_speed)
            else:
                cores = client_cores(self.f, float(self.slowdown[party]))
            pool = self.pools[party] = QuotaCores(self.env, cores, burst_s(cores))
        return pool

    def start(self, work: float, party: int = SERVER) -> Job:
        """A job of ``work`` seconds of ``party``'s CPU on a reference core."""
        return self.pool(party).start(work)

    def cancel(self, job: Job) -> float:
        assert isinstance(job.pool, QuotaCores)
        return job.pool.cancel(job)

    def compute(self, work: float, slowdown: float = 1.0, party: int = SERVER) -> Generator[simpy.Event, Any, None]:
        """``party``'s compute charge: ``work`` as the round charges it (the server's already divided by its
        speed, which its quota holds instead; a client's slow-down is its quota's, so ``slowdown`` is not
        slept)."""
        yield from self.pool(party).run(work * self.server_speed if party == SERVER else work)
