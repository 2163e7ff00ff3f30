"""A simulation engine's testbed (``testbed: {emulation: engine}``): the profile's engine section, the actor
pool and polling clock in virtual time (exact timelines), the flower profile's engine, and the validation
against Flower (its comparison, against measurements given as a file)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import simpy

from sim.costs.engine import VECTOR_OPERATIONS, EngineCosts, EngineCostsError
from sim.costs.model import DEFAULT_PROFILE, PROFILES, CostModel, CostModelError
from sim.deploy.deployment import DeployError, check_deployable
from sim.engine.actors import ActorEngine
from sim.results.read import read_run_table
from sim.runner import run_scenario
from sim.scenario import load
from sim.scenario.errors import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
FLOWER_SCENARIO = ROOT / "scenarios" / "flower.yaml"

ENGINE = {
    "name": "test-engine",
    "description": "a test",
    "measured_by": "hand",
    "cpus_per_client": 1,
    "delivery_interval_s": 0.1,
    "pull_interval_s": 0.1,
    "inline_limit_bytes": 1000,
    "message": {"coef": {"const": 0.01, "bytes": 0.0, "stored": 0.0}},
}


def engine_costs(**changes: object) -> EngineCosts:
    return EngineCosts.from_dict({**ENGINE, **changes}, "test")


def free_profile(tmp_path: Path, **engine: object) -> Path:
    """The shipped profile with every operation free and a test engine: only the engine costs time."""
    doc = json.loads(DEFAULT_PROFILE.read_text())
    doc["operations"] = {op: {**entry, "coef": {}} for op, entry in doc["operations"].items()}
    doc["engine"] = {**ENGINE, **engine}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    return path


def simulate(tmp_path: Path, profile: Path, *overrides: str) -> pd.Series:
    sets = [f"costs.profile={profile}", "population=4", "sampling.clients_per_round=4", "dropout.rate=0", *overrides]
    run = tmp_path / "run"
    run_scenario(load(FLOWER_SCENARIO, sets, output=str(run)).base(), run, progress=False)
    return read_run_table(run, "rounds").iloc[0]


# -- the profile's section --------------------------------------------------------------------------------
def test_an_engine_section_reads_its_costs():
    e = engine_costs(message={"coef": {"const": 0.005, "bytes": 2e-9, "stored": 0.004}}, client_scale=1.5)
    assert (e.workers(2), e.workers(3), engine_costs(cpus_per_client=2).workers(2)) == (2, 3, 1)
    assert e.payload_seconds(500) == pytest.approx(1e-6)  # inline
    assert e.payload_seconds(2000) == pytest.approx(4e-6 + 0.004)  # through the object store
    assert e.message_seconds(2000) == pytest.approx(0.005 + 4e-6 + 0.004)
    assert e.client_scale == 1.5


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"pull_interval_s": -0.1}, "pull_interval_s"),
        ({"delivery_interval_s": "fast"}, "delivery_interval_s"),
        ({"cpus_per_client": 0}, "cpus_per_client"),
        ({"client_scale": 0}, "client_scale"),
        ({"message": {"coef": {"const": 0.01, "latency": 1}}}, "message"),
        ({"message": {"coef": {"const": -1}}}, "message.coef.const"),
        ({"name": 3}, "name"),
    ],
)
def test_a_bad_engine_section_is_refused_naming_the_key(change, names):
    with pytest.raises(EngineCostsError, match=names):
        engine_costs(**change)
    doc = {**json.loads(DEFAULT_PROFILE.read_text()), "engine": {**ENGINE, **change}}
    with pytest.raises(CostModelError, match=rf"cost profile x\.json: 'engine\.?{names.split('.')[0]}"):
        CostModel.from_dict(doc, "x.json")


def test_the_flower_profile_declares_flowers_engine_measured_apart_from_the_validation_grid():
    engine = CostModel.load("flower").engine
    assert engine is not None and engine.name == "flower-simulation"
    assert (engine.delivery_interval_s, engine.pull_interval_s, engine.inline_limit_bytes) == (0.1, 0.1, 102400)
    assert engine.message_const_s > 0 and engine.client_scale > 0
    doc = json.loads(PROFILES["flower"].read_text())["engine"]
    probed = {(r["clients"], r["dim"]) for r in doc["rounds"]}
    grid = {(n, d) for n in (10, 20, 50) for d in (100_000, 1_000_000)}
    assert probed and not probed & grid
    assert CostModel.load("dordis").engine is None and CostModel.load("dropsim").engine is None


def test_a_client_scale_scales_what_clients_pay_and_not_the_server():
    costs = CostModel.load("flower")
    scaled = costs.scaled(2.0, role="client")
    size = {"elements": 1e6}
    assert scaled.seconds("prg.expand", size, "client") == pytest.approx(2 * costs.seconds("prg.expand", size))
    assert scaled.seconds("prg.expand", size, "server") == pytest.approx(costs.seconds("prg.expand", size))
    assert scaled.engine is costs.engine and scaled.wire is costs.wire


def test_the_work_on_the_models_values_takes_its_own_scale_inside_the_engine():
    """With vector scales, each role's operations on the model's values take that role's vector scale and
    every other operation its plain scale, its own ``op@role`` entries included; without them, every
    operation takes the plain scale, to the same floats as before."""
    flower = json.loads(PROFILES["flower"].read_text())
    doc = {**flower, "engine": {**flower["engine"], "client_scale": 1.25, "server_scale": 0.75}}
    doc["engine"].update(client_vector_scale=2.0, server_vector_scale=3.0)
    doc["operations"] = {
        **flower["operations"],
        "prg.expand@client": {"coef": {"elements": 7e-9}},  # as a profile calibrated on deployed parties has
        "x25519.agree@server": {"coef": {"count": 5e-4}},
    }
    base = CostModel.from_dict(doc, "x.json")
    engine = base.inside_engine()
    values, agree = ({"elements": 1e6}, "prg.expand"), ({"count": 3}, "x25519.agree")
    for (size, op), client, server in ((values, 2.0, 3.0), (agree, 1.25, 0.75)):
        for role, scale in (("client", client), ("server", server)):
            alone = base.seconds(op, size, role)
            assert engine.seconds(op, size, role) == pytest.approx(scale * alone, rel=1e-12)
    assert base.seconds("prg.expand", values[0], "client") == pytest.approx(7e-3)  # its own entry, scaled above
    one_client_scale = {**doc["engine"], "client_vector_scale": 1.25}
    one = CostModel.from_dict({**doc, "engine": one_client_scale}, "y.json").engine
    assert one is not None and one.scales("client") == (1.25, 1.25) and one.scales("server") == (0.75, 3.0)
    no_vector_scales = {
        k: v for k, v in flower["engine"].items() if k not in ("client_vector_scale", "server_vector_scale")
    }
    single = CostModel.from_dict({**flower, "engine": no_vector_scales}, "single.json")
    assert single.engine is not None and single.engine.client_vector_scale is None
    old = single.scaled(single.engine.client_scale, role="client").scaled(single.engine.server_scale, role="server")
    new = single.inside_engine()
    for op in single.operations:
        for role in ("client", "server"):
            assert new.cost(op, role).coef == old.cost(op, role).coef  # the same floats: tables unchanged
    assert CostModel.load("dropsim").inside_engine().operations == CostModel.load("dropsim").operations


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"client_vector_scale": 0}, "client_vector_scale"),
        ({"vector_operations": "prg.expand"}, "vector_operations"),
        ({"vector_operations": ["prg.expand@client"]}, "vector_operations"),
    ],
)
def test_bad_vector_scales_are_refused_naming_the_key(change, names):
    with pytest.raises(EngineCostsError, match=names):
        engine_costs(**change)


def test_vector_operations_must_be_the_profiles_own():
    flower = json.loads(PROFILES["flower"].read_text())
    misspelt = {**flower, "engine": {**flower["engine"], "vector_operations": ["prg.expnad"]}}
    with pytest.raises(CostModelError, match=r"engine\.vector_operations.*'prg\.expnad'"):
        CostModel.from_dict(misspelt, "x.json")


def test_two_scales_are_told_apart_only_where_the_rounds_can():
    from sim.profiling.flower_rounds import _scales

    rest, on_values = [0.3, 0.28, 0.3], [0.03, 0.24, 1.7]
    measured = [1.2 * r + 2.0 * v for r, v in zip(rest, on_values, strict=True)]
    fitted = _scales(measured, on_values, rest)
    assert fitted[0] == pytest.approx(1.2, rel=1e-9) and fitted[1] == pytest.approx(2.0, rel=1e-9)
    # one round, or rounds with the same share of work on values: one scale, and exact where one fits
    assert _scales(measured[:1], on_values[:1], rest[:1]) == (pytest.approx(measured[0] / 0.33), None)
    alike = [0.3, 0.6, 0.9]
    assert _scales([1.5 * 1.1 * r for r in alike], [0.1 * r for r in alike], alike) == (pytest.approx(1.5), None)

    def single(measured: list[float], charged: list[float]) -> float:  # the least squares of (s c / m - 1)
        ratios = [c / m for c, m in zip(charged, measured, strict=True)]
        return sum(ratios) / sum(x * x for x in ratios)

    assert _scales(measured, [0.0] * 3, rest) == (pytest.approx(single(measured, rest)), None)
    # measured seconds that the rest alone explains best: one scale for all the work, the relative fit
    charged = [r + v for r, v in zip(rest, on_values, strict=True)]
    assert _scales(rest, on_values, rest) == (pytest.approx(single(rest, charged)), None)
    assert _scales([0.0, 1.0], [0.1, 0.2], [0.1, 0.1]) == (pytest.approx(1 / 0.5), None)  # a round measured nothing


def test_the_work_scales_are_fitted_on_what_the_simulator_charges(tmp_path):
    """Rounds measured as 1.1 times the charged rest and 2.4 times the charged work on values give those
    scales back, the charged seconds being the simulator's own for those rounds; the split between the
    two is the vector operations' (a profile with only those charges all of it to them)."""
    from sim.profiling.flower_rounds import fit_work_scales

    doc = json.loads(PROFILES["flower"].read_text())
    points = [(6, 2_000, 0.0), (6, 50_000, 0.0), (6, 200_000, 0.0)]
    rows = [
        {"clients": n, "dim": d, "dropout": p, "client_measured_s": 1.0, "server_measured_s": 1.0} for n, d, p in points
    ]
    charged = fit_work_scales(doc, rows)["scale_rounds"]
    for role in ("client", "server"):
        assert all(0 < r[f"{role}_values_charged_s"] < r[f"{role}_charged_s"] for r in charged)
    vector = set(doc["engine"]["vector_operations"])
    only = {op: e if op.split("@")[0] in vector else {**e, "coef": {}} for op, e in doc["operations"].items()}
    for row in fit_work_scales({**doc, "operations": only}, rows)["scale_rounds"]:
        for role in ("client", "server"):
            assert row[f"{role}_values_charged_s"] == pytest.approx(row[f"{role}_charged_s"], rel=1e-12)
    for row in charged:
        for role, rest, values in (("client", 1.1, 2.4), ("server", 0.9, 2.6)):
            on_values = row[f"{role}_values_charged_s"]
            row[f"{role}_measured_s"] = rest * (row[f"{role}_charged_s"] - on_values) + values * on_values
    fitted = fit_work_scales(doc, charged)
    assert fitted["client_scale"] == pytest.approx(1.1, rel=1e-6)
    assert fitted["client_vector_scale"] == pytest.approx(2.4, rel=1e-6)
    assert fitted["server_scale"] == pytest.approx(0.9, rel=1e-6)
    assert fitted["server_vector_scale"] == pytest.approx(2.6, rel=1e-6)
    assert fitted["vector_operations"] == sorted(VECTOR_OPERATIONS) == doc["engine"]["vector_operations"]
    CostModel.from_dict({**doc, "engine": {**doc["engine"], **fitted}}, "fitted.json")  # a profile that reads


