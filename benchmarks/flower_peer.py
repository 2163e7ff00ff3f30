"""Peer benchmark: one round of Flower's own SecAgg+ (flwr 1.42) on this machine, for comparison with ours.

What is run and measured: :mod:`sim.profiling.flower_rounds` (Flower's ``SecAggPlusWorkflow`` and
``secaggplus_mod`` through ``run_simulation`` on Ray, in a loopback-only network namespace, with SecAgg+
parameters matching ours). This prints the table of :data:`COLUMNS` (seconds, MB) and writes every
measured column to ``--csv``.

    python benchmarks/flower_peer.py --clients 16 --dims 100000
    python benchmarks/flower_peer.py --clients 16 100 --dims 100000 --dropout 0 0.1 --csv flower.csv

Needs ``pip install "flwr[simulation]==1.42.0"`` (the ``peer`` extra) and ``unshare`` (util-linux).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from sim.profiling.flower_rounds import flower_round
from sim.results.manifest import host

COLUMNS = (
    "clients",
    "dim",
    "dropout",
    "survivors",
    "round_s",
    "stage_s_setup",
    "stage_s_share_keys",
    "stage_s_collect_masked_vectors",
    "stage_s_unmask",
    "client_s_mean",
    "client_s_max",
    "server_s",
    "client_mb_up",
    "warmup_s",
    "ray_start_s",
    "simulation_s",
    "invocation_s",
    "peak_pss_mb",
    "max_abs_error",
    "num_shares",
    "reconstruction_threshold",
    "quantization_range",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 100])
    parser.add_argument("--dims", type=int, nargs="+", default=[100_000])
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to each round's process")
    parser.add_argument("--csv", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true", help="show Flower's and Ray's own logs")
    args = parser.parse_args(argv)

    rows = []
    for n in args.clients:
        for d in args.dims:
            for dropout in args.dropout:
                rows.append(flower_round(n, d, dropout, args.timeout, args.verbose))
                print(f"done: flower secagg+ n={n} d={d} dropout={dropout}", file=sys.stderr)
    table = pd.DataFrame(rows).drop(columns=["engine", "stage_spans", "round_span"], errors="ignore")
    machine = host()
    print(f"# {machine['hostname']} {machine['processor']}; flwr SecAgg+ over Ray, seconds")
    shown = [c for c in COLUMNS if c in table.columns]
    print(table[shown].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
        print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
