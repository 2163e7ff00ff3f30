"""A built-in model at an input shape the profile has not measured: its training is charged as the measured
shape of the same model nearest in multiply-adds, its per-sample coefficient scaled by their ratio
(:mod:`sim.costs.estimate`); a measured shape is charged exactly as measured, and a model with no measured
shape at all is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.costs.estimate import SCALED, TrainingEstimate, estimate_training, parse_train_op
from sim.costs.model import CostModel, CostModelError
from sim.learning.federated import data_shape
from sim.learning.flops import multiply_adds
from sim.learning.models import MODELS, model_train_op, train_op
from sim.scenario import load
from sim.testbed import cost_profile

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """
name: linear6050
seed: 3
rounds: 1
population: 6
sampling: {clients_per_round: 4}
data: {dataset: synthetic, samples_per_client: 20, input_shape: [1, 60, 50], classes: 10}
model: {name: linear}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: fedavg}
fidelity: timing
"""
"""A linear model on 1x60x50 inputs, 10 classes: 30,000 multiply-adds a sample, a shape the shipped profile
does not measure (its nearest measured linear shape is 3x32x32 with 10 classes: 30,720)."""

OP = "train.linear.1x60x50.10"
SOURCE = "train.linear.3x32x32.10"


def profile(operations: dict[str, dict[str, float]], name: str = "test") -> CostModel:
    return CostModel.from_dict({"format": 1, "operations": {op: {"coef": c} for op, c in operations.items()}}, name)


def test_operation_names_read_back():
    for model in MODELS:
        assert parse_train_op(train_op(model, (3, 17, 5), 7)) == (model, (3, 17, 5), 7)
    assert parse_train_op("train.params") is None
    assert parse_train_op("train.linear.1x8x8.10@client") is None  # a role's entry is not a shape
    assert parse_train_op("train.tiny_cnn-faaa46a2.1x12x12.4") is None  # a factory's: not a built-in model


def test_the_estimate_is_the_nearest_measured_shape_with_its_per_sample_cost_scaled_exactly():
    costs = CostModel.load()
    estimate = estimate_training(costs, OP, multiply_adds)
    assert estimate == TrainingEstimate(OP, SOURCE, 1 * 60 * 50 * 10, 3 * 32 * 32 * 10)
    assert estimate.ratio == 30_000 / 30_720
    measured = costs.cost(SOURCE).coef
    charged = estimate.applied(costs)
    assert SCALED == "samples"
    assert charged.cost(OP).coef == {
        "const": measured["const"],
        "samples": measured["samples"] * (30_000 / 30_720),
        "batches": measured["batches"],
    }
    size = {"samples": 40.0, "batches": 4.0}
    expected = measured["const"] + measured["samples"] * (30_000 / 30_720) * 40.0 + measured["batches"] * 4.0
    assert charged.seconds(OP, size) == expected  # the same sum, in the same order
    assert charged.seconds(OP, size) < charged.seconds(SOURCE, size)  # fewer multiply-adds, less time


def test_nearest_is_by_log_ratio_not_by_difference():
    costs = profile({"train.linear.1x1x1.1000": {"samples": 1.0}, "train.linear.1x1x1.4000": {"samples": 4.0}})
    # 2,100 multiply-adds: 1,100 above 1,000 but 1,900 below 4,000; in ratio 2.1 against 1.9
    estimate = estimate_training(costs, "train.linear.1x1x1.2100", multiply_adds)
    assert estimate is not None and estimate.source == "train.linear.1x1x1.4000"
    assert estimate.applied(costs).seconds("train.linear.1x1x1.2100", {"samples": 1.0}) == 4.0 * (2100 / 4000)


def test_a_measured_operation_is_charged_as_measured():
    costs = CostModel.load()
    for op in costs.operations:
        if parse_train_op(op) is not None:
            assert estimate_training(costs, op, multiply_adds) is None
    costs = profile({"train.linear.1x8x8.10": {"samples": 1.0}, "train.linear.1x8x8.20@client": {"samples": 7.0}})
    estimate = estimate_training(costs, "train.linear.1x8x8.20", multiply_adds)
    assert estimate is not None
    applied = estimate.applied(costs)  # a role's entry the profile has stays as it is
    assert applied.cost("train.linear.1x8x8.20@client").coef == {"samples": 7.0}
    assert list(applied.operations)[:2] == list(costs.operations)


def test_a_roles_entry_of_the_measured_shape_gives_the_estimates_at_that_role():
    costs = profile(
        {
            "train.mlp.1x8x8.10": {"const": 1.0, "samples": 2.0, "batches": 3.0},
            "train.mlp.1x8x8.10@client": {"const": 10.0, "samples": 20.0, "batches": 30.0},
        }
    )
    estimate = estimate_training(costs, "train.mlp.1x9x9.10", multiply_adds)
    assert estimate is not None and estimate.source == "train.mlp.1x8x8.10"
    r = (81 * 200 + 200 * 200 + 200 * 10) / (64 * 200 + 200 * 200 + 200 * 10)
    assert estimate.ratio == r
    applied = estimate.applied(costs)
    assert applied.cost("train.mlp.1x9x9.10").coef == {"const": 1.0, "samples": 2.0 * r, "batches": 3.0}
    assert applied.cost("train.mlp.1x9x9.10", "client").coef == {"const": 10.0, "samples": 20.0 * r, "batches": 30.0}
    assert applied.cost("train.mlp.1x9x9.10", "server").coef == {"const": 1.0, "samples": 2.0 * r, "batches": 3.0}


def test_a_model_with_no_measured_shape_is_refused_naming_it_and_the_profiler():
    costs = profile({"train.mlp.1x8x8.10": {"samples": 1.0}}, "mine.json")
    with pytest.raises(CostModelError) as caught:
        estimate_training(costs, "train.linear.1x8x8.10", multiply_adds)
    message = str(caught.value)
    assert "mine.json measures no shape of model 'linear'" in message
    assert "`dropsim profile`" in message and "dropsim profile --model" in message


def test_every_shipped_scenario_trains_at_a_measured_operation(tmp_path):
    """What keeps every shipped scenario's results as they were: none of them is estimated."""
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        if path.name == "reproductions.yaml":
            continue
        for point in load(path).points():
            if point.model.factory is not None or point.data.loader is not None:
                continue
            costs = CostModel.load(cost_profile(point))
            op = model_train_op(point.model, *data_shape(point.data))
            assert estimate_training(costs, op, multiply_adds) is None, f"{path}: {op}"


