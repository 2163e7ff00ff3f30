"""The round engine as stories with exact virtual times, and the fidelity and determinism contracts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.learning.models import count_parameters
from sim.runner import Simulation, run_scenario
from sim.scenario import load

MLP_DIM = count_parameters("mlp", (1, 8, 8), 10)
DOWN_BYTES = 8 + 4 + 9 + 4 * MLP_DIM  # header + round (u32) + vector header (u8 dtype, u64 count) + float32s
UP_BYTES = 8 + 4 + 8 + 8 + 9 + 4 * MLP_DIM  # header + round + client (u64) + weight (f64) + vector
T_DOWN = DOWN_BYTES * 8 / 100e6  # each client link 100 Mbps, below its half of the 1000 Mbps server link
T_UP = UP_BYTES * 8 / 100e6


def profile(tmp_path: Path, accumulate: float = 0.0) -> Path:
    """A cost profile with round numbers: training 1 s flat, FedAvg finalisation 0.5 s."""
    path = tmp_path / "profile.json"
    ops = {
        "train.mlp.1x8x8.10": {"coef": {"const": 1.0}},
        "fedavg.accumulate": {"coef": {"const": accumulate}},
        "fedavg.finalize": {"coef": {"const": 0.5}},
        "wire.encode": {"coef": {}},
        "wire.decode": {"coef": {}},
    }
    path.write_text(json.dumps({"format": 1, "machine": {"note": "test"}, "operations": ops}))
    return path


def scenario(
    tmp_path: Path, extra: str = "", slowdown: str = "[1, 1]", fidelity: str = "timing", overrides=(), accumulate=0.0
):
    text = f"""
name: story
seed: 7
rounds: 2
population: 2
sampling: {{clients_per_round: 2}}
clients:
  compute: {{zipf_a: 1.0, slowdown: {slowdown}}}
  bandwidth_mbps: {{zipf_a: 0, range: [100, 100]}}