def test_the_work_scales_take_each_points_median_over_its_rounds():
    """Three rounds of one point measured 2, 5 and 1 s of ClientApp time and 0.1, 0.2 and 0.6 s of the
    server's: the fit sees their medians, 2 s and 0.2 s (not their means, nor the last round's), each
    role's apart; the rounds of another point, mixed in, make a row of their own."""
    from sim.profiling.flower_rounds import work_scales

    def probed(app_s: float, server_s: float, dropout: float = 0.0) -> dict:
        messages = [{"app_s": app_s / 2}, {"app_s": app_s / 2}, {"app_s": math.nan}]  # an error reply: no time
        point = {"clients": 4, "dim": 1000, "dropout": dropout}
        return {**point, "server_s": server_s, "engine": {"messages": messages}}

    doc = json.loads(PROFILES["flower"].read_text())
    rounds = [probed(2.0, 0.1), probed(9.0, 0.9, 0.25), probed(5.0, 0.2), probed(1.0, 0.6)]
    rows = work_scales(doc, rounds)["scale_rounds"]
    assert [(r["dropout"], r["rounds"]) for r in rows] == [(0.0, 3), (0.25, 1)]
    assert (rows[0]["client_measured_s"], rows[0]["server_measured_s"]) == (pytest.approx(2.0), pytest.approx(0.2))
    assert (rows[1]["client_measured_s"], rows[1]["server_measured_s"]) == (pytest.approx(9.0), pytest.approx(0.9))


