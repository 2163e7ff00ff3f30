"""Model shapes for timing studies: the CIFAR ResNet-18 and VGG-19, abstract models of N parameters,
and synthetic data of a chosen image shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sim.costs.model import DEFAULT_PROFILE, CostModel, CostModelError
from sim.learning.federated import SHAPES, SyntheticData, data_shape
from sim.learning.models import MODELS, build_model, count_parameters, model_dimension, train_op
from sim.learning.trainer import Learner
from sim.preflight import preflight
from sim.profiling.profiler import VALIDATION_SHAPES, training_grid, training_plan
from sim.runner import Simulation, run_scenario
from sim.scenario import ScenarioError, load
from sim.scenario.types import MODELS as SCENARIO_MODELS
from sim.scenario.types import Data, Model, Partition, Training
from sim.seeds import Stream, generator

# ResNet-18 at 3x32x32, 10 classes, counted by hand (GroupNorm has BatchNorm's 2 parameters per channel):
# stem 3*64*9 + 2*64 = 1,856; stage 64: 2 * (2 * 64*64*9 + 2 * 128) = 147,968; stage 128: 230,144 + 295,424;
# stage 256: 919,040 + 1,180,672; stage 512: 3,673,088 + 4,720,640; linear 512*10 + 10 = 5,130.
RESNET18_CIFAR = 1_856 + 147_968 + 525_568 + 2_099_712 + 8_393_728 + 5_130
# VGG-19 at 3x32x32, 10 classes: the 16 convs (with bias) and their 2C norm parameters, then 512*10 + 10.
_CONVS = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256)] + [(256, 256)] * 3 + [(256, 512)] + [(512, 512)] * 7
VGG19_CIFAR = sum(cin * cout * 9 + cout + 2 * cout for cin, cout in _CONVS) + 5_130


def test_parameter_counts_are_pinned():
    assert RESNET18_CIFAR == 11_173_962  # kuangliu/pytorch-cifar's ResNet18, the "11.17M" of the literature
    assert VGG19_CIFAR == 20_040_522  # kuangliu/pytorch-cifar's VGG('VGG19')
    assert count_parameters("cnn", (1, 28, 28), 62) == 1_206_590
    assert count_parameters("resnet18", (3, 32, 32), 10) == RESNET18_CIFAR
    assert count_parameters("vgg19", (3, 32, 32), 10) == VGG19_CIFAR
    # one input channel: the first conv loses 2 * 64 * 9 = 1,152 weights
    assert count_parameters("resnet18", (1, 8, 8), 10) == 11_172_810 == RESNET18_CIFAR - 1_152
    assert count_parameters("vgg19", (1, 8, 8), 10) == 20_039_370 == VGG19_CIFAR - 1_152
    # 62 classes: 52 more rows of the 512-wide linear layer
    assert count_parameters("resnet18", (1, 28, 28), 62) == 11_199_486 == RESNET18_CIFAR - 1_152 + 52 * 513
    assert count_parameters("vgg19", (1, 28, 28), 62) == 20_066_046 == VGG19_CIFAR - 1_152 + 52 * 513
    # the image size does not matter to the convolutional models (adaptive pooling)
    assert count_parameters("resnet18", (3, 8, 8), 10) == RESNET18_CIFAR
    assert count_parameters("vgg19", (3, 100, 60), 10) == VGG19_CIFAR


def test_the_scenario_offers_every_model():
    assert SCENARIO_MODELS == MODELS


@pytest.mark.parametrize("name", ["resnet18", "vgg19"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32), (3, 6, 6), (4, 37, 9)])
def test_large_models_build_for_every_shape_and_hold_parameters_only(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 7)
    assert list(model.buffers()) == []  # the flat parameter vector is the whole state
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        one = model(torch.rand(1, *shape))
    assert one.shape == (1, 7) and torch.isfinite(one).all()


@pytest.mark.parametrize("name", ["resnet18", "vgg19"])
def test_large_models_train_one_local_step_for_real(name):
    """Fidelity full: a client of 3 synthetic 3x8x8 images trains in batches of 2 and 1 (a batch of one
    is fine: GroupNorm normalises each sample on its own)."""
    config = Data("synthetic", Partition("iid"), None, 0.2, 3, 1, (3, 8, 8), 10)
    data = SyntheticData(4, config, seed=1)
    training = Training(1, 2, 0.05, 0.9, 0.0, 1.0, 1)
    learner = Learner(name, data, training, seed=1)
    assert learner.dim == count_parameters(name, (3, 8, 8), 10)
    delta, weight = learner.local_update(client=2, round=1)
    assert delta.shape == (learner.dim,) and delta.dtype == np.float32 and weight == 3.0
    assert np.isfinite(delta).all() and np.abs(delta).max() > 0
    again, _ = Learner(name, data, training, seed=1).local_update(client=2, round=1)
    assert np.array_equal(delta, again)  # reproducible with one thread


def test_default_profile_measures_the_large_models_at_the_data_sets_shapes():
    costs = CostModel.load()
    for shape, classes in SHAPES.values():
        for name in ("resnet18", "vgg19"):
            op = train_op(name, shape, classes)
            per_sample = costs.seconds(op, {"samples": 1, "batches": 0}) - costs.seconds(op, {})
            assert per_sample > costs.seconds(train_op("cnn", shape, classes), {"samples": 1}), op


# -- scenarios ------------------------------------------------------------------------------------------

BASE = """
name: shapes
seed: 4
rounds: 2
population: 4
sampling: {clients_per_round: 2}
clients:
  compute: {zipf_a: 0, slowdown: [2, 2]}
  bandwidth_mbps: {zipf_a: 0, range: [100, 100]}
