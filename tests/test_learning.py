"""Partitions, models and local training: exact where the arithmetic allows, properties otherwise."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.learning.datasets import DataError
from sim.learning.federated import (
    SHAPES,
    SyntheticData,
    dirichlet_partition,
    iid_partition,
    load_federated,
    natural_partition,
)
from sim.learning.models import build_model, count_parameters, train_op
from sim.learning.trainer import Learner, local_batches
from sim.scenario.types import Data, Partition, Training


def data_config(**kw) -> Data:
    base = {
        "dataset": "digits",
        "partition": Partition("iid"),
        "path": None,
        "test_fraction": 0.2,
        "samples_per_client": 12,
        "writers_per_client": 1,
    }
    base.update(kw)
    return Data(**base)


TRAINING = Training(local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=0.0, server_lr=1.0, threads=1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), clients=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_iid_partition_covers_every_sample_once_in_near_equal_parts(n, clients, seed):
    clients = min(clients, n)
    parts = iid_partition(n, clients, np.random.default_rng(seed))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 4), min_size=10, max_size=200),
    clients=st.integers(1, 10),
    alpha=st.floats(0.05, 10),
    seed=st.integers(0, 2**32),
)
def test_dirichlet_partition_covers_every_sample_once_and_leaves_nobody_empty(labels, clients, alpha, seed):
    y = np.asarray(labels)
    parts = dirichlet_partition(y, clients, alpha, np.random.default_rng(seed))
    assert len(parts) == clients
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))
    assert all(len(p) >= 1 for p in parts)


def test_dirichlet_skews_labels_more_for_small_alpha():
    y = np.repeat(np.arange(10), 200)

    def skew(alpha):
        parts = dirichlet_partition(y, 20, alpha, np.random.default_rng(0))
        return np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts])

    assert skew(0.1) > 0.6 > skew(100.0)


def test_natural_partition_groups_consecutive_writers():
    writers = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    parts = natural_partition(writers, 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5, 6], [7]]


def test_digits_partition_is_seeded():
    a = load_federated(data_config(partition=Partition("dirichlet", 1.0)), 30, seed=1)
    b = load_federated(data_config(partition=Partition("dirichlet", 1.0)), 30, seed=1)
    c = load_federated(data_config(partition=Partition("dirichlet", 1.0)), 30, seed=2)
    assert [a.num_samples(i) for i in range(30)] == [b.num_samples(i) for i in range(30)]
    assert [a.num_samples(i) for i in range(30)] != [c.num_samples(i) for i in range(30)]
    assert sum(a.num_samples(i) for i in range(30)) == 1438


def test_too_many_clients_for_the_data_is_a_clear_error():
    with pytest.raises(DataError, match="population 2000 exceeds the 1438 training samples of digits"):
        load_federated(data_config(), 2000, seed=0)


def test_synthetic_data_is_generated_per_client_and_reproducibly():
    data = SyntheticData(10**6, data_config(dataset="synthetic", partition=Partition("dirichlet", 0.3)), seed=4)
    x, y = data.client_data(999_999)
    x2, y2 = data.client_data(999_999)
    assert x.shape == (12, 1, 8, 8) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(data.client_data(5)[0], x)
    assert data.num_samples(3) == 12 and data.test_data()[0].shape == (1000, 1, 8, 8)


def test_model_sizes():
    # cnn: conv(1->32, 3x3) 320 + conv(32->64, 3x3) 18,496 + dense(64*2*2 -> 128) 32,896 + dense(128 -> 10) 1,290
    assert count_parameters("cnn", (1, 8, 8), 10) == 320 + 18_496 + 32_896 + 1_290
    # On FEMNIST (12x12x64 after pooling): the ~1M-parameter CNN of the distributed-DP papers.
    assert count_parameters("cnn", (1, 28, 28), 62) == 320 + 18_496 + (9216 * 128 + 128) + (128 * 62 + 62)
    assert count_parameters("mlp", (3, 32, 32), 10) == 3072 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    model = build_model("cnn", (1, 8, 8), 10)
    assert sum(p.numel() for p in model.parameters()) == count_parameters("cnn", (1, 8, 8), 10)
    assert list(model.buffers()) == []
    assert train_op("cnn", *SHAPES["femnist"]) == "train.cnn.1x28x28.62"
    with pytest.raises(ValueError, match="at least 6x6"):
        build_model("cnn", (1, 4, 4), 10)


def test_local_batches():
    assert local_batches(25, 10, 2) == 6
    assert local_batches(10, 10, 1) == 1


def test_local_update_is_deterministic_and_fedavg_moves_the_model():
    data = load_federated(data_config(), 20, seed=3)
    a = Learner("cnn", data, TRAINING, seed=3)
    b = Learner("cnn", data, TRAINING, seed=3)
    assert a.model_sha256() == b.model_sha256()
    delta_a, weight = a.local_update(4, round=1)
    delta_b, _ = b.local_update(4, round=1)
    assert weight == data.num_samples(4)
    assert delta_a.dtype == np.float32 and delta_a.shape == (a.dim,)
    assert np.array_equal(delta_a, delta_b)
    other, _ = a.local_update(4, round=2)
    assert not np.array_equal(other, delta_a)
    before = a.params.copy()
    a.apply(delta_a)
    assert np.array_equal(a.params, before + delta_a)
    accuracy, loss = a.evaluate()
    assert 0 <= accuracy <= 1 and loss > 0
