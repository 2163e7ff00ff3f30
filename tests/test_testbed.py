"""The testbed time model: K shared cores by processor sharing (sim.engine.host) and the rounds run on them.

The pool's stories are computed by hand with numbers exact in binary floating point, so their times are
asserted with ``==``; random job sets are checked against an exact (rational) processor-sharing
reference. Whole rounds are checked against the model without a testbed: with more cores than jobs a
compute charge of w reference seconds at slow-down f takes w on the cores plus (f - 1) w of sleep, the
f w of the per-party model.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs.model import DEFAULT_PROFILE, CostModel
from sim.deploy.validate import compare
from sim.engine.host import SharedHost
from sim.learning.trainer import local_batches
from sim.runner import Simulation, run_scenario
from sim.scenario import ScenarioError, load
from sim.scenario.types import Testbed as ScenarioTestbed
from sim.world import CALL_OP, TRANSPORT_OPS

Log = list[tuple[str, float]]

# ------------------------------------------------------------------------------------- the pool alone


def _job(
    env: simpy.Environment,
    host: SharedHost,
    log: Log,
    name: str,
    work: float,
    start: float = 0.0,
    worked: dict[str, float] | None = None,
) -> simpy.Process:
    """A process that starts a job of ``work`` at ``start`` and logs ``(name, time)`` when it ends (or
    ``(name + " cut", time)`` when interrupted; ``worked`` gets the reference seconds it did)."""

    def proc() -> Generator[simpy.Event, Any, None]:
        if start > 0:
            yield env.timeout(start)
        charged: list[float] = []
        try:
            yield from host.scheduler.run(host.pool, work, charged.append)
            log.append((name, env.now))
        except simpy.Interrupt:
            log.append((f"{name} cut", env.now))
        if worked is not None:
            worked[name] = charged[0]

    return env.process(proc())


def _interrupt(env: simpy.Environment, proc: simpy.Process, at: float) -> None:
    def cut() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        if proc.is_alive:
            proc.interrupt("cut")

    env.process(cut())


def test_two_equal_jobs_on_one_core_both_end_at_twice_their_work() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 1), []
    _job(env, host, log, "a", 1.0)
    _job(env, host, log, "b", 1.0)
    env.run()
    # each runs at rate min(1, 1/2) = 1/2: 1 s of work takes 2 s; they end together, in start order
    assert log == [("a", 2.0), ("b", 2.0)]
    assert not host.pool.jobs


def test_two_equal_jobs_on_two_cores_each_take_their_work() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 2), []
    _job(env, host, log, "a", 1.0)
    _job(env, host, log, "b", 1.0)
    env.run()
    assert log == [("a", 1.0), ("b", 1.0)]  # rate min(1, 2/2) = 1: one thread, one core


def test_jobs_started_at_different_times_share_by_hand() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 1), []
    _job(env, host, log, "a", 2.0)
    _job(env, host, log, "b", 1.0, start=1.0)
    _job(env, host, log, "c", 0.25, start=1.5)
    _job(env, host, log, "d", 0.25, start=1.5)
    env.run()
    # [0, 1): a alone at rate 1, does 1 (1 left).
    # [1, 1.5): a and b at 1/2, do 0.25 each (a 0.75, b 0.75 left).
    # [1.5, 2.5): four jobs at 1/4; c and d need 0.25 / (1/4) = 1 s: end at 2.5 (a, b 0.5 left).
    # [2.5, 3.5): a and b at 1/2 need 0.5 / (1/2) = 1 s: end at 3.5 = the total work on one core.
    assert log == [("c", 2.5), ("d", 2.5), ("a", 3.5), ("b", 3.5)]


def test_a_job_beyond_the_cores_slows_the_others_only_while_it_runs() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 2), []
    _job(env, host, log, "a", 2.0)
    _job(env, host, log, "b", 2.0)
    _job(env, host, log, "c", 0.5, start=1.0)
    env.run()
    # [0, 1): a, b at 1 (1 left each). [1, ...): three jobs on two cores at 2/3 each; c needs 0.5 / (2/3)
    # = 0.75 s: ends at 1.75, a and b have 1 - 0.5 = 0.5 left and end at 2.25 at rate 1.
    assert [name for name, _ in log] == ["c", "a", "b"]
    assert [t for _, t in log] == pytest.approx([1.75, 2.25, 2.25], rel=1e-15)


def test_equal_jobs_beyond_the_cores_stay_level_to_the_last_bit() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 2), []
    for name in "abc":
        _job(env, host, log, name, 1.0)
    env.run()
    # each at 2/3 (one division, the same float for all): 1 / (2/3) rounds to 1.5. Water-filling the cores
    # one job at a time would give them rates apart in the last bit, and an end at 1.4999999999999998 out
    # of start order.
    assert log == [("a", 1.5), ("b", 1.5), ("c", 1.5)]


def test_an_interrupted_job_leaves_the_pool_and_reports_its_work_done() -> None:
    env = simpy.Environment()
    host, log, worked = SharedHost(env, 1), [], {}
    _job(env, host, log, "a", 1.0, worked=worked)
    b = _job(env, host, log, "b", 1.0, worked=worked)
    _interrupt(env, b, 1.0)
    env.run()
    # [0, 1): both at 1/2; b is cut having done 0.5; a has 0.5 left at rate 1: ends at 1.5
    assert log == [("b cut", 1.0), ("a", 1.5)]
    assert worked == {"a": 1.0, "b": 0.5}
    assert not host.pool.jobs


def test_zero_work_ends_at_once_and_bad_work_or_cores_are_refused() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 1), []
    _job(env, host, log, "nothing", 0.0)
    env.run()
    assert log == [("nothing", 0.0)]
    with pytest.raises(ValueError, match="work"):
        host.start(-1.0)
    with pytest.raises(ValueError, match="work"):
        host.start(float("nan"))
    for cores in (0, 1.5, True):
        with pytest.raises(ValueError, match="cores"):
            SharedHost(env, cores)  # type: ignore[arg-type]


def test_the_slow_down_is_a_sleep_that_holds_no_core() -> None:
    env = simpy.Environment()
    host, log = SharedHost(env, 1), []

    def slow(name: str, work: float, slowdown: float) -> Generator[simpy.Event, Any, None]:
        yield from host.compute(work, slowdown)
        log.append((name, env.now))

    env.process(slow("slow", 1.0, 3.0))
    env.process(slow("fast", 1.0, 1.0))
    env.run()
    # both at 1/2 until 2; then "slow" sleeps (3 - 1) * 1 = 2 s, off the cores
    assert log == [("fast", 2.0), ("slow", 4.0)]


def _reference(cores: int, jobs: list[tuple[Fraction, Fraction, Fraction | None]]) -> list[tuple[Fraction, Fraction]]:
    """Exact processor sharing: per job ``(start, work, cut_at)``, its ``(end, work done)`` (end: when it
    finished or was cut)."""
    remaining = {i: work for i, (_, work, _) in enumerate(jobs)}
    out: dict[int, tuple[Fraction, Fraction]] = {}
    active: set[int] = set()
    now = Fraction(0)
    while len(out) < len(jobs):
        rate = min(Fraction(1), Fraction(cores, len(active))) if active else Fraction(1)
        starts = [jobs[i][0] for i in remaining if i not in active and i not in out]
        cuts = [jobs[i][2] for i in active if jobs[i][2] is not None]
        ends = [now + remaining[i] / rate for i in active]
        t = min([*starts, *(c for c in cuts if c is not None), *ends])
        for i in active:
            remaining[i] -= rate * (t - now)
        now = t
        for i in sorted(active):
            cut = jobs[i][2]
            if remaining[i] == 0 or (cut is not None and cut == now):
                out[i] = (now, jobs[i][1] - remaining[i])
                active.discard(i)
        for i, (start, work, _) in enumerate(jobs):
            if i not in active and i not in out and start == now:
                if work == 0:
                    out[i] = (now, Fraction(0))
                else:
                    active.add(i)
    return [out[i] for i in range(len(jobs))]


_eighths = st.integers(0, 24).map(lambda k: Fraction(k, 8))
_jobs = st.lists(
    st.tuples(_eighths, st.integers(1, 16).map(lambda k: Fraction(k, 8)), st.none() | st.integers(1, 24)),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(cores=st.integers(1, 4), spec=_jobs)
def test_random_job_sets_follow_processor_sharing(
    cores: int, spec: list[tuple[Fraction, Fraction, int | None]]
) -> None:
    jobs = [(start, work, None if cut is None else start + Fraction(cut, 8)) for start, work, cut in spec]
    env = simpy.Environment()
    host, log, worked = SharedHost(env, cores), [], {}
    for i, (start, work, cut_at) in enumerate(jobs):
        proc = _job(env, host, log, str(i), float(work), float(start), worked)
        if cut_at is not None:
            _interrupt(env, proc, float(cut_at))
    env.run()
    assert not host.pool.jobs
    ended = {name.removesuffix(" cut"): t for name, t in log}
    expected = _reference(cores, jobs)
    spans = []
    for i, (start, work, _) in enumerate(jobs):
        end, done = expected[i]
        assert ended[str(i)] == pytest.approx(float(end), abs=1e-9)
        assert worked[str(i)] == pytest.approx(float(done), abs=1e-9)
        assert 0 <= worked[str(i)] <= float(work)  # a cut job reports no more than its work
        assert ended[str(i)] - float(start) >= worked[str(i)] - 1e-9  # never faster than one core
        spans.append((float(start), ended[str(i)]))
    # Work-conserving: min(running jobs, K) cores were busy at every instant (never idle while a job
    # waits), and together they did exactly the work the jobs report.
    instants = sorted({t for span in spans for t in span})
    busy = 0.0
    for a, b in itertools.pairwise(instants):
        running = sum(1 for s, e in spans if s <= a and e >= b)
        busy += min(running, cores) * (b - a)
    assert busy == pytest.approx(sum(worked.values()), abs=1e-9)
    if cores >= len(jobs):
        for i, (start, work, cut_at) in enumerate(jobs):
            if cut_at is None or cut_at >= start + work:
                assert ended[str(i)] == pytest.approx(float(start + work), rel=1e-12)


# ------------------------------------------------------------------------------------------- rounds

ROUND = """
name: testbed
seed: 3
rounds: 2
population: 12
sampling: {clients_per_round: 6}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 4.0]}
dropout: {rate: 0.0}
data: {dataset: synthetic, samples_per_client: 20}
model: {name: mlp}
fidelity: timing
aggregation: {protocol: secagg, bits: 20}
"""


def _records(tmp_path: Path, *overrides: str, text: str = ROUND) -> list[Any]:
    path = tmp_path / "testbed.yaml"
    path.write_text(text)
    sim = Simulation(load(path, list(overrides)).base())
    records = []
    for _ in range(sim.scenario.rounds):
        records.append(sim.step().record)
        host = sim.setup.host
        if host is not None:
            assert isinstance(host, SharedHost) and not host.pool.jobs, "a finished round leaves no job on the cores"
    return records


def _free_transport(tmp_path: Path) -> str:
    """``costs.profile=...`` of the default profile without the testbed's socket and hand-over costs."""
    doc = json.loads(DEFAULT_PROFILE.read_text())
    for op in (*TRANSPORT_OPS, CALL_OP):
        doc["operations"][op] = {"coef": {}, "r2": 1.0, "points": 0}
    path = tmp_path / "free-transport.json"
    path.write_text(json.dumps(doc))
    return f"costs.profile={path}"


