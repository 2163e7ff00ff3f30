"""A user's own model: ``model: {factory: "pkg.module:function", args: {...}}`` (or an installed
``dropsim.models`` entry point's name as ``factory`` or ``name``), a plug-in of :mod:`sim.plugins`.

The factory is called with ``args`` as keyword arguments, and with ``input_shape`` (the shape of one input,
e.g. ``(1, 8, 8)``) and ``num_classes`` when it names them among its parameters; it returns a
``torch.nn.Module`` whose output on a batch of inputs is one logit per class. Its parameters, flattened, are
the update: their count is the update's size. The trainer keeps and averages parameters only, so a model
with buffers (batch-norm statistics) keeps each process's own (refused with ``training.workers`` > 1).

:func:`check_model` is what ``dropsim check``, ``run`` and ``sweep`` try before a run starts: the model
builds, is a module with parameters, and maps the data's inputs to ``num_classes`` logits.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import torch
from torch import nn

from sim.plugins import PluginError, call, resolve
from sim.scenario.types import Model


def factory_label(model: Model) -> str:
    """How a cost profile's operation names the factory's model: its function's name (up to 24 letters, digits
    and ``_``), ``-``, and the first 8 hex digits of SHA-256 of its import path and ``args`` as canonical JSON,
    e.g. ``tiny_cnn-faaa46a2``. Models of one factory with other args are other models; an entry point's name
    and the import path it stands for are the same one. Plain characters, so that the name travels in a
    deployment's operation reports (:mod:`sim.deploy.operations`)."""
    assert model.factory is not None
    _, ref = resolve("model", model.factory, "model.factory")
    text = json.dumps([ref.path, model.args], sort_keys=True, separators=(",", ":"), default=repr)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9_]", "_", ref.path.rpartition(":")[2].rpartition(".")[2])[:24]
    return f"{name}-{digest}"


def build_plugin_model(
    model: Model, input_shape: tuple[int, ...], num_classes: int, where: str = "model.factory"
) -> nn.Module:
    """A fresh model from ``model.factory`` (initialised from torch's global generator: seed it first)."""
    assert model.factory is not None
    factory, ref = resolve("model", model.factory, where)
    offered = {"input_shape": tuple(input_shape), "num_classes": num_classes}
    built = call(factory, model.args, offered, ref.path, where)
    if not isinstance(built, nn.Module):
        raise PluginError(
            f"{where}: {ref.path} returned a {type(built).__name__}, not a torch.nn.Module (docs/plugins.md)"
        )
    if not any(p.numel() for p in built.parameters()):
        raise PluginError(f"{where}: {ref.path} returned a {type(built).__name__} without parameters: nothing to train")
    return built


_COUNTS: dict[tuple[str, str, tuple[int, ...], int], int] = {}


def plugin_parameters(model: Model, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Parameters of the factory's model (built once per process, torch's generator left as it was)."""
    assert model.factory is not None
    key = (factory_label(model), "", tuple(input_shape), num_classes)
    if key not in _COUNTS:
        with torch.random.fork_rng(devices=[]):
            built = build_plugin_model(model, input_shape, num_classes)
        _COUNTS[key] = sum(p.numel() for p in built.parameters())
    return _COUNTS[key]


def check_model(module: nn.Module, inputs: np.ndarray, num_classes: int, what: str, where: str) -> None:
    """Raise :class:`PluginError` unless ``module`` maps ``inputs`` (a few of the data's, float32) to one
    logit per class, output of shape ``(len(inputs), num_classes)``, and takes a training step on them (a
    backward pass, in training mode)."""
    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
    module.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = module(x)
    except Exception as exc:
        raise PluginError(
            f"{where}: {what} fails on the data's inputs of shape {tuple(x.shape)}: {type(exc).__name__}: {exc}"
        ) from exc
    expected = (int(x.shape[0]), num_classes)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PluginError(
            f"{where}: {what} gives outputs of shape {shape} for inputs of shape {tuple(x.shape)}; one logit per "
            f"class, shape {expected}, is expected (the data have {num_classes} classes)"
        )
    module.train()
    try:
        with torch.random.fork_rng(devices=[]):
            loss = nn.functional.cross_entropy(module(x), torch.zeros(int(x.shape[0]), dtype=torch.int64))
            loss.backward()
    except Exception as exc:
        raise PluginError(
            f"{where}: {what} fails to train on the data's inputs of shape {tuple(x.shape)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
