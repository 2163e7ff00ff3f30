"""Pipelined aggregation in timing fidelity: Dordis section 6.4's setups, plain against pipelined.

For each setup (model shape, sampled clients), privacy strategy and dropout rate, the shipped scenario
``scenarios/pipeline.yaml`` (Zipf a = 1.2 compute and 21-210 Mbps bandwidth, DSkellam at 20 bits under
SecAgg, epsilon 6) runs ``--rounds`` rounds plain (one chunk, Dordis Table 1's five stages once) and
pipelined (``chunks: auto``: eq. 3 fitted on short simulated runs, the Hyades appendix F recurrence).
It reports the mean virtual round time and its aggregation part (``agg_time``) for both, the speedups,
XNoise's plain round time over Orig's, and the wall-clock seconds per simulated round (the pipelined
runs' include the profiling runs that choose m).

Setups (Dordis 6.1 and 6.4): ``cnn`` (FEMNIST shape, 1.2M parameters, 100 of 1,000 clients),
``resnet18`` (CIFAR-10 shape, 11.2M, 16 of 100), ``vgg19`` (CIFAR-10 shape, 20.0M, 16 of 100), and
``resnet18-femnist`` (FEMNIST shape, 11.2M, 100 of 1,000; slow: not in the default set).

    python benchmarks/pipeline.py                                   # the three models, orig and xnoise, 0/20%
    python benchmarks/pipeline.py --setups vgg19 --dropouts 0 0.1 0.2 0.3 --csv pipeline.csv
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import pandas as pd

from sim.runner import run_scenario
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "pipeline.yaml"

FEMNIST = [
    "population=1000",
    "sampling.clients_per_round=100",
    "data={dataset: synthetic, samples_per_client: 240, input_shape: [1, 28, 28], classes: 62}",
    "training={local_epochs: 2, batch_size: 20}",
    "privacy.clip=1.0",
    "privacy.delta=0.001",
]
SETUPS: dict[str, list[str]] = {
    "cnn": ["model.name=cnn", *FEMNIST],
    "resnet18": ["model.name=resnet18"],
    "vgg19": ["model.name=vgg19"],
    "resnet18-femnist": ["model.name=resnet18", *FEMNIST],
}


def run(overrides: list[str], folder: Path) -> tuple[pd.DataFrame, float]:
    """Run the scenario with ``overrides``; returns its rounds and the wall seconds it took."""
    scenario = load(SCENARIO, overrides, output=str(folder)).base()
    start = time.perf_counter()
    run_scenario(scenario, folder, progress=False)
    wall = time.perf_counter() - start
    return pd.read_csv(folder / "rounds.csv"), wall


def measure(
    setup: str,
    strategy: str,
    dropout: float,
    rounds: int,
    protocol: str,
    links: str,
    work: Path,
    extra: list[str] | None = None,
) -> dict[str, object]:
    base = [*SETUPS[setup], f"privacy.strategy={strategy}", f"dropout.rate={dropout}", f"rounds={rounds}"]
    base += [f"aggregation.protocol={protocol}", f"pipeline.links={links}", *(extra or [])]
    row: dict[str, object] = {"setup": setup, "protocol": protocol, "strategy": strategy, "dropout": dropout}
    for mode, chunks in (("plain", "1"), ("pipelined", "auto")):
        name = f"{setup}_{protocol}_{strategy}_{dropout}_{mode}".replace("+", "p")
        table, wall = run([*base, f"pipeline.chunks={chunks}"], work / name)
        ok = table[table["outcome"] == "ok"]
        if mode == "pipelined":
            row["chunks"] = int(table["chunks"].iloc[0])
        row[f"{mode}_round_s"] = ok["round_time"].mean()
        row[f"{mode}_agg_s"] = ok["agg_time"].mean()
        row[f"{mode}_wall_s_per_round"] = wall / len(table)
    row["params"] = None
    row["speedup_round"] = float(row["plain_round_s"]) / float(row["pipelined_round_s"])  # type: ignore[arg-type]
    row["speedup_agg"] = float(row["plain_agg_s"]) / float(row["pipelined_agg_s"])  # type: ignore[arg-type]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", nargs="+", default=["cnn", "resnet18", "vgg19"], choices=sorted(SETUPS))
    parser.add_argument("--strategies", nargs="+", default=["orig", "xnoise"])
    parser.add_argument("--dropouts", nargs="+", type=float, default=[0.0, 0.2])
    parser.add_argument("--protocols", nargs="+", default=["secagg"], choices=["secagg", "secagg+"])
    parser.add_argument("--rounds", type=int, default=2, help="rounds per configuration (default 2)")
    parser.add_argument(
        "--links", default="shared", choices=["shared", "duplex"], help="pipeline.links (Dordis: shared)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a scenario key in every run, e.g. --set server.latency_ms=25",
    )
    parser.add_argument("--csv", type=Path, default=Path("pipeline.csv"), help="table to write (default pipeline.csv)")
    args = parser.parse_args(argv)
    from sim.learning.models import model_dimension

    rows = []
    with TemporaryDirectory() as tmp:
        for setup in args.setups:
            params = model_dimension(load(SCENARIO, SETUPS[setup]).base())
            for protocol in args.protocols:
                for strategy in args.strategies:
                    for dropout in args.dropouts:
                        print(f"{setup} {protocol} {strategy} dropout {dropout:g}", file=sys.stderr, flush=True)
                        row = measure(
                            setup, strategy, dropout, args.rounds, protocol, args.links, Path(tmp), args.overrides
                        )
                        row["params"] = params
                        rows.append(row)
    table = pd.DataFrame(rows)
    orig = table[table["strategy"] == "orig"].set_index(["setup", "protocol", "dropout"])["plain_round_s"]
    table["xnoise_over_orig_plain"] = [
        r.plain_round_s / orig.get((r.setup, r.protocol, r.dropout), float("nan")) if r.strategy == "xnoise" else None
        for r in table.itertuples()
    ]
    machine = platform.processor() or platform.machine()
    settings = " ".join(args.overrides)
    print(f"# {platform.node()}, {machine}, python {platform.python_version()}, pipeline.links {args.links} {settings}")
    columns = [
        "setup",
        "params",
        "protocol",
        "strategy",
        "dropout",
        "chunks",
        "plain_round_s",
        "pipelined_round_s",
        "speedup_round",
        "plain_agg_s",
        "pipelined_agg_s",
        "speedup_agg",
        "xnoise_over_orig_plain",
        "plain_wall_s_per_round",
        "pipelined_wall_s_per_round",
    ]
    print(table[columns].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    table[columns].to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
