"""Multiply-adds of a built-in model's forward pass, per sample: a size of its computation.

A multiply-add (multiply-accumulate, MAC) is one product added to a sum. Counted for the layers that do
the model's arithmetic, and only those:

- ``Conv2d``: ``out_channels * (in_channels / groups) * kh * kw`` per output position, times the output's
  ``H_out * W_out`` positions;
- ``Linear``: ``in_features * out_features``.

Biases, activations, pooling and normalisation are left out (each is O(outputs), not O(outputs x
fan-in)). The model is built on torch's ``meta`` device and run once on a meta input of two samples with a
forward hook on every counted layer: shapes propagate, but no memory is allocated and nothing is
computed, so a VGG-19 costs what a linear model does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from sim.learning.models import build_model


def multiply_adds(model: str, input_shape: tuple[int, int, int], num_classes: int) -> int:
    """Multiply-adds of one forward pass of one ``input_shape`` (C, H, W) sample through built-in ``model``
    (:data:`sim.learning.models.MODELS`) with ``num_classes`` outputs; raises ``ValueError`` for an
    unknown model or a shape it cannot take."""
    with torch.device("meta"):
        net = build_model(model, input_shape, num_classes)
    return module_multiply_adds(net, input_shape)


def module_multiply_adds(net: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-adds of one forward pass of one ``input_shape`` sample through ``net`` (any model, a
    plug-in's too), counted on a copy of it on the meta device (``net`` itself is left as it is)."""
    total = 0

    def count(layer: nn.Module, _inputs: tuple[torch.Tensor, ...], output: object) -> None:
        nonlocal total
        if isinstance(layer, nn.Conv2d) and isinstance(output, torch.Tensor):
            kh, kw = layer.kernel_size
            per_position = layer.out_channels * (layer.in_channels // layer.groups) * kh * kw
            total += per_position * output.shape[-2] * output.shape[-1]
        elif isinstance(layer, nn.Linear):
            total += layer.in_features * layer.out_features

    _forward_on_meta(net, input_shape, count, lambda m: isinstance(m, (nn.Conv2d, nn.Linear)))
    return total


def activations_per_sample(net: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Values that ``net``'s leaf modules output for one ``input_shape`` sample (what its backward pass
    keeps, for memory estimates), counted on a copy on the meta device."""
    total = 0

    def count(_layer: nn.Module, _inputs: tuple[torch.Tensor, ...], output: object) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() // _BATCH

    _forward_on_meta(net, input_shape, count, lambda m: not list(m.children()))
    return total


_BATCH = 2
"""Samples in the counting pass: batch normalisation without running statistics refuses a batch of one."""


def _forward_on_meta(
    net: nn.Module,
    input_shape: tuple[int, ...],
    hook: Callable[[nn.Module, tuple[torch.Tensor, ...], object], None],
    hooked: Callable[[nn.Module], bool],
) -> None:
    """A forward pass of :data:`_BATCH` samples through ``net`` on the meta device (a copy, unless it is there
    already; in eval mode), with ``hook`` on every module that is ``hooked``: shapes propagate, nothing is
    computed or allocated. A Conv2d's or Linear's multiply-adds per sample do not depend on the batch; an
    output's values are counted per sample."""
    meta = net if all(p.device.type == "meta" for p in net.parameters()) else copy.deepcopy(net).to("meta")
    meta.eval()
    handles = [m.register_forward_hook(hook) for m in meta.modules() if hooked(m)]
    try:
        with torch.no_grad():  # two samples: batch statistics refuse a batch of one
            meta(torch.empty((_BATCH, *input_shape), device="meta"))
    finally:
        for h in handles:
            h.remove()
