"""Real local training and evaluation with torch; the global model as a flat float32 vector.

A client's local update is ``theta_local - theta_global`` after ``local_epochs`` of mini-batch SGD with
momentum from the global model, mini-batches in an order drawn from the client's ``TRAINING`` stream for
the round. The server applies ``theta <- theta + server_lr * aggregate`` (FedAvg, McMahan et al. 2017:
with server_lr = 1 the new model is the weighted mean of the client models). The model hash is SHA-256
of the parameters as little-endian float32 bytes.
"""

from __future__ import annotations

import hashlib
import math
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from sim.errors import InputError
from sim.learning.federated import FederatedData, load_federated
from sim.learning.models import make_model
from sim.learning.pool import DataSource, TrainingPool
from sim.plugins import PluginError
from sim.scenario.types import Model, Training
from sim.seeds import Stream, int_seed

_EVAL_BATCH = 1024


class Learner:
    """The global model and the means to train it locally and test it."""

    def __init__(
        self,
        model: Model | str,
        data: FederatedData,
        training: Training,
        seed: int,
        source: DataSource | None = None,
    ) -> None:
        """``model``: the scenario's model section (a built-in's name or a factory plug-in), or a built-in's
        name. ``source`` (the data set's configuration, population and seed) lets ``training.workers`` > 1
        processes build the same data set (and model) themselves."""
        torch.set_num_threads(training.threads)
        torch.manual_seed(int_seed(seed, Stream.MODEL_INIT))
        self.model: nn.Module = make_model(model, data.input_shape, data.num_classes)
        self.data = data
        self.training = training
        self.seed = seed
        self.params = parameters_to_vector(self.model.parameters()).detach().numpy().astype(np.float32)
        self._loss = nn.CrossEntropyLoss()
        self._model_spec = model
        self._source = source
        self._pool: TrainingPool | None = None
        if training.workers > 1:
            if source is None:
                raise ValueError("training.workers > 1 needs the data set's source, to build it in the workers")
            if next(self.model.buffers(), None) is not None:
                raise InputError(
                    f"training.workers: {training.workers} needs a model whose state is its parameters; "
                    f"{_described(model)} has buffers (e.g. batch-norm statistics) that would differ between processes"
                )

    def prefetch(self, round: int, clients: list[int]) -> None:
        """With ``training.workers`` > 1, start training ``clients`` for ``round`` in worker processes;
        :meth:`local_update` then returns their (identical) updates. Without, nothing."""
        if self.training.workers <= 1 or not clients:
            return
        if self._pool is None:
            assert self._source is not None
            build = partial(_worker_learner, self._model_spec, self._source, self.training, self.seed)
            self._pool = TrainingPool(build, self.training.workers)
        self._pool.start(self.params, round, clients, [self.data.num_samples(c) for c in clients])

    def close(self) -> None:
        """Stop the training workers, if any."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def dim(self) -> int:
        return int(self.params.shape[0])

    def _load(self, params: np.ndarray) -> None:
        vector_to_parameters(torch.from_numpy(params.copy()), self.model.parameters())

    def local_update(self, client: int, round: int) -> tuple[np.ndarray, float]:
        """Train ``client`` from the global model; returns ``(delta float32, weight = sample count)``."""
        if self._pool is not None:
            started = self._pool.take(client, round)
            if started is not None:
                return started
        x_np, y_np = self.data.client_data(client)
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
        self._load(self.params)
        self.model.train()
        t = self.training
        optimizer = torch.optim.SGD(self.model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        order = torch.Generator().manual_seed(int_seed(self.seed, Stream.TRAINING, round, client))
        n = int(y.shape[0])
        try:
            for _ in range(t.local_epochs):
                perm = torch.randperm(n, generator=order)
                for start in range(0, n, t.batch_size):
                    batch = perm[start : start + t.batch_size]
                    optimizer.zero_grad(set_to_none=True)
                    loss = self._loss(self.model(x[batch]), y[batch])
                    loss.backward()
                    optimizer.step()
        except Exception as exc:
            if isinstance(self._model_spec, str) or self._model_spec.factory is None:
                raise
            raise PluginError(
                f"model.factory: {self._model_spec.factory}: training client {client} in round {round} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        local = parameters_to_vector(self.model.parameters()).detach().numpy().astype(np.float32)
        return local - self.params, float(n)

    def apply(self, aggregate: np.ndarray) -> None:
        """FedAvg server step with the aggregated (weighted-mean) update."""
        lr = np.float32(self.training.server_lr)
        self.params = (self.params + lr * aggregate.astype(np.float32)).astype(np.float32)

    def evaluate(self) -> tuple[float, float]:
        """``(accuracy, mean cross-entropy loss)`` of the global model on the test set."""
        x_np, y_np = self.data.test_data()
        self._load(self.params)
        self.model.eval()
        correct, loss_sum = 0, 0.0
        with torch.no_grad():
            for start in range(0, y_np.shape[0], _EVAL_BATCH):
                x = torch.from_numpy(x_np[start : start + _EVAL_BATCH])
                y = torch.from_numpy(y_np[start : start + _EVAL_BATCH])
                out = self.model(x)
                loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(dim=1) == y).sum())
        n = int(y_np.shape[0])
        loss = loss_sum / n
        return correct / n, loss if math.isfinite(loss) else float("nan")

    def model_sha256(self) -> str:
        return hashlib.sha256(self.params.astype("<f4").tobytes()).hexdigest()


def _worker_learner(model: Model | str, source: DataSource, training: Training, seed: int) -> Learner:
    """A training worker's own learner (:class:`~sim.learning.pool.TrainingPool`): the same model, seed and
    settings, the data set loaded there from its source (plug-ins imported there by their paths)."""
    return Learner(model, load_federated(*source), training, seed, source)


def _described(model: Model | str) -> str:
    if isinstance(model, str):
        return model
    return model.factory or model.name or "the model"


def local_batches(samples: int, batch_size: int, epochs: int) -> int:
    """Optimizer steps of local training: ``epochs * ceil(samples / batch_size)``."""
    return epochs * math.ceil(samples / batch_size)
