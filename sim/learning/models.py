"""Models: a small CNN, an MLP, and the CIFAR ResNet-18 and VGG-19, sized from the data's input shape
and class count.

``cnn`` is the EMNIST/FEMNIST CNN of the distributed-DP literature (the "CNN [5, 40]" of Dordis 6.1,
as in TensorFlow Federated's EMNIST example, without dropout): conv 3x3 32, ReLU, conv 3x3 64, ReLU,
max-pool 2, dense 128, ReLU, dense classes. On FEMNIST (1x28x28, 62 classes) it has 1,206,590
parameters; on digits (1x8x8, 10 classes) 53,002. ``mlp`` is the two-hidden-layer "2NN" of McMahan
et al. (200 units each). ``linear`` is multinomial logistic regression (one dense layer,
``C*H*W*classes + classes`` parameters): a model whose size is set exactly by the input shape, for timing
studies and the deployment's validation grid (a 1x27x37 input with 10 classes has exactly 10^4
parameters, 1x99x101 with 10 classes 10^5, and with 100 classes 10^6).

``resnet18`` and ``vgg19`` are the CIFAR-10 models of Dordis section 6.4 (the common CIFAR variants,
e.g. github.com/kuangliu/pytorch-cifar): ResNet-18 with a 3x3 stem conv of 64 channels, no max-pool,
BasicBlocks [2, 2, 2, 2] at 64/128/256/512 channels, global average pool, linear; VGG-19 with the
configuration [64, 64, M, 128, 128, M, 256 x4, M, 512 x4, M, 512 x4, M], a normalisation after every
conv, then one Linear(512, classes). Two departures, both without effect on the parameter count:

- Normalisation is GroupNorm (32 groups, Wu & He 2018) in place of BatchNorm. Both learn a scale and
  a shift per channel, so the counts equal the BatchNorm models'; but BatchNorm keeps running
  statistics in buffers, and GroupNorm has none, so the flat parameter vector stays the whole model
  state (what the trainer sends, averages and loads). GroupNorm normalises each sample on its own: the
  same in training and evaluation, defined for a batch of one, and the usual choice under non-IID
  federated data (Hsieh et al., ICML 2020).
- Pooling adapts to small inputs: ResNet ends in a global average pool, VGG's max-pools round up
  (``ceil_mode``) and it ends in a global average pool, so every shipped shape builds (at 3x32x32
  both are exactly the CIFAR models).

Parameters (``count_parameters``; they depend on the input channels and the classes only):

=========  ===================  ====================  =====================
model      1x8x8, 10 classes    1x28x28, 62 classes   3x32x32, 10 classes
=========  ===================  ====================  =====================
resnet18   11,172,810           11,199,486            11,173,962
vgg19      20,039,370           20,066,046            20,040,522
=========  ===================  ====================  =====================

Models hold parameters only (no buffers), so the flat parameter vector is the whole model state.
"""

from __future__ import annotations

import torch
from torch import nn

from sim.learning.federated import data_shape
from sim.learning.plugin_model import build_plugin_model, factory_label, plugin_parameters
from sim.scenario.types import Model, Scenario

MODELS = ("cnn", "mlp", "resnet18", "vgg19", "linear")

PARAMS_TRAIN_OP = "train.params"
"""Cost-model operation of an abstract model's local training (``model: {params: N}``), and of a factory
model's that gives ``train_seconds_per_sample``: the engine charges ``model.train_seconds_per_sample`` per
sample pass under this name, not a profiled cost."""

_GROUPS = 32
"""GroupNorm groups (Wu & He 2018's default); divides every channel count used here."""

