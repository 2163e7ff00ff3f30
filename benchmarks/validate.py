"""The simulator against the socket deployment, over a grid: how far are the simulated round times?

First a calibration, apart from the grid: the shipped scenario ``scenarios/deploy.yaml`` (5 clients,
10^5 parameters) with seed 2 is deployed and simulated, and the CPU seconds of every party's computations
give this host's ``testbed.cpu_scale`` S (docs/deploy.md, "Calibrating the testbed model"; ``--cpu-scale``
gives S instead). Then for every point of the grid (sampled clients, model parameters, dropout rate,
chunks) the scenario (SecAgg, Zipf a = 1.2 compute slow-downs 1-3 and 21-210 Mbps links, a server at
1 Gbps, a ``linear`` model on synthetic data sized to exactly 10^4, 10^5 or 10^6 parameters) runs
``--rounds`` rounds with the same seed: deployed once on this host (a server and one client process per
sampled client, over loopback TCP with token-bucket links) and simulated twice under the testbed model
(``testbed.cores`` = this host's cores, ``server.speed`` 1), with the profile as is (S = 1, the
``*_profile`` columns) and with S. It prints per point the mean measured and simulated round times and
their relative errors ((simulated - measured) / measured), whether every round's model is
bit-identical, the point's own CPU ratio, and over the grid the median and worst absolute error of
round time for both; per stage (download, training, each server step, aggregation, CPU) in
``--stages-csv``. Round 1 is left out of the errors with ``--skip-first`` (a warm-up: first-touch
allocations in fresh processes).

    python benchmarks/validate.py --rounds 4 --skip-first          # the full grid: 36 points, ~35 minutes
    python benchmarks/validate.py --clients 5 --params 1e5 --dropouts 0 --chunks 1   # one point

With ``--testbed kernel`` (root: docs/deploy.md, "The kernel testbed") it validates the simulator's model of
the kernel testbed instead, on the grid of :func:`kernel_grid`: 48 points of 5, 10 and 20 clients,
SecAgg and SecAgg+, XNoise on and off, 20% dropping before upload or during unmasking, unpipelined or 3
chunks on shared links, each with a model of 10^4, 10^5 or 10^6 parameters (rotating). Every point is
deployed on the kernel testbed (``--rounds`` rounds at 10^6 parameters, and 2 and 4 times as many at 10^5
and 10^4, whose rounds are shorter and vary more: :data:`ROUNDS_FACTOR`; round 1 left out as a warm-up); ``dropsim
calibrate`` then fits the profile to the deployed parties' operations at the calibration half of the
points (:func:`calibration_half`: a fixed half-fraction of the four two-level factors), and every point is
simulated under the kernel testbed's model with the calibrated profile (and with the profile as is, for
reference). It prints the round-time and per-stage errors on each half; the held-out half is the
validation. ``--keep DIR`` keeps every run, and a grid interrupted there goes on where it stopped.

    python benchmarks/validate.py --testbed kernel --keep results/validate-kernel    # ~1.5 hours
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

import pandas as pd

from sim.costs.model import DEFAULT_PROFILE
from sim.deploy.deployment import DeployOptions
from sim.deploy.grid import (
    SCENARIO,
    SHAPES,
    calibration_half,
    complete,
    deployments,
    grid_for,
    repeated_points,
)
from sim.deploy.validate import Validation, compare, signed_error, testbed_overrides
from sim.results.read import read_manifest
from sim.runner import Deployed, run_scenario
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]


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


def round_columns(validation: Validation, suffix: str) -> dict[str, object]:
    """A point's round-time columns from one comparison: ``simulated_s``, ``measured_s`` and ``error``, the
    simulated ones with ``suffix`` (which model simulated it)."""
    summary = validation.summary.set_index("stage")
    return {
        f"simulated_s{suffix}": summary.at["round", "simulated_s"],
        "measured_s": summary.at["round", "measured_s"],
        f"error{suffix}": summary.at["round", "error"],
    }


def run_point(point: list[str], folder: Path, scales: dict[str, float]) -> tuple[Path, dict[str, Path], float]:
    """Deploy the scenario of ``point`` once and simulate it under each testbed ``cpu_scale`` of ``scales``;
    the deployed folder, the simulated folders by name and the deployment's wall seconds."""
    scenario = load(SCENARIO, point, output=str(folder / "out")).base()
    deployed = folder / "deployed"
    start = time.perf_counter()
    options = DeployOptions(log_dir=deployed)
    run_scenario(scenario, deployed, progress=False, engine=partial(Deployed, options=options), driver="deploy")
    wall = time.perf_counter() - start
    simulated = {}
    for name, scale in scales.items():
        scaled = load(SCENARIO, [*point, f"testbed.cpu_scale={scale}"], output=str(folder / "out")).base()
        simulated[name] = folder / f"simulated-{name}"
        run_scenario(scaled, simulated[name], progress=False)
    return deployed, simulated, wall


