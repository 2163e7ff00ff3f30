"""A user's own data: ``data: {loader: "pkg.module:function", args: {...}}`` (or an installed
``dropsim.datasets`` entry point's name as ``loader`` or ``dataset``), a plug-in of :mod:`sim.plugins`.

The loader is called with ``args`` as keyword arguments, and with ``population`` and ``seed`` (the
scenario's) when it names them among its parameters. It returns a mapping:

- ``clients``: a list of ``(inputs, labels)``, one per client of the population, in its order; or
- ``train``: ``(inputs, labels)``, cut among the clients by the scenario's ``data.partition`` (``iid`` or
  ``{dirichlet: alpha}``, from the ``PARTITION`` stream as for the built-in data sets; ``natural`` with
  ``writers``, one writer id per training sample);
- ``test``: ``(inputs, labels)``, the held-out set the global model is evaluated on (required);
- ``classes`` (optional): the number of labels; else the largest label plus one.

Inputs are arrays (numpy or torch) of shape ``(samples, *input_shape)`` whose values convert to float32, the
same ``input_shape`` everywhere; labels are one whole number per sample in ``[0, classes)``. :func:`check`
says what is wrong, naming the part (``clients[3]``, ``test``) and what was expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sim.learning.datasets import Dataset
from sim.learning.federated import (
    FederatedData,
    PartitionedData,
    dirichlet_partition,
    iid_partition,
    natural_partition,
)
from sim.plugins import PluginError, call, resolve
from sim.scenario.types import Data
from sim.seeds import Stream, generator

KEYS = ("clients", "train", "test", "classes", "writers")
"""Keys of a loader's mapping."""


class LoaderError(PluginError):
    """A loader's data that cannot be used: which part, and what was expected."""


class ClientData(FederatedData):
    """Data given per client (a loader's ``clients``)."""

    def __init__(
        self, clients: list[tuple[np.ndarray, np.ndarray]], test: tuple[np.ndarray, np.ndarray], classes: int
    ) -> None:
        self.clients = clients
        self.test = test
        self.input_shape = tuple(int(s) for s in test[0].shape[1:])
        self.num_classes = classes

    def num_samples(self, client: int) -> int:
        return int(self.clients[client][1].shape[0])

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        return self.clients[client]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.test


_LOADED: dict[tuple[str, str, int, int], tuple[Mapping[str, Any], str]] = {}
"""The last loader results of this process, by loader, args, population and seed (a run's checks, its
privacy plan and its data read the loader once)."""


def call_loader(config: Data, population: int, seed: int, where: str) -> tuple[Mapping[str, Any], str]:
    """The loader's mapping (checked to be one) and its import path; called once per process for the same
    loader, args, population and seed."""
    assert config.loader is not None
    key = (config.loader, json.dumps(config.args, sort_keys=True, default=repr), population, seed)
    if key not in _LOADED:
        loader, ref = resolve("dataset", config.loader, where)
        result = call(loader, config.args, {"population": population, "seed": seed}, ref.path, where)
        if not isinstance(result, Mapping):
            raise LoaderError(
                f"{where}: {ref.path} returned a {type(result).__name__}; a mapping with clients (or train) and "
                "test is expected (docs/plugins.md)"
            )
        if len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = (result, ref.path)
    return _LOADED[key]


def load_plugin_data(config: Data, population: int, seed: int, where: str = "data.loader") -> FederatedData:
    """The loader's data, checked (:func:`check`) and cut among ``population`` clients."""
    result, path = call_loader(config, population, seed, where)
    return check(result, config, population, seed, f"{where}: {path}")


