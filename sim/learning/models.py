"""Models: a small CNN and an MLP, sized from the data's input shape and class count.

``cnn`` is the EMNIST/FEMNIST CNN of the distributed-DP literature (the "CNN [5, 40]" of Dordis 6.1,
as in TensorFlow Federated's EMNIST example, without dropout): conv 3x3 32, ReLU, conv 3x3 64, ReLU,
max-pool 2, dense 128, ReLU, dense classes. On FEMNIST (1x28x28, 62 classes) it has 1,206,590
parameters; on digits (1x8x8, 10 classes) 53,514. ``mlp`` is the two-hidden-layer "2NN" of McMahan
et al. (200 units each). Models hold parameters only (no buffers), so the flat parameter vector is the
whole model state.
"""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("cnn", "mlp")


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A fresh model; initialised from torch's global generator (seed it first)."""
    c, h, w = input_shape
    if name == "cnn":
        if h < 6 or w < 6:
            raise ValueError(f"cnn needs images of at least 6x6, not {h}x{w}")
        flat = 64 * ((h - 4) // 2) * ((w - 4) // 2)
        return nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(flat, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * h * w, 200),
            nn.ReLU(),
            nn.Linear(200, 200),
            nn.ReLU(),
            nn.Linear(200, num_classes),
        )
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")


def count_parameters(name: str, input_shape: tuple[int, int, int], num_classes: int) -> int:
    """Number of parameters, counted on torch's meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        model = build_model(name, input_shape, num_classes)
    return sum(p.numel() for p in model.parameters())


def train_op(name: str, input_shape: tuple[int, int, int], num_classes: int) -> str:
    """Cost-model operation name of local training, e.g. ``train.cnn.1x8x8.10``."""
    return f"train.{name}.{'x'.join(str(s) for s in input_shape)}.{num_classes}"