@pytest.mark.parametrize("pipeline", [(), ("pipeline.chunks=3",)], ids=["secagg", "pipelined"])
def test_enough_cores_give_the_times_of_a_processor_per_party(tmp_path: Path, pipeline: tuple[str, ...]) -> None:
    # without the testbed's own costs (sockets, hand-over to the compute thread), which only it has
    alone = _records(tmp_path, *pipeline, _free_transport(tmp_path))
    hosted = _records(tmp_path, *pipeline, "testbed.cores=1000", _free_transport(tmp_path))
    assert all(r.outcome == "ok" for r in alone + hosted)
    for a, h in zip(alone, hosted, strict=True):
        assert h.t_end - h.t_start == pytest.approx(a.t_end - a.t_start, rel=1e-9)
        assert h.server_compute_s == pytest.approx(a.server_compute_s, rel=1e-9)
        for ca, ch in zip(a.clients, h.clients, strict=True):
            assert ch.train_end == pytest.approx(ca.train_end, rel=1e-9)
            assert ch.compute_s == pytest.approx(ca.compute_s, rel=1e-9)


@pytest.mark.parametrize("pipeline", [(), ("pipeline.chunks=3",)], ids=["secagg", "pipelined"])
def test_the_sockets_cost_cpu_on_the_testbed(tmp_path: Path, pipeline: tuple[str, ...]) -> None:
    # each message's framing and copying at both ends is a job on the cores while it flows, and every
    # computation is handed to a compute thread: more time, bounded by what those costs add up to
    free = _records(tmp_path, *pipeline, "testbed.cores=1000", _free_transport(tmp_path))
    paid = _records(tmp_path, *pipeline, "testbed.cores=1000")
    costs = CostModel.load()
    for f, p in zip(free, paid, strict=True):
        assert p.outcome == f.outcome == "ok"
        moved = p.server_bytes_in + p.server_bytes_out
        messages = 4 * len(p.clients) * 20  # generous: every message of every step, both ways
        bound = sum(costs.seconds(op, {"bytes": moved}) for op in TRANSPORT_OPS)
        bound += messages * (costs.seconds(TRANSPORT_OPS[0], {"bytes": 0}) + costs.seconds(CALL_OP, {}))
        assert f.t_end - f.t_start < p.t_end - p.t_start < f.t_end - f.t_start + bound