def calibrate(rounds: int, folder: Path, extra: list[str]) -> float:
    """This host's ``testbed.cpu_scale``, measured apart from the grid: the shipped scenario (5 clients,
    10^5 parameters, dropout 0.2) with another seed, its first round left out."""
    point = [f"rounds={rounds + 1}", "seed=2", *testbed_overrides(), *extra]
    deployed, simulated, _ = run_point(point, folder, {"profile": 1.0})
    return compare(simulated["profile"], deployed, skip_first=True).cpu_scale


def measure(
    clients: int,
    params: int,
    dropout: float,
    chunks: int,
    rounds: int,
    skip_first: bool,
    folder: Path,
    cpu_scale: float,
    extra: list[str] | None = None,
) -> tuple[dict[str, object], pd.DataFrame]:
    """One grid point: deploy, then simulate with the profile as is and with ``cpu_scale``; compare."""
    point = [*overrides(clients, params, dropout, chunks), f"rounds={rounds}", *testbed_overrides(), *(extra or [])]
    deployed, simulated, wall = run_point(point, folder, {"profile": 1.0, "calibrated": cpu_scale})
    row: dict[str, object] = {"clients": clients, "params": params, "dropout": dropout, "chunks": chunks}
    stages = []
    for name, run in simulated.items():
        validation = compare(run, deployed, skip_first=skip_first)
        suffix = "" if name == "calibrated" else f"_{name}"
        row.update(round_columns(validation, suffix))
        row[f"identical{suffix}"] = validation.identical
        row[f"cpu_scale{suffix}"] = validation.cpu_scale
        point_columns = {"clients": clients, "params": params, "dropout": dropout, "chunks": chunks}
        stages.append(validation.summary.assign(model=name, **point_columns))
    row["deploy_wall_s"] = wall
    return row, pd.concat(stages)


def simulate(job: tuple[Path, list[str]]) -> None:
    """Simulate one point (in a process of a pool)."""
    folder, sets = job
    run_scenario(load(SCENARIO, sets, output=str(folder)).base(), folder, progress=False)