_VGG19 = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class GlobalAvgPool(nn.Module):
    """The mean of each channel over the image: ``AdaptiveAvgPool2d(1)`` as a plain mean, whose gradient on a
    GPU is deterministic (adaptive pooling's backward on CUDA is not, and deterministic training refuses
    it: :mod:`sim.learning.device`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3), keepdim=True)


class _BasicBlock(nn.Module):
    """ResNet's two 3x3 convs with a shortcut (a 1x1 conv where the shape changes); He et al. 2016."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.GroupNorm(_GROUPS, cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False),
            nn.GroupNorm(_GROUPS, cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(_GROUPS, cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _resnet18(channels: int, num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False),
        nn.GroupNorm(_GROUPS, 64),
        nn.ReLU(),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [GlobalAvgPool(), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def _vgg19(channels: int, num_classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    cin = channels
    for v in _VGG19:
        if v == "M":
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        else:
            assert isinstance(v, int)
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.GroupNorm(_GROUPS, v), nn.ReLU()]
            cin = v
    layers += [GlobalAvgPool(), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


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
    if name == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))
    if name == "resnet18":
        return _resnet18(c, num_classes)
    if name == "vgg19":
        return _vgg19(c, num_classes)
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")


def make_model(
    model: Model | str, input_shape: tuple[int, ...], num_classes: int, where: str = "model.factory"
) -> nn.Module:
    """A fresh model of a scenario's ``model`` section (or a named model): built here, or by its factory
    plug-in (:mod:`sim.learning.plugin_model`; its errors start with ``where``); initialised from torch's
    global generator (seed it first)."""
    if isinstance(model, Model) and model.factory is not None:
        return build_plugin_model(model, input_shape, num_classes, where)
    name = model if isinstance(model, str) else model.name
    if name is None:
        raise ValueError("an abstract model (model.params) has no weights to build")
    if len(input_shape) != 3:
        raise ValueError(f"model {name} takes images (C, H, W), not inputs of shape {tuple(input_shape)}")
    c, h, w = input_shape
    return build_model(name, (c, h, w), num_classes)


def count_parameters(name: str, input_shape: tuple[int, int, int], num_classes: int) -> int:
    """Number of parameters, counted on torch's meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        model = build_model(name, input_shape, num_classes)
    return sum(p.numel() for p in model.parameters())


def train_op(name: str, input_shape: tuple[int, ...], num_classes: int) -> str:
    """Cost-model operation name of local training, e.g. ``train.cnn.1x8x8.10``; a factory model's is named
    by :func:`model_name`, e.g. ``train.tiny_cnn-faaa46a2.1x12x12.4``."""
    return f"train.{name}.{'x'.join(str(s) for s in input_shape)}.{num_classes}"


def model_name(model: Model) -> str:
    """The name a model's training operation has: the built-in's name, or a factory's
    :func:`~sim.learning.plugin_model.factory_label`."""
    if model.factory is None:
        assert model.name is not None
        return model.name

    return factory_label(model)


def update_dimension(model: Model, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Length of an update: ``model.params`` for an abstract model, else the model's parameters."""
    if model.params is not None:
        return model.params
    if model.factory is not None:
        return plugin_parameters(model, input_shape, num_classes)
    assert model.name is not None and len(input_shape) == 3
    c, h, w = input_shape
    return count_parameters(model.name, (c, h, w), num_classes)


def model_dimension(scenario: Scenario) -> int:
    """Parameters of the scenario's model on its data set's input shape (``model.params`` if abstract)."""
    return update_dimension(scenario.model, *data_shape(scenario.data, scenario.population, scenario.seed))


def model_train_op(model: Model, input_shape: tuple[int, ...], num_classes: int) -> str:
    """The cost-model operation charged for local training: the model's profiled :func:`train_op`, or
    :data:`PARAMS_TRAIN_OP` for a model that trains at its ``train_seconds_per_sample`` (an abstract model,
    or a factory's that gives one)."""
    if model.params is not None or model.train_seconds_per_sample > 0:
        return PARAMS_TRAIN_OP
    return train_op(model_name(model), input_shape, num_classes)


def trains_at_rate(model: Model) -> bool:
    """Whether local training is charged at ``model.train_seconds_per_sample``, not a profiled operation."""
    return model.params is not None or model.train_seconds_per_sample > 0
