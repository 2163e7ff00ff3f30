"""How steady this host's CPU is: one fixed piece of work, timed again and again on every core at once.

The kernel testbed (docs/deploy.md, "The kernel testbed") gives each party a CPU quota in seconds of a
core. If the cores themselves run faster or slower from one moment to the next (other tenants of the
physical host on the same cores, caches or memory bus), the same work takes different times, and no
model of the testbed can be closer to a single deployment than the host is to itself. This benchmark
measures that.

One process per core, pinned to it, repeats a fixed piece of work of one to two milliseconds (AES-GCM sealing
of 4 KiB, a Python integer loop, a 120 x 120 float matrix product: the kinds of work a party does) every
``--interval`` seconds for ``--seconds`` seconds, and records the CPU seconds each repetition took
(``time.thread_time``: time-slicing by other processes is not counted, only how fast the core ran; on a
virtual machine that does not report its stolen time, a vCPU descheduled by the physical host counts). The
matrix product runs on one thread, as a deployed party's does (``sim.deploy.compute.one_thread_math``):
with OpenBLAS's own threads, each core's process had a helper thread on the other cores, and with every
core sampled at once the helpers spun against each other (on this project's 2-core machine on 2026-11-28,
a 90th percentile of 17 ms against a median of 2 ms), a contention of this benchmark's making that it
reported as the host's. Per
core it prints the median, the 10th and 90th percentiles and their spread ((p90 - p10) / median); and,
for windows of 1, 10 and 60 seconds, how far the mean CPU of two back-to-back windows differs (median and
worst |difference| / mean over consecutive pairs): what two deployments of that length, run one after
the other, would differ by from the host alone.

    python benchmarks/host_speed.py                           # 120 s, every core
    python benchmarks/host_speed.py --seconds 600 --csv host_speed.csv --samples-csv samples.csv
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from threadpoolctl import threadpool_limits

WINDOWS_S = (1.0, 10.0, 60.0)


def work(aead: AESGCM, block: bytes, matrix: np.ndarray) -> None:
    """The fixed piece of work: 16 AES-GCM seals of 4 KiB, 20,000 Python integer products, two products
    of a 120 x 120 float matrix (one to two milliseconds of CPU on this project's machine)."""
    nonce = bytes(12)
    for _ in range(16):
        aead.encrypt(nonce, block, None)
    total = 0
    for i in range(20_000):
        total += i * i
    for _ in range(2):
        matrix @ matrix


def sample_core(core: int, seconds: float, interval: float) -> list[tuple[int, float, float]]:
    """On ``core`` alone: (core, wall seconds since start, CPU seconds of one repetition) per repetition. The
    calling process is pinned to ``core`` meanwhile and given its cores back after."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        limits = threadpool_limits(limits=1)  # the matrix product on this thread alone, as a deployed party's
    except BaseException:
        os.sched_setaffinity(0, allowed)
        raise
    try:
        aead = AESGCM(bytes(16))
        block = bytes(4096)
        matrix = np.random.default_rng(core).standard_normal((120, 120))
        for _ in range(20):  # warm up: first calls load code and allocate
            work(aead, block, matrix)
        rows = []
        start = time.monotonic()
        while (now := time.monotonic() - start) < seconds:
            before = time.thread_time()
            work(aead, block, matrix)
            rows.append((core, now, time.thread_time() - before))
            time.sleep(interval)
        return rows
    finally:
        limits.restore_original_limits()
        os.sched_setaffinity(0, allowed)


def window_gaps(samples: pd.DataFrame, window_s: float) -> list[float]:
    """|difference| / mean of the mean CPU per repetition of consecutive ``window_s``-second windows."""
    means = samples.groupby((samples["t_s"] // window_s).astype(int))["cpu_s"].mean().to_numpy()
    return [abs(a - b) / ((a + b) / 2) for a, b in itertools.pairwise(means)]


def summarise(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per core: the spread of single repetitions, and the gaps between windows of each length."""
    rows = []
    for core, part in samples.groupby("core"):
        cpu = part["cpu_s"]
        median = float(cpu.median())
        row: dict[str, float | int] = {
            "core": int(core),  # type: ignore[call-overload]
            "repetitions": len(part),
            "median_ms": median * 1e3,
            "p10_ms": float(cpu.quantile(0.1)) * 1e3,
            "p90_ms": float(cpu.quantile(0.9)) * 1e3,
            "spread": float(cpu.quantile(0.9) - cpu.quantile(0.1)) / median,
        }
        for w in WINDOWS_S:
            gaps = window_gaps(part, w)
            row[f"gap_{w:g}s_median"] = statistics.median(gaps) if gaps else float("nan")
            row[f"gap_{w:g}s_worst"] = max(gaps) if gaps else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120.0, help="how long to sample (default 120)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between repetitions (default 0.05)")
    parser.add_argument(
        "--cores", nargs="+", type=int, help="cores to sample (default: every core this process may use)"
    )
    parser.add_argument("--csv", type=Path, help="write the per-core table here")
    parser.add_argument("--samples-csv", type=Path, help="write every repetition here")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.interval < 0:
        parser.error("--seconds must be positive and --interval not negative")
    cores = args.cores or sorted(os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(len(cores)) as pool:
        parts = pool.starmap(sample_core, [(c, args.seconds, args.interval) for c in cores])
    samples = pd.DataFrame([r for part in parts for r in part], columns=["core", "t_s", "cpu_s"])
    table = summarise(samples)
    print(f"host: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
    print(f"{args.seconds:g} s on cores {cores}, a repetition every {args.interval:g} s")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.samples_csv:
        samples.to_csv(args.samples_csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
