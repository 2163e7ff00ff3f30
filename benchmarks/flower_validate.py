"""The simulator against Flower itself: Flower's SecAgg+ rounds, measured and simulated side by side.

For every point of the grid (clients n, parameters d, dropout rate), Flower 1.42's own SecAgg+ runs on
this host through Flower's simulation engine (:mod:`sim.profiling.flower_rounds`: Ray actors in a
loopback-only namespace, clients submitting fixed vectors, the dropping ones raising in fit after sharing
keys), and the simulator plays the same round from ``scenarios/flower.yaml``: the flower cost profile
(Flower's primitives, wire sizes and simulation engine, measured by ``dropsim profile --impl flower``)
under ``testbed: {emulation: engine}``, with the point's n, d and dropout. Flower's round runs
``--repeats`` times (a fresh simulation each; the one of median round time counts: on this host
back-to-back rounds differ by 10-30%, ``spread``). It prints per point the measured and simulated round
times and their relative error (simulated - measured) / measured, the same per SecAgg+ stage (Flower's
setup, share-keys, collect-masked-vectors and unmask stages against the simulator's advertise-keys,
share-keys, masked-input (with the model, as Flower sends it) and unmasking (with the aggregation)
steps), and over the grid the median and worst absolute round-time error. The target is a median of at
most 10%.

    python benchmarks/flower_validate.py                              # the grid: 12 points, ~10 minutes
    python benchmarks/flower_validate.py --clients 10 --dims 100000 --dropout 0
    python benchmarks/flower_validate.py --measured flower.csv         # simulate against earlier measurements

``--csv`` writes every column (the measured ones as :mod:`benchmarks.flower_peer` has them); ``--measured``
reads such a file instead of running Flower (for a host without flwr, or to re-simulate after a change).
Needs the ``peer`` extra (``flwr[simulation]``) and ``unshare`` to measure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd

from sim.preflight import measured_elsewhere
from sim.results.manifest import host
from sim.results.read import read_run_table
from sim.runner import run_scenario
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "flower.yaml"

STAGES = {
    "setup": ("time_advertise_keys",),
    "share_keys": ("time_share_keys",),
    "collect_masked_vectors": ("time_masked_input",),
    "unmask": ("time_unmasking", "aggregate_s"),
}
"""Flower's SecAgg+ stage -> the simulated round's columns that cover it."""


def overrides(n: int, d: int, dropout: float) -> list[str]:
    """``--set`` overrides of ``scenarios/flower.yaml`` for one grid point, on this host's cores (Flower's
    round starts Ray with ``num_cpus=os.cpu_count()``: one actor a core)."""
    point = [f"population={n}", f"sampling.clients_per_round={n}", f"model.params={d}", f"dropout.rate={dropout}"]
    return [*point, f"testbed.cores={os.cpu_count() or 1}"]


def measure(n: int, d: int, dropout: float, repeats: int, timeout: float) -> dict:
    """``repeats`` Flower rounds of one point (a fresh simulation each); the one of median round time, with
    every round's time (``round_s_runs``) and their spread ((max - min) / median, ``spread``)."""
    from sim.profiling.flower_rounds import flower_round

    runs = []
    for _ in range(max(1, repeats)):
        result = flower_round(n, d, dropout, timeout)
        for key in ("engine", "stage_spans", "round_span"):
            result.pop(key, None)
        runs.append(result)
    runs.sort(key=lambda r: r["round_s"])
    middle = runs[(len(runs) - 1) // 2]
    times = [r["round_s"] for r in runs]
    return {
        **middle,
        "round_s_runs": " ".join(f"{t:.4g}" for t in times),
        "spread": (times[-1] - times[0]) / middle["round_s"],
    }


def simulate(n: int, d: int, dropout: float, extra: list[str] | None = None) -> dict[str, float]:
    """The simulated round of one grid point: its round time and the time covering each Flower stage (s)."""
    with tempfile.TemporaryDirectory(prefix="flower-sim-") as folder:
        scenario = load(SCENARIO, [*overrides(n, d, dropout), *(extra or [])], output=folder).base()
        run_scenario(scenario, Path(folder), progress=False)
        rounds = read_run_table(Path(folder), "rounds")
    row = rounds.iloc[0]
    if row["outcome"] != "ok":
        raise RuntimeError(f"simulated round n={n} d={d} dropout={dropout}: {row['outcome']}")
    out = {"sim_round_s": float(row["round_time"]), "sim_survivors": int(row["survivors"])}
    for stage, columns in STAGES.items():
        out[f"sim_stage_s_{stage}"] = float(sum(float(row[c]) for c in columns))
    return out


def relative_error(simulated: float, measured: float) -> float:
    return (simulated - measured) / measured if measured > 0 else float("nan")


def compare(measured: dict, simulated: dict[str, float]) -> dict:
    """One point's row: the measured columns, the simulated ones and their errors."""
    row = {**measured, **simulated, "error": relative_error(simulated["sim_round_s"], measured["round_s"])}
    for stage in STAGES:
        row[f"error_{stage}"] = relative_error(simulated[f"sim_stage_s_{stage}"], measured[f"stage_s_{stage}"])
    return row


def summary(table: pd.DataFrame) -> str:
    """The grid's median and worst absolute round-time errors, and which point the worst is."""
    errors = table["error"].abs()
    worst = table.loc[errors.idxmax()]
    return (
        f"round time over {len(table)} points: median |error| {statistics.median(errors):.1%}, worst "
        f"{errors.max():.1%} (n={int(worst['clients'])}, d={int(worst['dim'])}, dropout={worst['dropout']:g}); "
        f"target: median <= 10%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20, 50])
    parser.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--measured", type=Path, help="CSV of earlier Flower rounds (this script's or flower_peer's)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="another scenario override")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed to each Flower round")
    parser.add_argument(
        "--repeats", type=int, default=3, help="Flower rounds per point; the one of median round time counts"
    )
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)

    earlier = pd.read_csv(args.measured) if args.measured is not None else None
    rows = []
    for n in args.clients:
        for d in args.dims:
            for dropout in args.dropout:
                if earlier is not None:
                    match = earlier[(earlier["clients"] == n) & (earlier["dim"] == d) & (earlier["dropout"] == dropout)]
                    if match.empty:
                        parser.error(f"--measured {args.measured} has no round of n={n} d={d} dropout={dropout}")
                    measured = match.iloc[0].to_dict()
                else:
                    measured = measure(n, d, dropout, args.repeats, args.timeout)
                rows.append(compare(measured, simulate(n, d, dropout, args.extra)))
                print(f"done: n={n} d={d} dropout={dropout}: error {rows[-1]['error']:+.1%}", file=sys.stderr)
    table = pd.DataFrame(rows)
    machine = host()
    print(f"# {machine['hostname']} {machine['processor']}: Flower 1.42 SecAgg+ rounds, measured and simulated (s)")
    shown = ["clients", "dim", "dropout", "survivors", "round_s", "sim_round_s", "error"]
    shown += [c for c in ("spread",) if c in table.columns]
    shown += [f"error_{stage}" for stage in STAGES]
    print(table[shown].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(summary(table))
    elsewhere = measured_elsewhere(load(SCENARIO, args.extra).base())
    if elsewhere and args.measured is None:
        print(f"note: the simulated times' cost profile {elsewhere}")
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
        print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