def test_check_accepts_the_scenario_and_notes_the_estimate(tmp_path, capsys):
    path = tmp_path / "linear6050.yaml"
    path.write_text(SCENARIO)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"costs.profile: the profile does not measure {OP}: its training time is an estimate from the " in out
    assert f"measured {SOURCE}, the time per sample times 0.9766" in out


def test_check_refuses_a_model_the_profile_has_never_measured(tmp_path, capsys):
    doc = json.loads((ROOT / "sim" / "costs" / "default.json").read_text())
    doc["operations"] = {op: e for op, e in doc["operations"].items() if not op.startswith("train.linear.")}
    (tmp_path / "nolinear.json").write_text(json.dumps(doc))
    path = tmp_path / "linear6050.yaml"
    path.write_text(SCENARIO + f"costs: {{profile: {tmp_path / 'nolinear.json'}}}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "costs.profile: cost profile" in err and "measures no shape of model 'linear'" in err
    assert "`dropsim profile`" in err


def test_a_run_charges_the_estimate_and_its_manifest_says_so(tmp_path, capsys):
    path = tmp_path / "linear6050.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["run", str(path), "--output", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training_cost"] == {
        "op": OP,
        "estimated": True,
        "from": SOURCE,
        "scaled": "samples",
        "multiply_adds": 30_000,
        "from_multiply_adds": 30_720,
        "multiply_adds_ratio": 30_000 / 30_720,
    }
    clients = pd.read_csv(out / "clients.csv")
    assert len(clients) == 4
    measured = CostModel.load().cost(SOURCE).coef
    for row in clients.itertuples():  # 20 samples a client, one epoch, batches of 10
        charged = measured["const"] + measured["samples"] * (30_000 / 30_720) * 20 + measured["batches"] * 2
        assert row.samples == 20
        assert row.train_s == pytest.approx(row.slowdown * charged, rel=1e-12)


def test_a_measured_runs_manifest_says_it_is_measured(tmp_path):
    path = tmp_path / "linear8.yaml"
    path.write_text(SCENARIO.replace("[1, 60, 50]", "[1, 8, 8]"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--output", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training_cost"] == {"op": "train.linear.1x8x8.10", "estimated": False}


def test_profile_measures_the_exact_shape_and_then_it_is_charged_as_measured(tmp_path, capsys):
    path = tmp_path / "linear6050.yaml"
    path.write_text(SCENARIO)
    measured = tmp_path / "measured.json"
    assert main(["profile", "--model", str(path), "--out", str(measured), "--quick"]) == 0
    assert OP in json.loads(measured.read_text())["operations"]
    path.write_text(SCENARIO + f"costs: {{profile: {measured}}}\n")
    capsys.readouterr()
    assert main(["check", str(path)]) == 0
    assert "estimate" not in capsys.readouterr().out
    assert estimate_training(CostModel.load(measured), OP, multiply_adds) is None
