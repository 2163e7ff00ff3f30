"""The testbed host's CPUs in virtual time: every party's compute is a job on K cores, in CPU cgroups.

The ``testbed`` scenario section models the real-socket deployment, where the server and one OS process
per sampled client run on one host with K cores (``docs/time-model.md``, "The testbed model"). Each compute
charge is a job of ``work`` reference seconds (seconds on one core of the profiled reference machine). A job
is one thread, so it runs on at most one core. One :class:`QuotaScheduler` runs them all: each job is in a
:class:`Pool` (a CPU cgroup, with a quota or without), and when they may run at more than K cores in total
they share the cores max-min fairly (water-filling).

The process testbed (:class:`SharedHost`) puts every party in one pool without a quota. With n jobs each
then progresses at

    rate = min(1, K / n)    reference seconds of work per virtual second,

the egalitarian processor sharing of Kleinrock ("Time-shared systems: a theoretical treatment", JACM 1967)
with K servers, the fluid limit of a fair OS scheduler. A lone job of ``w`` takes exactly ``w`` seconds;
n equal jobs started together on one core all end after ``n w``. A client of slow-down f >= 1 is emulated
by its process sleeping (f - 1) times the CPU seconds of each computation after it, holding its own
processor: :meth:`SharedHost.compute`.

The kernel testbed (``testbed: {emulation: kernel}``) gives every party a CPU cgroup of its own instead:
:class:`PartyQuotas` charges each party's compute on a pool of its own, its quota f / s cores for a client
of slow-down s and f times its speed for the server (:mod:`sim.testbed`), refilled once per CFS period as
the kernel does (docs/time-model.md, "The kernel testbed").

Like :mod:`sim.engine.network`, the scheduler is event-driven: whenever a job starts, ends or is
cancelled, every job's remaining work is advanced at the old rate and one timer is set for the next event
(a version counter voids the older timers). Jobs are kept in start order, so a run is deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from sim.costs.model import CLIENT_ROLE, SERVER_ROLE
from sim.protocol.machine import SERVER
from sim.seeds import Stream, generator
from sim.testbed import client_cores, quota_us, server_cores

if TYPE_CHECKING:
    from sim.clients.population import Profile

_EPS_S = 1e-15
"""Remaining reference seconds below which a job counts as done (float round-off of rate * time)."""
_HELD_S = 1e-9
"""Seconds a pool's jobs must wait for a refill to count as throttled (a quota that runs out at the refill
itself, to round-off of the virtual clock, holds nothing back)."""


class Job:
    """One computation in the pool; ``done`` fires (with the job) when its last reference second is done."""

    __slots__ = ("done", "id", "pool", "remaining", "started", "work")

    def __init__(self, jid: int, work: float, done: simpy.Event, now: float, pool: Pool) -> None:
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


class Pool:
    """One party's CPU cgroup in a :class:`QuotaScheduler`, as CFS bandwidth control runs it: at every
    boundary of its period (``phase + k * period`` seconds) the kernel hands it ``runtime`` CPU seconds (its
    quota per period; ``quota`` = runtime / period cores) and carries none over. Its jobs run at up to a core
    each while any of that is left (``credit``), and not at all once it is spent, until the next boundary
    (docs/time-model.md, "The kernel testbed"). Each period its spent quota held jobs back costs ``restart``
    CPU seconds more when the refill lets them run again, shared by them: their threads come back to caches
    that others used meanwhile (``deploy.restart``, fitted by ``dropsim calibrate`` on the throttles the
    deployment counted; docs/time-model.md, "Where a deployed computation's time goes").

    A pool of ``runtime`` infinite has no quota (``limited`` false): its jobs run at up to a core each,
    bounded only by the host's cores, and it is never refilled nor throttled (the process testbed's
    processes; period, phase and restart then play no part)."""

    __slots__ = (
        "credit",
        "jobs",
        "limited",
        "next_boundary",
        "period",
        "phase",
        "quota",
        "restart",
        "runtime",
        "spent_at",
    )

    def __init__(
        self,
        runtime: float = math.inf,
        period: float = math.inf,
        phase: float = 0.0,
        now: float = 0.0,
        restart: float = 0.0,
    ) -> None:
        self.limited = runtime != math.inf
        """Whether it has a quota (else its jobs are held back by the host's cores alone)."""
        if self.limited and not all(math.isfinite(x) and x > 0 for x in (runtime, period)):
            raise ValueError(f"a quota of {runtime!r} s of CPU per period of {period!r} s")
        if not (math.isfinite(phase) and math.isfinite(now)):
            raise ValueError(f"a CFS period's phase {phase!r} s at {now!r} s")
        if not (math.isfinite(restart) and 0 <= restart < runtime):
            raise ValueError(
                f"a restart of {restart!r} s of CPU after a throttle, with a quota of {runtime!r} s per period: it "
                "must be >= 0 and less than the quota (a job would never end)"
            )
        self.runtime = runtime
        """CPU seconds per period (the cgroup's quota)."""
        self.period = period if self.limited else math.inf
        """Seconds between the kernel's refills."""
        self.quota = runtime / period if self.limited else math.inf
        """Cores: the quota's long-run rate."""
        self.phase = phase % self.period if self.limited else 0.0
        """Seconds from time 0 to the first refill (the period timer's phase)."""
        self.credit = runtime
        """CPU seconds it may still run in this period (a cgroup idle for a period holds all of its quota)."""
        self.restart = restart
        """Reference seconds its throttled jobs take more, together, when a refill lets them run again."""
        self.spent_at: float | None = None
        """When this period's quota ran out with jobs waiting (seconds), or None: held back since then."""
        self.jobs: dict[int, Job] = {}
        self.next_boundary = self.boundary_after(now) if self.limited else math.inf

    def boundary_after(self, t: float) -> float:
        """The first refill strictly after ``t`` (seconds)."""
        k = math.floor((t - self.phase) / self.period) + 1
        boundary = self.phase + k * self.period
        while boundary <= t:  # round-off at a boundary itself
            k += 1
            boundary = self.phase + k * self.period
        return boundary

    def cap(self) -> float:
        """The most a job of this pool may run at now (reference seconds per second): a core while its
        period's quota lasts, else 0 (throttled until the next refill)."""
        return 1.0 if self.credit > _EPS_S else 0.0


class QuotaScheduler:
    """A testbed's CPUs in virtual time: parties' CPU cgroups (:class:`Pool`) on a host of ``cores`` cores.

    CFS hands a group its quota afresh at every boundary of its period and carries none over. A group may
    run at full speed until it has used that period's quota, and then not at all until the next boundary.
    The host's cores bound them all together: when the jobs may run at more than ``cores`` in total
    (parties bursting at once), they share the cores max-min fairly, none above what its pool allows
    (water-filling, the fluid limit of CFS's fair share among runnable groups).

    When no pool has a quota (the process testbed), every job may run at a core, so the water level is the
    same for all: each runs at min(1, cores / n), processor sharing. The scheduler then gives them that
    rate in one division, so that jobs level in work stay level to the last bit, and ends the jobs level
    (to round-off) with the least work left together, in start order.

    The scheduler is event-driven: whenever a job starts, ends or is cancelled, a pool's quota runs out,
    or a busy pool's period ends, every job's remaining work and every pool's credit are advanced at the
    old rates and one timer is set for the next such event (a version counter voids older timers)."""

    def __init__(self, env: simpy.Environment, cores: float = math.inf) -> None:
        if not cores > 0:
            raise ValueError(f"a host has cores > 0, not {cores!r}")
        self.env = env
        self.cores = cores
        self.pools: list[Pool] = []
        self._quotas = False
        """Whether any pool has a quota (else the jobs share the cores alike)."""
        self._rates: dict[int, float] = {}
        self._ids = itertools.count()
        self._last = env.now
        self._version = 0

    def pool(
        self, runtime: float = math.inf, period: float = math.inf, phase: float = 0.0, restart: float = 0.0
    ) -> Pool:
        """A cgroup handed ``runtime`` CPU seconds every ``period`` seconds, its periods starting at ``phase``
        seconds (modulo the period); idle until now, so it holds all of this period's quota. Every refill that
        ends a throttle of it adds ``restart`` reference seconds to its jobs, shared. Without ``runtime``, a
        group with no quota."""
        self._advance()
        pool = Pool(runtime, period, phase, float(self.env.now), restart)
        self.pools.append(pool)
        self._quotas = self._quotas or pool.limited
        return pool

    def start(self, pool: Pool, work: float) -> Job:
        """Put a job of ``work`` reference seconds in ``pool``; wait on its ``done`` event."""
        if not (math.isfinite(work) and work >= 0):
            raise ValueError(f"a job needs a finite work >= 0 reference seconds, not {work}")
        self._advance()
        job = Job(next(self._ids), float(work), self.env.event(), self.env.now, pool)
        if job.work <= _EPS_S:
            job.remaining = 0.0
            job.done.succeed(job)
            return job
        pool.jobs[job.id] = job
        if pool.credit <= _EPS_S and pool.spent_at is None:
            pool.spent_at = float(self.env.now)  # it waits for the refill
        self._reschedule()
        return job

    def cancel(self, job: Job) -> float:
        """Take ``job`` out of its pool; its ``done`` never fires. Returns the reference seconds it did (all
        of them if it had already ended)."""
        pool = job.pool
        if job.id in pool.jobs:
            self._advance()
            del pool.jobs[job.id]
            job.remaining = max(job.remaining, 0.0)
            self._reschedule()
        return job.worked

    def run(
        self, pool: Pool, work: float, charge: Callable[[float], None] | None = None
    ) -> Generator[simpy.Event, Any, None]:
        """Compute ``work`` reference seconds in ``pool`` (``yield from`` it in a SimPy process). ``charge`` is
        told the reference seconds done: all of them, or, if the process is interrupted, what was done by
        then (the job leaves the pool and the :class:`simpy.Interrupt` goes on to the caller)."""
        job = self.start(pool, work)
        if job.id in pool.jobs:
            try:
                yield job.done
            except simpy.Interrupt:
                self.cancel(job)
                if charge is not None:
                    charge(job.worked)
                raise
        if charge is not None:
            charge(job.work)

    # -- internals --------------------------------------------------------------------------------
    def _running(self) -> list[Job]:
        return [job for pool in self.pools for job in pool.jobs.values()]

    def _compute_rates(self) -> None:
        """Each running job's rate: its pool's cap, water-filled under the host's cores."""
        caps = {job.id: job.pool.cap() for job in self._running()}
        if sum(caps.values()) <= self.cores:
            self._rates = caps
            return
        if not self._quotas:  # every cap is a core: each job's share is the level, min(1, cores / n) = cores / n
            self._rates = dict.fromkeys(caps, self.cores / len(caps))
            return
        left, rates = self.cores, {}
        ordered = sorted(caps.items(), key=lambda item: (item[1], item[0]))
        for i, (jid, cap) in enumerate(ordered):
            share = left / (len(ordered) - i)
            rate = min(cap, share)
            rates[jid] = rate
            left -= rate
        self._rates = rates

    def _pool_rate(self, pool: Pool) -> float:
        return sum(self._rates.get(jid, 0.0) for jid in pool.jobs)

    def _advance(self) -> list[Pool]:
        """Advance every job and credit to now at the rates set last; the pools refilled now."""
        now = float(self.env.now)
        dt = now - self._last
        self._last = now
        refilled = []
        for pool in self.pools:
            if dt > 0 and pool.jobs:
                used = 0.0
                for job in pool.jobs.values():
                    rate = self._rates.get(job.id, 0.0)
                    job.remaining -= rate * dt
                    used += rate
                pool.credit = max(0.0, pool.credit - used * dt)
            refill = now >= pool.next_boundary - _EPS_S
            if not refill and pool.jobs and pool.credit <= _EPS_S and pool.spent_at is None:
                pool.spent_at = now  # spent before the period's end, with jobs waiting
            if refill:  # a busy pool's is an event, an idle pool's passes
                waiting = [job for job in pool.jobs.values() if job.remaining > _EPS_S + 1e-12 * job.work]
                held = pool.spent_at is not None and now - pool.spent_at > _HELD_S
                if held and waiting:  # its jobs run again from cold, sharing the cost
                    extra = pool.restart / len(waiting)
                    for job in waiting:
                        job.work += extra
                        job.remaining += extra
                pool.spent_at = None
                pool.credit = pool.runtime
                pool.next_boundary = pool.boundary_after(max(now, pool.next_boundary))
                refilled.append(pool)
        return refilled

    def _reschedule(self) -> None:
        self._version += 1
        self._compute_rates()
        now = float(self.env.now)
        wait: float = math.inf
        target: Job | Pool | None = None  # the next event: a job's end, or a busy pool's quota running out
        refill = False  # ... or its period's end
        for pool in self.pools:
            if not pool.jobs:
                continue
            for job in pool.jobs.values():
                rate = self._rates[job.id]
                if rate > 0 and max(job.remaining, 0.0) / rate < wait:
                    wait, target, refill = max(job.remaining, 0.0) / rate, job, False
            drain = self._pool_rate(pool)
            if pool.credit > _EPS_S and drain > 0 and pool.credit / drain < wait:
                wait, target, refill = pool.credit / drain, pool, False
            if pool.next_boundary - now < wait:
                wait, target, refill = max(0.0, pool.next_boundary - now), pool, True
        if target is None:
            return
        timer = self.env.timeout(wait)
        version = self._version
        timer.callbacks.append(lambda _ev: self._on_timer(version, target, refill))

    def _on_timer(self, version: int, target: Job | Pool, refill: bool) -> None:
        if version != self._version:
            return
        refilled = self._advance()  # a refill due now is done here
        if isinstance(target, Pool) and not refill and target not in refilled:
            target.credit = 0.0  # its quota ran out (to round-off), not at a refill
            if target.jobs and target.spent_at is None:
                target.spent_at = float(self.env.now)
        # the job the timer was set for ends, with any that are level with it (to round-off)
        if not self._quotas:  # one rate for all: the target has the least work left; the level end in start order
            running = self._running()
            least = min(job.remaining for job in running)
            finished = [job for job in running if job.remaining - least <= _EPS_S + 1e-12 * job.work]
        else:
            finished = [target] if isinstance(target, Job) else []
            for job in self._running():
                if job is not target and job.remaining <= _EPS_S + 1e-12 * job.work:
                    finished.append(job)
        for job in finished:
            job.remaining = 0.0
            del job.pool.jobs[job.id]
        self._reschedule()
        for job in finished:
            job.done.succeed(job)


class SharedHost:
    """The process testbed's CPUs: ``cores`` cores that every party's compute shares by processor sharing
    (a :class:`QuotaScheduler` with one pool, without a quota). A client's slow-down is a sleep after each
    of its computations, off the cores (:meth:`compute`)."""

    def __init__(self, env: simpy.Environment, cores: int) -> None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"a testbed host has a whole number >= 1 of cores, not {cores!r}")
        self.env = env
        self.cores = cores
        self.scheduler = QuotaScheduler(env, cores)
        self.pool = self.scheduler.pool()
        """Every party's jobs, in start order."""

    def start(self, work: float, party: int = SERVER) -> Job:
        """Put a job of ``work`` reference seconds on the cores (whoever's: ``party`` is for
        :class:`PartyQuotas`); wait on its ``done`` event."""
        return self.scheduler.start(self.pool, work)

    def cancel(self, job: Job) -> float:
        """Take ``job`` off the cores (its party stopped); its ``done`` never fires. Returns the reference
        seconds it had done (all of them if it had already ended)."""
        return self.scheduler.cancel(job)

    def compute(self, work: float, slowdown: float = 1.0, party: int = SERVER) -> Generator[simpy.Event, Any, None]:
        """A party's compute charge on the testbed: ``work`` reference seconds on the cores, then a sleep of
        ``(slowdown - 1) * work`` seconds (the slow device is busy; a testbed process cannot run faster than
        a core, so a slow-down below 1 sleeps 0). The caller holds its own processor throughout (``party``
        is for :class:`PartyQuotas`)."""
        yield from self.scheduler.run(self.pool, work)
        idle = (slowdown - 1.0) * work
        if idle > 0:
            yield self.env.timeout(idle)


