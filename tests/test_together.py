"""A round's clients trained together (``training.clients_at_once``) equal the loop's training of each alone,
for every built-in model; the choice of ``auto``; ``training.device``; plug-in models that cannot be
vectorised."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sim.errors import InputError
from sim.learning import together
from sim.learning.federated import FederatedData
from sim.learning.flops import module_multiply_adds, multiply_adds
from sim.learning.models import MODELS
from sim.learning.trainer import Learner
from sim.scenario.types import Training

TOLERANCE = 1e-5
"""The largest difference allowed between a client's update trained together and alone, relative to the
largest value of its update alone (docs/performance.md, section 8: measured at most 6.5e-6, ResNet-18)."""

SHAPES = {"cnn": (1, 6, 6), "mlp": (1, 4, 4), "linear": (1, 4, 4), "resnet18": (3, 4, 4), "vgg19": (3, 4, 4)}


class Uneven(FederatedData):
    """Clients of unequal sizes (one of a single sample), standard-normal inputs, uniform labels."""

    def __init__(self, shape: tuple[int, int, int], sizes: tuple[int, ...] = (7, 1, 10, 4), classes: int = 5) -> None:
        self.input_shape, self.num_classes, self.sizes = shape, classes, sizes
        rng = np.random.default_rng(3)
        self.xs = [rng.standard_normal((n, *shape), dtype=np.float32) for n in sizes]
        self.ys = [rng.integers(0, classes, n).astype(np.int64) for n in sizes]

    def num_samples(self, client: int) -> int:
        return self.sizes[client]

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        return self.xs[client], self.ys[client]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.xs[0], self.ys[0]


def _training(**changes: object) -> Training:
    base = Training(
        local_epochs=2,
        batch_size=3,
        lr=0.05,
        momentum=0.9,
        weight_decay=1e-3,
        server_lr=1.0,
        threads=1,
        device="cpu",
        clients_at_once=1,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _relative(alone: np.ndarray, joint: np.ndarray) -> float:
    return float(np.abs(alone - joint).max() / np.abs(alone).max())


@pytest.mark.parametrize("model", MODELS)
def test_every_built_in_model_trains_together_as_each_client_alone(model: str) -> None:
    # unequal sizes (a client of one sample finishes first), a partial last batch, two local epochs,
    # momentum and weight decay: each client's update equals the loop's within the stated tolerance
    large = model in ("resnet18", "vgg19")  # fewer clients and steps (each costs seconds here), the same code
    data = Uneven(SHAPES[model], sizes=(3, 1) if large else (7, 1, 10, 4))
    settings = {"local_epochs": 1, "batch_size": 2} if large else {}
    alone = Learner(model, data, _training(**settings), seed=5)
    joint = Learner(model, data, _training(clients_at_once=4, **settings), seed=5)
    assert joint.together.at_once == 4
    clients = list(range(len(data.sizes)))
    expected = [alone.local_update(c, 2) for c in clients]
    got = joint.train_clients(2, clients)
    for (u_alone, w_alone), (u_joint, w_joint) in zip(expected, got, strict=True):
        assert w_joint == w_alone
        assert u_joint.dtype == np.float32 and u_joint.shape == u_alone.shape
        assert _relative(u_alone, u_joint) <= TOLERANCE


def test_groups_smaller_than_the_round_and_other_momenta_give_the_same_updates() -> None:
    data = Uneven(SHAPES["mlp"], sizes=(5, 2, 9, 3, 6))
    for changes in ({"momentum": 0.0, "weight_decay": 0.0}, {"momentum": 0.5, "batch_size": 4, "local_epochs": 3}):
        alone = Learner("mlp", data, _training(**changes), seed=2)
        joint = Learner("mlp", data, _training(clients_at_once=2, **changes), seed=2)
        assert together.group_sizes(5, 2) == [2, 2, 1]
        expected = [u for u, _ in alone.train_clients(1, [4, 0, 2, 1, 3])]
        got = [u for u, _ in joint.train_clients(1, [4, 0, 2, 1, 3])]
        assert max(_relative(a, b) for a, b in zip(expected, got, strict=True)) <= TOLERANCE


def test_a_client_that_finished_is_left_unchanged_by_the_others_steps() -> None:
    # one sample, batch 3, one epoch: a single step; its update alone is the same whether its group runs
    # one step or ten
    data = Uneven(SHAPES["linear"], sizes=(1, 30))
    short = Learner("linear", data, _training(local_epochs=1, clients_at_once=1), seed=1).local_update(0, 1)[0]
    grouped = Learner("linear", data, _training(local_epochs=1, clients_at_once=2), seed=1).train_clients(1, [0, 1])
    assert _relative(short, grouped[0][0]) <= TOLERANCE


def test_the_schedule_is_the_loops_own_shuffle() -> None:
    plan = together.schedule(7, 10, _training(batch_size=4, local_epochs=2), seed=3, round=5)
    assert [s.shape[0] for s in plan.steps] == [4, 4, 2, 4, 4, 2]
    from sim.seeds import Stream, int_seed

    order = torch.Generator().manual_seed(int_seed(3, Stream.TRAINING, 5, 7))
    first, second = torch.randperm(10, generator=order), torch.randperm(10, generator=order)
    assert torch.equal(torch.cat(plan.steps[:3]), first) and torch.equal(torch.cat(plan.steps[3:]), second)


def test_train_clients_is_deterministic_and_keeps_the_order_asked() -> None:
    data = Uneven(SHAPES["cnn"])
    first = Learner("cnn", data, _training(clients_at_once=3), seed=4).train_clients(1, [3, 1, 0, 2])
    again = Learner("cnn", data, _training(clients_at_once=3), seed=4).train_clients(1, [3, 1, 0, 2])
    assert [w for _, w in first] == [4.0, 1.0, 7.0, 10.0]
    for (a, _), (b, _) in zip(first, again, strict=True):
        assert np.array_equal(a, b)


def test_auto_on_the_cpu_follows_the_measured_rule() -> None:
    small = Learner("cnn", Uneven((1, 8, 8)), _training(clients_at_once=None, batch_size=10), seed=1)
    assert small.together.at_once > 1 and small.together.why.startswith("auto: together")
    large = Learner("cnn", Uneven((1, 28, 28)), _training(clients_at_once=None, batch_size=20), seed=1)
    assert large.together.at_once == 1
    assert "one at a time is faster" in large.together.why
    macs = module_multiply_adds(large.model, (1, 28, 28))
    assert macs == multiply_adds("cnn", (1, 28, 28), 5)
    assert macs * 20 > together.CPU_STEP_LIMIT >= module_multiply_adds(small.model, (1, 8, 8)) * 10


def test_groups_are_sized_to_the_memory_and_a_model_too_large_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = Uneven(SHAPES["mlp"])
    need = together.bytes_per_client(Learner("mlp", data, _training(), seed=1).model, SHAPES["mlp"], 3, 10)
    monkeypatch.setattr(together, "free_bytes", lambda device: int(need * 3.5 / together.MEMORY_SHARE))
    assert Learner("mlp", data, _training(clients_at_once=None), seed=1).together.at_once == 2  # a power of 2
    monkeypatch.setattr(together, "free_bytes", lambda device: int(need * 2 / together.MEMORY_SHARE) + 1)
    assert Learner("mlp", data, _training(clients_at_once=None), seed=1).together.at_once == 2
    capped = Learner("mlp", data, _training(clients_at_once=4), seed=1).together
    assert capped.at_once == 2 and "4 asked; 2 fit in memory" in capped.why
    monkeypatch.setattr(together, "free_bytes", lambda device: need)
    with pytest.raises(InputError, match=r"model mlp: training one client together .* GiB .*clients_at_once: 1"):
        Learner("mlp", data, _training(clients_at_once=None), seed=1)


class _Branchy(torch.nn.Module):
    """A model whose forward pass branches on its data: torch.func.vmap cannot vectorise it."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dense(x.flatten(1))
        return out * 2 if float(out.detach().sum()) > 0 else out


