"""The simulator against the socket deployment, over a grid: how far are the simulated round times?

For every point of the grid (sampled clients, model parameters, dropout rate, chunks), the shipped
scenario ``scenarios/deploy.yaml`` (SecAgg, Zipf a = 1.2 compute slow-downs 1-3 and 21-210 Mbps links,
a server at 1 Gbps, a ``linear`` model on synthetic data sized to exactly 10^4, 10^5 or 10^6 parameters)
runs ``--rounds`` rounds twice with the same seed: simulated under the testbed model (``testbed.cores`` =
this host's cores, ``server.speed`` 1) and deployed on this host (a server and one client process per
sampled client, over loopback TCP with token-bucket links). It prints per point the mean simulated and
measured round time and their relative error ((simulated - measured) / measured), whether every round's
model is bit-identical, and over the grid the median and worst absolute error of round time; per stage
(download, training, each server step, aggregation) in ``--stages-csv``. Round 1 is left out of the
errors with ``--skip-first`` (a warm-up: first-touch allocations in fresh processes).

    python benchmarks/validate.py                                  # the full grid: 36 points, ~25 minutes
    python benchmarks/validate.py --clients 5 --params 1e5 --dropouts 0 --chunks 1   # one point
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

import pandas as pd

from sim.deploy.deployment import Deployment, DeployOptions
from sim.deploy.validate import compare, testbed_overrides
from sim.runner import run_scenario
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "deploy.yaml"

SHAPES = {10_000: ([1, 27, 37], 10), 100_000: ([1, 99, 101], 10), 1_000_000: ([1, 99, 101], 100)}
"""Parameters -> (input shape, classes) of a ``linear`` model with exactly that many parameters."""


def overrides(clients: int, params: int, dropout: float, chunks: int) -> list[str]:
    shape, classes = SHAPES[params]
    point = [
        f"population={2 * clients}",
        f"sampling.clients_per_round={clients}",
        f"data.input_shape={shape}",
        f"data.classes={classes}",
        f"dropout.rate={dropout}",
    ]
    if chunks > 1:
        point.append(f"pipeline={{chunks: {chunks}}}")
    return point


def measure(
    clients: int,
    params: int,
    dropout: float,
    chunks: int,
    rounds: int,
    skip_first: bool,
    folder: Path,
    extra: list[str] | None = None,
) -> tuple[dict[str, object], pd.DataFrame]:
    """One grid point: simulate, deploy, compare (``extra``: more ``--set`` overrides)."""
    point = [*overrides(clients, params, dropout, chunks), f"rounds={rounds}", *testbed_overrides(), *(extra or [])]
    scenario = load(SCENARIO, point, output=str(folder / "out")).base()
    simulated, deployed = folder / "simulated", folder / "deployed"
    run_scenario(scenario, simulated, progress=False)
    start = time.perf_counter()
    options = DeployOptions(log_dir=deployed)
    run_scenario(scenario, deployed, progress=False, engine=partial(Deployment, options=options), driver="deploy")
    wall = time.perf_counter() - start
    validation = compare(simulated, deployed, skip_first=skip_first)
    summary = validation.summary.set_index("stage")
    row: dict[str, object] = {
        "clients": clients,
        "params": params,
        "dropout": dropout,
        "chunks": chunks,
        "simulated_s": summary.at["round", "simulated_s"],
        "measured_s": summary.at["round", "measured_s"],
        "error": summary.at["round", "error"],
        "identical": validation.identical,
        "deploy_wall_s": wall,
    }
    stages = validation.summary.assign(clients=clients, params=params, dropout=dropout, chunks=chunks)
    return row, stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--params", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument("--dropouts", nargs="+", type=float, default=[0.0, 0.2])
    parser.add_argument("--chunks", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per point (default 3)")
    parser.add_argument("--skip-first", action="store_true", help="leave round 1 out of the errors")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a scenario key at every point, e.g. --set costs.profile=now.json",
    )
    parser.add_argument("--csv", type=Path, default=Path("validate.csv"), help="table per point (validate.csv)")
    parser.add_argument(
        "--stages-csv", type=Path, default=Path("validate_stages.csv"), help="table per point and stage"
    )
    args = parser.parse_args(argv)
    params = [int(p) for p in args.params]
    unknown = sorted(set(params) - set(SHAPES))
    if unknown:
        parser.error(f"--params {unknown}: the grid's models have {', '.join(f'{p:g}' for p in SHAPES)} parameters")
    rows, stages = [], []
    with TemporaryDirectory() as tmp:
        for clients in args.clients:
            for p in params:
                for dropout in args.dropouts:
                    for chunks in args.chunks:
                        print(f"clients {clients} params {p:g} dropout {dropout:g} chunks {chunks}", file=sys.stderr)
                        folder = Path(tmp) / f"c{clients}_p{p}_d{dropout}_m{chunks}"
                        row, stage = measure(
                            clients, p, dropout, chunks, args.rounds, args.skip_first, folder, args.overrides
                        )
                        rows.append(row)
                        stages.append(stage)
                        pd.DataFrame(rows).to_csv(args.csv, index=False)  # kept as the grid goes
                        pd.concat(stages).to_csv(args.stages_csv, index=False)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    errors = table["error"].abs()
    print(
        f"\nround time, |simulated - measured| / measured over {len(table)} points: "
        f"median {errors.median():.1%}, worst {errors.max():.1%} "
        f"({table.loc[errors.idxmax(), ['clients', 'params', 'dropout', 'chunks']].to_dict()})"
    )
    print(f"models bit-identical at every point: {bool(table['identical'].all())}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; tables: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
