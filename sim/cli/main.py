"""The ``dropsim`` command.

Exit status: 0 on success, 1 when a run or a sweep point failed, 2 for bad input (a scenario, a result
folder, a profile, a finished run's table that changed since), 130 when interrupted (Ctrl-C), 143 when
``run``, ``sweep`` or ``reproduce`` is terminated (SIGTERM, as a batch scheduler sends at its time limit):
those three end alike on either signal (:mod:`sim.runner.interrupts`), keeping the finished rounds, closing
the interrupted runs' manifests as ``interrupted`` and reaping every process they started. Errors go to
stderr and name the file, key and value.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

import sim
from sim import api
from sim.cli.deploy import add_deploy_parsers, cmd_calibrate, cmd_deploy, cmd_validate, cmd_worker
from sim.cli.output import print_table
from sim.cli.trace import add_trace_parser, cmd_trace
from sim.costs.model import CostModelError
from sim.errors import InputError
from sim.paper.cli import add_reproduce_parser, cmd_reproduce
from sim.profiling.implementations import profile_implementation
from sim.protocol.registry import PROTOCOLS, spec_of
from sim.protocol.spec import either, pipelined, protocols_where
from sim.results.folders import check_name
from sim.results.read import read_run_table, run_dirs
from sim.results.writer import ResultsError, csv_bytes, make_folder, write_atomic
from sim.scenario import load
from sim.scenario.errors import ScenarioError
from sim.scenario.types import Pipelining

if TYPE_CHECKING:
    from sim.runner.interrupts import Interruption

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
UNVERIFIED = (
    "its manifest, from an earlier dropsim, holds no digests of its tables, so they are shown unverified "
    "(--force runs it again, and records them)"
)
"""The note for a finished run found without digests (:mod:`sim.results.integrity`)."""
STOPPABLE = frozenset({"run", "sweep", "reproduce", "deploy", "validate"})
"""Commands that SIGTERM stops as Ctrl-C does (the others keep the default: it ends them at once)."""


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="scenario YAML file")
    _set_option(p, "override a key (value read as YAML); repeatable, e.g. --set dropout.rate=0.3")


def _set_option(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dropsim",
        description="Discrete-event simulation of federated-learning rounds under client dropout.",
    )
    parser.add_argument("--version", action="version", version=f"dropsim {sim.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run one scenario and write its result tables")
    _scenario_args(p)
    p.add_argument("--output", metavar="DIR", help="results folder (default: the scenario's output key)")
    p.add_argument(
        "--force", action="store_true", help="run even if the folder holds this run, complete, or another run's tables"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("check", help="validate a scenario file (and every point of its sweep)")
    _scenario_args(p)

    p = sub.add_parser("sweep", help="run every point of the scenario's sweep grid")
    _scenario_args(p)
    p.add_argument("--output", metavar="DIR", help="sweep folder (default: the scenario's output key)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the points on the Dask distributed cluster whose scheduler is at ADDRESS (tcp://HOST:PORT)",
    )
    p.add_argument(
        "--force", action="store_true", help="run every point again, those the folder holds finished included"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "privacy", help="plan the noise and print the epsilon each strategy ends at per dropout rate (no training)"
    )
    _scenario_args(p)
    p.add_argument(
        "--dropout",
        type=float,
        nargs="+",
        default=[0.0, 0.1, 0.2, 0.3, 0.4],
        metavar="RATE",
        help="fractions of the sampled clients dropping each round (default 0 0.1 0.2 0.3 0.4)",
    )
    p.add_argument("--dim", type=int, metavar="N", help="model parameters (default: the scenario's model)")
    p.add_argument("--strategies", nargs="+", metavar="NAME", help="strategies to compare (default: all but none)")
    p.add_argument("--csv", type=Path, metavar="OUT", help="also write the table as CSV")
    p.add_argument("--plot", type=Path, metavar="DIR", help="also draw epsilon against dropout (PNG and PDF)")

    p = sub.add_parser("plot", help="plot accuracy and round time from result folders")
    p.add_argument("results", nargs="+", type=Path, help="run or sweep folders")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="folder for the PNG and PDF files")
    p.add_argument("--by", metavar="KEY", help="one line per value of this swept key (mean over the rest)")
    p.add_argument(
        "--gantt",
        type=int,
        metavar="ROUND",
        help="also draw the pipeline Gantt chart of this round for each run (gantt_<run_id>_round<ROUND>)",
    )

    p = sub.add_parser(
        "profile",
        help="measure this machine and fit the compute cost model; or, with --pipeline, fit a scenario's "
        "pipeline model and choose its chunk count",
    )
    p.add_argument("--out", type=Path, default=Path("profile.json"), metavar="FILE", help="profile to write")
    p.add_argument(
        "--quick", action="store_true", help="few sizes, one repeat: a rough profile in seconds, for trying things out"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="OP",
        help="measure again only these operations (e.g. noise.skellam) and update them in the existing --out profile",
    )
    p.add_argument(
        "--impl",
        choices=("dropsim", "dordis", "flower"),
        default="dropsim",
        help="whose implementation to measure: dropsim's own code (default), Dordis's primitives (needs "
        "pip install -e '.[impl]') or Flower 1.42's SecAgg+ functions (needs pip install -e '.[peer]'); "
        "docs/profiles.md",
    )
    p.add_argument(
        "--base",
        type=Path,
        metavar="FILE",
        help="with --impl other than dropsim: the dropsim profile of this machine to copy the operations the "
        "implementation does alike from (default: the shipped one)",
    )
    p.add_argument(
        "--model",
        metavar="SCENARIO",
        help="time local training of this scenario's model (its own, model.factory, or a built-in) on its data's "
        "shape and add it to the --out profile (a copy of the scenario's profile if --out does not exist yet)",
    )
    p.add_argument(
        "--pipeline",
        metavar="SCENARIO",
        help="fit Dordis eq. 3 per stage from short simulated runs of this scenario (secagg or secagg+) and "
        "predict the completion time of every chunk count (Hyades appendix F)",
    )
    _set_option(p, "with --pipeline or --model: override a scenario key (repeatable)")
    p.add_argument(
        "--check",
        action="store_true",
        help="with --pipeline: also simulate every chunk count and compare with the prediction",
    )
    p.add_argument(
        "--rounds", type=int, default=1, metavar="N", help="with --check: rounds simulated per m (default 1)"
    )
    p.add_argument("--csv", type=Path, metavar="OUT", help="with --pipeline: also write the table per m as CSV")

    add_trace_parser(sub)
    add_deploy_parsers(sub)
    add_reproduce_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a kernel testbed runs it again
    if args.command not in STOPPABLE:
        return _dispatch(args, None)
    from sim.runner.interrupts import interruptible  # deferred: torch, kept out of the light commands
    from sim.runner.workers import reaping_resource_tracker  # deferred: torch, kept out of the light commands

    with interruptible() as caught, reaping_resource_tracker():  # nothing this command starts outlives it
        return _dispatch(args, caught)


def _dispatch(args: argparse.Namespace, caught: Interruption | None) -> int:
    """Run the command; bad input and interruptions (``caught`` says by which signal, where the command is
    :data:`STOPPABLE`) become exit statuses and one line on stderr."""
    try:
        return int(_COMMANDS[args.command](args))
    except InputError as exc:
        print(f"dropsim: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if caught is not None and caught.signal == signal.SIGTERM:
            print("dropsim: terminated (SIGTERM); finished rounds are kept", file=sys.stderr)
            return caught.exit_status
        print("dropsim: interrupted; finished rounds are kept", file=sys.stderr)
        return EXIT_INTERRUPTED


def cmd_check(args: argparse.Namespace) -> int:
    from sim.preflight import check_all, warnings  # deferred: torch, kept out of the light commands

    grid = load(args.file, args.overrides)
    base = grid.base()
    points = grid.points()
    check_name(base)
    check_all(points)
    print(
        f"{args.file}: ok: {base.name}, {base.rounds} rounds, population {base.population}, "
        f"aggregation {base.aggregation.protocol}, fidelity {base.fidelity}, output {base.output}"
    )
    if grid.sweep:
        print(f"sweep of {len(points)} runs over {', '.join(grid.sweep)}; all valid")
    for warning in dict.fromkeys(str(w) for point in points for w in warnings(point)):  # once, in order
        print(f"warning: {warning}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    grid = load(args.file, args.overrides, args.output)
    scenario = grid.base()
    if grid.sweep:
        print(
            f"note: {args.file} defines a sweep of {grid.size} runs; this runs the scenario as written. "
            f"Use `dropsim sweep {args.file}` for the grid.",
            file=sys.stderr,
        )
    result = api.run(grid, progress=not args.quiet, force=args.force)
    if not result.ran:
        print(f"{result.path} already holds this scenario's complete run (--force runs it again)", file=sys.stderr)
        if not result.verified:
            print(f"note: {result.path}: {UNVERIFIED}", file=sys.stderr)
    summary = result.summary
    print_table([summary.row()])
    if summary.stopped:
        print(f"stopped {summary.stopped}")
    budget = scenario.privacy.epsilon
    if scenario.privacy.enabled and summary.epsilon > budget * (1 + 1e-9):
        print(
            f"note: this run spent epsilon {summary.epsilon:.4g}, more than the budget {budget:g} its noise was "
            "planned for (dropout beyond what the strategy removes, or fewer clients to sample from than planned)",
            file=sys.stderr,
        )
    print(f"results: {scenario.output}/ (rounds.csv, clients.csv, stages.csv, manifest.json)")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        print("dropsim: --jobs must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = api.sweep(
        args.file,
        args.output,
        args.overrides,
        jobs=args.jobs,
        scheduler=args.scheduler,
        progress=not args.quiet,
        force=args.force,
    )
    statuses = result.statuses
    unverified = [r for r in result.runs.values() if not r.ran and not r.verified]
    if unverified:
        print(f"note: {len(unverified)} finished runs found (e.g. {unverified[0].path}): {UNVERIFIED}", file=sys.stderr)
    rows = []
    for st in statuses:
        s = st.summary
        rows.append(
            {
                "run": st.run_id,
                "status": st.status,
                "final acc": s.final_accuracy if s else math.nan,
                "epsilon": s.epsilon if s else math.nan,
                "stopped": "yes" if s and s.stopped else "",
                "round time (s)": s.mean_round_time if s else math.nan,
                "wall (s)": s.wall_seconds if s else math.nan,
            }
        )
    print_table(rows)
    out = result.path
    failed = result.failed
    for st in failed:
        folder = Path(out) / "runs" / st.run_id
        where = f" (details in {folder}/)" if folder.is_dir() else ""
        print(f"failed: {st.run_id}: {st.error}{where}", file=sys.stderr)
    print(f"results: {out}/ (rounds.csv, runs.csv, sweep.json, runs/)")
    return EXIT_FAILED if failed else 0


def cmd_privacy(args: argparse.Namespace) -> int:
    from sim.learning.models import model_dimension  # deferred: torch, kept out of the light commands

    scenario = load(args.file, args.overrides).base()
    try:
        rows = api.privacy_rows(scenario, args.dropout, args.strategies or None, args.dim)
    except ValueError as exc:
        print(f"dropsim: {args.file}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    dim = args.dim or model_dimension(scenario)
    p = scenario.privacy
    print(
        f"{scenario.name}: {scenario.rounds} rounds, budget epsilon {p.epsilon:g} at delta {p.delta:g}, "
        f"{p.mechanism}, {dim} parameters, tolerance {p.tolerance:g}"
    )
    print_table(rows)
    if args.csv:
        make_folder(args.csv.parent)
        write_atomic(args.csv, csv_bytes(rows, list(rows[0]), header=True))
        print(f"table: {args.csv}")
    if args.plot:
        from sim.plots import plot_privacy  # deferred: matplotlib, loaded only to plot

        for path in plot_privacy(pd.DataFrame(rows), args.plot, budget=p.epsilon):
            print(path)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from sim.plots import gantt_name, plot_gantt, plot_results  # deferred: matplotlib, loaded only to plot

    written = plot_results(args.results, args.out, by=args.by)
    if args.gantt is not None:
        names: set[str] = set()
        for folder in args.results:
            for directory in run_dirs(folder):
                stages = read_run_table(directory, "stages")
                run_id = str(stages["run_id"].iloc[0]) if len(stages) else directory.name
                name = gantt_name(run_id, args.gantt)
                if name in names:  # two folders holding runs of the same id: keep both figures
                    name = f"{name}_{len(names) + 1}"
                names.add(name)
                try:
                    written += plot_gantt(stages, args.out, round=args.gantt, name=name)
                except ResultsError as exc:
                    raise ResultsError(f"{directory}: {exc}") from None
    for path in written:
        print(path)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from sim.profiling.profiler import run_profile  # deferred: torch, kept out of the light commands

    if args.pipeline is not None and args.only:
        print("dropsim: --only re-measures operations of a profile; it does not go with --pipeline", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.model is not None and (
        args.pipeline is not None or args.only or args.impl != "dropsim" or args.base is not None
    ):
        print(
            "dropsim: --model adds one model's training to a profile; not with --pipeline, --only, --impl or --base",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.pipeline is not None:
        return cmd_profile_pipeline(args)
    folder = args.out.parent if str(args.out.parent) else Path()
    if not folder.is_dir():
        print(f"dropsim: {args.out}: the folder {folder} does not exist; create it first", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.model is not None:
        return cmd_profile_model(args)
    if args.overrides or args.check or args.csv:
        print("dropsim: --set, --check and --csv go with --pipeline SCENARIO", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.impl != "dropsim" and args.only:
        print("dropsim: --only re-measures operations of a dropsim profile; not with --impl", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.impl == "dropsim" and args.base is not None:
        print("dropsim: --base goes with --impl dordis or flower", file=sys.stderr)
        return EXIT_BAD_INPUT
    say = lambda m: print(f"profiling {m}", file=sys.stderr)  # noqa: E731
    if args.impl != "dropsim":
        try:
            doc = profile_implementation(args.impl, args.out, base=args.base, quick=args.quick, progress=say)
        except ModuleNotFoundError as exc:
            extra = "peer" if args.impl == "flower" else "impl"
            print(f"dropsim: --impl {args.impl} needs {exc.name}: pip install -e '.[{extra}]'", file=sys.stderr)
            return EXIT_BAD_INPUT
        except CostModelError as exc:
            print(f"dropsim: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except RuntimeError as exc:  # a probed round of the implementation's own engine failed
            print(f"dropsim: --impl {args.impl}: {exc}", file=sys.stderr)
            return 1
    elif args.only:
        from sim.profiling.profiler import update_profile  # deferred: torch, kept out of the light commands

        try:
            doc = update_profile(args.out, args.only, quick=args.quick, progress=say)
        except CostModelError as exc:
            print(f"dropsim: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    else:
        doc = run_profile(args.out, quick=args.quick, progress=say)
    shown = args.only or [op for op, e in doc["operations"].items() if e.get("as", args.impl) == args.impl]
    rows = [{"operation": op, **doc["operations"][op]["coef"], "r2": doc["operations"][op]["r2"]} for op in shown]
    print_table(rows)
    engine = doc.get("engine")
    if engine is not None:
        coef = engine["message"]["coef"]
        print(
            f"engine {engine['name']}: {coef['const'] * 1e3:.3g} ms + {coef['bytes'] * 1e9:.3g} ns/byte a message "
            f"(r2 {engine['message']['r2']:.2f}); sweep every {engine['delivery_interval_s']:g} s, poll every "
            f"{engine['pull_interval_s']:g} s"
        )
    print(f"profile: {args.out} (use it with `costs: {{profile: {args.out}}}` in a scenario)")
    if args.quick:
        print(
            "note: a --quick profile fits each operation from a few one-shot timings; its numbers can be off by "
            "a factor of two. Measure without --quick for results.",
            file=sys.stderr,
        )
    return 0


def cmd_profile_model(args: argparse.Namespace) -> int:
    """``dropsim profile --model SCENARIO --out PROFILE``: the scenario's model's training added to a profile."""
    from sim.preflight import plugin_problems  # deferred: torch, kept out of the light commands
    from sim.profiling.profiler import profile_model, training_op  # deferred: torch, kept out of the light commands

    if args.check or args.csv:
        print("dropsim: --check and --csv go with --pipeline SCENARIO", file=sys.stderr)
        return EXIT_BAD_INPUT
    say = lambda m: print(f"profiling {m}", file=sys.stderr)  # noqa: E731
    try:
        points = api.load_scenario(args.model, args.overrides).points()
        problems = [p for point in points for p in plugin_problems(point)]
        if problems:
            raise ScenarioError(problems)
        timed: dict[str, dict[str, Any]] = {}
        for point in points:  # each model of a sweep (its points' models, shapes and args), once
            if training_op(point) not in timed:
                op, doc = profile_model(point, args.out, quick=args.quick, progress=say)
                timed[op] = doc["operations"][op]
    except (InputError, CostModelError) as exc:
        print(f"dropsim: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_table([{"operation": op, **entry["coef"], "r2": entry["r2"]} for op, entry in timed.items()])
    print(f"profile: {args.out} (use it with `costs: {{profile: {args.out}}}` in a scenario)")
    return 0


def cmd_profile_pipeline(args: argparse.Namespace) -> int:
    """``dropsim profile --pipeline SCENARIO``: fitted stage latencies, predicted times, the chosen m."""
    from sim.learning.models import model_dimension  # deferred: torch, kept out of the light commands
    from sim.runner.chunks import check_chunks, plan_chunks  # deferred: torch, kept out of the light commands

    if args.rounds < 1:
        print(f"dropsim: --rounds {args.rounds} is below 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    scenario = load(args.pipeline, args.overrides).base()
    if spec_of(scenario.aggregation).pipeline is None:
        print(
            f"dropsim: {args.pipeline}: aggregation.protocol is {scenario.aggregation.protocol!r}; pipelining "
            f"runs one secure-aggregation instance per chunk: use {either(protocols_where(PROTOCOLS, pipelined))}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if scenario.pipeline is None:
        scenario = dataclasses.replace(scenario, pipeline=Pipelining(chunks=None))
    assert scenario.pipeline is not None
    dim = model_dimension(scenario)
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    plan = plan_chunks(scenario, dim, say)
    print(f"{scenario.name}: d = {dim} values; per-chunk latency of each stage (Dordis eq. 3), fitted on short runs:")
    names = ("c-comp", "comm (upload)", "s-comp", "comm (dispatch)", "c-comp (decode)")
    print_table(
        [
            {
                "stage": f"{i + 1} {names[i]}",
                "resource": plan.model.resources[i],
                "beta1 (s/value)": st.per_value,
                "beta2 (s/chunk)": st.per_chunk,
                "beta3 (s)": st.constant,
                "r2": st.r2,
                "points": st.points,
            }
            for i, st in enumerate(plan.model.stages)
        ]
    )
    rows: list[dict[str, object]] = [{"chunks": m, "predicted_s": t} for m, t in plan.predicted.items()]
    if args.check:
        checked = check_chunks(scenario, list(plan.predicted), args.rounds, say)
        for row, result in zip(rows, checked, strict=True):
            row["simulated_agg_s"] = result.simulated_s
            row["simulated_round_s"] = result.round_time_s
    print()
    print_table(rows)
    best = plan.predicted_best
    print(f"\npredicted best: chunks {best} ({plan.predicted[best]:.4g} s)")
    if plan.chunks != best:
        print(
            f"chosen: chunks {plan.chunks}: its proxy round took {plan.proxy_seconds[plan.chunks]:.4g} s, the "
            f"predicted best's {plan.proxy_seconds[best]:.4g} s (proxy rounds: no training)"
        )
    else:
        print(f"chosen: chunks {plan.chunks} (no proxy round at another m was faster)")
    if args.check:
        simulated = {int(str(r["chunks"])): float(str(r["simulated_agg_s"])) for r in rows}
        fastest = min(simulated, key=lambda m: (simulated[m], m))

        def off(m: int) -> str:
            return f"{simulated[m]:.4g} s, {simulated[m] / simulated[fastest] - 1:+.1%} from the best"

        print(f"simulated best: chunks {fastest} ({simulated[fastest]:.4g} s)")
        print(f"the predicted best (chunks {best}) simulates at {off(best)}")
        print(f"the chosen m (chunks {plan.chunks}) simulates at {off(plan.chunks)}")
    if args.csv:
        make_folder(args.csv.parent)
        write_atomic(args.csv, csv_bytes(rows, tuple(rows[0]), header=True))
        print(f"table: {args.csv}")
    return 0


_COMMANDS = {
    "run": cmd_run,
    "check": cmd_check,
    "sweep": cmd_sweep,
    "privacy": cmd_privacy,
    "plot": cmd_plot,
    "profile": cmd_profile,
    "trace": cmd_trace,
    "deploy": cmd_deploy,
    "worker": cmd_worker,
    "validate": cmd_validate,
    "calibrate": cmd_calibrate,
    "reproduce": cmd_reproduce,
}


if __name__ == "__main__":
    sys.exit(main())
