"""The benchmark scripts run and measure what they say (no timing assertions: times are not tested)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ahead  # noqa: E402
import cores  # noqa: E402
import fidelity  # noqa: E402
import host_speed  # noqa: E402
import overhead  # noqa: E402
import scale  # noqa: E402
import skellam  # noqa: E402
import training  # noqa: E402
import validate  # noqa: E402

from sim.crypto import agreement  # noqa: E402


@pytest.mark.slow
def test_overhead_replays_every_primitive_of_a_private_secagg_round() -> None:
    original = agreement.generate
    row = overhead.measure(
        ROOT / "scenarios" / "privacy.yaml",
        ["population=12", "sampling.clients_per_round=4", "dropout.rate=0.25"],
        rounds=1,
        label="tiny",
        repeats=1,
    )
    assert agreement.generate is original  # the recording is taken off again
    assert (row["protocol"], row["privacy"], row["clients"], row["rounds"]) == ("secagg", "xnoise", 4, 1)
    # the round's work, as recorded: key agreement, masks, Shamir, noise, encoding, frames and training
    for name in (
        "x25519.keygen",
        "x25519.agree",
        "aead.seal",
        "shamir.share",
        "prg.expand",
        "noise",
        "encode.dskellam",
        "decode.dskellam",
        "vector.add",
        "wire.encode",
        "wire.decode",
        "training",
    ):
        assert float(row[f"{name}_s"]) > 0, name
    names = {name for _, _, name in overhead.PRIMITIVES}
    assert float(row["primitives_s"]) == pytest.approx(sum(float(row[f"{n}_s"]) for n in names if f"{n}_s" in row))
    assert int(row["calls"]) > 0


def test_a_peer_round_times_its_own_mask_expansions_alone() -> None:
    import secagg

    from sim.costs.model import CostModel
    from sim.loopback import ClientSteps

    row = secagg.one_round("secagg+", 8, 1000, 0.0, CostModel.load())
    # 8 clients, each with 2 ceil(log2 8) = 6 neighbours: 6 pair masks and a self mask each; the server
    # expands the 8 survivors' self masks to remove them
    assert row["masks"] == 8 * 7 + 8
    assert 0 < float(row["masks_s"]) < float(row["round_s"])
    same = ("masks", "client_mb_up", "client_mb_down", "server_mb_in", "model_client_s_mean", "model_server_s")
    with ClientSteps(3) as steps:  # threads of its own, or kept from round to round
        for workers in (3, steps):
            threaded = secagg.one_round("secagg+", 8, 1000, 0.0, CostModel.load(), workers=workers)
            assert threaded["workers"] == 3
            assert 0 < float(threaded["masks_s"]) < float(threaded["round_s"])
            assert {k: threaded[k] for k in same} == {k: row[k] for k in same}  # the same work and bytes


def test_ahead_times_both_ways_and_finds_the_rounds_identical() -> None:
    row = ahead.point(4, 100_000, threads=2, rounds=1, repeats=1)
    assert (row["clients"], row["dim"], row["threads"], row["rounds"]) == (4, 100_000, 2, 1)
    assert float(row["round_s"]) > 0 and float(row["threads_round_s"]) > 0
    assert row["speedup"] == pytest.approx(float(row["round_s"]) / float(row["threads_round_s"]))
    assert row["identical"] is True
    with pytest.raises(ValueError, match="dimension 5 is not one of"):
        ahead.point(4, 5, threads=2, rounds=1)


def test_fidelity_times_both_and_finds_the_tables_identical() -> None:
    cheap = ("sampling.clients_per_round=4", "training.local_epochs=1", "model.name=linear")
    row = fidelity.point(ROOT / "scenarios" / "secagg.yaml", rounds=1, overrides=cheap)
    assert (row["scenario"], row["rounds"], row["tables_identical"]) == ("secagg", 1, True)
    assert row["ratio"] == pytest.approx(float(row["full_s"]) / float(row["learning_s"]))
    assert not fidelity.applicable(ROOT / "scenarios" / "scale.yaml")  # timing: nothing to learn


@pytest.mark.slow
def test_scale_counts_events_and_memory_in_a_fresh_process() -> None:
    result = scale.measure(population=5_000, sampled=20, rounds=1)
    assert (result["population"], result["sampled"], result["rounds"]) == (5_000, 20, 1)
    assert result["events_per_round"] > 20  # every client's messages are events
    assert result["virtual_s_per_round"] > 0
    assert result["peak_rss_mb"] > 0


@pytest.mark.slow
def test_scale_rows_end_with_the_huge_population_and_its_idle_bytes() -> None:
    table = scale.run(150_000, [20], rounds=1, huge=10**9, huge_sampled=20)
    assert table[["population", "sampled"]].values.tolist() == [[150_000, 20], [10**9, 20]]
    # one value for every row: the 10^9 row's peak against 100,000 clients', over the clients between them
    assert table["bytes_per_idle_client"].nunique() == 1
    assert abs(float(table["bytes_per_idle_client"].iloc[0])) < 0.1  # nothing held per client
    assert (table["process_s"] > table["wall_s"]).all()


@pytest.mark.slow
def test_cores_runs_each_job_serially_and_split_over_worker_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.dp import noise

    threads = noise.threads()
    table = cores.run([1, 2], ["python", "noise"], per_worker=1, repeats=1)
    assert noise.threads() == threads  # the jobs on threads leave the process's noise threads as they were
    assert table[["job", "workers", "jobs"]].values.tolist() == [
        ["python", 1, 1],
        ["python", 2, 2],
        ["noise", 1, 1],
        ["noise", 2, 2],
    ]
    assert (table["serial_s"] > 0).all() and (table["parallel_s"] > 0).all()
    assert table["speedup"].tolist() == (table["serial_s"] / table["parallel_s"]).tolist()
    assert table["efficiency"].tolist() == (table["speedup"] / table["workers"]).tolist()
    assert (table["threads_s"] > 0).all()
    assert table["threads_speedup"].tolist() == (table["serial_s"] / table["threads_s"]).tolist()
    with pytest.raises(ValueError, match="do not split evenly"):
        cores.measure("python", 2, 3, 1)
    monkeypatch.setattr(cores, "ROUND", (4, 1_000))  # the round job, small, in this process
    cores.JOBS["round"]()


def test_skellam_benchmark_times_ours_and_both_references() -> None:
    table = skellam.run([3.0, 1e6], [1_000], repeats=1)
    assert table[["variance", "values"]].values.tolist() == [[3.0, 1_000], [1e6, 1_000]]
    for column in ("ours_ns_per_value", "ours_ns_per_draw", "numpy_ns_per_draw", "torch_ns_per_draw"):
        assert (table[column] > 0).all(), column


def test_the_doc_blocks_are_rewritten_in_place(tmp_path: Path) -> None:
    import pandas as pd
    import performance

    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- performance:scale:begin -->\nold\n<!-- performance:scale:end -->\nafter\n")
    table = performance.markdown(pd.DataFrame({"sampled": [100], "rounds_per_s": [6.7278]}))
    assert table == "| sampled | rounds_per_s |\n| --- | --- |\n| 100 | 6.728 |"
    performance.rewrite_doc(doc, {"scale": table})
    block = f"<!-- performance:scale:begin -->\n{table}\n<!-- performance:scale:end -->"
    assert doc.read_text() == f"intro\n{block}\nafter\n"
    with pytest.raises(SystemExit, match="peer"):
        performance.rewrite_doc(doc, {"peer": table})


def test_host_speed_window_gaps_are_the_differences_of_consecutive_window_means() -> None:
    # two 1-second windows of means 1.0 and 3.0 ms, then one of 3.0 ms
    samples = pd.DataFrame({"core": 0, "t_s": [0.1, 0.6, 1.2, 1.7, 2.5], "cpu_s": [0.5e-3, 1.5e-3, 3e-3, 3e-3, 3e-3]})
    assert host_speed.window_gaps(samples, 1.0) == pytest.approx([1.0, 0.0])
    row = host_speed.summarise(samples).iloc[0]
    assert row["repetitions"] == 5
    assert row["median_ms"] == pytest.approx(3.0)
    assert row["gap_1s_median"] == pytest.approx(0.5)
    assert row["gap_1s_worst"] == pytest.approx(1.0)


def test_host_speed_samples_each_core_it_is_given() -> None:
    allowed = os.sched_getaffinity(0)
    rows = host_speed.sample_core(0, seconds=0.2, interval=0.01)
    assert os.sched_getaffinity(0) == allowed
    assert len(rows) >= 2
    assert all(core == 0 and cpu > 0 for core, _, cpu in rows)
    assert [t for _, t, _ in rows] == sorted(t for _, t, _ in rows)


def test_host_speed_multiplies_matrices_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every core sampled at once, BLAS helper threads would spin against each other's processes."""
    from threadpoolctl import threadpool_info

    seen: list[int] = []
    real = host_speed.work

    def counted(*args: object) -> None:
        seen.append(max((pool["num_threads"] for pool in threadpool_info()), default=1))
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(host_speed, "work", counted)
    before = [pool["num_threads"] for pool in threadpool_info()]
    host_speed.sample_core(0, seconds=0.05, interval=0.0)
    assert seen and set(seen) == {1}
    assert [pool["num_threads"] for pool in threadpool_info()] == before  # given back after


