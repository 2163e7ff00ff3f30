"""Skellam noise from a seed against the compiled Poisson samplers of numpy and torch, side by side.

Our ``sim.dp.noise.skellam`` draws ``2 size`` Poisson(variance/2) values from the AES-256-CTR keystream of a
seed (PTRS for means from 10, inversion below; vectorised in blocks), so that the server can regenerate a
client's XNoise component. The references draw the same number of Poisson values with no seed to honour:
numpy's ``Generator(PCG64).poisson`` (in C, one draw at a time: PTRS from a mean of 10, multiplication
of uniforms below) and ``torch.poisson`` (CPU). The default
points are the variances and the 65,536-value calls of a 32-client XNoise round of ``scenarios/privacy.yaml``
(integer units), a small variance, and a model of 2^21 values.

Columns: ``ours_ns_per_value`` (one Skellam value, two Poisson draws), then nanoseconds per Poisson draw for
ours, numpy and torch, and ``ours_over_numpy`` (below 1: ours is faster). Best of ``--repeats`` timed calls
after a warm-up call, in this process.

    python benchmarks/skellam.py
    python benchmarks/skellam.py --sizes 65536 --variances 3e7 --csv noise.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sim.dp import noise

VARIANCES = (3.0, 3e7, 1e8, 9.3e8)
"""Integer-unit variances: a small one (inversion), and the range of a 32-client XNoise round's components."""
SIZES = (65_536, 1 << 21)


def _best(call: Callable[[], object], repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def run(variances: Sequence[float], sizes: Sequence[int], repeats: int = 5) -> pd.DataFrame:
    """One row per (variance, size): ours and the references, in nanoseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ours runs on one thread; so does numpy's
    try:
        return _run(variances, sizes, repeats)
    finally:
        torch.set_num_threads(threads)


def _run(variances: Sequence[float], sizes: Sequence[int], repeats: int) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for variance in variances:
        mean = variance / 2.0
        for size in sizes:
            ours = _best(partial(noise.skellam, bytes(range(32)), variance, size), repeats)
            draws = 2 * size
            numpy_s = _best(partial(rng.poisson, mean, draws), repeats)
            torch_s = _best(partial(torch.poisson, torch.full((draws,), mean, dtype=torch.float64)), repeats)
            per_draw = 1e9 * ours / draws
            rows.append(
                {
                    "variance": variance,
                    "values": size,
                    "ours_ns_per_value": 1e9 * ours / size,
                    "ours_ns_per_draw": per_draw,
                    "numpy_ns_per_draw": 1e9 * numpy_s / draws,
                    "torch_ns_per_draw": 1e9 * torch_s / draws,
                    "ours_over_numpy": ours / numpy_s,
                }
            )
            print(f"noise: variance={variance:g} values={size} done", file=sys.stderr)
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variances", type=float, nargs="+", default=list(VARIANCES))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args(argv)
    table = run(args.variances, args.sizes, args.repeats)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