# -- the actor pool and the polls, in virtual time ------------------------------------------------------------
def test_the_server_polls_every_interval_from_its_last_send():
    env = simpy.Environment()
    engine = ActorEngine(env, engine_costs(), cores=2)
    assert engine.workers.capacity == 2
    env.run(until=1.0)
    engine.sent()
    assert engine.next_poll(1.0) == 1.0
    assert engine.next_poll(1.05) == pytest.approx(1.1)
    on_poll = 1.1 + 1e-12  # round-off of a job ending on a poll: that poll, never before the reply
    assert engine.next_poll(on_poll) == on_poll
    assert engine.next_poll(1.0 + 0.1 * 3) >= 1.0 + 0.1 * 3
    assert engine.next_poll(1.31) == pytest.approx(1.4)
    assert ActorEngine(env, engine_costs(pull_interval_s=0), 2).next_poll(1.234) == 1.234


def test_the_sweeps_run_every_interval_from_the_runs_start_and_one_at_a_send_has_passed():
    engine = ActorEngine(simpy.Environment(), engine_costs(), cores=2)
    assert engine.next_sweep(0.0) == pytest.approx(0.1)  # the first round's first send waits a whole interval
    assert engine.next_sweep(0.03) == pytest.approx(0.1)
    assert engine.next_sweep(0.1) == pytest.approx(0.2)
    assert engine.next_sweep(0.3 - 1e-15) == pytest.approx(0.4)  # round-off below a sweep is on it
    assert engine.next_sweep(0.3 + 1e-15) == pytest.approx(0.4)
    assert engine.next_sweep(1.234) == pytest.approx(1.3)
    assert ActorEngine(simpy.Environment(), engine_costs(delivery_interval_s=0), 2).next_sweep(1.234) == 1.234


