"""Federated data: each client's local samples and the common test set.

Partitions (``data.partition``) of a real data set among ``population`` clients, drawn from the
``PARTITION`` stream:

- ``iid``: a uniform random permutation cut into near-equal parts.
- ``{dirichlet: alpha}``: latent Dirichlet allocation over labels (Hsu et al. 2019; Dordis 6.1 uses
  alpha = 1.0): for each class, the proportions of its samples given to each client are drawn from
  Dir(alpha, ..., alpha). A client left with no sample takes one from the currently largest client
  (lowest index on ties), so every client can train.
- ``natural``: FEMNIST's writers, ``writers_per_client`` consecutive writers per client (Dordis merges
  three); the first ``population`` such clients take part.

``synthetic`` data is procedural and per client, generated from the ``SYNTHETIC`` stream only when a
client is sampled, so populations of millions cost nothing until used: ``classes`` prototypes of shape
``input_shape`` (default ten of 1x8x8), uniform in [0, 1) per pixel, each sample a prototype plus
Gaussian noise (sd 0.6), ``samples_per_client`` samples with labels uniform (``iid``) or from the
client's own Dir(alpha) label distribution. The prototypes are drawn on first use, so a ``timing`` run
(which trains nothing) of CIFAR-sized or larger images allocates no image at all; a ``full`` run holds
``classes`` prototypes and the 1000 test images (4 bytes per value).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from sim.learning.datasets import DataError, Dataset, load_cifar10, load_digits, load_femnist
from sim.scenario.types import SYNTHETIC_CLASSES, SYNTHETIC_SHAPE, Data
from sim.seeds import Stream, generator

SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "synthetic": (SYNTHETIC_SHAPE, SYNTHETIC_CLASSES),
    "femnist": ((1, 28, 28), 62),
    "cifar10": ((3, 32, 32), 10),
}
"""Input shape and number of classes of each data set, known without reading it (``synthetic``: its
default; see :func:`data_shape`)."""


def data_shape(config: Data, population: int = 1, seed: int = 0) -> tuple[tuple[int, ...], int]:
    """Input shape (``(C, H, W)`` for images) and number of classes of the scenario's data: without reading it,
    but for a loader's (:mod:`sim.learning.plugin_data`), which is loaded for the scenario's ``population``
    and ``seed``."""
    if config.dataset == "synthetic":
        return config.input_shape, config.classes
    if config.loader is not None:
        data = load_federated(config, population, seed)
        return data.input_shape, data.num_classes
    return SHAPES[config.dataset]


_SYNTHETIC_NOISE = 0.6
_SYNTHETIC_TEST = 1000


class FederatedData:
    """Clients' local data and the test set; ``client`` indices are population indices."""

    input_shape: tuple[int, ...]
    """The shape of one input: ``(C, H, W)`` for images."""
    num_classes: int

    def num_samples(self, client: int) -> int:
        raise NotImplementedError

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)``: float32 inputs (n, *input_shape), e.g. images (n, C, H, W), and int64 labels of one client."""
        raise NotImplementedError

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


@dataclass
class PartitionedData(FederatedData):
    """A real data set cut into per-client index sets."""

    dataset: Dataset
    parts: list[np.ndarray]

    def __post_init__(self) -> None:
        self.input_shape = self.dataset.input_shape
        self.num_classes = self.dataset.num_classes

    def num_samples(self, client: int) -> int:
        return int(self.parts[client].shape[0])

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.parts[client]
        return self.dataset.x_train[idx], self.dataset.y_train[idx]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.dataset.x_test, self.dataset.y_test


class SyntheticData(FederatedData):
    """Procedural per-client data, generated on demand from the scenario seed."""

    def __init__(self, population: int, config: Data, seed: int) -> None:
        self.input_shape, self.num_classes = data_shape(config)
        self.population = population
        self.config = config
        self.seed = seed

    @cached_property
    def prototypes(self) -> np.ndarray:
        """One float32 image per class, drawn on first use (its own stream: order does not matter)."""
        rng = generator(self.seed, Stream.SYNTHETIC, 0)
        return rng.random((self.num_classes, *self.input_shape)).astype(np.float32)

    def num_samples(self, client: int) -> int:
        return self.config.samples_per_client

    def _labels(self, client: int, rng: np.random.Generator) -> np.ndarray:
        n = self.config.samples_per_client
        if self.config.partition.kind == "dirichlet":
            assert self.config.partition.alpha is not None
            p = rng.dirichlet(np.full(self.num_classes, self.config.partition.alpha))
            return rng.choice(self.num_classes, size=n, p=p).astype(np.int64)
        return rng.integers(0, self.num_classes, size=n).astype(np.int64)

    def _draw(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        noise = rng.normal(0.0, _SYNTHETIC_NOISE, size=(labels.shape[0], *self.input_shape))
        return (self.prototypes[labels] + noise).astype(np.float32)

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        rng = generator(self.seed, Stream.SYNTHETIC, 1, client)
        y = self._labels(client, rng)
        return self._draw(y, rng), y

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self._test

    @cached_property
    def _test(self) -> tuple[np.ndarray, np.ndarray]:
        """The test set, drawn on first use and kept: every evaluation reads it, and drawing it is 1,000
        samples of Gaussian noise (10^7 values at 1x99x101, a quarter of a second)."""
        rng = generator(self.seed, Stream.SYNTHETIC, 2)
        y = rng.integers(0, self.num_classes, size=_SYNTHETIC_TEST).astype(np.int64)
        return self._draw(y, rng), y


def load_federated(config: Data, population: int, seed: int) -> FederatedData:
    """Read (or generate, or have its loader give) the scenario's data set and partition it among
    ``population`` clients."""
    if config.loader is not None:
        # deferred: sim.learning.plugin_data imports sim.learning.federated at import time
        from sim.learning.plugin_data import load_plugin_data

        return load_plugin_data(config, population, seed)
    if config.dataset == "synthetic":
        return SyntheticData(population, config, seed)
    rng = generator(seed, Stream.PARTITION, 0)
    if config.dataset == "digits":
        dataset = load_digits(config.test_fraction, rng)
    elif config.dataset == "femnist":
        assert config.path is not None
        dataset = load_femnist(config.path)
    elif config.dataset == "cifar10":
        assert config.path is not None
        dataset = load_cifar10(config.path)
    else:
        raise DataError(f"unknown dataset {config.dataset!r}")
    prng = generator(seed, Stream.PARTITION, 1)
    n = int(dataset.y_train.shape[0])
    kind = config.partition.kind
    if kind == "natural":
        if dataset.writers is None:
            raise DataError(f"dataset {dataset.name} has no writer ids for a natural partition")
        parts = natural_partition(dataset.writers, config.writers_per_client)
        if population > len(parts):
            raise DataError(
                f"population {population} exceeds the {len(parts)} clients of {dataset.name}'s natural partition "
                f"({config.writers_per_client} writer(s) per client); lower population or writers_per_client"
            )
        parts = parts[:population]
    else:
        if population > n:
            raise DataError(
                f"population {population} exceeds the {n} training samples of {dataset.name}, so some clients "
                "would have no data; lower population, or use dataset synthetic for large populations"
            )
        if kind == "iid":
            parts = iid_partition(n, population, prng)
        else:
            assert config.partition.alpha is not None
            parts = dirichlet_partition(dataset.y_train, population, config.partition.alpha, prng)
    return PartitionedData(dataset, parts)


def iid_partition(n: int, clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation of ``range(n)`` cut into ``clients`` near-equal sorted parts."""
    return [np.sort(p) for p in np.array_split(rng.permutation(n), clients)]


def dirichlet_partition(labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Per-class Dir(alpha) proportions over clients; every client gets at least one sample."""
    buckets: list[list[int]] = [[] for _ in range(clients)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(clients, alpha))
        cuts = (np.cumsum(shares)[:-1] * idx.shape[0]).astype(np.int64)
        for client, part in enumerate(np.split(idx, cuts)):
            buckets[client].extend(part.tolist())
    for client in range(clients):
        if not buckets[client]:
            donor = max(range(clients), key=lambda c: (len(buckets[c]), -c))
            buckets[client].append(buckets[donor].pop())
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def natural_partition(writers: np.ndarray, writers_per_client: int) -> list[np.ndarray]:
    """Client k holds the samples of writers ``k*w .. k*w + w - 1`` (w = ``writers_per_client``)."""
    groups = writers // writers_per_client
    order = np.argsort(groups, kind="stable")
    counts = np.bincount(groups)
    return [np.sort(p) for p in np.split(order, np.cumsum(counts)[:-1])]
