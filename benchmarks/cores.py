"""What more cores give full-fidelity work on this host: the same jobs one after another, then at once.

The clients' protocol work within a step is independent from client to client, so it could run on every
core. How much that could gain is bounded by the host: if two copies of a job running at once, in two
processes that share nothing, take as long as the two in turn, no division of one round's clients over
those cores can be faster. This benchmark measures that bound for three jobs:

- ``round``: one SecAgg+ round through the in-memory driver at n clients and d values, with its setup
  (:mod:`secagg`'s ``one_round`` without its separate timing of the masks: the clients' random updates and
  machines, then encoding, mask expansion, bit packing, every frame encoded and decoded). Its per-value
  work is AES-CTR keystream and numpy passes over vectors of d values;
- ``noise``: XNoise's Skellam sampling, ``noise.total`` of 32 components of 65,536 values at variance 1e8
  (:mod:`sim.dp.noise`), what the server regenerates for every survivor;
- ``python``: a loop of integer additions, bound by neither memory nor a shared unit: what two cores give
  code that scales.

For each job and worker count P, ``jobs`` copies (a multiple of P) run first one after another in this
process, then split evenly over P worker processes started and warmed up beforehand (no data crosses
between them but the job's name), then split evenly over P threads of this process. ``speedup`` is the
serial time over the processes' time, ``threads_speedup`` over the threads': P at best, and for threads
only as far as the job runs outside the interpreter's lock (numpy passes, AES-CTR, which release it; the
``python`` job never does). The three runs alternate ``--repeats`` times and the medians are reported.

    python benchmarks/cores.py                         # P = the cores this process may run on
    python benchmarks/cores.py --workers 2 4 --csv cores.csv
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.model import CostModel
from sim.dp import noise

sys.path.insert(0, str(Path(__file__).resolve().parent))

from secagg import one_round

ROUND = (16, 1_000_000)
"""(clients, values) of the ``round`` job: the peer comparison's large setting (docs/performance.md)."""
NOISE = (32, 65_536, 1e8)
"""(components, values, variance) of the ``noise`` job."""
LOOP = 3_000_000
"""Additions of the ``python`` job."""
SHOWN = ["job", "workers", "jobs", "serial_s", "parallel_s", "speedup", "efficiency", "threads_s", "threads_speedup"]


@functools.cache
def _cost_model() -> CostModel:
    return CostModel.load()


def _round() -> None:
    one_round("secagg+", *ROUND, 0.0, _cost_model(), masks=False)


def _noise() -> None:
    """The components summed on the calling thread, as ``noise.total`` on one thread does (the cores are the
    workers'). Not through ``noise.limit_threads``: that limit is the process's, and jobs on threads would
    save and restore it over one another."""
    components, values, variance = NOISE
    total = np.zeros(values, dtype=np.int64)
    for k in range(components):
        total += noise.sample("skellam", bytes([k]) * 32, variance, values)


def _python() -> None:
    total = 0
    for i in range(LOOP):
        total += i


JOBS: dict[str, Callable[[], None]] = {"round": _round, "noise": _noise, "python": _python}


def _run(name: str, count: int = 1) -> None:
    for _ in range(count):
        JOBS[name]()


def measure(name: str, workers: int, jobs: int, repeats: int) -> dict[str, object]:
    """Median seconds of ``jobs`` copies of job ``name`` in turn, over ``workers`` processes and over
    ``workers`` threads."""
    if jobs % workers:
        raise ValueError(f"{jobs} jobs do not split evenly over {workers} workers")
    context = multiprocessing.get_context("spawn")
    serial, parallel, threaded = [], [], []
    with context.Pool(workers) as pool, ThreadPoolExecutor(workers) as threads:
        pool.starmap(_run, [(name, 1)] * workers)  # imports, caches and buffers, in every worker
        list(threads.map(_run, [name] * workers))  # and in every thread (their kept buffers)
        _run(name)  # and here
        for _ in range(repeats):
            start = time.perf_counter()
            _run(name, jobs)
            serial.append(time.perf_counter() - start)
            start = time.perf_counter()
            pool.starmap(_run, [(name, jobs // workers)] * workers, chunksize=1)
            parallel.append(time.perf_counter() - start)
            start = time.perf_counter()
            list(threads.map(_run, [name] * workers, [jobs // workers] * workers))
            threaded.append(time.perf_counter() - start)
    serial_s, parallel_s, threads_s = (statistics.median(t) for t in (serial, parallel, threaded))
    return {
        "job": name,
        "workers": workers,
        "jobs": jobs,
        "serial_s": serial_s,
        "parallel_s": parallel_s,
        "speedup": serial_s / parallel_s,
        "efficiency": serial_s / parallel_s / workers,
        "threads_s": threads_s,
        "threads_speedup": serial_s / threads_s,
    }


def run(
    workers: Sequence[int], names: Sequence[str] = tuple(JOBS), per_worker: int = 3, repeats: int = 5
) -> pd.DataFrame:
    """:func:`measure` for every job and worker count, ``per_worker`` jobs for each worker."""
    rows = [measure(name, p, p * per_worker, repeats) for name in names for p in workers]
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[noise.usable_cores()])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--per-worker", type=int, default=3, help="jobs for each worker (the serial run does them all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv", type=Path, default=Path("cores.csv"))
    args = parser.parse_args(argv)
    if min(args.workers) < 1:
        parser.error("--workers must be at least 1")
    table = run(args.workers, args.jobs, args.per_worker, args.repeats)
    print(table[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