@pytest.mark.parametrize("pipeline", [(), ("pipeline.chunks=3",)], ids=["secagg", "pipelined"])
def test_one_core_makes_the_round_longer(tmp_path: Path, pipeline: tuple[str, ...]) -> None:
    many = _records(tmp_path, *pipeline, "testbed.cores=1000")
    one = _records(tmp_path, *pipeline, "testbed.cores=1")
    for m, o in zip(many, one, strict=True):
        assert o.outcome == "ok"
        assert o.t_end - o.t_start > m.t_end - m.t_start
        # busy seconds include the contention: a client's training at least as long as alone (to round-off)
        for cm, co in zip(m.clients, o.clients, strict=True):
            assert co.train_end - co.train_start >= (cm.train_end - cm.train_start) * (1 - 1e-9)
        assert sum(c.train_end - c.train_start for c in o.clients) > sum(c.train_end - c.train_start for c in m.clients)


@pytest.mark.parametrize("pipeline", [(), ("pipeline.chunks=3",)], ids=["secagg", "pipelined"])
def test_cpu_scale_multiplies_every_profiled_cost_not_the_sockets(tmp_path: Path, pipeline: tuple[str, ...]) -> None:
    one = _records(tmp_path, *pipeline, "testbed.cores=2")
    two = _records(tmp_path, *pipeline, "testbed.cores=2", "testbed.cpu_scale=2")
    for a, b in zip(one, two, strict=True):
        assert a.outcome == b.outcome == "ok"
        assert a.server_cpu_s > 0 and b.server_cpu_s == pytest.approx(2 * a.server_cpu_s, rel=1e-12)
        for ca, cb in zip(a.clients, b.clients, strict=True):
            assert ca.cpu_s > 0 and cb.cpu_s == pytest.approx(2 * ca.cpu_s, rel=1e-12)
        assert b.t_end - b.t_start > a.t_end - a.t_start
    # the sockets' and hand-overs' costs are the testbed's own, measured on it: only the profile is scaled
    path = tmp_path / "testbed.yaml"
    scaled = Simulation(load(path, [*pipeline, "testbed.cores=2", "testbed.cpu_scale=2"]).base())
    plain = Simulation(load(path, [*pipeline, "testbed.cores=2"]).base())
    for op, cost in plain.costs.operations.items():
        factor = 1 if op in (*TRANSPORT_OPS, CALL_OP) else 2
        assert scaled.costs.operations[op].coef == {k: factor * c for k, c in cost.coef.items()}
    assert scaled.costs.interference_s == 2 * plain.costs.interference_s


