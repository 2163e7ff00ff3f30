"""Real local training and evaluation with torch; the global model as a flat float32 vector.

A client's local update is ``theta_local - theta_global`` after ``local_epochs`` of mini-batch SGD with
momentum from the global model, mini-batches in an order drawn from the client's ``TRAINING`` stream for
the round. The server applies ``theta <- theta + server_lr * aggregate`` (FedAvg, McMahan et al. 2017:
with server_lr = 1 the new model is the weighted mean of the client models). The model hash is SHA-256
of the parameters as little-endian float32 bytes.

A round's clients train one at a time (the loop, :meth:`Learner._alone`) or together
(:mod:`sim.learning.together`, ``training.clients_at_once``): the engine names them first
(:meth:`Learner.prefetch`), the first :meth:`Learner.local_update` of the round trains them all, and each
later call takes its own update. Training and evaluation run on ``training.device``
(:mod:`sim.learning.device`), with the clients' data and the test set put there once
(:mod:`sim.learning.shards`); the global model stays a host array, which the protocols encode.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from sim.errors import InputError
from sim.learning.device import describe as describe_device
from sim.learning.device import resolve as resolve_device
from sim.learning.federated import FederatedData, load_federated
from sim.learning.models import make_model
from sim.learning.pool import DataSource, TrainingPool, Update
from sim.learning.shards import Shards, largest_shard
from sim.learning.together import choose_together, group_sizes, schedule
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
        self.device = resolve_device(training.device)
        torch.manual_seed(int_seed(seed, Stream.MODEL_INIT))
        self.model: nn.Module = make_model(model, data.input_shape, data.num_classes).to(self.device)
        self.data = data
        self.training = training
        self.seed = seed
        self.params = parameters_to_vector(self.model.parameters()).detach().cpu().numpy().astype(np.float32)
        self._loss = nn.CrossEntropyLoss()
        self._model_spec = model
        self._source = source
        self._pool: TrainingPool | None = None
        self.shards = Shards(data, self.device, training.workers)
        x0, y0 = self.shards.client(0)
        self.together = choose_together(
            self.model,
            data.input_shape,
            (x0[:2], y0[:2]),
            training,
            self.device,
            _described(model),
            largest_shard(data),
            training.workers,
        )
        """How a round's clients train: together in groups, or one at a time (and why)."""
        self._trainer = self.together.trainer if self.together.at_once > 1 else None
        self._queued: tuple[int, list[int]] | None = None
        """The round and clients :meth:`prefetch` named, trained together on the first :meth:`local_update`."""
        self._trained: dict[tuple[int, int], Update] = {}
        if training.workers > 1:
            if source is None:
                raise ValueError("training.workers > 1 needs the data set's source, to build it in the workers")
            if next(self.model.buffers(), None) is not None:
                raise InputError(
                    f"training.workers: {training.workers} needs a model whose state is its parameters; "
                    f"{_described(model)} has buffers (e.g. batch-norm statistics) that would differ between processes"
                )

    def prefetch(self, round: int, clients: list[int]) -> None:
        """Name the ``clients`` that train in ``round``. With ``training.workers`` > 1, start training them
        in worker processes; else, if they train together, they do on the first :meth:`local_update` of
        the round. :meth:`local_update` then returns their updates."""
        self._trained.clear()  # of clients of earlier rounds that never asked (they left)
        if not clients:
            return
        if self.training.workers > 1:
            if self._pool is None:
                assert self._source is not None
                build = partial(_worker_learner, self._model_spec, self._source, self.training, self.seed)
                self._pool = TrainingPool(build, self.training.workers)
            self._pool.start(self.params, round, clients, [self.data.num_samples(c) for c in clients])
        elif self._trainer is not None:
            self._queued = (round, list(clients))

    def close(self) -> None:
        """Stop the training workers, if any."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def dim(self) -> int:
        return int(self.params.shape[0])

    def _load(self, params: np.ndarray) -> None:
        vector_to_parameters(torch.from_numpy(params.copy()).to(self.device), self.model.parameters())

    def local_update(self, client: int, round: int) -> tuple[np.ndarray, float]:
        """Train ``client`` from the global model; returns ``(delta float32, weight = sample count)``."""
        if self._pool is not None:
            started = self._pool.take(client, round)
            if started is not None:
                return started
        if self._queued is not None and self._queued[0] == round and client in self._queued[1]:
            clients = self._queued[1]
            self._queued = None
            self._trained.update(zip(((round, c) for c in clients), self.train_clients(round, clients), strict=True))
        trained = self._trained.pop((round, client), None)
        if trained is not None:
            return trained
        return self._alone(client, round)

    def train_clients(self, round: int, clients: list[int]) -> list[Update]:
        """The updates of ``clients`` in ``round``: trained together in groups of at most
        ``together.at_once`` (clients of similar sizes in a group), or one at a time."""
        if self._trainer is None:
            return [self._alone(c, round) for c in clients]
        sizes = {c: self.data.num_samples(c) for c in clients}
        ordered = sorted(clients, key=lambda c: (-sizes[c], c))
        found: dict[int, Update] = {}
        start = 0
        for size in group_sizes(len(ordered), self.together.at_once):
            group = ordered[start : start + size]
            start += size
            found.update(zip(group, self._fitting(group, round, sizes), strict=True))
        return [found[c] for c in clients]

    def _fitting(self, clients: list[int], round: int, sizes: dict[int, int]) -> list[Update]:
        """:meth:`_group`, in halves (and for the rest of the run, groups half as large) when the device
        runs out of memory: the memory per client is an estimate (:func:`~sim.learning.together.bytes_per_client`)."""
        try:
            return self._group(clients, round, sizes)
        except torch.cuda.OutOfMemoryError:
            if len(clients) == 1:
                raise
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        half = len(clients) // 2
        if self.together.at_once > half:
            why = f"{self.together.why}; {half} at once after the device ran out of memory in round {round}"
            self.together = replace(self.together, at_once=half, why=why)
        return self._fitting(clients[:half], round, sizes) + self._fitting(clients[half:], round, sizes)

    def _group(self, clients: list[int], round: int, sizes: dict[int, int]) -> list[Update]:
        assert self._trainer is not None
        plans = [schedule(c, sizes[c], self.training, self.seed, round) for c in clients]
        shards = [self.shards.client(c) for c in clients]
        xs = nn.utils.rnn.pad_sequence([x for x, _ in shards], batch_first=True)
        ys = nn.utils.rnn.pad_sequence([y for _, y in shards], batch_first=True)
        global_params = torch.from_numpy(self.params).to(self.device)
        try:
            updates = self._trainer.train(global_params, xs, ys, plans).cpu().numpy()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:
            failed = self._failed(f"clients {clients}", round, exc)
            if failed is exc:
                raise
            raise failed from exc
        return [(updates[i].astype(np.float32, copy=False), float(sizes[c])) for i, c in enumerate(clients)]

    def _failed(self, clients: str, round: int, exc: Exception) -> Exception:
        """A plug-in model's failure as a :class:`PluginError` naming it; a built-in's as it was raised."""
        if isinstance(self._model_spec, str) or self._model_spec.factory is None:
            return exc
        return PluginError(
            f"model.factory: {self._model_spec.factory}: training {clients} in round {round} failed: "
            f"{type(exc).__name__}: {exc}"
        )

    def _alone(self, client: int, round: int) -> tuple[np.ndarray, float]:
        """Train ``client`` by itself: the loop of mini-batch SGD steps (module docstring)."""
        x, y = self.shards.client(client)
        self._load(self.params)
        self.model.train()
        t = self.training
        optimizer = torch.optim.SGD(self.model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        order = torch.Generator().manual_seed(int_seed(self.seed, Stream.TRAINING, round, client))
        n = int(y.shape[0])
        try:
            for _ in range(t.local_epochs):
                perm = torch.randperm(n, generator=order).to(self.device)
                for start in range(0, n, t.batch_size):
                    batch = perm[start : start + t.batch_size]
                    optimizer.zero_grad(set_to_none=True)
                    loss = self._loss(self.model(x[batch]), y[batch])
                    loss.backward()
                    optimizer.step()
        except Exception as exc:
            failed = self._failed(f"client {client}", round, exc)
            if failed is exc:
                raise
            raise failed from exc
        local = parameters_to_vector(self.model.parameters()).detach().cpu().numpy().astype(np.float32)
        return local - self.params, float(n)

    def apply(self, aggregate: np.ndarray) -> None:
        """FedAvg server step with the aggregated (weighted-mean) update."""
        lr = np.float32(self.training.server_lr)
        self.params = (self.params + lr * aggregate.astype(np.float32)).astype(np.float32)

    def evaluate(self) -> tuple[float, float]:
        """``(accuracy, mean cross-entropy loss)`` of the global model on the test set, in batches of
        :data:`_EVAL_BATCH` on the training device (the test set is put there once)."""
        x_all, y_all = self.shards.test()
        self._load(self.params)
        self.model.eval()
        correct, loss_sum = 0, 0.0
        n = int(y_all.shape[0])
        with torch.no_grad():
            for start in range(0, n, _EVAL_BATCH):
                x = x_all[start : start + _EVAL_BATCH]
                y = y_all[start : start + _EVAL_BATCH]
                out = self.model(x)
                loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(dim=1) == y).sum())
        loss = loss_sum / n
        return correct / n, loss if math.isfinite(loss) else float("nan")

    def model_sha256(self) -> str:
        return hashlib.sha256(self.params.astype("<f4").tobytes()).hexdigest()

    def manifest(self) -> dict[str, object]:
        """What the manifest records of training: the device, torch's and CUDA's versions, and how clients
        trained (together in groups of how many, or one at a time, and why)."""
        return {
            "device_requested": self.training.device,
            **describe_device(self.device),
            "clients_at_once": self.together.at_once,
            "clients_at_once_requested": self.training.clients_at_once or "auto",
            "clients_at_once_why": self.together.why,
        }


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