def kernel_main(args: argparse.Namespace, argv: list[str]) -> int:
    """The kernel testbed's grid (see the module's docstring)."""
    from sim.deploy.kernel import in_private_network, reexec_in_private_network
    from sim.profiling.calibrate import calibrate as fit_profile
    from sim.profiling.calibrate import summary, write_profile

    grid = grid_for(args.regime)
    if args.points:
        grid = [p for p in grid if any(sel in p.name for sel in args.points)]
    elif args.repeats > 1:
        grid = repeated_points(grid)
    if not grid:
        print(f"no point of the {args.regime} grid matches --points {' '.join(args.points)}", file=sys.stderr)
        return 2
    if args.keep is None and not in_private_network():  # everything is to deploy, in a namespace of its own
        reexec_in_private_network([sys.executable, str(Path(__file__).resolve()), *argv])
    with TemporaryDirectory() if args.keep is None else contextlib.nullcontext(str(args.keep)) as folder:
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        # interleaved: every point once, then every point again, so that a slow stretch of the host falls
        # on all points alike rather than on one point's repetitions
        order = [(r, point) for r in range(args.repeats) for point in grid]
        todo = [(r, point) for r, point in order if not complete(deployments(root, point, args.repeats)[r])]
        if todo and not in_private_network():
            reexec_in_private_network([sys.executable, str(Path(__file__).resolve()), *argv])
        # the host the runs were deployed on: kept runs simulated on another machine model their own cores
        cores = args.cores or deployed_cores(run for _, point in order for run in deployments(root, point, 1))
        base = [*testbed_overrides(cores), "testbed.emulation=kernel", "testbed.cpu_scale=1"]
        base.append(f"costs.profile={DEFAULT_PROFILE}")  # what the deployed runs are calibrated from
        for k, (r, point) in enumerate(todo, start=1):
            deployed = deployments(root, point, args.repeats)[r]
            print(f"[{k}/{len(todo)}] deploying {point.name} ({r + 1} of {args.repeats})", file=sys.stderr)
            keys = [*base, *point.overrides(args.rounds), *args.overrides]
            scenario = load(SCENARIO, keys, output=str(deployed)).base()
            options = DeployOptions(log_dir=deployed)
            start = time.perf_counter()
            run_scenario(scenario, deployed, progress=False, engine=partial(Deployed, options=options), driver="deploy")
            print(f"    {time.perf_counter() - start:.1f} s", file=sys.stderr)
        calibration = [run for p in grid if calibration_half(p) for run in deployments(root, p, args.repeats)]
        profile = root / "calibrated.json"
        runs = calibration or [run for p in grid for run in deployments(root, p, args.repeats)]
        doc = fit_profile(runs, DEFAULT_PROFILE)  # what they were deployed with, wherever it lay
        write_profile(doc, profile)
        print(summary(doc))
        models = {"calibrated": [f"costs.profile={profile}"], "profile": [f"costs.profile={DEFAULT_PROFILE}"]}
        jobs = [
            (root / point.name / f"simulated-{model}", [*base, *point.overrides(args.rounds), *args.overrides, *sets])
            for point in grid
            for model, sets in models.items()
        ]
        print(f"simulating {len(jobs)} runs, {args.jobs} at a time", file=sys.stderr)
        with ProcessPoolExecutor(args.jobs) as pool:
            list(pool.map(simulate, jobs))
        rows, stages = [], []
        for r, point in order:
            deployed = deployments(root, point, args.repeats)[r]
            row: dict[str, object] = {
                "half": "calibration" if calibration_half(point) else "validation",
                "name": point.name,
                **{k: v for k, v in point.__dict__.items() if k != "slowdown"},
                "repeat": r + 1,
            }
            for model in models:
                simulated = root / point.name / f"simulated-{model}"
                validation = compare(simulated, deployed, skip_first=True)
                suffix = "" if model == "calibrated" else f"_{model}"
                row.update(round_columns(validation, suffix))
                stages.append(validation.summary.assign(model=model, point=point.name, half=row["half"], repeat=r + 1))
            row["time_dilation"] = read_manifest(deployed).get("testbed", {}).get("time_dilation")
            rows.append(row)
            pd.DataFrame(rows).to_csv(args.csv, index=False)
            pd.concat(stages).to_csv(args.stages_csv, index=False)
    table = pd.DataFrame(rows)
    per_stage = pd.concat(stages)
    bias = bias_table(per_stage)
    bias.to_csv(args.bias_csv, index=False)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for half in ("calibration", "validation"):
        part = table[table["half"] == half]
        if part.empty:
            continue
        for suffix, model in (("", "calibrated profile"), ("_profile", "profile as is")):
            errors = part[f"error{suffix}"].abs()
            print(
                f"\n{half} half ({part['name'].nunique()} points, {len(part)} deployments), {model}: round time "
                f"|simulated - measured| / measured: median {errors.median():.1%}, worst {errors.max():.1%} "
                f"({part.loc[errors.idxmax(), 'name']})"
            )
        print(f"  mean signed error with its 95% interval, per stage (calibrated, {half} half):")
        print(format_bias(bias[(bias["half"] == half) & (bias["model"] == "calibrated")]))
    print(repeatability(table[table["repeat"] == 1]))
    if args.repeats > 1:
        print(spread(table))
    dilations = sorted({round(float(f), 3) for f in table["time_dilation"].dropna()})
    print(f"time dilation f: {', '.join(f'{f:g}' for f in dilations)}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; tables: {args.csv}")
    return 0


def deployed_cores(runs: Iterable[Path]) -> int | None:
    """``testbed.cores`` of the first finished run of ``runs`` (the cores of the host it was deployed on), or
    None if none is finished."""
    for run in runs:
        if complete(run):
            cores = (read_manifest(run).get("scenario", {}).get("testbed") or {}).get("cores")
            if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0:
                return cores
    return None


