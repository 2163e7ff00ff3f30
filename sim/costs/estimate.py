"""Local training at an input shape the profile has not measured: estimated from a measured shape of the
same model.

A profile times a built-in model's training at a few shapes, as the linear cost of operation
``train.{model}.{C}x{H}x{W}.{classes}`` (:func:`sim.learning.models.train_op`) in ``samples`` (sample
passes), ``batches`` (optimiser steps) and ``const`` (a call). Another shape runs the same layers on other
data sizes: its arithmetic per sample follows its multiply-adds (forward, per sample:
:mod:`sim.learning.flops`), while the per-batch and per-call costs (the framework's dispatch per layer,
the optimiser step, the model's copy) do not. So an unmeasured shape of multiply-adds ``a`` is charged as
the measured shape of the same model whose multiply-adds ``b`` are nearest in log ratio (least
``|ln(a / b)|``, ties to the first name), with only its per-sample coefficient scaled:

    seconds = const + (a / b) * s * samples + bt * batches     (const, s, bt: the measured shape's)

and a role's entry (``op@client``, ``op@server``) of the measured shape gives the estimate's at that role
alike. An operation the profile measures is never estimated. A model with no measured shape at all is
refused (:class:`~sim.costs.model.CostModelError`).

The multiply-adds come in as a function (``count``): this package does not build models, nor load torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.costs.model import CostModel, CostModelError, LinearCost

Count = Callable[[str, tuple[int, int, int], int], int]
"""Multiply-adds per sample of a built-in model at an input shape (C, H, W) and a class count
(:func:`sim.learning.flops.multiply_adds`)."""

SCALED = "samples"
"""The feature of training's linear cost whose coefficient the estimate scales (the rest are kept)."""

_TRAIN_OP = re.compile(r"train\.(?P<model>[A-Za-z0-9_]+)\.(?P<c>\d+)x(?P<h>\d+)x(?P<w>\d+)\.(?P<classes>\d+)")
"""A built-in model's training operation, as :func:`sim.learning.models.train_op` names it."""


def parse_train_op(op: str) -> tuple[str, tuple[int, int, int], int] | None:
    """``(model, (C, H, W), classes)`` of a built-in model's training operation (no role), else None."""
    m = _TRAIN_OP.fullmatch(op)
    if m is None:
        return None
    return m["model"], (int(m["c"]), int(m["h"]), int(m["w"])), int(m["classes"])


@dataclass(frozen=True)
class TrainingEstimate:
    """Training operation ``op`` charged as the measured operation ``source``, its per-sample coefficient
    times :attr:`ratio`."""

    op: str
    """The unmeasured operation, e.g. ``train.linear.1x60x50.10``."""
    source: str
    """The measured operation of the same model it is estimated from."""
    multiply_adds: int
    """Multiply-adds per sample (forward) of ``op``'s model and shape."""
    source_multiply_adds: int
    """Multiply-adds per sample (forward) at ``source``'s shape."""

    def __post_init__(self) -> None:
        if self.multiply_adds <= 0 or self.source_multiply_adds <= 0:
            raise ValueError(
                f"training estimate of {self.op}: multiply-adds must be positive, not "
                f"{self.multiply_adds} and {self.source_multiply_adds}"
            )

    @property
    def ratio(self) -> float:
        """``multiply_adds / source_multiply_adds``: the factor on ``source``'s per-sample coefficient."""
        return self.multiply_adds / self.source_multiply_adds

    def cost(self, measured: LinearCost) -> LinearCost:
        """The estimate's linear cost from ``source``'s (at one role): the :data:`SCALED` coefficient times
        :attr:`ratio`, the others as measured, in ``measured``'s order."""
        return LinearCost({k: c * self.ratio if k == SCALED else c for k, c in measured.coef.items()})

    def applied(self, costs: CostModel) -> CostModel:
        """``costs`` with ``op`` added, and ``op@role`` for each role ``source`` has an entry of; an entry
        the profile already has is kept as it is."""
        added: dict[str, LinearCost] = {}
        for name, measured in costs.operations.items():
            base, at, role = name.partition("@")
            if base == self.source:
                added[f"{self.op}{at}{role}"] = self.cost(measured)
        return costs.with_operations({name: cost for name, cost in added.items() if name not in costs.operations})

    def manifest(self) -> dict[str, Any]:
        """The run manifest's ``training_cost`` entry."""
        return {
            "op": self.op,
            "estimated": True,
            "from": self.source,
            "scaled": SCALED,
            "multiply_adds": self.multiply_adds,
            "from_multiply_adds": self.source_multiply_adds,
            "multiply_adds_ratio": self.ratio,
        }

    def note(self) -> str:
        """One line for ``dropsim check``."""
        return (
            f"the profile does not measure {self.op}: its training time is an estimate from the measured "
            f"{self.source}, the time per sample times {self.ratio:.4g} (the ratio of multiply-adds per sample, "
            f"{self.multiply_adds:,} to {self.source_multiply_adds:,}); measure it with "
            "`dropsim profile --model SCENARIO --out PROFILE` (docs/profiles.md)"
        )


def estimate_training(costs: CostModel, op: str, count: Count) -> TrainingEstimate | None:
    """How ``costs`` charges built-in training operation ``op``: None where it measures ``op``, else the
    estimate from the measured shape of the same model nearest in multiply-adds. Raises
    :class:`CostModelError` where the profile measures no shape of the model. An ``op`` that is not a built-in
    model's on (C, H, W) images (:func:`parse_train_op`) is not estimated (None)."""
    if costs.has(op):
        return None
    target = parse_train_op(op)
    if target is None:  # not a built-in model on images: the profile's own error says what is missing
        return None
    model, shape, classes = target
    measured = {}
    for name in costs.operations:
        parsed = parse_train_op(name)
        if parsed is not None and parsed[0] == model:
            measured[name] = count(*parsed)
    if not measured:
        raise CostModelError(
            f"cost profile {costs.source} measures no shape of model {model!r} (no train.{model}.* operation), "
            f"so its training at {op} cannot be estimated; run `dropsim profile` (every built-in model), or "
            "`dropsim profile --model SCENARIO --out PROFILE` (this one), and use that profile"
        )
    a = count(model, shape, classes)
    source = min(measured, key=lambda name: (abs(math.log(a / measured[name])), name))
    return TrainingEstimate(op, source, a, measured[source])