def test_a_model_that_cannot_be_vectorised_falls_back_under_auto_and_is_refused_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sim.learning.trainer.make_model", lambda *a, **k: _Branchy())
    data = Uneven(SHAPES["linear"])
    fallback = Learner("linear", data, _training(clients_at_once=None), seed=1)
    assert fallback.together.at_once == 1
    assert "cannot be trained together (torch.func.vmap" in fallback.together.why
    assert fallback.manifest()["clients_at_once_why"] == fallback.together.why
    with pytest.raises(InputError, match=r"training.clients_at_once: 3: linear cannot be trained together"):
        Learner("linear", data, _training(clients_at_once=3), seed=1)


def _frozen_first_layer() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5))
    model[1].weight.requires_grad_(False)
    model[1].bias.requires_grad_(False)
    return model


class _Unused(torch.nn.Module):
    """A model with a parameter its forward pass never uses: the loop's SGD leaves it (no weight decay)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(16, 5)
        self.spare = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x.flatten(1))


@pytest.mark.parametrize("build", [_frozen_first_layer, _Unused])
def test_parameters_the_loop_does_not_step_stay_the_global_models(
    build: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.learning.trainer.make_model", lambda *a, **k: build())  # type: ignore[operator]
    data = Uneven(SHAPES["linear"], sizes=(6, 4))
    alone = Learner("linear", data, _training(weight_decay=0.01), seed=1)
    joint = Learner("linear", data, _training(weight_decay=0.01, clients_at_once=None), seed=1)
    assert joint.together.at_once > 1
    expected = [alone.local_update(c, 1)[0] for c in (0, 1)]
    got = [u for u, _ in joint.train_clients(1, [0, 1])]
    for a, b in zip(expected, got, strict=True):
        assert _relative(a, b) <= TOLERANCE
        assert np.array_equal(a == 0, b == 0)  # the parameters left alone are exactly unchanged


class _BatchStatistics(torch.nn.Module):
    """Batch normalisation without running statistics: a sample's output depends on its batch."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(16, 6)
        self.norm = torch.nn.BatchNorm1d(6, track_running_stats=False)
        self.out = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.dense(x.flatten(1))))