def test_every_step_waits_for_the_sweep_the_workers_and_the_poll(tmp_path):
    """4 clients, 2 workers, 10 ms a message, nothing else charged: the server sends each step's messages
    on a poll, where a sweep has just passed, so they reach the actors a whole interval later; two clients
    at a time take 10 ms, and the server sees the replies at its second poll: every step lasts 0.2 s."""
    row = simulate(tmp_path, free_profile(tmp_path))
    steps = ("advertise_keys", "share_keys", "masked_input", "unmasking")
    assert [row[f"time_{s}"] for s in steps] == pytest.approx([0.2] * 4, abs=1e-9)
    assert row["round_time"] == pytest.approx(0.8, abs=1e-9)


def test_the_wait_for_the_sweep_is_the_interval_less_the_servers_time_since_its_poll(tmp_path):
    """The server's work between two steps brings the next sweep closer. With adding a masked vector
    charged 0.03 s at the server, the masked-input step ends 0.2 s (its replies at the second poll) plus
    4 x 0.03 s after its send, at 0.72 s; the unmasking requests sent then reach the actors at the sweep
    of 0.8 s, 0.08 s later, not 0.1 s, and their replies (two pairs of 10 ms) are stored at 0.82 s, on the
    server's first poll: the step lasts 0.1 s, not 0.2 s. Then the aggregation adds the four again."""
    path = free_profile(tmp_path)
    doc = json.loads(path.read_text())
    doc["operations"]["vector.add@server"] = {"coef": {"const": 0.03}}
    path.write_text(json.dumps(doc))
    row = simulate(tmp_path, path)
    steps = ("advertise_keys", "share_keys", "masked_input", "unmasking")
    assert [row[f"time_{s}"] for s in steps] == pytest.approx([0.2, 0.2, 0.2 + 4 * 0.03, 0.1], abs=1e-9)
    assert row["aggregate_s"] == pytest.approx(4 * 0.03, abs=1e-9)
    assert row["round_time"] == pytest.approx(0.82 + 4 * 0.03, abs=1e-9)


