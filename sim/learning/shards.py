"""Clients' data on the training device, put there once per run (issue 38: no per-client host-to-device copy
per round).

A real data set partitioned among clients (:class:`~sim.learning.federated.PartitionedData`) goes to the
device whole, once, with each client's sample indices: a client's shard is a gather on the device. Data
made per client (``synthetic``, a loader's clients) is put on a GPU the first time the client is sampled
and kept, up to :data:`CACHE_SHARE` of the GPU's free memory (least recently used first out, then made
again: the same values, from the client's own seed); on the CPU it is made at each call, as it always
was (no copy to save, and a run's memory stays what :mod:`sim.footprint` estimates). The test set goes
there once. On the CPU the tensors share the arrays' memory, and the values are exactly the arrays', so a
run's tables do not depend on this module.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from sim.learning.device import free_bytes
from sim.learning.federated import FederatedData, PartitionedData, SyntheticData

CACHE_SHARE = 0.25
"""Share of a GPU's free memory (when the run starts) that clients' data made per client may hold."""


class Shards:
    """The clients' samples and the test set of a run's data, as tensors on ``device``."""

    def __init__(self, data: FederatedData, device: torch.device, processes: int = 1) -> None:
        """``processes``: how many learners share the device (``training.workers``); each keeps a share of
        :data:`CACHE_SHARE`."""
        self.data = data
        self.device = device
        self.processes = processes
        self._whole: tuple[torch.Tensor, torch.Tensor] | None = None
        self._rows: dict[int, torch.Tensor] = {}
        self._kept: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._kept_bytes = 0
        self._budget: int | None = None
        self._test: tuple[torch.Tensor, torch.Tensor] | None = None

    def client(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of ``client`` on the device: float32 inputs ``(n, *input_shape)`` and int64 labels."""
        if isinstance(self.data, PartitionedData):
            x_all, y_all = self._partitioned()
            rows = self._rows.get(client)
            if rows is None:
                rows = self._rows[client] = torch.from_numpy(self.data.parts[client]).to(self.device)
            return x_all[rows], y_all[rows]
        kept = self._kept.get(client)
        if kept is not None:
            self._kept.move_to_end(client)
            return kept
        x_np, y_np = self.data.client_data(client)
        shard = _on(x_np, self.device), _on(y_np, self.device)
        self._keep(client, shard, x_np.nbytes + y_np.nbytes)
        return shard

    def test(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The test set on the device (put there on first use)."""
        if self._test is None:
            x_np, y_np = self.data.test_data()
            self._test = _on(x_np, self.device), _on(y_np, self.device)
        return self._test

    def _partitioned(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._whole is None:
            assert isinstance(self.data, PartitionedData)
            dataset = self.data.dataset
            self._whole = _on(dataset.x_train, self.device), _on(dataset.y_train, self.device)
        return self._whole

    def _keep(self, client: int, shard: tuple[torch.Tensor, torch.Tensor], size: int) -> None:
        if self.device.type != "cuda":  # nothing to save on the CPU (module docstring)
            return
        if self._budget is None:
            self._budget = int(free_bytes(self.device) * CACHE_SHARE / self.processes)
        if size > self._budget:
            return
        while self._kept and self._kept_bytes + size > self._budget:
            _, (x, y) = self._kept.popitem(last=False)
            self._kept_bytes -= x.nbytes + y.nbytes
        self._kept[client] = shard
        self._kept_bytes += size


def _on(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device`` (on the CPU, sharing its memory)."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)


def largest_shard(data: FederatedData) -> int:
    """The most samples a client holds (a group is padded to its largest)."""
    if isinstance(data, SyntheticData):
        return data.config.samples_per_client
    if isinstance(data, PartitionedData):
        return max((int(p.shape[0]) for p in data.parts), default=1)
    clients = getattr(data, "clients", None)  # a loader's clients (sim.learning.plugin_data.ClientData)
    if isinstance(clients, list):
        return max((int(y.shape[0]) for _, y in clients), default=1)
    return max(data.num_samples(0), 1)