def test_a_model_with_batch_statistics_trains_one_at_a_time_under_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sim.learning.trainer.make_model", lambda *a, **k: _BatchStatistics())
    learner = Learner("linear", Uneven(SHAPES["linear"]), _training(clients_at_once=None), seed=1)
    assert learner.together.at_once == 1
    assert "depends on the rest of its batch" in learner.together.why
    with pytest.raises(InputError, match="depends on the rest of its batch"):
        Learner("linear", Uneven(SHAPES["linear"]), _training(clients_at_once=2), seed=1)


def test_a_model_with_batch_statistics_is_counted_on_one_sample() -> None:
    # the meta-device pass runs the model in eval mode: batch normalisation takes a batch of one there
    from sim.learning.flops import activations_per_sample

    assert module_multiply_adds(_BatchStatistics(), (1, 4, 4)) == 16 * 6 + 6 * 5
    assert activations_per_sample(_BatchStatistics(), (1, 4, 4)) == 6 + 6 + 5


def test_training_together_after_an_evaluation_trains_in_training_mode() -> None:
    # evaluation leaves the model in eval mode; a model whose forward pass reads it must train as the loop does
    class _ModeAware(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense = torch.nn.Linear(16, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.dense(x.flatten(1))
            return out * 3 if self.training else out

    data = Uneven(SHAPES["linear"])
    import sim.learning.trainer as trainer

    original = trainer.make_model
    trainer.make_model = lambda *a, **k: _ModeAware()  # type: ignore[assignment]
    try:
        alone = Learner("linear", data, _training(), seed=1)
        joint = Learner("linear", data, _training(clients_at_once=4), seed=1)
    finally:
        trainer.make_model = original
    alone.evaluate()
    joint.evaluate()
    joint.prefetch(1, [0, 1])  # as the engine does: name the round's clients, then take each update
    for c in (1, 0):
        assert _relative(alone.local_update(c, 1)[0], joint.local_update(c, 1)[0]) <= TOLERANCE


def _tiny_run(tmp_path: Path, folder: str, training: dict[str, object]) -> Path:
    """A two-round run of a small CNN on digits into ``tmp_path / folder`` (its tables name the run "tiny")."""
    from sim.api import load_scenario, run

    scenario = load_scenario(
        {
            "name": "tiny",
            "seed": 3,
            "rounds": 2,
            "population": 12,
            "sampling": {"clients_per_round": 5},
            "dropout": {"rate": 0.2, "stage": "before_upload"},
            "data": {"dataset": "digits", "partition": {"dirichlet": 1.0}},
            "model": {"name": "cnn"},
            "training": {"local_epochs": 2, "batch_size": 16, **training},
            "output": str(tmp_path / folder),
        }
    )
    run(scenario, progress=False)
    return tmp_path / folder


def _tables(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.csv"))}


def test_a_run_that_trains_together_is_reproducible_and_its_manifest_says_how(tmp_path: Path) -> None:
    first = _tiny_run(tmp_path, "a", {"clients_at_once": 5})
    again = _tiny_run(tmp_path, "b", {"clients_at_once": 5})
    assert _tables(first) == _tables(again)
    manifest = json.loads((first / "manifest.json").read_text())
    training = manifest["training"]
    assert (training["device"], training["torch"], training["cuda"]) == ("cpu", torch.__version__, torch.version.cuda)
    assert training["clients_at_once"] == 5 and training["clients_at_once_requested"] == 5
    assert manifest["scenario"]["training"]["device"] == "auto"
    alone = Learner("cnn", Uneven(SHAPES["cnn"]), _training(clients_at_once=1), seed=1).manifest()
    assert (alone["clients_at_once"], alone["clients_at_once_why"]) == (
        1,
        "training.clients_at_once is 1: one at a time",
    )


def test_a_training_worker_trains_its_share_of_the_clients_as_the_learner_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # what a worker process of training.workers runs (sim.learning.pool._train), here in this process
    from sim.learning import pool

    data = Uneven(SHAPES["mlp"])
    learner = Learner("mlp", data, _training(clients_at_once=4), seed=2)
    monkeypatch.setattr(pool, "_worker", [learner])
    expected = Learner("mlp", data, _training(clients_at_once=4), seed=2).train_clients(3, [2, 0, 3])
    got = pool._train(learner.params.copy(), 3, [2, 0, 3])
    assert [w for _, w in got] == [w for _, w in expected]
    for (a, _), (b, _) in zip(expected, got, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_run_is_reproducible_and_agrees_with_the_cpu(tmp_path: Path) -> None:
    gpu = _tiny_run(tmp_path, "gpu", {"device": "cuda"})
    again = _tiny_run(tmp_path, "gpu2", {"device": "cuda"})
    cpu = _tiny_run(tmp_path, "cpu", {"device": "cpu"})
    assert _tables(gpu) == _tables(again)
    accuracy = [np.genfromtxt(f / "rounds.csv", delimiter=",", names=True)["accuracy"] for f in (gpu, cpu)]
    assert np.allclose(accuracy[0], accuracy[1], atol=0.02)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", MODELS)
def test_on_a_gpu_every_model_trains_together_as_each_client_alone(model: str) -> None:
    data = Uneven(SHAPES[model])
    alone = Learner(model, data, _training(device="cuda", local_epochs=1), seed=5)
    joint = Learner(model, data, _training(device="cuda", local_epochs=1, clients_at_once=4), seed=5)
    expected = [alone.local_update(c, 2)[0] for c in range(4)]
    got = [u for u, _ in joint.train_clients(2, [0, 1, 2, 3])]
    assert max(_relative(a, b) for a, b in zip(expected, got, strict=True)) <= 1e-3  # TF32 convolutions