def test_a_reply_stored_on_a_poll_counts_at_that_poll_and_workers_are_free_for_the_next_round(tmp_path):
    """50 ms a message: the second pair of clients ends 0.2 s after the send (the sweep's 0.1 s and two
    messages), on a poll. Two rounds: the actors outlive the first,
    free again for the second."""
    run = tmp_path / "run"
    sets = [f"costs.profile={free_profile(tmp_path, message={'coef': {'const': 0.05}})}", "population=4"]
    sets += ["sampling.clients_per_round=4", "dropout.rate=0", "rounds=2"]
    run_scenario(load(FLOWER_SCENARIO, sets, output=str(run)).base(), run, progress=False)
    rounds = read_run_table(run, "rounds")
    assert list(rounds["round_time"]) == pytest.approx([0.8, 0.8], abs=1e-9)
    assert list(rounds["t_start"]) == pytest.approx([0.0, 0.8], abs=1e-9)


def test_clients_queue_for_the_workers(tmp_path):
    """60 ms a message: the second pair of clients waits for the first, its replies are stored at 0.22 s
    after the send, seen at the poll of 0.3 s."""
    row = simulate(tmp_path, free_profile(tmp_path, message={"coef": {"const": 0.06}}))
    assert row["time_advertise_keys"] == pytest.approx(0.3, abs=1e-9)
    assert row["round_time"] == pytest.approx(1.2, abs=1e-9)
    one_worker = simulate(tmp_path, free_profile(tmp_path, message={"coef": {"const": 0.06}}, cpus_per_client=2))
    assert one_worker["time_advertise_keys"] == pytest.approx(0.4, abs=1e-9)  # 0.1 + 4 x 0.06 = 0.34


def test_a_dropping_client_answers_with_an_error_at_the_next_poll(tmp_path):
    """One of 4 leaves before uploading: its worker still takes the request (10 ms), and the server hears
    of it at the poll that brings the others' masked inputs; the three survivors unmask in 0.2 s."""
    row = simulate(tmp_path, free_profile(tmp_path), "dropout.rate=0.25")
    assert (row["dropped"], row["survivors"]) == (1, 3)
    assert row["time_masked_input"] == pytest.approx(0.2, abs=1e-9)
    assert row["round_time"] == pytest.approx(0.8, abs=1e-9)


