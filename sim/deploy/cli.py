"""``dropsim deploy`` and ``dropsim worker``: run a scenario over real sockets.

    dropsim deploy scenarios/deploy.yaml                      # server and workers here, on loopback
    dropsim deploy FILE --host 0.0.0.0 --port 7000 --no-spawn --secret-file testbed.key
    dropsim worker --connect SERVER:7000 --index 0 --secret-file testbed.key   # on each client host

The parsers are added to the main one by :func:`add_deploy_parsers`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from sim.deploy.identity import SECRET_ENV, new_secret, read_secret, write_secret
from sim.errors import InputError

__all__ = ["add_deploy_parsers", "cmd_deploy", "cmd_validate", "cmd_worker", "deploy_options"]


def add_deploy_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy",
        help="run a scenario over real TCP: a server here and one client worker process per sampled client",
    )
    p.add_argument("file", help="scenario YAML file")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a key"
    )
    p.add_argument("--output", metavar="DIR", help="results folder (default: the scenario's output + '-deploy')")
    p.add_argument("--force", action="store_true", help="run even if the folder holds this run or another's")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_network_options(p)

    p = sub.add_parser(
        "validate",
        help="simulate a scenario under the testbed model and deploy it on this host; compare stage by stage",
    )
    p.add_argument("file", help="scenario YAML file")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a key"
    )
    p.add_argument(
        "--output", metavar="DIR", help="folder for both runs and the comparison (default: results/validate-NAME)"
    )
    p.add_argument("--cores", type=int, metavar="K", help="cores the testbed model shares (default: this host's)")
    p.add_argument(
        "--cpu-scale",
        type=float,
        metavar="S",
        help="testbed.cpu_scale: a deployed party's CPU seconds per profiled second (default: the scenario's, or 1)",
    )
    p.add_argument("--skip-first", action="store_true", help="leave round 1 (a warm-up) out of the errors")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_network_options(p)

    p = sub.add_parser("worker", help="a client worker of a deployment (started by deploy, or by hand elsewhere)")
    p.add_argument("--connect", required=True, metavar="HOST:PORT", help="the deployment server's address")
    p.add_argument("--index", type=int, required=True, metavar="J", help="this worker's index (0..workers-1)")
    p.add_argument("--secret-file", type=Path, metavar="FILE", help=f"the deployment's secret (default: ${SECRET_ENV})")
    p.add_argument("--max-frame-mb", type=float, default=64.0, metavar="MB", help="largest frame accepted")


def add_network_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address the server listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: any free one)")
    p.add_argument("--workers", type=int, metavar="N", help="client processes (default: clients per round)")
    p.add_argument(
        "--no-spawn", action="store_true", help="start no workers here: wait for `dropsim worker` from other hosts"
    )
    p.add_argument(
        "--secret-file",
        type=Path,
        metavar="FILE",
        help="the testbed's key secret: read it, or write a new one there for remote workers",
    )
    p.add_argument("--max-frame-mb", type=float, default=64.0, metavar="MB", help="largest frame accepted (64)")
    p.add_argument(
        "--connect-timeout", type=float, default=60.0, metavar="S", help="how long a round waits for its workers"
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="a step's deadline where the scenario sets none (default 300)",
    )


def deploy_options(args: argparse.Namespace, log_dir: Path | None):  # type: ignore[no-untyped-def]
    from sim.deploy.deployment import DeployOptions

    secret = None
    if args.secret_file is not None:
        if args.secret_file.exists():
            secret = _secret(args.secret_file)
        else:
            secret = new_secret()
            write_secret(args.secret_file, secret)
            print(f"wrote the testbed secret to {args.secret_file} (give it to remote workers)", file=sys.stderr)
    if args.no_spawn and args.host in ("127.0.0.1", "localhost") and args.secret_file is None:
        raise InputError("--no-spawn needs --secret-file: remote workers must hold the testbed's secret")
    return DeployOptions(
        host=args.host,
        port=args.port,
        workers=args.workers,
        spawn=not args.no_spawn,
        secret=secret,
        max_frame_mb=args.max_frame_mb,
        connect_timeout_s=args.connect_timeout,
        step_timeout_s=args.step_timeout,
        log_dir=log_dir,
    )


def _secret(path: Path) -> bytes:
    try:
        return read_secret(path)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def cmd_deploy(args: argparse.Namespace) -> int:
    from functools import partial

    from sim.cli import _print_table
    from sim.deploy.deployment import Deployment, check_deployable
    from sim.preflight import check_all
    from sim.runner import prepare_output, run_scenario, summarize
    from sim.scenario import load

    grid = load(args.file, args.overrides, args.output)
    scenario = grid.base()
    if args.output is None:
        from dataclasses import replace

        scenario = replace(scenario, output=f"{scenario.output}-deploy")
    check_all([scenario])
    check_deployable(scenario)
    out = Path(scenario.output)
    options = deploy_options(args, out)
    if options.spawn is False:
        print(f"waiting for workers at {args.host}:{args.port}", file=sys.stderr)
    if prepare_output(out, scenario, force=args.force, driver="deploy"):
        summary = run_scenario(
            scenario, out, progress=not args.quiet, engine=partial(Deployment, options=options), driver="deploy"
        )
    else:
        print(f"{out} already holds this scenario's complete deployment (--force runs it again)", file=sys.stderr)
        summary = summarize(out)
    _print_table([summary.row()])
    print(f"results: {out}/ (rounds.csv, clients.csv, stages.csv, manifest.json; times in wall-clock seconds)")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from sim.deploy.worker import worker_main

    host, _, port = args.connect.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--connect {args.connect!r}: expected HOST:PORT, e.g. 127.0.0.1:7000")
    if args.secret_file is not None:
        secret = _secret(args.secret_file)
    else:
        text = os.environ.get(SECRET_ENV, "")
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            secret = b""
        if len(secret) != 32:
            raise InputError(f"no deployment secret: give --secret-file, or set ${SECRET_ENV} (64 hex digits)")
    worker_main(host, int(port), args.index, secret, int(args.max_frame_mb * 2**20))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from functools import partial

    from sim.deploy.deployment import Deployment, check_deployable
    from sim.deploy.validate import compare, plot, testbed_overrides
    from sim.preflight import check_all
    from sim.runner import run_scenario
    from sim.scenario import load

    grid = load(args.file, [*testbed_overrides(args.cores, args.cpu_scale), *args.overrides])
    scenario = grid.base()
    check_all([scenario])
    check_deployable(scenario)
    out = Path(args.output or f"results/validate-{scenario.name}")
    if out.exists() and any(out.iterdir()) and not (out / "summary.csv").exists() and not (out / "simulated").exists():
        raise InputError(f"{out}: is not empty and holds no validation; choose another --output")
    simulated, deployed = out / "simulated", out / "deployed"
    testbed = scenario.testbed
    if testbed is None:
        raise InputError(f"{args.file}: testbed is unset; validate simulates under the testbed model (testbed.cores)")
    model = f"{testbed.cores} cores, cpu_scale {testbed.cpu_scale:g}"
    print(f"simulating {scenario.name} under the testbed model ({model})")
    run_scenario(replace(scenario, output=str(simulated)), simulated, progress=not args.quiet)
    print(f"deploying {scenario.name} on this host")
    options = deploy_options(args, deployed)
    run_scenario(
        replace(scenario, output=str(deployed)),
        deployed,
        progress=not args.quiet,
        engine=partial(Deployment, options=options),
        driver="deploy",
    )
    validation = compare(simulated, deployed, skip_first=args.skip_first)
    validation.per_round.to_csv(out / "validation.csv", index=False)
    validation.summary.to_csv(out / "summary.csv", index=False)
    plot(validation, out, f"{scenario.name}: simulated vs measured")
    table = validation.summary.copy()
    table["error"] = table["error"].map(lambda e: f"{e:+.1%}")
    for column in ("median_abs_error", "worst_abs_error"):
        table[column] = table[column].map(lambda e: f"{e:.1%}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    same = "identical" if validation.identical else "DIFFERENT"
    print(f"models after every round: {same} (model_sha256, {validation.rounds} rounds)")
    if math.isfinite(validation.cpu_scale):
        print(
            f"CPU: the deployed computations took {validation.cpu_scale / testbed.cpu_scale:.3g} times the simulated "
            f"CPU seconds; this host's testbed.cpu_scale is {validation.cpu_scale:.3g} (--cpu-scale, docs/deploy.md)"
        )
    print(f"results: {out}/ (summary.csv, validation.csv, validation.png/.pdf, simulated/, deployed/)")
    return 0 if validation.identical else 1