"""
DATA = "data: {dataset: synthetic, samples_per_client: 30}\n"


def text(extra: str) -> str:
    """The base scenario with ``extra`` keys (and the default data section unless ``extra`` has one)."""
    return BASE + ("" if "data:" in extra else DATA) + extra


def scenario(tmp_path: Path, extra: str, *overrides: str):
    path = tmp_path / "s.yaml"
    path.write_text(text(extra))
    return load(path, list(overrides), output=str(tmp_path / "out")).base()


def problems(tmp_path: Path, extra: str) -> list[str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text(extra))
    with pytest.raises(ScenarioError) as info:
        load(path).points()
    return [str(p) for p in info.value.problems]


def test_abstract_model_uploads_its_size_and_trains_at_its_rate(tmp_path):
    records = {}
    for n in (1_000, 25_000_000):
        extra = f"model: {{params: {n}, train_seconds_per_sample: 0.125}}\nfidelity: timing\n"
        sim = Simulation(scenario(tmp_path, extra, "training.local_epochs=3"))
        assert sim.dim == n
        records[n] = [sim.step().record for _ in range(2)]
    for n, recs in records.items():
        for rec in recs:
            assert rec.outcome == "ok" and rec.survivors == 2
            for c in rec.clients:
                # fedavg upload: header 8 + round u32 + client u64 + weight f64 + vector header 9 + float32s
                assert c.bytes_up == 8 + 4 + 8 + 8 + 9 + 4 * n
                # slow-down 2 x 0.125 s x 30 samples x 3 epochs
                assert c.train_end - c.train_start == pytest.approx(2 * 0.125 * 30 * 3, abs=1e-9)
    up = {n: recs[0].server_bytes_in for n, recs in records.items()}
    assert up[25_000_000] - up[1_000] == 2 * 4 * (25_000_000 - 1_000)


def test_abstract_model_without_a_rate_does_not_model_training(tmp_path):
    sc = scenario(tmp_path, "model: {params: 10}\nfidelity: timing\n")
    assert sc.model == Model(None, 10, 0.0)
    assert sc.resolved["model"] == {"params": 10, "train_seconds_per_sample": 0.0}
    rec = Simulation(sc).step().record
    assert all(c.train_end == c.train_start for c in rec.clients)


def test_abstract_model_flows_into_the_privacy_planner(tmp_path):
    sc = scenario(tmp_path, "model: {params: 123456}\nfidelity: timing\n")
    assert model_dimension(sc) == 123_456
    assert preflight(sc) == []


def test_abstract_model_needs_timing_fidelity(tmp_path):
    (message,) = problems(tmp_path, "model: {params: 1000}\n")
    assert "model.params: is 1000: an abstract model has no weights, so there is nothing to train" in message
    assert "set fidelity: timing" in message
    (message,) = problems(tmp_path, "model: {params: 1000}\nfidelity: full\n")
    assert "model.params: is 1000" in message


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("{params: 0}", "model.params: is 0, out of range; allowed: a whole number >= 1"),
        ("{params: 2.5}", "model.params: is 2.5; a whole number >= 1 is expected"),
        ("{params: 10, train_seconds_per_sample: -1}", "model.train_seconds_per_sample: is -1, out of range"),
        ("{name: cnn, params: 10}", "model.name: is 'cnn', given with params; give one"),
        ("{name: cnn, train_seconds_per_sample: 1}", "model.train_seconds_per_sample: applies only to an abstract"),
        ("{name: resnet50}", "model.name: is 'resnet50'; allowed: cnn | mlp | resnet18 | vgg19"),
    ],
)
def test_bad_model_values_name_the_key(tmp_path, model, expected):
    found = problems(tmp_path, f"model: {model}\nfidelity: timing\n")
    assert any(expected in m for m in found), found


def test_model_checks_itself():
    with pytest.raises(ValueError, match="one of name, params or factory"):
        Model("cnn", 10)
    with pytest.raises(ValueError, match="one of name, params or factory"):
        Model(None)
    with pytest.raises(ValueError, match="one of name, params or factory"):
        Model(None, 10, factory="m:f")
    with pytest.raises(ValueError, match="only to an abstract model"):
        Model("cnn", None, 1.0)
    with pytest.raises(ValueError, match="args are the factory's"):
        Model("cnn", args={"width": 2})


def test_synthetic_default_shape_is_unchanged(tmp_path):
    sc = scenario(tmp_path, "fidelity: timing\n")
    assert (sc.data.input_shape, sc.data.classes) == ((1, 8, 8), 10) == SHAPES["synthetic"]
    assert sc.resolved["data"]["input_shape"] == [1, 8, 8] and sc.resolved["data"]["classes"] == 10
    data = SyntheticData(4, sc.data, sc.seed)
    # the prototypes are drawn exactly as before the shape became a key
    expected = generator(sc.seed, Stream.SYNTHETIC, 0).random((10, 1, 8, 8)).astype(np.float32)
    assert np.array_equal(data.prototypes, expected)


def test_synthetic_cifar_shape_runs_two_timing_rounds(tmp_path):
    extra = "data: {dataset: synthetic, samples_per_client: 30, input_shape: [3, 32, 32], classes: 10}\n"
    sc = scenario(tmp_path, extra + "model: {name: vgg19}\nfidelity: timing\n")
    assert data_shape(sc.data) == ((3, 32, 32), 10) and preflight(sc) == []
    sim = Simulation(sc)
    assert sim.dim == VGG19_CIFAR and "prototypes" not in vars(sim.data)  # timing draws no image
    costs = CostModel.load()
    train = 2 * costs.seconds("train.vgg19.3x32x32.10", {"samples": 30, "batches": 2})
    for _ in range(2):
        rec = sim.step().record
        assert rec.outcome == "ok"
        for c in rec.clients:
            assert c.train_end - c.train_start == pytest.approx(train, rel=1e-12)
            assert c.bytes_up == 37 + 4 * VGG19_CIFAR


def test_synthetic_cifar_shape_trains_a_full_round_with_the_cnn(tmp_path):
    extra = "data: {dataset: synthetic, samples_per_client: 8, input_shape: [3, 32, 32], classes: 10}\n"
    sc = scenario(tmp_path, extra + "model: {name: cnn}\nfidelity: full\n", "rounds=1")
    summary = run_scenario(sc, tmp_path / "out", progress=False)
    assert summary.rounds == 1 and 0 <= summary.final_accuracy <= 1
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["model_parameters"] == count_parameters("cnn", (3, 32, 32), 10) == 1_626_442
    x, y = SyntheticData(4, sc.data, sc.seed).client_data(0)
    assert x.shape == (8, 3, 32, 32) and x.dtype == np.float32 and y.max() < 10


def test_synthetic_shape_without_a_profiled_train_op_is_estimated_from_a_measured_one(tmp_path):
    extra = "data: {dataset: synthetic, input_shape: [3, 16, 16], classes: 5}\nfidelity: timing\n"
    sc = scenario(tmp_path, extra)
    assert preflight(sc) == []
    world = Simulation(sc).world  # 3,119,104 multiply-adds a sample, nearest the 11,999,104 of 1x28x28
    assert world.training_estimate is not None and world.training_estimate.source == "train.cnn.1x28x28.62"


def test_a_model_the_profile_measures_at_no_shape_fails_at_check_time(tmp_path):
    doc = json.loads(DEFAULT_PROFILE.read_text())
    doc["operations"] = {op: e for op, e in doc["operations"].items() if not op.startswith("train.cnn.")}
    (tmp_path / "nocnn.json").write_text(json.dumps(doc))
    extra = "data: {dataset: synthetic, input_shape: [3, 16, 16], classes: 5}\nfidelity: timing\n"
    sc = scenario(tmp_path, extra + f"costs: {{profile: {tmp_path / 'nocnn.json'}}}\n")
    (problem,) = preflight(sc)
    assert problem.key == "costs.profile"
    assert "measures no shape of model 'cnn'" in problem.message and "`dropsim profile`" in problem.message
    with pytest.raises(CostModelError, match="measures no shape of model 'cnn'"):
        Simulation(sc)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ("input_shape: [5, 32, 32]", "data.input_shape: is [5, 32, 32]; allowed: [C, H, W], whole numbers with"),
        ("input_shape: [3, 4, 32]", "data.input_shape: is [3, 4, 32]; allowed: [C, H, W]"),
        ("input_shape: [3, 32, 257]", "data.input_shape: is [3, 32, 257]; allowed"),
        ("input_shape: [3, 32]", "data.input_shape: is [3, 32]; allowed"),
        ("input_shape: [3, 32.5, 32]", "data.input_shape: is [3, 32.5, 32]; allowed"),
        ("input_shape: 32", "data.input_shape: is 32; allowed"),
        ("classes: 1", "data.classes: is 1, out of range; allowed: a whole number in [2, 1000]"),
        ("classes: 1001", "data.classes: is 1001, out of range"),
    ],
)
def test_bad_synthetic_shapes_name_the_key(tmp_path, data, expected):
    found = problems(tmp_path, f"data: {{dataset: synthetic, {data}}}\nfidelity: timing\n")
    assert any(expected in m for m in found), found


def test_only_synthetic_takes_a_shape(tmp_path):
    (message,) = problems(tmp_path, "data: {dataset: digits, input_shape: [1, 8, 8]}\n")
    assert "data.input_shape: is not used by dataset 'digits' (only by synthetic)" in message
    (message,) = problems(tmp_path, "data: {dataset: digits, classes: 10}\n")
    assert "data.classes: is not used by dataset 'digits' (only by synthetic)" in message


def test_profile_times_every_model_at_every_shape_and_the_asked_ones():
    plan = training_plan([((3, 16, 16), 5), ((3, 32, 32), 10)])
    shapes = [((1, 8, 8), 10), ((1, 28, 28), 62), ((3, 32, 32), 10), ((3, 16, 16), 5)]
    validation = [train_op("linear", s, k) for s, k in VALIDATION_SHAPES]
    assert [op for op, *_ in plan] == [train_op(m, s, k) for s, k in shapes for m in MODELS] + validation
    last = len(plan) - len(validation) - 1
    assert plan[last] == ("train.linear.3x16x16.5", "linear", (3, 16, 16), 5, "synthetic 3x16x16, 5 classes")
    assert training_grid("vgg19", quick=False) == ((10, 20, 40), (5, 10, 20), 3)  # large models: fewer points
    assert training_grid("cnn", quick=False) == ((20, 60, 120, 240), (10, 20, 50), 5)
