"""Secure aggregation inside the engine: same models as plain, dropout at every protocol stage, aborts
that keep the model and let training go on, and timing fidelity with the same virtual times."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sim.runner import run_scenario
from sim.scenario import ScenarioError, load

SCENARIO = """
name: agg
seed: 3
rounds: 3
population: 30
sampling: {clients_per_round: 8}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: digits, partition: {dirichlet: 1.0}}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: secagg, bits: 20, clip: 2.0}
"""


def run(tmp_path: Path, name: str, *overrides: str) -> Path:
    path = tmp_path / "agg.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / name
    run_scenario(load(path, list(overrides), output=str(out)).base(), out, progress=False)
    return out


def rounds(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "rounds.csv", keep_default_na=False, na_values=[""])


@pytest.mark.parametrize("stage", ["before_share_keys", "before_upload", "during_unmasking"])
def test_plain_secagg_and_secagg_plus_give_identical_models(tmp_path, stage):
    hashes = {}
    for protocol in ("plain", "secagg", "secagg+"):
        overrides = [f"aggregation.protocol={protocol}"]
        if protocol != "plain":
            overrides.append(f"dropout.stage={stage}")
        out = run(tmp_path, protocol, *overrides)
        table = rounds(out)
        assert (table["outcome"] == "ok").all()
        hashes[protocol] = list(table["model_sha256"])
    # During unmasking the dropped clients' inputs are still in the sum; before upload they are not:
    # plain drops before upload, so compare it only where the survivors agree.
    if stage == "during_unmasking":
        assert hashes["secagg"] == hashes["secagg+"]
        assert hashes["secagg"] != hashes["plain"]
        plain_all = rounds(run(tmp_path, "plain_all", "aggregation.protocol=plain", "dropout.rate=0"))
        assert hashes["secagg"] == list(plain_all["model_sha256"])
    else:
        assert hashes["plain"] == hashes["secagg"] == hashes["secagg+"]


def test_protocol_steps_are_timed_and_bytes_counted(tmp_path):
    out = run(tmp_path, "steps", "aggregation.adversary=malicious", "aggregation.threshold=0.6")
    table = rounds(out)
    steps = ["advertise_keys", "share_keys", "masked_input", "consistency_check", "unmasking"]
    assert all((table[f"time_{s}"] > 0).all() for s in steps)
    assert (table["outcome"] == "ok").all() and (table["survivors"] == 6).all()
    stages = pd.read_csv(out / "stages.csv")
    assert [s for s in stages[stages["round"] == 1]["stage"] if s.startswith("step.")] == [f"step.{s}" for s in steps]
    assert (table["server_bytes_in"] > 6 * table["client_bytes_up_mean"].min()).all()
    assert (table["server_compute_s"] > 0).all() and (table["client_compute_s_mean"] > 0).all()


def test_below_threshold_the_round_aborts_and_training_goes_on(tmp_path):
    # 8 sampled, t = floor(0.75 * 8) + 1 = 7: three dropping clients leave too few.
    out = run(tmp_path, "abort", "aggregation.threshold=0.75", "dropout.rate=0.375", "dropout.mode=fixed", "rounds=2")
    table = rounds(out)
    assert list(table["outcome"]) == ["aborted: masked_input: 5 of 8 clients answered, threshold 7"] * 2
    assert (table["survivors"] == 0).all()
    assert table["model_sha256"].nunique() == 1  # the model did not move
    clients = pd.read_csv(out / "clients.csv", keep_default_na=False)
    assert (clients["dropped_stage"].isin(["before_upload", "not aggregated"])).all()


def test_timing_fidelity_gives_the_same_virtual_times_for_secagg(tmp_path):
    for protocol in ("secagg", "secagg+"):
        overrides = [
            f"aggregation.protocol={protocol}",
            "dropout.stage=during_unmasking",
            "aggregation.adversary=malicious",
        ]
        full = run(tmp_path, f"full_{protocol}", *overrides)
        timing = run(tmp_path, f"timing_{protocol}", *overrides, "fidelity=timing")
        for table in ("clients.csv", "stages.csv"):
            assert (full / table).read_bytes() == (timing / table).read_bytes()
        columns = [c for c in rounds(full).columns if c.startswith("time_") or c.endswith(("_s", "bytes_in"))]
        assert rounds(full)[columns].equals(rounds(timing)[columns])


def test_aggregation_keys_are_checked(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SCENARIO.replace("protocol: secagg,", "protocol: secagg, adversary: malicious, threshold: 0.4,"))
    with pytest.raises(ScenarioError, match="the malicious variant needs threshold >= 0.5"):
        load(path).base()
    path.write_text(SCENARIO.replace("protocol: secagg,", "protocol: plain, neighbours: 4,"))
    with pytest.raises(ScenarioError, match="neighbours: only applies to protocol secagg\\+"):
        load(path).base()
    path.write_text(SCENARIO.replace("bits: 20", "bits: 4"))
    with pytest.raises(ScenarioError, match="bits: is 4: too few to sum 8 clients' updates"):
        load(path).base()
    path.write_text(SCENARIO.replace("stage: before_upload", "stage: during_unmasking").replace("secagg,", "plain,"))
    with pytest.raises(ScenarioError, match="allowed: after_sampling \\| before_upload"):
        load(path).base()
    path.write_text(SCENARIO + "timeouts: {unmasking: 5, consistency_check: 1}\n")
    with pytest.raises(ScenarioError, match="consistency_check: is a step of secagg only with aggregation.adversary"):
        load(path).base()
    path.write_text(SCENARIO.replace("bits: 20", "bits: 20, threshold: 0"))
    with pytest.raises(ScenarioError, match="the reconstruction threshold would be 1"):
        load(path).base()


@pytest.mark.parametrize(
    ("dropout", "timeouts", "step"),
    [
        ("{rate: 0.2, stage: before_upload, silent: true}", "{advertise_keys: 10}", "masked_input"),
        ("{rate: 0.2, stage: during_unmasking, silent: true}", "{share_keys: 5}", "unmasking"),
        ("{rate: 0.2, stage: after_sampling, silent: true}", "{unmasking: 5}", "advertise_keys"),
        ("{mode: per_client, stage: before_share_keys, silent: true}", "{}", "share_keys"),
    ],
)
def test_silent_dropout_needs_a_timeout_where_it_is_missed(tmp_path, dropout, timeouts, step):
    path = tmp_path / "silent.yaml"
    path.write_text(SCENARIO.replace("{rate: 0.25, stage: before_upload}", dropout) + f"timeouts: {timeouts}\n")
    with pytest.raises(ScenarioError, match=f"missed in step {step}, .* set timeouts.{step}"):
        load(path).base()
    path.write_text(SCENARIO.replace("{rate: 0.25, stage: before_upload}", dropout) + f"timeouts: {{{step}: 9}}\n")
    assert load(path).base().timeouts[step] == 9


def test_a_round_too_small_for_its_threshold_aborts(tmp_path):
    # Poisson sampling can draw two clients; threshold 0.3 of two holders would be t = 1.
    out = run(tmp_path, "tiny", "sampling={rate: 0.07}", "aggregation.threshold=0.3", "rounds=6", "fidelity=timing")
    table = rounds(out)
    two = table[table["sampled"] == 2]
    assert len(two) > 0
    assert two["outcome"].str.contains("reconstruction threshold of 1").all()