def check(result: Mapping[str, Any], config: Data, population: int, seed: int, where: str) -> FederatedData:
    """The loader's ``result`` as arrays, or a :class:`LoaderError` naming the part and what was expected."""

    def fail(message: str) -> LoaderError:
        return LoaderError(f"{where}: {message} (docs/plugins.md)")

    unknown = [str(k) for k in result if k not in KEYS]
    if unknown:
        raise fail(f"returned unknown key(s) {', '.join(unknown)}; allowed: {', '.join(KEYS)}")
    if ("clients" in result) == ("train" in result):
        raise fail("returned " + ("both clients and train" if "clients" in result else "neither clients nor train"))
    if "test" not in result:
        raise fail("returned no test set: a test (inputs, labels) is required")
    if "writers" in result and "train" not in result:
        raise fail("returned writers without train: writer ids cut a train set (partition natural)")
    test = _pair(result["test"], "test", fail)
    if test[1].shape[0] == 0:
        raise fail("returned an empty test set: the global model is evaluated on it, so it needs a sample")
    if "clients" in result:
        clients = result["clients"]
        if not isinstance(clients, Sequence) or isinstance(clients, str | bytes):
            raise fail(f"returned clients as a {type(clients).__name__}; a list of (inputs, labels) is expected")
        if len(clients) != population:
            raise fail(f"returned {len(clients)} clients; population is {population}: one (inputs, labels) each")
        parts = [_pair(c, f"clients[{i}]", fail) for i, c in enumerate(clients)]
        empty = [i for i, (_, y) in enumerate(parts) if y.shape[0] == 0]
        if empty:
            raise fail(f"clients[{empty[0]}] has no samples: every client needs one to train")
        if config.partition.kind != "iid":
            raise fail(
                f"returned clients, which data.partition {config.partition.kind} has nothing to cut (it cuts a train "
                "set); remove data.partition or return train"
            )
        named = [*(f"clients[{i}]" for i in range(len(parts))), "test"]
        pairs = [*parts, test]
    else:
        train = _pair(result["train"], "train", fail)
        named, pairs = ["train", "test"], [train, test]
    shape = pairs[-1][0].shape[1:]
    for name, (x, _) in zip(named, pairs, strict=True):
        if x.shape[1:] != shape:
            raise fail(
                f"{name} has inputs of shape {tuple(x.shape[1:])}, test {tuple(shape)}: every input must have the "
                "same shape"
            )
    largest = max(int(y.max()) if y.shape[0] else -1 for _, y in pairs)
    classes = largest + 1
    if "classes" in result:
        given = result["classes"]
        if isinstance(given, bool) or not isinstance(given, int | np.integer) or given < 1:
            raise fail(f"returned classes {given!r}; a whole number >= 1 is expected")
        classes = int(given)
        for name, (_, y) in zip(named, pairs, strict=True):
            if y.shape[0] and int(y.max()) >= classes:
                raise fail(f"{name} has label {int(y.max())}, outside [0, {classes}) (classes is {classes})")
    if "clients" in result:
        return ClientData(parts, test, classes)
    x, y = pairs[0]
    writers = None
    if "writers" in result:
        writers = _array(result["writers"], "writers", fail)
        if writers.shape != y.shape or not _integral(writers) or (writers.size and writers.min() < 0):
            raise fail("returned writers that are not one whole number >= 0 per training sample")
        writers = writers.astype(np.int64)
    dataset = Dataset("loader", x, y, test[0], test[1], classes, writers)
    return PartitionedData(dataset, _parts(dataset, config, population, seed, fail))


def _parts(dataset: Dataset, config: Data, population: int, seed: int, fail: Any) -> list[np.ndarray]:
    n = int(dataset.y_train.shape[0])
    kind = config.partition.kind
    if kind == "natural":
        if dataset.writers is None:
            raise fail("gave no writers: partition natural needs one writer id per training sample")
        parts = natural_partition(dataset.writers, 1)
        if population > len(parts):
            raise fail(f"gave {len(parts)} writers for a natural partition; population is {population}")
        return parts[:population]
    if population > n:
        raise fail(f"gave {n} training samples; population is {population}, so some clients would have none")
    rng = generator(seed, Stream.PARTITION, 1)
    if kind == "iid":
        return iid_partition(n, population, rng)
    assert config.partition.alpha is not None
    return dirichlet_partition(dataset.y_train, population, config.partition.alpha, rng)


def _array(value: Any, name: str, fail: Any) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise fail(f"{name} is a {type(value).__name__}; a numpy array or torch tensor is expected")
    return value


def _integral(a: np.ndarray) -> bool:
    if np.issubdtype(a.dtype, np.integer):
        return True
    return bool(np.issubdtype(a.dtype, np.floating) and np.all(np.isfinite(a)) and np.all(a == np.round(a)))


def _pair(value: Any, name: str, fail: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs float32, labels int64)`` of one part, checked."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise fail(f"{name} is {type(value).__name__}; a pair (inputs, labels) is expected")
    x = _array(value[0], f"{name} inputs", fail)
    y = _array(value[1], f"{name} labels", fail)
    if x.ndim < 2:
        raise fail(f"{name} inputs have shape {x.shape}; (samples, *input_shape) is expected")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise fail(f"{name} inputs are of dtype {x.dtype}; numbers are expected")
    x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise fail(f"{name} inputs hold NaN or infinite values")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise fail(f"{name} labels have shape {y.shape}; one label per input, shape ({x.shape[0]},), is expected")
    if not _integral(y):
        raise fail(f"{name} labels are not whole numbers (dtype {y.dtype})")
    if y.shape[0] and y.min() < 0:
        raise fail(f"{name} has label {int(y.min())}; labels are class indices >= 0")
    return np.ascontiguousarray(x), y.astype(np.int64)
