"""The simulator's model of the kernel testbed (sim.engine.host.QuotaScheduler, PartyQuotas, sim.testbed): a
party's CPU cgroup as CFS bandwidth control runs it, its quota handed out afresh at every period.

Stories are computed by hand with numbers exact in binary floating point and asserted with ``==``; random
job sets are checked against what any quota-limited pool must do (no job faster than its work, none slower
than its work at the quota, plus one period).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import testbed
from sim.costs.model import CostModelError
from sim.engine.host import PartyQuotas, Pool, QuotaScheduler
from sim.protocol.machine import SERVER
from sim.runner import Simulation, run_scenario
from sim.scenario import ScenarioError, load
from sim.world import CALL_OP, build

ROOT = Path(__file__).resolve().parent.parent
Log = list[tuple[str, float]]


def _scheduled(
    env: simpy.Environment, scheduler: QuotaScheduler, pool: Pool, log: Log, name: str, work: float, start: float = 0.0
) -> None:
    def proc() -> Generator[simpy.Event, Any, None]:
        if start > 0:
            yield env.timeout(start)
        yield from scheduler.run(pool, work)
        log.append((name, env.now))

    env.process(proc())


def test_a_short_job_after_idle_runs_at_full_speed_within_the_periods_quota() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)  # 0.25 s of CPU every 0.5 s: half a core
    _scheduled(env, scheduler, pool, log, "a", 0.125)
    env.run()
    assert log == [("a", 0.125)]
    assert pool.credit == 0.25 - 0.125  # what is left of this period's quota


def test_a_long_job_runs_each_periods_quota_then_waits_for_the_next() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    _scheduled(env, scheduler, pool, log, "a", 1.0)  # runs 0-0.25, 0.5-0.75, 1-1.25 and 1.5-1.75: throttled in between
    env.run()
    assert log == [("a", 1.75)]
    assert pool.credit == 0.0


def test_two_jobs_spend_the_quota_together_then_wait_together() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.375, 0.75)
    _scheduled(env, scheduler, pool, log, "a", 0.5)
    # 0.1875 each by 0.1875, and by 0.9375; the last 0.125 each by 1.625
    _scheduled(env, scheduler, pool, log, "b", 0.5)
    env.run()
    assert log == [("a", 1.625), ("b", 1.625)]


def test_each_refill_that_ends_a_throttle_costs_the_restart() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5, restart=0.0625)
    # 0-0.25 (0.25 left), throttled; at 0.5 0.0625 more: 0.5-0.75 (0.0625 left), throttled; at 1.0 0.0625 more
    _scheduled(env, scheduler, pool, log, "a", 0.5)
    env.run()
    assert log == [("a", 1.125)]  # without the restart: 0.75


def test_a_refill_that_ends_no_throttle_costs_nothing() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    whole = scheduler.pool(0.5, 0.5, restart=0.125)  # a whole core: its quota runs out at each refill, no sooner
    _scheduled(env, scheduler, whole, log, "core", 1.5)
    env.run()
    assert log == [("core", 1.5)]
    # the same on 10 ms periods late in a run, where the virtual clock's round-off is larger than _EPS_S
    env, log = simpy.Environment(initial_time=1000.0), []
    scheduler = QuotaScheduler(env)
    server = scheduler.pool(0.01, 0.01, phase=0.003, restart=1e-4)
    _scheduled(env, scheduler, server, log, "server", 5.0)
    env.run()
    assert log == [("server", pytest.approx(1005.0, abs=1e-9))]  # 500 restarts would have added 0.05 s


def test_a_job_put_in_a_spent_pool_waits_and_pays_the_restart() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5, restart=0.0625)
    _scheduled(env, scheduler, pool, log, "a", 0.25)  # spends the quota as it ends, at 0.25: nothing held back

    def late() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(0.375)
        yield from scheduler.run(pool, 0.125)  # held back until 0.5, then 0.125 + 0.0625
        log.append(("b", env.now))

    env.process(late())
    env.run()
    assert log == [("a", 0.25), ("b", 0.6875)]


def test_jobs_throttled_together_share_the_restart() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.375, 0.75, restart=0.125)
    # 0.1875 each by 0.1875; at 0.75 0.0625 more each (0.375 left each), 0.1875 each by 0.9375; at 1.5 0.0625
    # more each (0.25), 0.1875 each by 1.6875; at 2.25 0.0625 more each (0.125): both end at 2.375
    _scheduled(env, scheduler, pool, log, "a", 0.5)
    _scheduled(env, scheduler, pool, log, "b", 0.5)
    env.run()
    assert log == [("a", 2.375), ("b", 2.375)]  # without the restart: 1.625
    with pytest.raises(ValueError, match="restart"):
        scheduler.pool(0.25, 0.5, restart=0.25)  # as long as the quota: a job would never end


def test_an_idle_pool_gets_its_quota_back_at_the_next_period_not_before() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    _scheduled(env, scheduler, pool, log, "a", 1.0)  # ends at 1.75, the quota of the period 1.5-2 spent
    _scheduled(env, scheduler, pool, log, "b", 0.5, start=1.875)  # throttled until 2, then runs 2-2.25 and 2.5-2.75
    env.run()
    assert log == [("a", 1.75), ("b", 2.75)]


def test_the_period_has_a_phase() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5, phase=0.375)  # refills at 0.375, 0.875, ...

    def job() -> Generator[simpy.Event, Any, None]:
        yield from scheduler.run(pool, 0.5)  # 0-0.25, throttled until 0.375, then 0.25 more
        log.append(("a", env.now))

    env.process(job())
    env.run()
    assert log == [("a", 0.625)]
    assert pool.boundary_after(0.625) == 0.875 and pool.boundary_after(0.875) == 1.375


def test_a_quota_above_one_core_runs_each_job_on_a_core_at_most() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.5, 0.25)  # two cores
    for name in "ab":
        _scheduled(env, scheduler, pool, log, name, 1.0)
    env.run()
    assert log == [("a", 1.0), ("b", 1.0)]  # two jobs on two cores' quota: never throttled
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.5, 0.25)
    for name in "abc":
        # 1/6 each per period, spent 1/6 s into it: the 6th ends at 1.25 + 1/6
        _scheduled(env, scheduler, pool, log, name, 1.0)
    env.run()
    assert [t for _, t in log] == [pytest.approx(1.25 + 1 / 6)] * 3


def test_parties_bursting_at_once_share_the_hosts_cores() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env, cores=1.0)
    pools = [scheduler.pool(0.25, 1.0) for _ in range(2)]  # 0.25 s of CPU every second each

    def job(name: str, pool: Pool) -> Generator[simpy.Event, Any, None]:
        yield from scheduler.run(pool, 1.0)
        log.append((name, env.now))

    for name, pool in zip("ab", pools, strict=True):
        env.process(job(name, pool))
    # both may run at a core, the host has one: half each, so each period's quota is spent after 0.5 s;
    # 0.25 each per period, the fourth period's by 3.5
    env.run()
    assert log == [("a", 3.5), ("b", 3.5)]


def test_what_is_left_of_a_periods_quota_is_lost_at_its_end() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    _scheduled(env, scheduler, pool, log, "a", 0.125)  # 0.125 of this period's 0.25 left when it ends
    # 0.125 by 0.5; a fresh 0.25 at 0.5 (not 0.375): ends 0.75
    _scheduled(env, scheduler, pool, log, "b", 0.375, start=0.375)
    env.run()
    assert log == [("a", 0.125), ("b", 0.75)]
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    _scheduled(env, scheduler, pool, log, "a", 0.125)
    # idle across refills: a whole 0.25 by 1.5, then the refill's
    _scheduled(env, scheduler, pool, log, "b", 0.375, start=1.25)
    env.run()
    assert log == [("a", 0.125), ("b", 1.625)]


def test_a_pool_made_while_another_is_busy_starts_with_its_whole_quota() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    busy = scheduler.pool(0.25, 0.5)

    def late() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(0.375)
        pool = scheduler.pool(0.25, 0.5, phase=0.25)  # its periods: 0.25, 0.75, ...; made at 0.375
        yield from scheduler.run(pool, 0.375)  # 0.25 by 0.625, throttled until 0.75, then 0.125 more
        log.append(("late", env.now))

    scheduler.start(busy, 1.0)
    env.process(late())
    env.run(until=2.0)
    assert log == [("late", 0.875)]


def test_a_throttled_job_cancelled_leaves_the_period_spent() -> None:
    env = simpy.Environment()
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    job = scheduler.start(pool, 1.0)
    env.run(until=0.375)  # ran 0-0.25, throttled since
    assert scheduler.cancel(job) == 0.25
    log: Log = []
    _scheduled(env, scheduler, pool, log, "again", 0.125, start=0.0)  # nothing left until the refill at 0.5
    env.run()
    assert log == [("again", 0.625)]


def test_parties_of_different_phases_share_the_hosts_core() -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env, cores=1.0)
    first, second = scheduler.pool(0.5, 1.0), scheduler.pool(0.5, 1.0, phase=0.25)

    def job(name: str, pool: Pool) -> Generator[simpy.Event, Any, None]:
        yield from scheduler.run(pool, 0.75)
        log.append((name, env.now))

    env.process(job("first", first))
    env.process(job("second", second))
    # both at half the core throughout. The first's periods start at 0, 1, ...: its 0.5 lasts until 1.0,
    # where it is refilled. The second's start at 0.25, 1.25, ...: refilled at 0.25 having run 0.125, its
    # 0.5 lasts until 1.25, where it is refilled. Neither is ever throttled: both end at 1.5
    env.run()
    assert log == [("first", 1.5), ("second", 1.5)]
    assert first.credit == 0.5 - 0.25 and second.credit == 0.5 - 0.125


def test_a_cancelled_job_reports_its_work_done() -> None:
    env = simpy.Environment()
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(0.25, 0.5)
    job = scheduler.start(pool, 1.0)
    env.run(until=1.0)  # 0-0.25 and 0.5-0.75
    assert scheduler.cancel(job) == 0.5
    assert not pool.jobs


def test_bad_quotas_and_work_are_refused() -> None:
    env = simpy.Environment()
    for runtime, period in ((0.0, 0.1), (0.1, 0.0), (float("nan"), 0.1), (0.1, float("inf"))):
        with pytest.raises(ValueError, match="quota"):
            QuotaScheduler(env).pool(runtime, period)
    with pytest.raises(ValueError, match="phase"):
        QuotaScheduler(env).pool(0.1, 0.2, phase=float("nan"))
    scheduler = QuotaScheduler(env)
    with pytest.raises(ValueError, match="work"):
        scheduler.start(scheduler.pool(0.05, 0.1), -1.0)


@settings(max_examples=60, deadline=None)
@given(
    quota=st.sampled_from([0.125, 0.25, 0.5, 1.0, 1.5]),
    phase=st.floats(0, 0.01),
    jobs=st.lists(st.tuples(st.floats(0, 2), st.floats(1e-3, 1)), min_size=1, max_size=6),
)
def test_no_job_is_faster_than_its_work_nor_slower_than_the_quota_allows(
    quota: float, phase: float, jobs: list[tuple[float, float]]
) -> None:
    env, log = simpy.Environment(), []
    scheduler = QuotaScheduler(env)
    pool = scheduler.pool(quota * 0.01, 0.01, phase)

    def job(name: str, start: float, work: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(start)
        yield from scheduler.run(pool, work)
        log.append((name, env.now))

    for i, (start, work) in enumerate(jobs):
        env.process(job(str(i), start, work))
    env.run()
    ends = dict(log)
    total = sum(work for _, work in jobs)
    last_start = max(start for start, _ in jobs)
    for i, (start, work) in enumerate(jobs):
        assert ends[str(i)] >= start + work - 1e-9
    # all the work done by the last end: at the quota's rate (or a core each) from the last start, but for
    # the rest of the period the last one started in
    assert max(ends.values()) <= last_start + total / min(quota, 1.0) + pool.period + 1e-9


# ------------------------------------------------------------------------------------- the arithmetic
def test_the_dilation_fits_every_quota_in_the_cores() -> None:
    assert testbed.dilation(2, 1.0, [1.0, 2.0]) == pytest.approx(2 / 2.5)  # server 1 + clients 1 + 1/2
    assert testbed.dilation(64, 1.0, [1.0, 2.0]) == 1.0  # room enough: nobody is slowed beyond its device
    slowdowns = [1.0, 1.5, 3.0]
    f = testbed.dilation(2, 4.0, slowdowns)
    assert testbed.server_cores(f, 4.0) + sum(testbed.client_cores(f, s) for s in slowdowns) == pytest.approx(2)
    with pytest.raises(ValueError):
        testbed.dilation(2, 1.0, [0.5])


def test_small_quotas_get_longer_periods_so_the_kernel_accepts_them() -> None:
    assert testbed.quota_us(0.5) == (5_000, 10_000)
    assert testbed.quota_us(0.05) == (1_000, 20_000)  # 1 ms per period at least
    assert testbed.quota_us(2.0) == (20_000, 10_000)
    quota, period = testbed.quota_us(0.047)
    assert quota >= testbed.MIN_QUOTA_US and quota / period == pytest.approx(0.047, rel=1e-3)


def test_a_runs_dilation_fits_its_fastest_possible_sample() -> None:
    scenario = load(ROOT / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel"]).base()
    world = build(scenario)
    fastest = np.sort(world.population.slowdown)[:5]
    assert world.dilation == testbed.dilation(2, 1.0, fastest)
    assert 0 < world.dilation < 1
    assert build(load(ROOT / "scenarios" / "deploy.yaml").base()).dilation == 1.0


def test_a_kernel_simulation_charges_the_profiles_restarts_by_role(tmp_path: Path) -> None:
    doc = json.loads(testbed.KERNEL_PROFILE.read_text())
    doc["operations"]["deploy.restart@client"] = {"coef": {"count": 2e-4}}
    doc["operations"]["deploy.restart@server"] = {"coef": {"count": 1e-4}}
    doc["operations"]["deploy.restart"] = {"coef": {"count": 1e-4}}
    profile = tmp_path / "restart.json"
    profile.write_text(json.dumps(doc))
    sets = ["testbed.emulation=kernel", "fidelity=timing", f"costs.profile={profile}"]
    sim = Simulation(load(ROOT / "scenarios" / "deploy.yaml", sets).base())
    host = sim.setup.host
    assert isinstance(host, PartyQuotas) and host.restart == {"client": 2e-4, "server": 1e-4}
    assert host.pool(0).restart == 2e-4 and host.pool(SERVER).restart == 1e-4
    # a round takes longer with them: its clients' quotas throttle their trainings, each period at a cost
    slow = [
        "model={params: 1000000, train_seconds_per_sample: 0.05}",
        "data={dataset: synthetic, samples_per_client: 20}",
    ]
    scenario = ROOT / "scenarios" / "deploy.yaml"
    kernel = ["testbed.emulation=kernel", "fidelity=timing"]
    plain_round = Simulation(load(scenario, [*kernel, *slow]).base()).step().record
    costly_round = Simulation(load(scenario, [*sets, *slow]).base()).step().record
    trained = [
        (c.train_end - c.train_start, p.train_end - p.train_start)
        for c, p in zip(costly_round.clients, plain_round.clients, strict=True)
        if p.train_end > p.train_start
    ]
    assert trained and all(costly > plain for costly, plain in trained)
    # the shipped kernel profile has none: nothing changes
    plain = Simulation(load(ROOT / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel", "fidelity=timing"]).base())
    assert isinstance(plain.setup.host, PartyQuotas) and plain.setup.host.restart == {}
    # a restart as long as a period's least quota would never let a job end: refused up front, naming the profile
    doc["operations"]["deploy.restart@client"] = {"coef": {"count": 1e-3}}
    profile.write_text(json.dumps(doc))
    with pytest.raises(CostModelError, match="restart.json.*deploy.restart at the client"):
        Simulation(load(ROOT / "scenarios" / "deploy.yaml", sets).base())


def test_party_quotas_give_each_party_its_share() -> None:
    env = simpy.Environment()
    quotas = PartyQuotas(env, f=0.5, server_speed=2.0, slowdown=np.array([1.0, 4.0]))
    assert quotas.pool(SERVER).quota == 1.0
    assert quotas.pool(0).quota == 0.5
    assert quotas.pool(1).quota == 0.125
    assert quotas.pool(1).runtime == 0.00125 and quotas.pool(1).period == 0.01
    assert quotas.pool(1).phase != quotas.pool(0).phase  # each party's period timer started on its own
    log: Log = []

    def server() -> Generator[simpy.Event, Any, None]:
        yield from quotas.compute(0.25, party=SERVER)  # 0.5 s of its work at speed 2, on a whole core
        log.append(("server", env.now))

    env.process(server())
    env.run()
    assert log == [("server", pytest.approx(0.5, abs=1e-12))]  # never throttled (summed over 50 periods)


def test_emulation_is_read_only_when_given_and_checked() -> None:
    plain = load(ROOT / "scenarios" / "deploy.yaml").base()
    assert plain.testbed is not None and plain.testbed.emulation == "process"
    assert "emulation" not in plain.resolved["testbed"]  # a testbed without it keeps its digest
    with pytest.raises(ScenarioError, match="emulation.*allowed: process | kernel"):
        load(ROOT / "scenarios" / "deploy.yaml", ["testbed.emulation=kernl"]).base()


def test_a_kernel_testbed_simulation_charges_compute_at_each_partys_quota(tmp_path: Path) -> None:
    sets = ["testbed.emulation=kernel", "testbed.cpu_scale=1", "rounds=2", "fidelity=timing"]
    sets += [
        "model={params: 1000000, train_seconds_per_sample: 0.05}",
        "data={dataset: synthetic, samples_per_client: 20}",
    ]
    scenario = load(ROOT / "scenarios" / "deploy.yaml", sets, output=str(tmp_path)).base()
    run_scenario(scenario, tmp_path, progress=False)
    world = build(scenario)
    call = world.costs.seconds(CALL_OP, {}, "client")
    clients = pd.read_csv(tmp_path / "clients.csv").dropna(subset=["train_s"])
    assert len(clients) >= 8
    for _, row in clients.iterrows():
        quota = world.dilation / row["slowdown"]
        work = row["samples"] * 0.05 + call  # its samples at 0.05 s, and the hand-over
        train = row["train_s"]
        # its work at the quota, give or take where in a CFS period it started and ended: a period's quota
        # run just before a refill and another just after gain up to 2 (1 - q) periods
        period = testbed.quota_us(quota)[1] / 1e6
        assert work / quota - 2 * period - 1e-9 <= train <= work / quota + period + 1e-9


def test_a_profile_may_charge_an_operation_by_role() -> None:
    from sim.costs.model import CostModel, LinearCost, role

    costs = CostModel(
        {"wire.decode": LinearCost({"bytes": 1.0}), "wire.decode@client": LinearCost({"bytes": 3.0})}, {}, "t"
    )
    assert costs.seconds("wire.decode", {"bytes": 2.0}) == 2.0
    assert costs.seconds("wire.decode", {"bytes": 2.0}, "client") == 6.0
    assert costs.seconds("wire.decode", {"bytes": 2.0}, "server") == 2.0  # no server entry: the op's own
    assert role(SERVER) == "server" and role(0) == "client"


def test_the_kernel_testbed_has_a_profile_of_its_own() -> None:
    plain = load(ROOT / "scenarios" / "deploy.yaml").base()
    assert testbed.cost_profile(plain) is None
    kernel = load(ROOT / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel"]).base()
    assert testbed.cost_profile(kernel) == testbed.KERNEL_PROFILE and testbed.KERNEL_PROFILE.is_file()
    chosen = load(ROOT / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel", "costs.profile=x.json"]).base()
    assert testbed.cost_profile(chosen) == "x.json"
    doc = json.loads(testbed.KERNEL_PROFILE.read_text())
    assert doc["calibration"]["runs"] and doc["calibration"]["host"]  # where it comes from