def test_deployed_calls_splits_each_computations_wall_time(tmp_path: Path) -> None:
    import deployed_calls

    from sim.deploy.compute import Call
    from sim.deploy.operations import OperationsLog, entries
    from sim.protocol.machine import Work

    run = tmp_path / "point" / "deployed"
    log = OperationsLog(run)
    decode = (Work("wire.decode", {"bytes": 100.0}),)
    server = [
        Call(0.001, decode, (0.0, 0.0, 0.0, 0.001, 0.001)),  # first: idle unknown
        Call(0.002, decode, (0.0015, 0.0015, 0.0016, 0.0036, 0.0036)),  # idle 0.6 ms, warm
        Call(0.001, decode, (0.0036, 0.0036, 0.0036, 0.0046, 0.0046)),  # idle 0, warm
    ]
    client = [
        Call(0.001, decode, (0.010, 0.011, 0.012, 0.014, 0.015)),  # queue 1, hand 1, stall 1, back 1 ms
        Call(0.003, decode, (0.040, 0.040, 0.040, 0.043, 0.043)),  # 26 ms idle: 2 ms over the warm median
    ]
    log.append(1, {"server": entries(server, 0.01, [], []), "2": entries(client, 0.01, [], [])})
    pd.DataFrame({"client": [2], "slowdown": [3.0]}).to_csv(run / "clients.csv", index=False)
    assert deployed_calls.runs([tmp_path]) == [run]
    calls = deployed_calls.computations(run)
    first = calls[calls["party"] == "2"].iloc[0]
    assert first["kind"] == "client s=3.00" and first["ops"] == "wire.decode"
    assert [first[p] * 1e3 for p in ("queue", "hand", "cpu", "stall", "back")] == pytest.approx([1, 1, 1, 1, 1])
    assert calls[calls["party"] == "2"]["idle"].iloc[1] == pytest.approx(0.026)  # since the first returned
    split = deployed_calls.split_table(calls).set_index("kind")
    assert split.loc["client s=3.00", "wall"] == pytest.approx(5.0 + 3.0)  # its two computations, ms
    idle = deployed_calls.idle_table(calls).set_index(["who", "idle_ms"])
    # the warm median of wire.decode: the server's computation right after another (1 ms; 0.6 ms idle is not warm)
    assert idle.loc[("clients", "[20.0, 50.0)"), "extra_median_ms"] == pytest.approx(2.0)
    assert idle.loc[("server", "[0.5, 1.0)"), "extra_median_ms"] == pytest.approx(1.0)
    # a kernel testbed's throttles, per party and round, beside the CPU over the profile's charge
    from sim.costs.model import CostModel
    from sim.deploy.operations import ThrottleLog

    ThrottleLog(run).append(1, {"server": (0, 0.0), "2": (3, 0.02)})
    per = deployed_calls.charged_rounds([run], CostModel.load()).set_index("party")
    assert per.loc["2", "throttled_periods"] == 3 and per.loc["server", "throttled_periods"] == 0
    assert per.loc["2", "cpu"] == pytest.approx(0.004 + 0.006)  # its computations and its loop (the process less them)