def bias_table(per_stage: pd.DataFrame) -> pd.DataFrame:
    """Per half (and both together: ``all``), model and stage, the mean signed error with its 95% interval
    (:func:`sim.deploy.validate.signed_error`), and the median and worst |error| over the deployments. A
    deployment's error is the error of its mean round (its first round left out).

    The interval is over the points: each point's repetitions share one simulated run and the point's own
    error, so they are averaged first and the points are the independent draws (``mean_error``,
    ``ci_low``, ``ci_high``, ``n`` points). More repetitions narrow it only as far as the points agree.
    The interval over the deployments as if independent (``ci_low_deployments``, ``ci_high_deployments``)
    shows the noise of single deployments alone."""
    rows = []
    for half in ("calibration", "validation", "all"):
        part = per_stage if half == "all" else per_stage[per_stage["half"] == half]
        for (model, stage), group in part.groupby(["model", "stage"], sort=False):
            by_point = signed_error(group.groupby("point")["error"].mean())
            by_deployment = signed_error(group["error"])
            rows.append(
                {
                    "half": half,
                    "model": model,
                    "stage": stage,
                    **by_point,
                    "deployments": by_deployment["n"],
                    "ci_low_deployments": by_deployment["ci_low"],
                    "ci_high_deployments": by_deployment["ci_high"],
                    "median_abs_error": by_deployment["median_abs_error"],
                    "worst_abs_error": by_deployment["worst_abs_error"],
                }
            )
    return pd.DataFrame(rows)


def format_bias(bias: pd.DataFrame) -> str:
    """One line per stage: mean signed error [95% interval over the points], the interval over the
    deployments, median and worst |error| over the deployments, and their counts."""

    def interval(low: float, high: float) -> str:
        return "[no interval: one]" if pd.isna(low) else f"[{low:+7.1%}, {high:+7.1%}]"

    lines = []
    for row in bias.itertuples():
        lines.append(
            f"    {row.stage:<22} {row.mean_error:+7.1%} {interval(row.ci_low, row.ci_high)} over {int(row.n)} "
            f"points ({interval(row.ci_low_deployments, row.ci_high_deployments)} over {int(row.deployments)} "
            f"deployments)  median |error| {row.median_abs_error:6.1%}  worst {row.worst_abs_error:6.1%}"
        )
    return "\n".join(lines)


def spread(table: pd.DataFrame) -> str:
    """How far the repetitions of one point are apart: per point, the standard deviation of its measured
    round times over their mean (the coefficient of variation); the median and worst over the points."""
    cv = table.groupby("name")["measured_s"].agg(lambda m: m.std(ddof=1) / m.mean()).dropna()
    if cv.empty:
        return "spread: no point deployed twice"
    return (
        f"spread of a point's repetitions ({len(cv)} points, {table.groupby('name').size().min()} or more "
        f"deployments each): standard deviation / mean of the measured round times, median {cv.median():.1%}, "
        f"worst {cv.max():.1%}"
    )


TWIN_TOLERANCE = 0.02
"""Two points of the kernel grid count as the same work when the simulator's round times for them (with
the profile as is) differ by at most this fraction of their mean."""


