"""Replaying an availability trace in the engine: the server samples among online clients, waits when none
is online, and a sampled client whose interval ends mid-round leaves at that exact moment, at whatever
step it is in; the same run in timing fidelity gives identical tables."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.clients.availability import Availability
from sim.runner import run_scenario
from sim.scenario import load
from sim.traces.model import Trace

BASE = """
name: replay
seed: 5
rounds: 3
population: 6
sampling: {clients_per_round: 6}
data: {dataset: digits}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 20}
aggregation: {protocol: secagg, bits: 20}
fidelity: timing
trace: {file: TRACE}
"""


def write_trace(folder: Path, rows: list[tuple[int, float, float]]) -> Path:
    path = folder / "avail.csv"
    lines = ["# dropsim availability trace v1", "client,start_s,end_s"]
    lines += [f"{c},{float(a)!r},{float(b)!r}" for c, a, b in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def scenario(tmp_path: Path, rows, *overrides: str):
    trace = write_trace(tmp_path, rows)
    file = tmp_path / "replay.yaml"
    file.write_text(BASE.replace("TRACE", str(trace)))
    return load(file, list(overrides), output=str(tmp_path / "out")).points()[0]


def run(sc, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    run_scenario(sc, out, progress=False)
    return pd.read_csv(out / "rounds.csv"), pd.read_csv(out / "clients.csv")


def small_trace() -> Trace:
    # client 0: [0, 10) and [20, 30); client 2: [5, 15); client 3: periodic [0, 4) every 10 s
    return Trace(
        clients=np.array([0, 2, 3]),
        offsets=np.array([0, 2, 3, 4]),
        starts=np.array([0.0, 20.0, 5.0, 0.0]),
        ends=np.array([10.0, 30.0, 15.0, 4.0]),
        periods=np.array([np.nan, np.nan, 10.0]),
    )


@pytest.mark.parametrize(
    ("t", "online"),
    [(0.0, [0, 3]), (4.0, [0]), (5.0, [0, 2]), (10.0, [2, 3]), (12.0, [2, 3]), (15.0, []), (20.0, [0, 3]), (30.0, [3])],
)
def test_online_sets_follow_the_intervals(t, online):
    assert list(Availability(small_trace(), 6).online(t)) == online


def test_offset_and_time_scale_map_virtual_to_trace_time():
    avail = Availability(small_trace(), 6, offset_s=5.0, time_scale=2.0)  # trace t = 5 + 2 v
    assert list(avail.online(0.0)) == [0, 2]  # trace 5
    assert list(avail.online(2.5)) == [2, 3]  # trace 10: client 3 repeats every 10 s
    assert avail.offline_at(2, 0.0) == 5.0  # trace 15 -> virtual (15 - 5) / 2
    assert avail.next_online(5.5) == 7.5  # trace 16: client 3's next period starts at trace 20 -> v 7.5


def test_offline_times_and_the_next_arrival():
    avail = Availability(small_trace(), 6)
    assert avail.offline_at(0, 3.0) == 10.0
    assert avail.offline_at(3, 21.0) == 24.0  # periodic: [20, 24)
    assert avail.offline_at(2, 1.0) == 1.0  # offline already
    assert avail.offline_at(5, 1.0) == 1.0  # not in the trace: never online
    assert avail.next_online(15.0) == 20.0
    assert math.isinf(Availability(small_trace(), 1).next_online(31.0))  # client 0 only, after its last


def test_the_server_samples_online_clients_and_a_client_leaves_when_its_interval_ends(tmp_path):
    # 1, 3 and 5 online throughout; 2 goes offline 0.01 s in (during the model download); 0 and 4 never online
    rows = [(1, 0.0, 1e6), (2, 0.0, 0.01), (3, 0.0, 1e6), (5, 0.0, 1e6)]
    rounds, clients = run(scenario(tmp_path, rows, "rounds=1"), tmp_path / "r")
    assert list(clients["client"]) == [1, 2, 3, 5]
    left = clients.set_index("client")
    assert left.loc[2, "dropped_stage"] == "offline:advertise_keys"
    assert left.loc[2, "left_at"] == 0.01  # exactly when its interval ends
    assert left[["dropped_stage"]].drop(index=2).isna().all().all()
    assert rounds.loc[0, "outcome"] == "ok" and rounds.loc[0, "survivors"] == 3


def test_a_client_going_offline_mid_protocol_is_a_dropout_at_that_step(tmp_path):
    # find when the masked-input step runs in an undisturbed round, then end client 2's interval inside it
    rows = [(c, 0.0, 1e6) for c in (1, 2, 3, 5)]
    rounds, _ = run(scenario(tmp_path, rows, "rounds=1"), tmp_path / "calm")
    stages = pd.read_csv(tmp_path / "calm" / "stages.csv").set_index("stage")
    start = stages.loc["step.masked_input", "t_start"]
    cut = start + 1e-6  # the ciphertexts are on their way to it: it cannot have sent its masked input
    rows[1] = (2, 0.0, cut)
    rounds, clients = run(scenario(tmp_path, rows, "rounds=1"), tmp_path / "cut")
    left = clients.set_index("client").loc[2]
    assert left["left_at"] == cut
    assert left["dropped_stage"] == "offline:masked_input"
    assert rounds.loc[0, "outcome"] == "ok" and rounds.loc[0, "survivors"] == 3


def test_sampling_from_the_population_drops_the_offline_clients_at_once(tmp_path):
    # as Dordis Figure 1: all 6 are sampled; 0 and 4 are never online, 2 leaves 0.01 s in
    rows = [(1, 0.0, 1e6), (2, 0.0, 0.01), (3, 0.0, 1e6), (5, 0.0, 1e6)]
    sc = scenario(tmp_path, rows, "rounds=1", "trace.sample_from=population", "aggregation.threshold=0.3")
    rounds, clients = run(sc, tmp_path / "p")
    left = clients.set_index("client")
    assert list(left.index) == [0, 1, 2, 3, 4, 5]
    assert left.loc[0, "dropped_stage"] == left.loc[4, "dropped_stage"] == "offline:advertise_keys"
    # offline when sampled: gone as the round starts (once the server has encoded the model), long before
    # the model could reach it
    assert left.loc[0, "left_at"] == left.loc[4, "left_at"] < 1e-3
    assert np.isnan(left.loc[0, "train_s"]) or left.loc[0, "train_s"] == 0
    assert left.loc[2, "left_at"] == 0.01
    assert rounds.loc[0, "sampled"] == 6 and rounds.loc[0, "survivors"] == 3
    assert rounds.loc[0, "online"] == 4  # online when the round started; it sampled from all 6


def test_sample_from_names_its_choices(tmp_path, capsys):
    from sim.cli import main

    trace = write_trace(tmp_path, [(0, 0.0, 10.0)])
    file = tmp_path / "s.yaml"
    file.write_text(BASE.replace("TRACE", str(trace)))
    assert main(["check", str(file), "--set", "trace.sample_from=everyone"]) == 2
    assert "trace.sample_from: is 'everyone'; allowed: online | population" in capsys.readouterr().err


def test_the_server_waits_for_clients_to_come_online(tmp_path):
    rows = [(c, 100.0, 1e6) for c in range(6)]
    rounds, _ = run(scenario(tmp_path, rows, "rounds=1"), tmp_path / "w")
    assert rounds.loc[0, "t_start"] == pytest.approx(100.0, abs=1e-6)
    assert rounds.loc[0, "sampled"] == 6


@pytest.mark.slow
def test_full_and_timing_fidelity_agree_under_replay(tmp_path):
    rows = [(1, 0.0, 1e6), (2, 0.0, 0.5), (3, 0.3, 1e6), (4, 0.0, 0.9), (5, 0.0, 1e6)]
    timing = scenario(tmp_path, rows, "rounds=3", "aggregation.protocol=fedavg")
    full = scenario(tmp_path, rows, "rounds=3", "aggregation.protocol=fedavg", "fidelity=full")
    run(timing, tmp_path / "t")
    run(full, tmp_path / "f")
    for table in ("clients.csv", "stages.csv"):
        assert (tmp_path / "t" / table).read_bytes() == (tmp_path / "f" / table).read_bytes()


def test_private_rounds_are_accounted_at_the_rate_among_online_clients(tmp_path):
    """4 of the 6 clients online, 3 sampled per round: each round is accounted at q = 3/4, not 3/6."""
    import json

    from sim.dp.accounting import Accountant
    from sim.round.privacy import padded

    rows = [(c, 0.0, 1e6) for c in (0, 1, 3, 5)]
    sc = scenario(
        tmp_path,
        rows,
        "rounds=3",
        "sampling={clients_per_round: 3}",
        "privacy={strategy: xnoise, epsilon: 8, tolerance: 0.5}",
    )
    rounds, _ = run(sc, tmp_path / "dp")
    assert (rounds["outcome"] == "ok").all()
    assert (rounds["online"] == 4).all()
    dim = json.loads((tmp_path / "dp" / "manifest.json").read_text())["model_parameters"]
    acc = Accountant("skellam", 1e-3, 1.0, padded(dim), 3 / 6, scale=1.0)
    for variance, scale in zip(rounds["accounted_variance"], rounds["dp_scale"], strict=True):
        acc.add_round(variance, clients=3, scale=scale, q=3 / 4)
    assert rounds["epsilon"].iloc[-1] == pytest.approx(acc.epsilon(), rel=1e-12)
    assert rounds["epsilon"].iloc[-1] > 8  # planned for 3 rounds at 3/6: sampling at 3/4 spends more


def test_the_replay_stops_at_until_hours(tmp_path):
    rows = [(c, 0.0, 1e6) for c in range(6)]
    sc = scenario(tmp_path, rows, "rounds=50", "trace.time_scale=3600", "trace.until_hours=2")
    rounds, _ = run(sc, tmp_path / "u")
    assert len(rounds) < 50
    assert rounds["t_end"].iloc[-1] >= 2.0 and rounds["t_end"].iloc[-2] < 2.0  # virtual s = trace hours


def test_device_capacity_from_the_trace(tmp_path):
    rows = [(c, 0.0, 1e6) for c in (1, 2, 3)]
    sc = scenario(tmp_path, rows, "rounds=1", "trace.capacity=true", "aggregation.protocol=fedavg")
    # the sidecar next to the trace file (traces/README.md): client 3's compute and client 2's bandwidth unknown
    (tmp_path / "avail.clients.csv").write_text(
        "client,compute_ms_per_sample,bandwidth_kbps\n1,40,50000\n2,100,\n3,,8000\n"
    )
    _, clients = run(sc, tmp_path / "cap")
    by = clients.set_index("client")
    assert by.loc[1, "slowdown"] == 1.0 and by.loc[2, "slowdown"] == 2.5  # relative to the fastest traced device
    assert by.loc[1, "bandwidth_mbps"] == 50.0 and by.loc[3, "bandwidth_mbps"] == 8.0
    zipf = run(scenario(tmp_path, rows, "rounds=1", "aggregation.protocol=fedavg"), tmp_path / "zipf")[1]
    assert zipf.set_index("client").loc[3, "slowdown"] == by.loc[3, "slowdown"]  # unknown: Zipf value kept


def test_sessions_cut_by_the_end_of_the_trace_are_no_offline_events():
    avail = Availability(small_trace(), 6)
    assert avail.horizon == 30.0
    assert math.isinf(avail.offline_at(0, 25.0))  # [20, 30) ends where the trace ends: cut, not ended
    assert avail.offline_at(3, 21.0) == 24.0  # a repeating client's sessions do end


def test_the_run_stops_when_nobody_will_be_online_again(tmp_path):
    rows = [(1, 0.0, 0.3), (2, 0.0, 0.3), (3, 0.0, 10.0)]  # the trace ends at 10 s
    sc = scenario(tmp_path, rows, "rounds=500", "sampling={clients_per_round: 2}", "aggregation.protocol=fedavg")
    rounds, clients = run(sc, tmp_path / "end")
    assert len(rounds) < 500 and rounds["t_start"].iloc[-1] >= 10.0  # stopped before its 500 rounds
    assert rounds["sampled"].iloc[-1] == 0 and (rounds["sampled"].iloc[:-1] > 0).all()  # one empty round, then stop
    manifest = (tmp_path / "end" / "manifest.json").read_text()
    assert "no client of the trace is online after trace hour" in manifest
    assert clients["in_aggregate"].dtype == bool


@pytest.mark.parametrize(
    ("rows", "override", "message"),
    [
        ([(9, 0.0, 10.0)], "rounds=1", "unknown client 9"),
        ([(1, 0.0, 10.0), (1, 5.0, 20.0)], "rounds=1", "avail.csv:4"),
        ([(1, 0.0, 3600.0)], "trace.offset_hours=2", "past the end of the trace"),
    ],
)
def test_check_reads_the_trace(tmp_path, rows, override, message, capsys):
    from sim.cli import main

    sc_file = tmp_path / "replay.yaml"
    sc_file.write_text(BASE.replace("TRACE", str(write_trace(tmp_path, rows))))
    assert main(["check", str(sc_file), "--set", override]) == 2
    assert message in capsys.readouterr().err


def test_trace_stats_refuses_a_population_smaller_than_the_trace(tmp_path, capsys):
    from sim.cli import main

    path = write_trace(tmp_path, [(1, 0.0, 10.0), (7, 0.0, 5.0)])
    assert main(["trace", "stats", str(path), "--population", "5"]) == 2
    assert "client ids up to 7" in capsys.readouterr().err


def test_a_run_spending_more_than_its_budget_says_so(tmp_path, capsys):
    from sim.cli import main

    rows = [(c, 0.0, 1e6) for c in (0, 1, 3, 5)]  # 4 of 6 online: sampled at 3/4, planned at 3/6
    trace = write_trace(tmp_path, rows)
    sc_file = tmp_path / "replay.yaml"
    sc_file.write_text(BASE.replace("TRACE", str(trace)))
    args = ["--set", "sampling={clients_per_round: 3}", "--set", "privacy={strategy: xnoise, epsilon: 8}"]
    assert main(["run", str(sc_file), *args, "--output", str(tmp_path / "o"), "--quiet"]) == 0
    assert "more than the budget 8" in capsys.readouterr().err