server: {{bandwidth_mbps: 1000, speed: 1.0}}
data: {{dataset: digits}}
model: {{name: mlp}}
fidelity: {fidelity}
costs: {{profile: {profile(tmp_path, accumulate)}}}
{extra}
"""
    path = tmp_path / "story.yaml"
    path.write_text(text)
    return load(path, list(overrides)).base()


def test_model_size_is_the_real_mlp():
    assert MLP_DIM == 64 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


def test_round_story_without_dropout(tmp_path):
    sim = Simulation(scenario(tmp_path))
    rec = sim.step().record
    end_train = T_DOWN + 1.0
    assert rec.t_start == 0
    assert rec.steps == [("upload", 0, pytest.approx(end_train + T_UP, rel=1e-12))]
    assert rec.t_end == pytest.approx(end_train + T_UP + 0.5, rel=1e-12)
    assert rec.outcome == "ok" and rec.survivors == 2
    for c in rec.clients:
        assert (c.download_start, c.download_end, c.train_end) == (0, pytest.approx(T_DOWN), pytest.approx(end_train))
        assert c.upload_s == pytest.approx(T_UP, rel=1e-12)
        assert (c.bytes_down, c.bytes_up, c.dropped_stage) == (DOWN_BYTES, UP_BYTES, "")
    assert rec.server_bytes_out == 2 * DOWN_BYTES and rec.server_bytes_in == 2 * UP_BYTES
    second = sim.step().record
    assert second.t_start == rec.t_end
    assert second.t_end - second.t_start == pytest.approx(rec.t_end, rel=1e-12)


def test_dropout_before_upload_is_noticed_at_once(tmp_path):
    sim = Simulation(scenario(tmp_path, "dropout: {rate: 0.5, stage: before_upload}"))
    rec = sim.step().record
    dropped = [c for c in rec.clients if c.dropped_stage]
    assert [c.dropped_stage for c in dropped] == ["before_upload"]
    assert dropped[0].bytes_up == 0 and dropped[0].train_end == pytest.approx(T_DOWN + 1.0)
    assert rec.survivors == 1 and rec.dropped_planned == 1
    assert rec.t_end == pytest.approx(T_DOWN + 1.0 + T_UP + 0.5, rel=1e-12)


def test_dropout_after_sampling_never_downloads(tmp_path):
    sim = Simulation(scenario(tmp_path, "dropout: {rate: 0.5, stage: after_sampling}"))
    rec = sim.step().record
    (gone,) = [c for c in rec.clients if c.dropped_stage]
    assert gone.dropped_stage == "after_sampling" and gone.bytes_down == 0
    assert rec.server_bytes_out == DOWN_BYTES
    assert rec.t_end == pytest.approx(T_DOWN + 1.0 + T_UP + 0.5, rel=1e-12)


def test_silent_dropout_is_noticed_at_the_timeout(tmp_path):
    sim = Simulation(scenario(tmp_path, "dropout: {rate: 0.5, silent: true}\ntimeouts: {upload: 5}"))
    rec = sim.step().record
    assert rec.steps == [("upload", 0, 5.0)]
    assert rec.t_end == 5.5 and rec.survivors == 1
    assert sorted(c.dropped_stage for c in rec.clients) == ["", "before_upload"]


def test_straggler_misses_the_timeout(tmp_path):
    # Zipf a = 1 over 2 clients: slow-downs 3 and 1, so training takes 3 s and 1 s.
    sim = Simulation(scenario(tmp_path, "timeouts: {upload: 2}", slowdown="[1, 3]"))
    rec = sim.step().record
    by_slowdown = {c.slowdown: c for c in rec.clients}
    assert set(by_slowdown) == {1.0, 3.0}
    assert by_slowdown[3.0].dropped_stage == "timeout:upload"
    assert by_slowdown[1.0].dropped_stage == ""
    assert rec.steps == [("upload", 0, 2.0)] and rec.t_end == 2.5 and rec.timed_out == 1
    # The straggler was stopped with the round: it never trained to the end, and the next round is clean.
    assert by_slowdown[3.0].bytes_up == 0
    nxt = sim.step().record
    assert nxt.t_start == 2.5 and nxt.outcome == "ok"


def test_every_client_gone_aborts_and_keeps_the_model(tmp_path):
    sim = Simulation(scenario(tmp_path, "dropout: {rate: 1.0}", fidelity="full"))
    before = sim.learner.model_sha256()
    result = sim.step()
    assert result.record.outcome == "aborted: no client uploaded an update"
    assert result.model_sha256 == before
    assert result.record.t_end == pytest.approx(T_DOWN + 1.0, rel=1e-12)


SMALL = """
name: small
seed: 5
rounds: 3
population: 30
sampling: {clients_per_round: 8}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: digits, partition: {dirichlet: 0.5}}
model: {name: cnn}
training: {local_epochs: 1, batch_size: 10}
timeouts: {upload: 0.02}
"""


def run_small(tmp_path: Path, name: str, *overrides: str) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    out = tmp_path / name
    run_scenario(load(path, list(overrides), output=str(out)).base(), out, progress=False)
    return out


TIME_COLUMNS = ["t_start", "t_end", "round_time", "sampled", "survivors", "dropped", "timed_out", "download_s"]


@pytest.mark.parametrize("testbed", [(), ("testbed.cores=2", "timeouts={upload: 0.06}")], ids=["per-party", "testbed"])
def test_full_and_timing_fidelity_give_identical_virtual_times(tmp_path, testbed):
    import pandas as pd

    full = run_small(tmp_path, "full", *testbed)
    timing = run_small(tmp_path, "timing", "fidelity=timing", *testbed)
    rf, rt = pd.read_csv(full / "rounds.csv"), pd.read_csv(timing / "rounds.csv")
    assert rf["timed_out"].sum() > 0, "the scenario should exercise the timeout"
    assert rf[TIME_COLUMNS + ["train_s", "upload_s", "aggregate_s"]].equals(
        rt[TIME_COLUMNS + ["train_s", "upload_s", "aggregate_s"]]
    )
    assert rf["accuracy"].notna().all() and rt["accuracy"].isna().all()
    for table in ("clients.csv", "stages.csv"):
        assert (full / table).read_bytes() == (timing / table).read_bytes()


def test_same_scenario_and_seed_give_byte_identical_tables(tmp_path):
    a = run_small(tmp_path, "a")
    b = run_small(tmp_path, "b")
    for table in ("rounds.csv", "clients.csv", "stages.csv"):
        assert (a / table).read_bytes() == (b / table).read_bytes()
    c = run_small(tmp_path, "c", "seed=6")
    assert (a / "rounds.csv").read_bytes() != (c / "rounds.csv").read_bytes()


def test_dropout_counts_per_round_in_the_results(tmp_path):
    import pandas as pd

    out = run_small(tmp_path, "counts", "timeouts={}", "fidelity=timing", "rounds=6")
    rounds = pd.read_csv(out / "rounds.csv")
    assert (rounds["dropped_planned"] == 2).all()  # floor(0.25 * 8 + 1/2) = 2
    assert (rounds["dropped"] == 2).all() and (rounds["survivors"] == 6).all()
    clients = pd.read_csv(out / "clients.csv", keep_default_na=False)
    assert (clients.groupby("round")["dropped_stage"].apply(lambda s: (s == "before_upload").sum()) == 2).all()


@pytest.mark.slow
def test_fedavg_learns_digits_in_the_quickstart(tmp_path):
    scenario = load(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml", output=str(tmp_path)).base()
    summary = run_scenario(scenario, tmp_path, progress=False)
    assert summary.rounds == 30
    # Ten classes: chance is 0.1. The quickstart reaches about 0.95 (seed 1).
    assert summary.final_accuracy > 0.8


def test_evaluation_every_k_rounds_and_after_the_last(tmp_path):
    import pandas as pd

    out = run_small(tmp_path, "every", "evaluation.every=2", "rounds=5", "timeouts={}")
    accuracy = pd.read_csv(out / "rounds.csv")["accuracy"]
    assert accuracy.notna().tolist() == [False, True, False, True, True]


def test_poisson_sampling_may_sample_nobody(tmp_path):
    sim = Simulation(scenario(tmp_path, overrides=["sampling={rate: 0.05}", "rounds=40"]))
    results = [sim.step().record for _ in range(40)]
    empty = [r for r in results if r.sampled == 0]
    assert empty, "with q = 0.05 and two clients most rounds sample nobody"
    assert all(r.outcome == "aborted: no client uploaded an update" and r.t_end == r.t_start for r in empty)
    assert any(r.sampled > 0 and r.outcome == "ok" for r in results)


def test_a_message_arriving_after_the_deadline_is_late_even_if_the_server_was_busy(tmp_path):
    # Three clients with slow-downs 1.5, 1.125 and 1 train for that many seconds; their updates arrive at
    # about 1.035, 1.160 and 1.535 s. The server spends 2 s on each update, so it is busy from 1.035 to
    # 5.035. The deadline is 1.5 s: the second update (arrived 1.160) counts, the third (1.535) is late.
    sim = Simulation(
        scenario(
            tmp_path,
            "timeouts: {upload: 1.5}",
            slowdown="[1, 1.5]",
            overrides=["population=3", "sampling.clients_per_round=3"],
            accumulate=2.0,
        )
    )
    rec = sim.step().record
    by_slowdown = {c.slowdown: c for c in rec.clients}
    assert by_slowdown[1.5].dropped_stage == "timeout:upload"
    assert by_slowdown[1.125].dropped_stage == "" and by_slowdown[1.0].dropped_stage == ""
    assert rec.survivors == 2
    arrival_2 = T_DOWN + 1.125 + T_UP
    assert rec.steps == [("upload", 0, pytest.approx(T_DOWN + 1.0 + T_UP + 4.0, rel=1e-12))]
    assert arrival_2 < 1.5
    assert rec.t_end == pytest.approx(T_DOWN + 1.0 + T_UP + 4.5, rel=1e-12)


def test_step_times_and_aggregation_add_up_to_the_round(tmp_path):
    import pandas as pd

    out = run_small(tmp_path, "sum", "aggregation.protocol=secagg", "rounds=2", "timeouts={}")
    rounds = pd.read_csv(out / "rounds.csv")
    steps = rounds.filter(like="time_").sum(axis=1)
    assert (abs(steps + rounds["aggregate_s"] - rounds["round_time"]) < 1e-9).all()


def test_server_latency_delays_every_message_by_its_one_way_time(tmp_path: Path) -> None:
    # FedAvg: every client's download arrives L later, so its upload starts and arrives L later again;
    # the round, which ends with the last upload's aggregation, is 2 L longer, exactly.
    from sim.runner import run_scenario
    from sim.scenario import load

    path = tmp_path / "lat.yaml"
    path.write_text(
        "name: lat\nseed: 2\nrounds: 2\npopulation: 20\nsampling: {clients_per_round: 5}\n"
        "data: {dataset: synthetic, samples_per_client: 10}\nmodel: {name: mlp}\nfidelity: timing\n"
    )
    times = {}
    for ms in (0, 40):
        out = tmp_path / f"lat{ms}"
        run_scenario(load(path, [f"server.latency_ms={ms}"], output=str(out)).base(), out, progress=False)
        times[ms] = pd.read_csv(out / "rounds.csv")["round_time"]
    assert (times[40] - times[0] - 0.080).abs().max() < 1e-12