class PartyQuotas:
    """The kernel testbed's CPUs: a CPU cgroup per party (:class:`Pool`) on the host's ``cores``, of f / s
    cores for client ``c`` (``s`` its slow-down) and f times ``server_speed`` for the server
    (:mod:`sim.testbed`). A party's slow-down is in its quota, so no sleep follows its computations; the
    quotas fit in the cores, so parties wait for each other only when they burst at once. Each period in
    which a party's spent quota held its computations back costs them ``restart`` reference seconds more,
    shared (by role, ``client`` and ``server``; :class:`Pool`)."""

    def __init__(
        self,
        env: simpy.Environment,
        f: float,
        server_speed: float,
        slowdown: Profile | np.ndarray,
        cores: float = math.inf,
        seed: int = 0,
        restart: Mapping[str, float] | None = None,
    ) -> None:
        self.env = env
        self.f = f
        self.server_speed = server_speed
        self.slowdown = slowdown
        self.seed = seed
        self.restart = dict(restart or {})
        self.scheduler = QuotaScheduler(env, cores)
        self.pools: dict[int, Pool] = {}

    def pool(self, party: int) -> Pool:
        """``party``'s cgroup (a client's keeps its quota: a worker plays one client a round). Its quota and
        period are the kernel's (:func:`sim.testbed.quota_us`); its period's phase is drawn once for the
        party from the scenario seed (:attr:`sim.seeds.Stream.CFS_PHASE`): a cgroup's period timer starts
        when its process first runs, at no particular moment of a round."""
        pool = self.pools.get(party)
        if pool is None:
            if party == SERVER:
                cores = server_cores(self.f, self.server_speed)
            else:
                cores = client_cores(self.f, float(self.slowdown[party]))
            runtime_us, period_us = quota_us(cores)
            period = period_us / 1e6
            phase = float(generator(self.seed, Stream.CFS_PHASE, party + 1).random()) * period
            restart = self.restart.get(SERVER_ROLE if party == SERVER else CLIENT_ROLE, 0.0)
            pool = self.pools[party] = self.scheduler.pool(runtime_us / 1e6, period, phase, restart)
        return pool

    def start(self, work: float, party: int = SERVER) -> Job:
        """A job of ``work`` seconds of ``party``'s CPU on a reference core."""
        return self.scheduler.start(self.pool(party), work)

    def cancel(self, job: Job) -> float:
        return self.scheduler.cancel(job)

    def compute(self, work: float, slowdown: float = 1.0, party: int = SERVER) -> Generator[simpy.Event, Any, None]:
        """``party``'s compute charge: ``work`` as the round charges it (the server's already divided by its
        speed, which its quota holds instead; a client's slow-down is its quota's, so ``slowdown`` is not
        slept)."""
        yield from self.scheduler.run(self.pool(party), work * self.server_speed if party == SERVER else work)
