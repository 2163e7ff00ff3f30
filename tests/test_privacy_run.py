"""Distributed DP end to end: scenario keys, the ``dropsim privacy`` table, and runs whose rounds.csv
accounts each round at the noise it really had (Orig overspends under dropout, XNoise hits the budget,
Early stops before passing it), with identical virtual times and accounting in timing fidelity."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.dp.accounting import Accountant
from sim.round.privacy import padded
from sim.runner import run_scenario
from sim.scenario import load
from sim.scenario.errors import ScenarioError

BASE = """
name: dp
seed: 3
rounds: 6
population: 40
sampling: {clients_per_round: 10}
dropout: {rate: 0.3, stage: before_upload}
data: {dataset: digits}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 20}
aggregation: {protocol: secagg, bits: 20}
privacy: {strategy: xnoise, epsilon: 4, delta: 1.0e-3, clip: 1.0, tolerance: 0.5}
fidelity: timing
"""


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "dp.yaml"
    path.write_text(BASE)
    return path


def run(path: Path, out: Path, *overrides: str) -> pd.DataFrame:
    scenario = load(path, list(overrides), output=str(out)).points()[0]
    run_scenario(scenario, out, progress=False)
    return pd.read_csv(out / "rounds.csv")


def test_privacy_command_table(scenario_file, tmp_path, capsys):
    out = tmp_path / "eps.csv"
    code = main(["privacy", str(scenario_file), "--dropout", "0", "0.2", "0.4", "--dim", "1000", "--csv", str(out)])
    assert code == 0, capsys.readouterr().err
    table = pd.read_csv(out)
    assert list(table.columns[:4]) == ["strategy", "dropout", "epsilon", "rounds_completed"]
    by = {s: t.set_index("dropout") for s, t in table.groupby("strategy")}
    orig, xnoise, early = by["orig"]["epsilon"], by["xnoise"]["epsilon"], by["early"]
    assert orig[0.0] == pytest.approx(4, rel=1e-6) and orig[0.0] < orig[0.2] < orig[0.4]
    assert (xnoise - 4).abs().max() < 1e-5
    assert (early["epsilon"] <= 4).all()
    assert early["rounds_completed"][0.0] == 6 and early["rounds_completed"][0.4] < 6
    assert by["rebasing"]["epsilon"][0.4] == pytest.approx(4, rel=1e-6)


def test_privacy_command_rejects_unknown_strategies(scenario_file, capsys):
    assert main(["privacy", str(scenario_file), "--strategies", "magic"]) == 2
    assert "strategies ['magic'] are unknown or need another protocol" in capsys.readouterr().err


def test_rounds_csv_accounts_each_round(scenario_file, tmp_path):
    rounds = run(scenario_file, tmp_path / "x")
    assert (rounds["outcome"] == "ok").all()
    assert (rounds["realised_variance"] == rounds["target_variance"]).all()  # 3 of 10 dropped, T = 5
    assert rounds["epsilon"].is_monotonic_increasing
    assert rounds["epsilon"].iloc[-1] == pytest.approx(4, rel=1e-6)
    # the same composition by hand: six rounds at the target, each at its own scale, at q = 10 / 40, over the
    # model's dimension padded to a power of two
    dim = json.loads((tmp_path / "x" / "manifest.json").read_text())["model_parameters"]
    acc = Accountant("skellam", 1e-3, 1.0, padded(dim), 10 / 40, scale=1.0)
    for variance, scale in zip(rounds["accounted_variance"], rounds["dp_scale"], strict=True):
        acc.add_round(variance, clients=7, scale=scale)
    assert rounds["epsilon"].iloc[-1] == pytest.approx(acc.epsilon(), rel=1e-12)


def test_orig_overspends_and_early_stops(scenario_file, tmp_path):
    orig = run(scenario_file, tmp_path / "orig", "privacy.strategy=orig")
    assert ((orig["realised_variance"] - 0.7 * orig["target_variance"]).abs() < 1e-12).all()
    assert orig["epsilon"].iloc[-1] > 4
    early = run(scenario_file, tmp_path / "early", "privacy.strategy=early")
    assert len(early) < 6
    assert early["outcome"].iloc[-1].startswith("aborted: masked_input: privacy budget")
    assert math.isnan(early["realised_variance"].iloc[-1])  # refused before anything was unmasked
    assert early["epsilon"].iloc[-1] <= 4
    manifest = json.loads((tmp_path / "early" / "manifest.json").read_text())
    assert "privacy budget" in manifest["stopped"]


@pytest.mark.slow
def test_full_and_timing_fidelity_agree_on_times_and_accounting(scenario_file, tmp_path):
    timing = run(scenario_file, tmp_path / "t", "rounds=3")
    full = run(scenario_file, tmp_path / "f", "rounds=3", "fidelity=full")
    for column in ("t_end", "survivors", "epsilon", "realised_variance", "server_bytes_in", "time_unmasking"):
        pd.testing.assert_series_equal(full[column], timing[column], check_exact=True)
    assert full["accuracy"].notna().all()


@pytest.mark.slow
def test_survivors_dropping_during_noise_removal_are_recovered_from_shares(scenario_file, tmp_path):
    rounds = run(scenario_file, tmp_path / "r", "rounds=2", "fidelity=full", "dropout.stage=during_noise_removal")
    assert (rounds["outcome"] == "ok").all()
    assert (rounds["time_noise_removal"] > 0).all()  # stage 5 ran: seeds came from shares
    assert (rounds["realised_variance"] == rounds["target_variance"]).all()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("aggregation.protocol=plain", "removes noise with seeds shared under secure aggregation"),
        ("privacy.strategy=orig\naggregation.protocol=plain", "only central or local DP hold"),
        ("aggregation.protocol=fedavg", "needs an encoded protocol"),
        ("privacy.strategy=magic", "privacy.strategy"),
        ("privacy.tolerance=1.5", "privacy.tolerance"),
        ("privacy.mechanism=laplace", "privacy.mechanism"),
    ],
)
def test_bad_privacy_keys_are_named(scenario_file, override, message):
    with pytest.raises(ScenarioError, match=message):
        load(scenario_file, override.split("\n")).points()


def test_a_privacy_section_without_a_strategy_is_refused(scenario_file):
    with pytest.raises(ScenarioError, match="privacy.strategy: is missing"):
        load(scenario_file, ["privacy={epsilon: 6}"]).points()


def test_collusion_at_the_threshold_names_the_threshold(scenario_file):
    assert load(scenario_file, ["privacy.collusion=5"]).points()  # t = floor(0.5 * 10) + 1 = 6
    with pytest.raises(ScenarioError, match="not below the reconstruction threshold t = 6 of 10"):
        load(scenario_file, ["privacy.collusion=6"]).points()


@pytest.mark.parametrize("override", ["privacy.strategy=con", "privacy.collusion=2"])
def test_small_poisson_rounds_do_not_crash(scenario_file, tmp_path, override):
    rounds = run(scenario_file, tmp_path / "p", "sampling={rate: 0.15}", "dropout.rate=0", override)
    assert len(rounds) == 6
    # a round too small for the collusion tolerance aborts before anything is revealed
    assert all(o == "ok" or "collusion" in o or "answered" in o or "threshold" in o for o in rounds["outcome"])


@pytest.mark.parametrize("mechanism", ["skellam", "gaussian", "dgaussian"])
@pytest.mark.parametrize("bits", [30, 32])
def test_many_bits_are_capped_by_what_the_samplers_take(scenario_file, tmp_path, mechanism, bits):
    from sim.dp.noise import MAX_VARIANCE
    from sim.round.privacy import PrivacyLedger

    scenario = load(scenario_file, [f"aggregation.bits={bits}", f"privacy.mechanism={mechanism}"]).points()[0]
    for strategy in ("orig", "xnoise", "local", "central", "rebasing"):
        privacy = dataclasses.replace(scenario.privacy, strategy=strategy)
        aggregation = dataclasses.replace(scenario.aggregation, strategy=strategy)
        ledger = PrivacyLedger(privacy, aggregation, 6, 0.25, 10, 1000, 0)
        plan, private = ledger.round(1, 10)
        assert all(private.variance(i) <= MAX_VARIANCE for i in range(len(plan.components)))
        for component in (6 / 7, 0.1, 1.0):  # 6/7 and 0.1 round over the cap without the margin
            assert component * ledger.scale(10, plan.largest_residual, component) ** 2 <= MAX_VARIANCE
    rounds = run(
        scenario_file,
        tmp_path / "b",
        f"aggregation.bits={bits}",
        f"privacy.mechanism={mechanism}",
        "privacy.strategy=local",
        "fidelity=full",
        "rounds=1",
    )
    assert (rounds["outcome"] == "ok").all()


def test_privacy_command_counts_no_rounds_below_the_threshold(scenario_file, tmp_path, capsys):
    out = tmp_path / "deep" / "eps.csv"  # the folder is created
    assert main(["privacy", str(scenario_file), "--dropout", "0.6", "--dim", "1000", "--csv", str(out)]) == 0
    table = pd.read_csv(out).set_index("strategy")
    assert table.loc["orig", "rounds_completed"] == 0 and table.loc["orig", "epsilon"] == 0


def test_noise_removal_stage_needs_a_removing_strategy(scenario_file):
    with pytest.raises(ScenarioError, match="dropout.stage: is .during_noise_removal.: noise is removed only with"):
        load(scenario_file, ["privacy.strategy=orig", "dropout.stage=during_noise_removal"]).points()


def test_a_budget_the_bits_cannot_meet_is_refused_before_running(scenario_file, capsys):
    code = main(["check", str(scenario_file), "--set", "aggregation.bits=5", "--set", "privacy.epsilon=0.01"])
    assert code == 2
    err = capsys.readouterr().err
    assert "privacy: cannot plan the noise" in err and "raise aggregation.bits, or raise epsilon" in err


def test_a_round_aborted_after_unmasking_is_accounted(scenario_file, tmp_path):
    """Stage 5 gets no answer in time (a tiny noise_removal timeout): the round aborts, but its noisy sum was
    already unmasked, so it is reported as revealed and its privacy is spent."""
    rounds = run(
        scenario_file,
        tmp_path / "s5",
        "rounds=3",
        "dropout.stage=during_noise_removal",
        "timeouts={noise_removal: 1.0e-6}",
    )
    assert rounds["outcome"].str.startswith("aborted: noise_removal").all()
    assert (rounds["revealed"] == 10).all()  # the 3 leaving during removal had uploaded: all 10 in the sum
    assert rounds["epsilon"].is_monotonic_increasing and rounds["epsilon"].iloc[0] > 0


def test_plots_of_private_runs(scenario_file, tmp_path):
    run(scenario_file, tmp_path / "runs" / "a", "rounds=3")
    run(scenario_file, tmp_path / "runs" / "b", "rounds=3", "privacy.strategy=orig")
    assert main(["plot", str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b"), "--out", str(tmp_path / "f")]) == 0
    assert (tmp_path / "f" / "epsilon_vs_round.png").is_file() and (tmp_path / "f" / "epsilon_vs_round.pdf").is_file()
