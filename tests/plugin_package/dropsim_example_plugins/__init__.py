"""A plug-in of each kind for dropsim's tests (docs/plugins.md): a small CNN, a data set built in memory, a
dropout model, a privacy strategy, and broken ones for the errors.

``dropsim_example_plugins-0.1.dist-info`` beside this package makes it an installed distribution, with entry
points, for whatever has this folder on its path (``PYTHONPATH``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import nn

from sim.dp.strategies import RoundNoise, Strategy
from sim.scenario.dropout_modes import DropoutMode


# -- models ---------------------------------------------------------------------------------------
def small_cnn(input_shape: tuple[int, int, int], num_classes: int, width: int = 8) -> nn.Module:
    """One 3x3 convolution of ``width`` channels, a 2x2 max-pool, one dense layer."""
    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(width * (h // 2) * (w // 2), num_classes),
    )


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 16) -> nn.Module:
    """For inputs of any shape: flattened, one hidden layer."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def with_batch_norm(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A model with buffers (batch-norm running statistics)."""
    return nn.Sequential(nn.Conv2d(input_shape[0], 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(num_classes))


def not_a_model(input_shape: tuple[int, int, int], num_classes: int) -> str:
    return "a model"


def too_many_outputs(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes + 1))


# -- data -----------------------------------------------------------------------------------------
def _blobs(rng: np.random.Generator, centres: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, centres.shape[0], size=n)
    images = centres[labels] + rng.normal(0.0, 0.3, size=(n, *centres.shape[1:]))
    return images.astype(np.float32), labels


def blobs(population: int, seed: int, samples: int = 24, classes: int = 4) -> dict[str, Any]:
    """``classes`` noisy 1x8x8 prototypes; ``samples`` per client, a client's labels skewed to two classes."""
    rng = np.random.default_rng(seed)
    centres = rng.random((classes, 1, 8, 8))
    clients = []
    for k in range(population):
        x, y = _blobs(rng, centres, samples)
        y = np.where(rng.random(samples) < 0.5, y, k % classes)  # half its labels are its own class
        x = (centres[y] + rng.normal(0.0, 0.3, size=x.shape)).astype(np.float32)
        clients.append((x, y))
    test = _blobs(rng, centres, 200)
    return {"clients": clients, "test": (torch.from_numpy(test[0]), torch.from_numpy(test[1])), "classes": classes}


def pooled(seed: int, samples: int = 400, flat: bool = False) -> dict[str, Any]:
    """The same kind of data as one train set, for ``data.partition`` to cut; ``flat``: rows of 64 values."""
    rng = np.random.default_rng(seed)
    centres = rng.random((4, 1, 8, 8))
    train, test = _blobs(rng, centres, samples), _blobs(rng, centres, 100)
    if flat:
        train, test = (train[0].reshape(samples, 64), train[1]), (test[0].reshape(100, 64), test[1])
    return {"train": train, "test": test}


def tabular(population: int) -> dict[str, Any]:
    """Rows of 16 features, not images."""
    rng = np.random.default_rng(0)
    clients = [(rng.random((10, 16)), rng.integers(0, 3, 10)) for _ in range(population)]
    return {"clients": clients, "test": (rng.random((30, 16)), rng.integers(0, 3, 30)), "classes": 3}


def too_few_clients(population: int) -> dict[str, Any]:
    data = blobs(population - 1, 0)
    return {"clients": data["clients"], "test": data["test"]}


def ragged(population: int) -> dict[str, Any]:
    data = blobs(population, 0)
    x, y = data["clients"][2]
    data["clients"][2] = (x[:, :, :4, :], y)
    return data


def bad_labels(population: int) -> dict[str, Any]:
    data = blobs(population, 0)
    x, y = data["clients"][1]
    data["clients"][1] = (x, y + 0.5)
    return data


# -- dropout --------------------------------------------------------------------------------------
class Battery(DropoutMode):
    """Each client's battery is full or low, drawn once per run (low with probability ``low_fraction``); a
    sampled client drops with probability ``p_low`` if low, else ``p_full``."""

    uses_rate = False

    def __init__(self, low_fraction: float = 0.3, p_low: float = 0.8, p_full: float = 0.05) -> None:
        self.low_fraction, self.p_low, self.p_full = low_fraction, p_low, p_full

    def can_drop(self, config: Any) -> bool:
        return self.p_low > 0 or self.p_full > 0

    def prepare(self, config: Any, population: int, seed: int) -> np.ndarray:
        low = np.random.default_rng([seed, 7]).random(population) < self.low_fraction
        return np.where(low, self.p_low, self.p_full)

    def drops(self, config: Any, state: np.ndarray, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        return sampled[rng.random(sampled.shape[0]) < state[sampled]]


class Outsider(DropoutMode):
    """Broken: drops a client that was not sampled."""

    def drops(self, config: Any, state: Any, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        return np.array([int(sampled.max()) + 1])


# -- strategies -----------------------------------------------------------------------------------
class Doubled(Strategy):
    """Orig with twice the noise: every client adds chi(2 sigma^2 / n); nothing removed."""

    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (2 * plan.sigma / plan.sampled,)


class Inexact(Strategy):
    """Broken: a variance as a float."""

    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (float(plan.sigma) / plan.sampled,)  # type: ignore[return-value]