def repeatability(table: pd.DataFrame) -> str:
    """How far apart two deployments of the same work are: the pairs of points that differ in the protocol
    alone (SecAgg or SecAgg+) and that the simulator charges the same within :data:`TWIN_TOLERANCE` (at 5
    clients SecAgg+'s graph is complete and the times are equal; at 10 and 20 they differ by the graph's
    missing edges), their measured round times' difference over their mean. No model can be closer to
    single deployments than they are to each other, less the simulated difference."""
    keys = ["clients", "params", "xnoise", "stage", "chunks"]
    gaps = []
    for _, pair in table.groupby(keys):
        if len(pair) != 2:
            continue
        s, m = pair["simulated_s_profile"].to_numpy(), pair["measured_s"].to_numpy()
        if abs(s[0] - s[1]) > TWIN_TOLERANCE * (s[0] + s[1]) / 2:
            continue
        gaps.append((pair.iloc[0]["params"], abs(m[0] - m[1]) / ((m[0] + m[1]) / 2)))
    if not gaps:
        return "repeatability: no pair of points with the same work"
    by_size = {p: [g for q, g in gaps if q == p] for p in sorted({p for p, _ in gaps})}
    parts = [
        f"{p:g} parameters (n={len(g)}): median {statistics.median(g):.1%}, worst {max(g):.1%}"
        for p, g in by_size.items()
    ]
    return (
        f"repeatability ({len(gaps)} pairs of points with the same work within {TWIN_TOLERANCE:.0%}, deployed "
        "apart): |difference| / mean of their measured round times: " + "; ".join(parts)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--params", nargs="+", type=float, default=[1e4, 1e5, 1e6])
    parser.add_argument("--dropouts", nargs="+", type=float, default=[0.0, 0.2])
    parser.add_argument("--chunks", nargs="+", type=int, default=[1, 3])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per point (default 3)")
    parser.add_argument("--skip-first", action="store_true", help="leave round 1 out of the errors")
    parser.add_argument(
        "--cpu-scale",
        type=float,
        metavar="S",
        help="testbed.cpu_scale of the calibrated simulation (default: measured first, by a calibration run)",
    )
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
        "--keep", type=Path, metavar="DIR", help="keep every point's runs in DIR, a new folder (default: none kept)"
    )
    parser.add_argument(
        "--stages-csv", type=Path, default=Path("validate_stages.csv"), help="table per point and stage"
    )
    parser.add_argument(
        "--testbed",
        choices=("process", "kernel"),
        default="process",
        help="process (default: the grid above) or kernel (the kernel testbed's 48-point grid; root)",
    )
    parser.add_argument(
        "--points", nargs="+", metavar="TEXT", help="--testbed kernel: only the points whose names contain TEXT"
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="--testbed kernel: simulations at a time (cores)"
    )
    parser.add_argument(
        "--cores",
        type=int,
        help="--testbed kernel: the testbed's cores the runs are simulated with (default: those of the host the kept "
        "runs were deployed on, else this host's)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="K",
        help="--testbed kernel: deploy every point K times, interleaved (without --points: the 8 points of "
        "BIAS_COMBOS), to measure the mean signed error within a narrow interval",
    )
    parser.add_argument(
        "--regime",
        choices=("usual", "f1"),
        default="usual",
        help="--testbed kernel: usual (the grid of 5, 10 and 20 clients at this host's time dilation) or f1 "
        "(3 clients of slow-downs 3-9: every quota fits 2 cores at f = 1)",
    )
    parser.add_argument(
        "--bias-csv",
        type=Path,
        default=Path("validate_kernel_bias.csv"),
        help="--testbed kernel: the mean signed error and its 95%% interval per half, model and stage",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "repeats", "cores", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} is {value}; it must be at least 1")
    if args.testbed == "kernel":
        if args.csv == Path("validate.csv"):
            args.csv = Path("validate_kernel.csv")
        if args.stages_csv == Path("validate_stages.csv"):
            args.stages_csv = Path("validate_kernel_stages.csv")
        return kernel_main(args, list(sys.argv[1:] if argv is None else argv))
    params = [int(p) for p in args.params]
    unknown = sorted(set(params) - set(SHAPES))
    if unknown:
        parser.error(f"--params {unknown}: the grid's models have {', '.join(f'{p:g}' for p in SHAPES)} parameters")
    rows, stages = [], []
    with TemporaryDirectory() as scratch:
        tmp = str(args.keep) if args.keep is not None else scratch
        scale = args.cpu_scale
        if scale is None:
            print("calibrating: 5 clients, 10^5 parameters, seed 2", file=sys.stderr)
            scale = calibrate(args.rounds, Path(tmp) / "calibration", args.overrides)
        print(f"testbed.cpu_scale {scale:.3f}", file=sys.stderr)
        for clients in args.clients:
            for p in params:
                for dropout in args.dropouts:
                    for chunks in args.chunks:
                        print(f"clients {clients} params {p:g} dropout {dropout:g} chunks {chunks}", file=sys.stderr)
                        folder = Path(tmp) / f"c{clients}_p{p}_d{dropout}_m{chunks}"
                        row, stage = measure(
                            clients, p, dropout, chunks, args.rounds, args.skip_first, folder, scale, args.overrides
                        )
                        rows.append(row)
                        stages.append(stage)
                        pd.DataFrame(rows).to_csv(args.csv, index=False)  # kept as the grid goes
                        pd.concat(stages).to_csv(args.stages_csv, index=False)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for suffix, model in (("_profile", "the profile as is (cpu_scale 1)"), ("", f"cpu_scale {scale:.3g}")):
        errors = table[f"error{suffix}"].abs()
        print(
            f"\nround time under {model}, |simulated - measured| / measured over {len(table)} points: "
            f"median {errors.median():.1%}, worst {errors.max():.1%} "
            f"({table.loc[errors.idxmax(), ['clients', 'params', 'dropout', 'chunks']].to_dict()})"
        )
    same = bool(table["identical"].all() and table["identical_profile"].all())
    print(f"models bit-identical at every point: {same}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; tables: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
