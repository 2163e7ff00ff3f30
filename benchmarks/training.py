"""Local training of one round: each client alone (the loop) against all of them together (vmap), side by side.

For each row, one round of ``clients`` clients, each with ``samples`` random samples of the model's input
shape and random labels, trains from the same global model with SGD (lr 0.05, momentum 0.9) for ``epochs``
local epochs of batches of ``batch``: once with ``training.clients_at_once: 1`` and once with all clients at
once, through :class:`sim.learning.trainer.Learner` (the code a run uses). Each is repeated ``--repeats``
times after one warm-up; the table gives the median wall seconds with the range, the speed-up (ratio of
the medians, loop over together), the largest difference between the two updates of a client relative to
the largest value of its loop update (over every client), and what ``clients_at_once: auto`` chooses there.

The CPU rows are the shapes the shipped scenarios and the CPU rule (:data:`sim.learning.together.CPU_STEP_LIMIT`)
are about; the GPU rows are the Dordis shapes (FEMNIST CNN with 100 clients of 200 samples; ResNet-18 and
VGG-19 on CIFAR-10 shapes with 16 clients of 500). Without CUDA the GPU rows are skipped, and the table
says so.

    python benchmarks/training.py                      # CPU rows (and GPU rows where there is one)
    python benchmarks/training.py --quick --csv t.csv   # tiny rows: that it runs (tests/test_benchmarks.py)
    python benchmarks/training.py --rounds 150          # and, on a GPU, the end-to-end run below

``--rounds R`` (GPU only) also times a whole run end to end: R rounds of ResNet-18 at 16 of 100 clients on
CIFAR-shaped synthetic data (500 samples each, batch 32), SecAgg+ with XNoise (DSkellam, epsilon 6), 20 %
dropping before upload, ``fidelity: learning`` (:data:`END_TO_END`); the target is 150 rounds in under 15
minutes of wall time on an H100/H200-class GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sim.learning.federated import FederatedData
from sim.learning.trainer import Learner
from sim.scenario.types import Training


@dataclass(frozen=True)
class Row:
    model: str
    shape: tuple[int, int, int]
    classes: int
    clients: int
    samples: int
    batch: int
    epochs: int
    device: str


CPU_ROWS = (
    Row("linear", (1, 8, 8), 10, 100, 20, 10, 2, "cpu"),  # scenarios/paper/dordis_accuracy.yaml
    Row("cnn", (1, 8, 8), 10, 100, 14, 10, 5, "cpu"),  # scenarios/quickstart.yaml (digits: ~14 samples each)
    Row("cnn", (1, 8, 8), 10, 100, 20, 10, 2, "cpu"),
    Row("mlp", (1, 28, 28), 62, 50, 40, 20, 1, "cpu"),
    Row("cnn", (1, 28, 28), 62, 10, 40, 20, 1, "cpu"),
)
GPU_ROWS = (
    Row("cnn", (1, 28, 28), 62, 100, 200, 20, 1, "cuda"),  # FEMNIST CNN, Dordis 6.1
    Row("resnet18", (3, 32, 32), 10, 16, 500, 32, 1, "cuda"),  # CIFAR-10, Dordis 6.4
    Row("vgg19", (3, 32, 32), 10, 16, 500, 32, 1, "cuda"),
)
END_TO_END: dict[str, object] = {
    "name": "resnet18_cifar10_gpu",
    "seed": 1,
    "population": 100,
    "sampling": {"clients_per_round": 16},
    "clients": {
        "compute": {"zipf_a": 1.2, "slowdown": [1.0, 3.0]},
        "bandwidth_mbps": {"zipf_a": 1.2, "range": [21, 210]},
    },
    "server": {"bandwidth_mbps": 10000, "speed": 8.0},
    "dropout": {"rate": 0.2, "stage": "before_upload"},
    "data": {"dataset": "synthetic", "samples_per_client": 500, "input_shape": [3, 32, 32], "classes": 10},
    "model": {"name": "resnet18"},
    "training": {"local_epochs": 1, "batch_size": 32, "lr": 0.005, "momentum": 0.9, "device": "cuda"},
    "aggregation": {"protocol": "secagg+", "bits": 20, "threshold": 0.5},
    "privacy": {
        "strategy": "xnoise",
        "mechanism": "skellam",
        "epsilon": 6,
        "delta": 1.0e-2,
        "clip": 3.0,
        "tolerance": 0.5,
    },
    "fidelity": "learning",
}
"""Dordis section 6 at paper scale (scenarios/paper/dordis_privacy_cifar10.yaml's setup, trained): the
end-to-end GPU run of ``--rounds``."""
QUICK_ROWS = (Row("linear", (1, 8, 8), 10, 4, 6, 4, 1, "cpu"), Row("cnn", (1, 8, 8), 10, 3, 5, 4, 1, "cpu"))


class RandomData(FederatedData):
    """``clients`` clients of ``samples`` standard-normal inputs with uniform labels (seeded)."""

    def __init__(self, row: Row) -> None:
        self.input_shape, self.num_classes = row.shape, row.classes
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((row.clients, row.samples, *row.shape), dtype=np.float32)
        self.y = rng.integers(0, row.classes, (row.clients, row.samples)).astype(np.int64)

    def num_samples(self, client: int) -> int:
        return int(self.y.shape[1])

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[client], self.y[client]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.x[0], self.y[0]


def _timed(learner: Learner, clients: list[int], repeats: int) -> tuple[list[float], list[np.ndarray]]:
    learner.train_clients(1, clients)  # warm-up: torch's first calls, the data onto the device
    seconds, updates = [], []
    for r in range(repeats):
        if learner.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        updates = [u for u, _ in learner.train_clients(2 + r, clients)]
        if learner.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds, updates


def measure(row: Row, repeats: int) -> dict[str, object]:
    """One row: the loop and all clients together, timed side by side, and their largest difference."""
    data = RandomData(row)
    training = Training(
        local_epochs=row.epochs,
        batch_size=row.batch,
        lr=0.05,
        momentum=0.9,
        weight_decay=0.0,
        server_lr=1.0,
        threads=torch.get_num_threads(),
        device=row.device,
        clients_at_once=1,
    )
    clients = list(range(row.clients))
    loop = Learner(row.model, data, training, seed=1)
    together = Learner(row.model, data, dataclasses.replace(training, clients_at_once=row.clients), seed=1)
    auto = Learner(row.model, data, dataclasses.replace(training, clients_at_once=None), seed=1)
    loop_s, loop_updates = _timed(loop, clients, repeats)
    together_s, together_updates = _timed(together, clients, repeats)
    worst = max(
        float(np.abs(a - b).max() / max(float(np.abs(a).max()), 1e-30))
        for a, b in zip(loop_updates, together_updates, strict=True)
    )
    return {
        "model": row.model,
        "input": "x".join(map(str, row.shape)),
        "clients": row.clients,
        "samples": row.samples,
        "batch": row.batch,
        "epochs": row.epochs,
        "device": str(loop.device),
        "loop_s": statistics.median(loop_s),
        "loop_range_s": f"{min(loop_s):.3g}-{max(loop_s):.3g}",
        "together_s": statistics.median(together_s),
        "together_range_s": f"{min(together_s):.3g}-{max(together_s):.3g}",
        "together_at_once": together.together.at_once,
        "speedup": statistics.median(loop_s) / statistics.median(together_s),
        "max_rel_diff": worst,
        "auto_at_once": auto.together.at_once,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row, after a warm-up (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, as a run's default)")
    parser.add_argument("--quick", action="store_true", help="tiny rows only: that it runs")
    parser.add_argument("--csv", type=Path, default=Path("training.csv"), help="where to write the table")
    parser.add_argument("--rounds", type=int, default=0, help="on a GPU, also time a whole run of R rounds (above)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = list(QUICK_ROWS if args.quick else CPU_ROWS)
    if args.quick:
        print("GPU rows skipped: --quick runs the tiny CPU rows only")
    elif torch.cuda.is_available():
        rows += GPU_ROWS
    else:
        print(f"GPU rows skipped: torch {torch.__version__} sees no CUDA device")
    table = pd.DataFrame([measure(row, args.repeats) for row in rows])
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}")
    if args.rounds:
        if not torch.cuda.is_available():
            print("end-to-end run skipped: it needs a CUDA device", file=sys.stderr)
        else:
            end_to_end(args.rounds, args.csv.with_name(args.csv.stem + "-run"))
    return 0


def end_to_end(rounds: int, output: Path) -> float:
    """Wall seconds of :data:`END_TO_END` for ``rounds`` rounds into ``output``, printed with its accuracy."""
    from sim.api import run

    start = time.perf_counter()
    result = run({**END_TO_END, "rounds": rounds, "output": str(output)}, progress=False, force=True)
    seconds = time.perf_counter() - start
    final = result.rounds["accuracy"].dropna()
    print(
        f"end to end: {rounds} rounds of ResNet-18, SecAgg+ with XNoise, learning fidelity: {seconds:.1f} s wall, "
        f"final accuracy {final.iloc[-1] if len(final) else float('nan'):.4f}; tables in {output}"
    )
    return seconds


if __name__ == "__main__":
    sys.exit(main())