def test_deployed_calls_fits_the_cpu_a_throttle_costs() -> None:
    import deployed_calls

    periods = [0, 1, 4, 10, 2]
    per = pd.DataFrame({"throttled_periods": periods, "charged": 0.01, "cpu": [0.011 + 3e-4 * k for k in periods]})
    a, b, r, n = deployed_calls.throttle_fit(per)  # type: ignore[misc]
    assert (a, b, r, n) == pytest.approx((0.001, 3e-4, 1.0, 5))
    assert deployed_calls.throttle_fit(per.assign(throttled_periods=float("nan"))) is None


def test_repeatability_pairs_the_points_the_simulator_charges_alike() -> None:
    row = {"clients": 5, "params": 1e4, "xnoise": False, "stage": "before_upload", "chunks": 1}
    table = pd.DataFrame(
        [
            {**row, "protocol": "secagg", "simulated_s_profile": 1.00, "measured_s": 0.9},
            {**row, "protocol": "secagg+", "simulated_s_profile": 1.01, "measured_s": 1.1},
            # simulated 10% apart: not the same work, left out
            {**row, "clients": 20, "protocol": "secagg", "simulated_s_profile": 1.0, "measured_s": 1.0},
            {**row, "clients": 20, "protocol": "secagg+", "simulated_s_profile": 0.9, "measured_s": 2.0},
        ]
    )
    line = validate.repeatability(table)
    assert line.startswith("repeatability (1 pairs of points")
    assert "10000 parameters (n=1): median 20.0%, worst 20.0%" in line