def test_the_flower_scenario_simulates_and_its_bytes_are_flowers(tmp_path):
    row = simulate(tmp_path, PROFILES["flower"], "model.params=100000")
    assert row["outcome"] == "ok"
    steps = [row[f"time_{s}"] for s in ("advertise_keys", "share_keys", "masked_input", "unmasking")]
    assert all(t >= 0.1 - 1e-9 for t in steps)  # each step lasts at least until the server's first poll
    # the masked input is 8 bytes a value in an .npy array, the model 4 (float32)
    assert row["client_bytes_up_mean"] > 8 * 100_000 > row["client_bytes_down_mean"] > 4 * 100_000


# -- what the engine emulation refuses --------------------------------------------------------------------
def test_a_profile_without_an_engine_is_refused_under_the_engine_emulation(tmp_path):
    with pytest.raises(CostModelError, match="declares no simulation engine"):
        simulate(tmp_path, DEFAULT_PROFILE)


def test_the_engine_emulation_is_neither_pipelined_nor_deployed():
    with pytest.raises(ScenarioError, match="testbed.emulation.*not pipelined"):
        load(FLOWER_SCENARIO, ["pipeline={chunks: 2}"]).base()
    scenario = load(FLOWER_SCENARIO, ["fidelity=full", "model={name: mlp}"]).base()
    with pytest.raises(DeployError, match="only the simulator models"):
        check_deployable(scenario)


