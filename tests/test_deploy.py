"""The socket deployment runs the simulator's rounds over TCP: same aggregates, same tables."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.deploy.deployment import DeployError, DeployOptions, check_deployable
from sim.deploy.policy import scenario_policy
from sim.results.read import read_manifest, read_run_table
from sim.runner import Deployed, run_scenario
from sim.scenario import load

pytestmark = pytest.mark.slow

SCENARIO = """
name: dep
seed: 3
rounds: 2
population: 8
sampling: {clients_per_round: 4}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 3.0]}
  bandwidth_mbps: {zipf_a: 1.2, range: [21, 210]}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: digits, partition: {dirichlet: 1.0}}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10, clients_at_once: 1}  # as deployed clients train
aggregation: {protocol: secagg, bits: 20}
"""


def _scenario(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "dep.yaml"
    path.write_text(SCENARIO)
    return load(path, list(overrides), output=str(tmp_path / "out")).base()


def _both(tmp_path: Path, *overrides: str, seeded: bool = False) -> tuple[Path, Path]:
    scenario = _scenario(tmp_path, *overrides)
    simulated, deployed = tmp_path / "sim", tmp_path / "deploy"
    run_scenario(scenario, simulated, progress=False)
    options = DeployOptions(log_dir=deployed, seeded_secrets=seeded)
    run_scenario(scenario, deployed, progress=False, engine=partial(Deployed, options=options), driver="deploy")
    return simulated, deployed


CASES = {
    "secagg": (),
    "fedavg": ("aggregation={protocol: fedavg}",),
    "secagg+ xnoise pipelined": (
        "aggregation.protocol=secagg+",
        "privacy={strategy: xnoise, epsilon: 6, delta: 0.001}",
        "pipeline={chunks: 3}",
        "dropout.stage=during_unmasking",
    ),
    "malicious": ("aggregation.adversary=malicious", "dropout.stage=before_share_keys"),
}


SEEDED = {"secagg+ xnoise pipelined"}
"""Cases with DP noise: bit for bit only with the secrets derived from the scenario seed (no secrecy)."""


@pytest.mark.parametrize("case", list(CASES))
def test_deployed_rounds_match_the_simulated_ones(tmp_path: Path, case: str) -> None:
    """Same seed, same aggregate after every round (bit for bit), same survivors, outcomes and epsilon.
    Without DP the clients' secrets come from their operating systems and the masks still cancel exactly."""
    simulated, deployed = _both(tmp_path, *CASES[case], seeded=case in SEEDED)
    sim, dep = read_run_table(simulated, "rounds"), read_run_table(deployed, "rounds")
    assert list(dep["outcome"]) == list(sim["outcome"]) == ["ok", "ok"]
    assert list(dep["model_sha256"]) == list(sim["model_sha256"])
    assert list(dep["survivors"]) == list(sim["survivors"])
    # one of four drops each round; one dropping during unmasking has uploaded, so its input is in the sum
    assert list(sim["survivors"]) == ([4, 4] if "during_unmasking" in str(CASES[case]) else [3, 3])
    if "epsilon" in sim:
        assert list(dep["epsilon"]) == list(sim["epsilon"])
    clients = ["round", "client", "dropped_stage", "in_aggregate", "bytes_down", "bytes_up"]
    sim_clients = read_run_table(simulated, "clients")[clients].fillna("")
    dep_clients = read_run_table(deployed, "clients")[clients].fillna("")
    # what a leaver had received when it left depends on timing; the rest does not
    stayed = sim_clients["dropped_stage"] == ""
    for table in (sim_clients, dep_clients):
        table.loc[~stayed, ["bytes_down", "bytes_up"]] = 0
    pd.testing.assert_frame_equal(dep_clients, sim_clients)
    manifest = read_manifest(deployed)
    assert manifest["driver"] == "deploy"
    assert manifest["secrets"].startswith("seeded" if case in SEEDED else "os-csprng")
    # the workers started here accept what the scenario asks, and each said so when it connected
    policy = scenario_policy(_scenario(tmp_path, *CASES[case]), seeded=case in SEEDED).as_dict()
    assert manifest["worker_policy"] == policy
    assert manifest["worker_policies"] == {str(j): policy for j in range(4)}
    assert (dep["round_time"] > 0).all()


