"""Local training spread over worker processes (``training.workers``), with the updates training here gives.

At the start of a round the engine names the sampled clients that will train; :class:`TrainingPool`
splits them into one group per worker and sends each group the global model once. Every worker holds its
own :class:`~sim.learning.trainer.Learner` built from the same model name, data set (loaded in the worker
from the same configuration), training settings and seed (by the function the learner hands the pool, so
that this module does not import the trainer). A client's update depends only on the global
model, the client's data and its ``TRAINING`` stream for the round, as it does in this process, so the
models are bit-identical to ``workers: 1`` (tested) when clients train one at a time
(``training.clients_at_once: 1``; a worker trains its own share together otherwise, in other groups, so
the last bits may differ) for the models here, which hold no state besides
their parameters (a model with buffers, such as batch-norm statistics, is refused). The engine still
consumes each update at the client's moment in virtual time; only wall time changes.

The workers are spawned (a fresh interpreter each, torch with ``training.threads`` threads) on first use
and kept for the run. They ignore Ctrl-C (this process stops them) and exit when this process dies. Work
is pickled between this process and its own children only.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Protocol

import numpy as np

from sim.errors import InputError
from sim.scenario.types import Data

Update = tuple[np.ndarray, float]
DataSource = tuple[Data, int, int]
"""How a worker builds the data set: ``(data config, population, seed)`` for
:func:`~sim.learning.federated.load_federated` (the same partition as this process's)."""


class LocalTrainer(Protocol):
    """What a worker trains clients with: a :class:`~sim.learning.trainer.Learner`."""

    params: np.ndarray

    def local_update(self, client: int, round: int) -> Update: ...

    def train_clients(self, round: int, clients: list[int]) -> list[Update]: ...


_worker: list[LocalTrainer] = []
"""The worker process's own learner (one, once started)."""


def _exit_with_parent() -> None:
    """End this worker when its parent dies (killed, or exiting without closing the pool)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)


def _start_worker(build: bytes) -> None:
    """``build``: the pickled function that builds the worker's learner. It is unpickled only here, once
    Ctrl-C is ignored: unpickling imports the trainer (and torch), building it loads the data set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    try:
        _worker.append(pickle.loads(build)())
    except Exception as exc:  # e.g. a plug-in this process cannot import: said by the first work asked of it
        _failed.append(f"{type(exc).__name__}: {exc}")


_failed: list[str] = []
"""Why the worker process's learner could not be built (empty once it is)."""


def _train(params: np.ndarray, round: int, clients: list[int]) -> list[Update]:
    if _failed:
        raise InputError(f"a training worker (training.workers) could not start: {_failed[0]}")
    learner = _worker[0]
    learner.params = params
    return learner.train_clients(round, clients)  # together in groups, or one at a time, as the learner does


class TrainingPool:
    """``workers`` processes training clients for one learner; each builds its own with ``build`` (a
    picklable function: a module-level function or a :func:`functools.partial` of one)."""

    def __init__(self, build: Callable[[], LocalTrainer], workers: int) -> None:
        self.workers = workers
        self._executor = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(pickle.dumps(build),),
        )
        self._pending: dict[tuple[int, int], tuple[Future[list[Update]], int]] = {}

    def start(self, params: np.ndarray, round: int, clients: list[int], samples: list[int]) -> None:
        """Train ``clients`` (with ``samples`` local samples each) for ``round`` from the global model
        ``params``, in the background: one batch per worker, the largest clients first to the least loaded
        worker (longest-processing-time first), so the batches end at about the same time."""
        for key, (future, _) in list(self._pending.items()):
            if key[0] < round:  # clients of earlier rounds that never asked (they left): drop their work
                future.cancel()
                del self._pending[key]
        groups: list[list[int]] = [[] for _ in range(self.workers)]
        load = [0] * self.workers
        for n, c in sorted(zip(samples, clients, strict=True), key=lambda pair: -pair[0]):
            w = load.index(min(load))
            groups[w].append(c)
            load[w] += n
        for group in groups:
            if group:
                future = self._executor.submit(_train, params, round, group)
                for i, c in enumerate(group):
                    self._pending[(round, c)] = (future, i)

    def take(self, client: int, round: int) -> Update | None:
        """The update of ``client`` in ``round`` if it was started here (waiting for it), else None."""
        started = self._pending.pop((round, client), None)
        if started is None:
            return None
        future, i = started
        return future.result()[i]

    def close(self) -> None:
        """Stop the workers now: training still running (of clients that left, or after Ctrl-C) is dropped."""
        self._pending.clear()
        # both before shutdown forgets them
        processes = list(getattr(self._executor, "_processes", {}).values())
        manager = getattr(self._executor, "_executor_manager_thread", None)
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        # The executor's manager thread reaps the workers too: until it has, a worker it reaped first still
        # looks alive here (its exit code is set by whichever thread's waitpid won). Wait for it, then join.
        if manager is not None:
            manager.join(timeout=10)
        for process in processes:
            process.join(timeout=10)
