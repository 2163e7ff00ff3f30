"""Multiply-adds of a built-in model's forward pass, per sample: a size of its computation.

A multiply-add (multiply-accumulate, MAC) is one product added to a sum. Counted for the layers that do
the model's arithmetic, and only those:

- ``Conv2d``: ``out_channels * (in_channels / groups) * kh * kw`` per output position, times the output's
  ``H_out * W_out`` positions;
- ``Linear``: ``in_features * out_features``.

Biases, activations, pooling and normalisation are left out (each is O(outputs), not O(outputs x
fan-in)). The model is built on torch's ``meta`` device and run once on a meta input of one sample with a
forward hook on every counted layer: shapes propagate, but no memory is allocated and nothing is
computed, so a VGG-19 costs what a linear model does.
"""

from __future__ import annotations

import torch
from torch import nn

from sim.learning.models import build_model


def multiply_adds(model: str, input_shape: tuple[int, int, int], num_classes: int) -> int:
    """Multiply-adds of one forward pass of one ``input_shape`` (C, H, W) sample through built-in ``model``
    (:data:`sim.learning.models.MODELS`) with ``num_classes`` outputs; raises ``ValueError`` for an
    unknown model or a shape it cannot take."""
    total = 0

    def count(layer: nn.Module, _inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(layer, nn.Conv2d):
            kh, kw = layer.kernel_size
            per_position = layer.out_channels * (layer.in_channels // layer.groups) * kh * kw
            total += per_position * output.shape[-2] * output.shape[-1]
        elif isinstance(layer, nn.Linear):
            total += layer.in_features * layer.out_features

    with torch.device("meta"):
        net = build_model(model, input_shape, num_classes)
        handles = [m.register_forward_hook(count) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        try:
            with torch.no_grad():
                net(torch.empty((1, *input_shape)))
        finally:
            for h in handles:
                h.remove()
    return total