def test_the_training_benchmark_times_the_loop_and_clients_together_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "training.csv"
    assert training.main(["--quick", "--repeats", "1", "--csv", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table["model"]) == ["linear", "cnn"]
    assert (table["together_at_once"] == table["clients"]).all()
    assert (table["loop_s"] > 0).all() and (table["together_s"] > 0).all()
    assert (table["max_rel_diff"] <= 1e-5).all()  # the same updates within the stated tolerance


def test_signed_error_is_the_mean_with_its_student_t_interval() -> None:
    from sim.deploy.validate import signed_error

    got = signed_error([0.1, -0.1, 0.05, 0.0, float("nan")])
    # mean 0.0125; sample standard deviation sqrt(0.021875 / 3); t(0.975, 3) = 3.182446305284263
    half = 3.182446305284263 * (0.021875 / 3) ** 0.5 / 2
    assert got["n"] == 4
    assert got["mean_error"] == pytest.approx(0.0125)
    assert got["ci_half_width"] == pytest.approx(half)
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((0.0125 - half, 0.0125 + half))
    assert got["median_abs_error"] == pytest.approx(0.075)
    assert got["worst_abs_error"] == pytest.approx(0.1)
    lone = signed_error([-0.2])
    assert lone["mean_error"] == pytest.approx(-0.2) and lone["ci_half_width"] != lone["ci_half_width"]  # NaN


def test_repeats_deploy_both_halves_of_a_few_points_interleaved_and_f1_fits_the_cores(tmp_path: Path) -> None:
    from sim.clients.population import Population
    from sim.scenario import load
    from sim.testbed import clients_per_round, run_dilation

    for regime in ("usual", "f1"):
        points = validate.repeated_points(validate.grid_for(regime))
        assert len(points) == 8 and len({p.name for p in points}) == 8
        halves = [validate.calibration_half(p) for p in points]
        assert halves.count(True) == halves.count(False) == 4
        assert {p.params for p in points} == {10_000, 100_000}
    f1 = validate.repeated_points(validate.grid_for("f1"))[0]
    assert f1.name == "n3_d10000_secagg_plain_before_upload_m1_s3-9"
    scenario = load(validate.SCENARIO, [*f1.overrides(1), "testbed.cores=2", "server.speed=1"]).base()
    slowdown = Population.build(scenario.population, scenario.clients, scenario.seed).slowdown
    assert run_dilation(scenario, slowdown.smallest(clients_per_round(scenario))) == 1.0
    assert [d.name for d in validate.deployments(tmp_path, f1, 3)] == ["deployed", "deployed-2", "deployed-3"]


def test_the_bias_tables_interval_is_over_the_points_their_repetitions_averaged() -> None:
    rows = [
        {"stage": "round", "error": e, "model": "calibrated", "point": p, "half": h}
        for p, h, errors in (
            ("a", "calibration", (-0.1, -0.3)),
            ("b", "validation", (0.1, 0.2, 0.3)),
            ("c", "validation", (0.5, 0.5, 0.5)),
        )
        for e in errors
    ]
    bias = validate.bias_table(pd.DataFrame(rows)).set_index("half")
    assert list(bias.index) == ["calibration", "validation", "all"]
    assert bias.loc["calibration", "mean_error"] == pytest.approx(-0.2)
    assert bias.loc["calibration", "n"] == 1 and pd.isna(bias.loc["calibration", "ci_half_width"])  # one point
    # the validation half: points b (mean 0.2) and c (0.5); t(0.975, 1) = 12.706204736174698
    assert bias.loc["validation", "mean_error"] == pytest.approx(0.35)
    assert bias.loc["validation", "ci_half_width"] == pytest.approx(12.706204736174698 * 0.15 * 2**0.5 / 2**0.5)
    # as if its 6 deployments were independent: much narrower
    deployments = validate.signed_error([0.1, 0.2, 0.3, 0.5, 0.5, 0.5])
    assert bias.loc["validation", "ci_low_deployments"] == pytest.approx(deployments["ci_low"])
    assert bias.loc["validation", "deployments"] == 6 and bias.loc["validation", "worst_abs_error"] == 0.5
    assert bias.loc["all", "n"] == 3 and bias.loc["all", "deployments"] == 8
    assert "+35.0% [" in validate.format_bias(bias.reset_index().iloc[1:2])