def test_with_secrets_of_its_own_a_deployed_dp_round_has_other_noise(tmp_path: Path) -> None:
    """With DP and the workers' own randomness, the noise (and so the model) differs from the simulator's,
    while everything the noise does not decide is the same: outcomes, survivors and the epsilon spent."""
    simulated, deployed = _both(tmp_path, *CASES["secagg+ xnoise pipelined"], "rounds=1")
    sim, dep = read_run_table(simulated, "rounds"), read_run_table(deployed, "rounds")
    assert list(dep["outcome"]) == list(sim["outcome"]) == ["ok"]
    assert list(dep["survivors"]) == list(sim["survivors"])
    assert list(dep["epsilon"]) == list(sim["epsilon"])
    assert list(dep["model_sha256"]) != list(sim["model_sha256"])
    assert read_manifest(deployed)["secrets"].startswith("os-csprng")


def test_deployed_results_plot(tmp_path: Path) -> None:
    _, deployed = _both(tmp_path, "rounds=1")
    assert main(["plot", str(deployed), "--out", str(tmp_path / "fig")]) == 0
    assert any((tmp_path / "fig").glob("*.png"))


def test_validate_compares_stage_by_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dep.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "val"
    command = ["validate", str(path), "--output", str(out), "--quiet", "--set", "rounds=1", "--cpu-scale", "1.5"]
    assert main(command) == 0
    text = capsys.readouterr().out
    assert "identical" in text
    summary = pd.read_csv(out / "summary.csv")
    assert {"round", "train", "step.masked_input", "aggregate", "cpu"} <= set(summary["stage"])
    row = summary.set_index("stage").loc["round"]
    assert row["error"] == pytest.approx((row["simulated_s"] - row["measured_s"]) / row["measured_s"])
    assert (out / "validation.png").exists() and (out / "validation.pdf").exists()
    manifest = read_manifest(out / "simulated")
    assert manifest["scenario"]["testbed"]["cores"] >= 1
    assert manifest["scenario"]["testbed"]["cpu_scale"] == 1.5
    # the cpu row: every party's CPU seconds, as charged (simulated) and as its compute thread used them
    cpu = summary.set_index("stage").loc["cpu"]
    charged = read_run_table(out / "simulated", "clients")["cpu_s"].sum()
    charged += read_run_table(out / "simulated", "rounds")["server_cpu_s"].sum()
    assert cpu["simulated_s"] == pytest.approx(charged) and cpu["measured_s"] > 0
    scale = 1.5 * cpu["measured_s"] / cpu["simulated_s"]
    assert f"this host's testbed.cpu_scale is {scale:.3g}" in text


def test_what_cannot_be_deployed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="fidelity"):
        check_deployable(_scenario(tmp_path, "fidelity=timing"))
    path = tmp_path / "dep.yaml"
    path.write_text(SCENARIO)
    assert main(["deploy", str(path), "--set", "fidelity=timing", "--quiet"]) == 2


def test_validate_with_seeded_secrets_compares_dp_models_and_says_it_kept_nothing_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dep.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "val"
    dp = ["--set", "privacy={strategy: xnoise, epsilon: 6, delta: 0.001}", "--set", "rounds=1"]
    assert main(["validate", str(path), "--output", str(out), "--quiet", *dp, "--seeded-secrets"]) == 0
    captured = capsys.readouterr()
    assert "models after every round: identical" in captured.out
    assert "NO SECRECY" in captured.out and "--seeded-secrets" in captured.err
    assert "NO SECRECY" in read_manifest(out / "deployed")["secrets"]