def test_compare_measures_the_cpu_scale_from_the_cpu_seconds(tmp_path: Path) -> None:
    # a run at cpu_scale 3 "measured" against one simulated at 1.5: the host's scale is 1.5 * 2 = 3
    path = tmp_path / "testbed.yaml"
    path.write_text(ROUND)
    runs = {}
    for scale in (1.5, 3):
        runs[scale] = tmp_path / f"s{scale}"
        run_scenario(load(path, ["testbed.cores=2", f"testbed.cpu_scale={scale}"]).base(), runs[scale], progress=False)
    validation = compare(runs[1.5], runs[3])
    assert validation.cpu_scale == pytest.approx(3, rel=1e-12)
    cpu = validation.per_round[validation.per_round["stage"] == "cpu"]
    assert list(cpu["round"]) == [1, 2] and cpu["error"].to_list() == pytest.approx([-0.5, -0.5], rel=1e-12)
    skipped = compare(runs[1.5], runs[3], skip_first=True)
    assert set(skipped.per_round["round"]) == {2} and skipped.cpu_scale == pytest.approx(3, rel=1e-12)


def test_cpu_s_counts_the_reference_seconds_charged(tmp_path: Path) -> None:
    # training's cost plus every protocol computation's, without slow-down or the hand-over (call_s)
    records = _records(tmp_path, "testbed.cores=1000", _free_transport(tmp_path))
    alone = _records(tmp_path, _free_transport(tmp_path))
    for h, a in zip(records, alone, strict=True):
        for ch, ca in zip(h.clients, a.clients, strict=True):
            assert ch.cpu_s == pytest.approx(ca.cpu_s, rel=1e-12)
            # without a testbed, each computation takes its reference seconds times the slow-down
            assert ca.compute_s + (ca.train_end - ca.train_start) == pytest.approx(ca.slowdown * ca.cpu_s, rel=1e-9)