# -- the validation against Flower ----------------------------------------------------------------------
def test_flower_validate_compares_stage_by_stage_with_measurements_from_a_file(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import flower_validate
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    simulated = flower_validate.simulate(10, 100_000, 0.1)
    measured = {"clients": 10, "dim": 100_000, "dropout": 0.1, "survivors": 9, "round_s": 1.0}
    measured |= {f"stage_s_{stage}": 0.25 for stage in flower_validate.STAGES}
    csv = tmp_path / "flower.csv"
    pd.DataFrame([measured]).to_csv(csv, index=False)
    out = tmp_path / "out.csv"
    args = ["--clients", "10", "--dims", "100000", "--dropout", "0.1", "--measured", str(csv), "--csv", str(out)]
    assert flower_validate.main(args) == 0
    row = pd.read_csv(out).iloc[0]
    assert row["sim_round_s"] == pytest.approx(simulated["sim_round_s"])
    assert row["error"] == pytest.approx(simulated["sim_round_s"] - 1.0)
    assert sum(row[f"sim_stage_s_{s}"] for s in flower_validate.STAGES) == pytest.approx(row["sim_round_s"])
    assert row["error_setup"] == pytest.approx(row["sim_stage_s_setup"] / 0.25 - 1)
    text = capsys.readouterr().out
    assert "median |error|" in text and "target: median <= 10%" in text
    with pytest.raises(SystemExit):  # a point the file does not have
        flower_validate.main(["--clients", "20", "--dims", "100000", "--dropout", "0", "--measured", str(csv)])
    assert math.isfinite(row["error_unmask"])


# -- measuring the engine ---------------------------------------------------------------------------------
def probed_round(seconds_of) -> dict:
    """A probed round (as :class:`sim.profiling.flower_rounds.EngineProbe` records it) whose workers spend
    ``seconds_of(bytes_in, bytes_out)`` on each message besides 1 ms in the ClientApp."""
    messages, t = [], 10.0
    sizes = [(61, 438), (3_880, 4_968), (405_110, 800_303), (78, 548), (4_006_350, 8_000_303), (45_110, 80_303)]
    for bytes_in, bytes_out in sizes * 3:
        spent = seconds_of(bytes_in, bytes_out) + 0.001
        messages.append(
            {
                "node": 1,
                "stage": "",
                "start": t,
                "end": t + spent,
                "bytes_in": bytes_in,
                "bytes_out": bytes_out,
                "context_bytes": 0,
                "app_s": 0.001,
            }
        )
        t += spent
    pushes = [(9.9, 9.95, 1)]
    return {
        "clients": 15,
        "dim": 1000,
        "dropout": 0.0,
        "round_s": t - 10,
        "stage_spans": {"all": [9.9, t]},
        "engine": {"messages": messages, "pushes": pushes, "pulls": []},
    }


def test_the_engine_fit_recovers_a_known_cost_per_message_byte_and_stored_object():
    from sim.profiling.flower_rounds import INLINE_LIMIT_BYTES, engine_costs

    def cost(bytes_in: int, bytes_out: int) -> float:
        stored = (bytes_in > INLINE_LIMIT_BYTES) + (bytes_out > INLINE_LIMIT_BYTES)
        return 0.005 + 2e-9 * (bytes_in + bytes_out) + 0.004 * stored

    section = engine_costs([probed_round(cost)], pull_interval_s=0.1)
    coef = section["message"]["coef"]
    assert (coef["const"], coef["bytes"], coef["stored"]) == pytest.approx((0.005, 2e-9, 0.004), rel=1e-6)
    assert section["message"]["r2"] == pytest.approx(1.0)
    assert section["delivery_wait_measured_s"]["mean"] == pytest.approx(0.05)
    EngineCosts.from_dict(section, "fitted")
    # a cost that falls with size is no cost of size: the fit drops the feature (an unconstrained fit of
    # these points gives a negative per-byte cost)
    falling = engine_costs([probed_round(lambda i, o: 0.01 - 1e-10 * (i + o))], pull_interval_s=0.1)
    assert falling["message"]["coef"]["bytes"] == 0.0 and falling["message"]["coef"]["const"] > 0


def test_the_model_can_travel_with_the_upload_request(tmp_path):
    """Only the model (400 kB) exceeds the inline limit and costs 50 ms through the object store: with the
    model sent first, the first step takes it (after the sweep's 0.1 s, two pairs of 60 ms jobs: seen at
    the poll of 0.3 s); sent with the upload request, as Flower's workflow does, the masked-input step does."""
    engine = {"message": {"coef": {"const": 0.01, "stored": 0.05}}, "inline_limit_bytes": 300_000}
    steps = ("advertise_keys", "share_keys", "masked_input", "unmasking")
    first = simulate(tmp_path, free_profile(tmp_path, **engine), "model.params=100000")
    assert [first[f"time_{s}"] for s in steps] == pytest.approx([0.3, 0.2, 0.2, 0.2], abs=1e-9)
    late = simulate(tmp_path, free_profile(tmp_path, **engine, model_with_upload=True), "model.params=100000")
    assert [late[f"time_{s}"] for s in steps] == pytest.approx([0.2, 0.2, 0.3, 0.2], abs=1e-9)
    assert late["client_bytes_down_mean"] == first["client_bytes_down_mean"]
    with pytest.raises(EngineCostsError, match="model_with_upload"):
        engine_costs(model_with_upload="yes")


def test_clients_that_upload_first_train_at_once_whatever_the_engine_says(tmp_path):
    """FedAvg's clients upload unasked: there is no upload request to carry the model, so it goes first
    and they train at once (their training charged, as without ``model_with_upload``)."""
    sets = ["aggregation={protocol: fedavg}", "dropout.rate=0", "model.train_seconds_per_sample=0.001"]
    times = []
    for late in (False, True):
        row = simulate(tmp_path, free_profile(tmp_path, model_with_upload=late), *sets)
        assert row["outcome"] == "ok" and row["train_s"] > 0
        times.append(row["round_time"])
    assert times[0] == times[1]


def test_an_engine_section_is_read_strictly():
    assert engine_costs().inline_limit_bytes == 1000
    unlimited = {k: v for k, v in ENGINE.items() if k != "inline_limit_bytes"}
    assert EngineCosts.from_dict(unlimited, "test").inline_limit_bytes == math.inf  # all inline
    with pytest.raises(EngineCostsError, match="'engine.client_scael' is not a key"):
        engine_costs(client_scael=3)
    with pytest.raises(EngineCostsError, match="'engine.message' needs"):
        engine_costs(message={"coef": {}})
    missing = {k: v for k, v in ENGINE.items() if k != "pull_interval_s"}
    with pytest.raises(EngineCostsError, match="'engine.pull_interval_s' is missing"):
        EngineCosts.from_dict(missing, "test")