TWO = """
name: two
seed: 1
rounds: 1
population: 2
sampling: {clients_per_round: 2}
clients:
  compute: {zipf_a: 0, slowdown: [SLOW, SLOW]}
  bandwidth_mbps: {zipf_a: 0, range: [100, 100]}
data: {dataset: synthetic, samples_per_client: 20}
model: {name: mlp}
fidelity: timing
"""


@pytest.mark.parametrize(("slowdown", "factor"), [(1, 2), (2, 3)])
def test_two_clients_training_at_once_on_one_core(tmp_path: Path, slowdown: int, factor: int) -> None:
    """Two equal clients download together, then train together: on one core each training job of c
    reference seconds (its hand-over to the compute thread included) runs at 1/2 and takes 2 c, then the
    client sleeps (f - 1) c."""
    path = tmp_path / "two.yaml"
    path.write_text(TWO.replace("SLOW", str(slowdown)))
    sim = Simulation(load(path, ["testbed.cores=1"]).base())
    rec = sim.step().record
    s = sim.setup
    samples = rec.clients[0].samples
    cost = s.costs.seconds(
        s.train_op,
        {"samples": samples * s.local_epochs, "batches": local_batches(samples, s.batch_size, s.local_epochs)},
    )
    assert cost > 0 and rec.outcome == "ok"
    cost += s.call_s  # handed to the client's compute thread, as every computation on the testbed
    for c in rec.clients:
        assert c.samples == samples
        assert c.train_start == rec.clients[0].train_start
        assert c.train_end - c.train_start == pytest.approx(factor * cost, rel=1e-12)


# ------------------------------------------------------------------------------------------- schema

BASE = """\
name: t
rounds: 1
population: 4
fidelity: timing
"""


def _problems(tmp_path: Path, section: str) -> list[str]:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + section)
    with pytest.raises(ScenarioError) as info:
        load(path).points()
    return [str(p) for p in info.value.problems]


def test_testbed_reads_cores_and_is_resolved_only_when_given(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "testbed: {cores: 4}\n")
    scenario = load(path).base()
    assert scenario.testbed == ScenarioTestbed(4)
    assert scenario.resolved["testbed"] == {"cores": 4, "cpu_scale": 1.0}
    path.write_text(BASE + "testbed: {cores: 2, cpu_scale: 2.5}\n")
    assert load(path).base().testbed == ScenarioTestbed(2, 2.5)
    for absent in ("", "testbed: null\n", "testbed:\n"):
        path.write_text(BASE + absent)
        scenario = load(path).base()
        assert scenario.testbed is None and "testbed" not in scenario.resolved


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ("testbed: {cores: 0}", "testbed.cores: is 0, out of range; allowed: a whole number >= 1"),
        ("testbed: {cores: 1.5}", "testbed.cores: is 1.5; a whole number >= 1 is expected"),
        ("testbed: {cores: true}", "testbed.cores: is True; a whole number >= 1 is expected"),
        ("testbed: {core: 2}", "testbed.core: is not a known key; did you mean 'testbed.cores'?"),
        ("testbed: {}", "testbed.cores: is required in a testbed section"),
        ("testbed: {cores: 2, cpu_scale: 0}", "testbed.cpu_scale: is 0, out of range; allowed: a number > 0"),
        ("testbed: {cores: 2, cpu_scale: fast}", "testbed.cpu_scale: is 'fast'; a number > 0 is expected"),
        ("testbed: 4", "testbed: is 4; a mapping of keys to values is expected here"),
        ("testbd: {cores: 2}", "testbd: is not a known key; did you mean 'testbed'?"),
    ],
)
def test_testbed_errors_name_the_key_and_what_is_allowed(tmp_path: Path, section: str, says: str) -> None:
    found = _problems(tmp_path, section + "\n")
    assert any(says in message for message in found), found


def test_testbed_record_refuses_bad_cores() -> None:
    for cores in (0, 2.5, True):
        with pytest.raises(ValueError, match="testbed cores"):
            ScenarioTestbed(cores)  # type: ignore[arg-type]
