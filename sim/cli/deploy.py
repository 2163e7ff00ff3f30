"""``dropsim deploy`` and ``dropsim worker``: run a scenario over real sockets.

    dropsim deploy scenarios/deploy.yaml                      # server and workers here, on loopback
    dropsim worker --keygen --index 0 --keys keys/            # on each client host, once; copy worker-0.pub
    dropsim deploy FILE --host HOST --port 7000 --no-spawn --keys keys/   # makes server.key/.pub; copy .pub
    dropsim worker --connect SERVER:7000 --index 0 --keys keys/            # on each client host

Each party's signing key is its own (:mod:`sim.deploy.identity`); only ``.pub`` files travel.

The parsers are added to the main one by :func:`add_deploy_parsers`.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sim.cli.output import print_table
from sim.clients.population import Population
from sim.costs.model import DEFAULT_PROFILE
from sim.deploy import kernel
from sim.deploy.grid import SCENARIO, complete, deployments, grid_for, repeated_points
from sim.deploy.identity import (
    SERVER_KEY_ENV,
    Identity,
    IdentityError,
    announce,
    create_identity,
    known_workers,
    load_or_create,
    new_identity,
    parse_announcement,
    public_file,
    read_identity,
    read_public,
    server_key_file,
    sessions_file,
    worker_key_file,
)
from sim.deploy.validate import Validation, compare, plot, testbed_overrides
from sim.errors import InputError
from sim.results.read import read_manifest
from sim.scenario import load
from sim.testbed import clients_per_round, is_kernel, run_dilation

if TYPE_CHECKING:
    from sim.deploy.deployment import DeployOptions
    from sim.deploy.policy import WorkerPolicy
    from sim.runner import Experiment
    from sim.scenario.types import Scenario

__all__ = [
    "add_deploy_parsers",
    "cmd_calibrate",
    "cmd_deploy",
    "cmd_validate",
    "cmd_worker",
    "deploy_options",
]

T = TypeVar("T")


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
    p.set_defaults(seeded_secrets=False)

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

    p.add_argument(
        "--seeded-secrets",
        action="store_true",
        help="derive the clients' secrets from the scenario seed, so that models with DP match bit for bit: "
        "NO SECRECY (anyone with the scenario can unmask every update; docs/security.md)",
    )

    p = sub.add_parser(
        "calibrate",
        help="fit a cost profile's scales per operation class (crypto, encoding, framing, training) to the CPU "
        "seconds deployed parties measured (operations.csv of deploy or validate runs)",
    )
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN", help="folders of `dropsim deploy` or `validate` runs")
    p.add_argument("--out", type=Path, required=True, metavar="PROFILE", help="the calibrated profile to write")
    p.add_argument(
        "--host",
        action="store_true",
        help="calibrate this host (as root): deploy 8 points of the kernel grid on its kernel testbed, then fit to "
        'them (docs/deploy.md, "Calibrating a new host")',
    )
    p.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="--host: keep the deployed runs here (default results/calibrate-host); runs already there are reused",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        metavar="R",
        help="--host: rounds per point in the grid's units: each unit is 4 rounds at 10^4 parameters and 2 at 10^5, "
        "the first a warm-up (default 2; fewer fit a worse profile)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="the profile to scale (default: the runs' costs.profile, else the shipped default profile)",
    )

    p = sub.add_parser("worker", help="a client worker of a deployment (started by deploy, or by hand elsewhere)")
    p.add_argument("--connect", metavar="HOST:PORT", help="the deployment server's address")
    p.add_argument("--index", type=int, required=True, metavar="J", help="this worker's index (0..workers-1)")
    p.add_argument(
        "--bind",
        metavar="ADDRESS",
        help="the local address this worker connects from (default: the system's choice); a kernel testbed "
        "gives each worker its own loopback address, whose traffic it shapes",
    )
    p.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help=f"key folder: worker-J.key (this worker's) and server.pub (default: a new key, the server's from "
        f"${SERVER_KEY_ENV})",
    )
    p.add_argument("--keygen", action="store_true", help="make DIR/worker-J.key and .pub (with --keys), then exit")
    p.add_argument("--announce-fd", type=int, metavar="FD", help=argparse.SUPPRESS)
    policy = p.add_argument_group(
        "policy",
        "what this worker accepts of the server's scenario, refused otherwise before it trains or sends anything "
        "(docs/deploy.md, docs/security.md). Default: secagg or secagg+ with a threshold safe at the scenario's "
        "privacy.collusion; flags override --policy FILE's keys",
    )
    policy.add_argument("--policy", type=Path, metavar="FILE", help="a policy file (YAML: docs/deploy.md)")
    policy.add_argument(
        "--protocols", metavar="LIST", help="aggregation protocols accepted, comma-separated (default secagg,secagg+)"
    )
    policy.add_argument(
        "--adversary",
        help="semi-honest (accepts either variant) or malicious (requires aggregation.adversary: malicious, and "
        "every worker's worker-J.pub in --keys DIR); default semi-honest",
    )
    policy.add_argument(
        "--min-threshold",
        type=float,
        metavar="F",
        help="least aggregation.threshold: each round's t of this worker's holders at least floor(F n) + 1",
    )
    policy.add_argument(
        "--collusion",
        metavar="C",
        help="colluding clients the threshold must defeat (t > (n + C) / 2 of this worker's n holders, and "
        "t >= C + 2); the scenario's privacy.collusion counts if larger, so the default, 0, means the scenario's; "
        "'none': no such rules",
    )
    policy.add_argument("--require-dp", action="store_true", default=None, help="require DP noise from the clients")
    policy.add_argument("--max-epsilon-round", type=float, metavar="E", help="most epsilon a round may cost")
    policy.add_argument(
        "--max-epsilon-total", type=float, metavar="E", help="most epsilon the deployment may cost this worker"
    )
    policy.add_argument(
        "--trust-sampling",
        action="store_true",
        default=None,
        help="let the epsilon limits count on the server's subsampling (default: every round as if all took part)",
    )
    policy.add_argument(
        "--seeded-secrets",
        action="store_true",
        default=None,
        help="agree to derive this worker's secrets from the scenario seed when the server asks "
        "(validate --seeded-secrets): NO SECRECY",
    )
    policy.add_argument(
        "--allow-plugins",
        action="store_true",
        default=None,
        help="agree to run a scenario that names plug-ins (model.factory, data.loader, dropout.model, a strategy "
        "by import path: code this worker imports; docs/plugins.md); refused otherwise",
    )
    p.add_argument("--secret-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--max-frame-mb", type=float, default=64.0, metavar="MB", help="largest frame accepted")


def add_network_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--testbed",
        choices=("process", "kernel"),
        help="how the devices are emulated: process (sleeps and token buckets in each party, the default) or "
        "kernel (each party in a CPU cgroup of its quota, links shaped by tc in a private network namespace; "
        "root; testbed.emulation)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address the server listens on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: any free one)")
    p.add_argument("--workers", type=int, metavar="N", help="client processes (default: clients per round)")
    p.add_argument(
        "--no-spawn", action="store_true", help="start no workers here: wait for `dropsim worker` from other hosts"
    )
    p.add_argument(
        "--keys",
        type=Path,
        metavar="DIR",
        help="with --no-spawn: key folder with server.key (made if missing) and every worker-J.pub",
    )
    p.add_argument("--secret-file", type=Path, help=argparse.SUPPRESS)
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


SECRET_FILE_GONE = (
    "--secret-file is gone: one secret shared by all parties let the server act as, and derive the keys of, "
    "any worker. Each party now has its own key: --keys DIR (docs/deploy.md, docs/security.md)"
)


def deploy_options(args: argparse.Namespace, log_dir: Path | None) -> DeployOptions:
    from sim.deploy.deployment import DeployOptions  # deferred: torch, kept out of the light commands

    if args.secret_file is not None:
        raise InputError(SECRET_FILE_GONE)
    identity = None
    if args.keys is not None:
        identity, made = _identity(server_key_file(args.keys))
        if made:
            print(f"made the server's key {server_key_file(args.keys)}; give its .pub to every worker", file=sys.stderr)
    if args.no_spawn and args.keys is None:
        raise InputError("--no-spawn needs --keys DIR: the server's key and every remote worker's worker-J.pub")
    return DeployOptions(
        host=args.host,
        port=args.port,
        workers=args.workers,
        spawn=not args.no_spawn,
        identity=identity,
        keys=args.keys,
        seeded_secrets=args.seeded_secrets,
        max_frame_mb=args.max_frame_mb,
        connect_timeout_s=args.connect_timeout,
        step_timeout_s=args.step_timeout,
        log_dir=log_dir,
    )


def _identity(key_file: Path) -> tuple[Identity, bool]:
    try:
        return load_or_create(key_file)
    except (IdentityError, OSError) as exc:
        raise InputError(str(exc)) from None


def emulation_overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides of ``--testbed``: the emulation, and this host's cores if the scenario names none."""
    if args.testbed is None:
        return []
    sets = [f"testbed.emulation={args.testbed}"]

    if load(args.file, args.overrides).base().testbed is None:
        sets.insert(0, f"testbed.cores={os.cpu_count() or 1}")
    return sets


def run_in_private_network(scenario: Scenario, args: argparse.Namespace) -> None:
    """On a kernel testbed, go on in a network namespace of this command's own: the command starts again
    under ``unshare --net`` (exit 2 naming what this machine lacks for it). Elsewhere, nothing."""
    if not is_kernel(scenario):
        return
    if not kernel.in_private_network():
        kernel.reexec_in_private_network([sys.executable, "-m", "sim", *args.argv])
    # a kill (SIGTERM) ends the command as Ctrl-C does, through its cleanup (the cgroups, the workers): the
    # command line's interruptible() says so for deploy and validate, in the process run again too


def through_deployment(options: DeployOptions) -> Callable[[Scenario], Experiment]:
    """What runs a scenario through a deployment with ``options``; with workers started elsewhere, it says
    where they connect once the server listens (``--port 0``: the port the system chose)."""
    from sim.runner import Deployed  # deferred: torch, kept out of the light commands

    def deployed(scenario: Scenario) -> Experiment:
        experiment = Deployed(scenario, options)
        if not options.spawn:
            host, port = experiment.driver.address
            print(f"waiting for workers at {host}:{port} (dropsim worker --connect {host}:{port})", file=sys.stderr)
        return experiment

    return deployed


def cmd_deploy(args: argparse.Namespace) -> int:
    from sim.deploy.deployment import check_deployable  # deferred: torch, kept out of the light commands
    from sim.preflight import check_all  # deferred: torch, kept out of the light commands
    from sim.runner import prepare_output, run_scenario, summarize  # deferred: torch, kept out of the light commands

    grid = load(args.file, [*emulation_overrides(args), *args.overrides], args.output)
    scenario = grid.base()
    run_in_private_network(scenario, args)
    if args.output is None:
        scenario = replace(scenario, output=f"{scenario.output}-deploy")
    check_all([scenario])
    check_deployable(scenario)
    out = Path(scenario.output)
    options = deploy_options(args, out)
    if prepare_output(out, scenario, force=args.force, driver="deploy"):
        summary = run_scenario(
            scenario, out, progress=not args.quiet, engine=through_deployment(options), driver="deploy"
        )
    else:
        print(f"{out} already holds this scenario's complete deployment (--force runs it again)", file=sys.stderr)
        summary = summarize(out)
    print_table([summary.row()])
    print(f"results: {out}/ (rounds.csv, clients.csv, stages.csv, manifest.json; times in wall-clock seconds)")
    say_dilation(out)
    return 0


def say_dilation(run: Path) -> None:
    """On a kernel testbed, the run's time dilation f (from its manifest)."""
    testbed = read_manifest(run).get("testbed")
    if isinstance(testbed, dict) and "time_dilation" in testbed:
        print(
            f"kernel testbed: time dilation f = {testbed['time_dilation']:.4g} (a client of slow-down s computed on "
            f"f / s of a core, the server on f times its speed; cgroup {testbed.get('cgroup', '?')})"
        )


def cmd_worker(args: argparse.Namespace) -> int:
    if args.secret_file is not None:
        raise InputError(SECRET_FILE_GONE)
    if args.keygen:
        if args.keys is None:
            raise InputError("--keygen needs --keys DIR: where to write worker-J.key and worker-J.pub")
        key_file = worker_key_file(args.keys, args.index)
        try:
            create_identity(key_file)
        except (IdentityError, OSError) as exc:
            raise InputError(str(exc)) from None
        print(f"made {key_file} (keep it here) and {public_file(key_file)} (copy it to the server's --keys folder)")
        return 0
    if args.connect is None:
        raise InputError("worker needs --connect HOST:PORT (or --keygen)")
    policy = worker_policy(args)
    host, _, port = args.connect.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--connect {args.connect!r}: expected HOST:PORT, e.g. 127.0.0.1:7000")
    bind = args.bind
    if bind is not None:
        try:
            bind = str(ipaddress.ip_address(bind))
        except ValueError:
            raise InputError(f"--bind {args.bind!r}: expected an IP address, e.g. 127.0.1.1") from None
    if args.keys is not None:
        identity = _read(lambda: read_identity(worker_key_file(args.keys, args.index)))
        server_key = _read(lambda: read_public(args.keys / "server.pub"))
    else:
        identity = new_identity()  # the operating system's randomness, this process's alone
        try:
            server_key = parse_announcement(os.environ.get(SERVER_KEY_ENV, "").encode())
        except IdentityError:
            raise InputError(f"no server key: give --keys DIR (with server.pub), or set ${SERVER_KEY_ENV}") from None
    if args.announce_fd is not None:
        try:
            announce(args.announce_fd, identity)
        except OSError as exc:
            raise InputError(f"--announce-fd {args.announce_fd}: {exc}") from None
    from sim.deploy.worker import worker_main  # deferred: torch, kept out of the light commands

    sessions, directory = None, frozenset[bytes]()
    if args.keys is not None:
        sessions = sessions_file(worker_key_file(args.keys, args.index))
        directory = _read(lambda: known_workers(args.keys))
    # deferred: dp_accounting (the policy's epsilon bounds), kept out of the light commands
    from sim.deploy.policy import MALICIOUS

    if policy.adversary == MALICIOUS and not directory - {identity.verification}:
        raise InputError(
            "--adversary malicious: the malicious variant protects this worker only against keys it knows: put "
            "every worker's worker-J.pub in --keys DIR (with its own alone, the server lists the other clients' "
            "keys itself, and can sign as them)"
        )
    max_frame = int(args.max_frame_mb * 2**20)
    worker_main(host, int(port), args.index, identity, server_key, max_frame, policy, sessions, directory, bind)
    return 0


def worker_policy(args: argparse.Namespace) -> WorkerPolicy:
    """The worker's policy: ``--policy FILE`` (else the safe default), with the policy flags given over it."""
    # deferred: dp_accounting (the policy's epsilon bounds), kept out of the light commands
    from sim.deploy.policy import PolicyError, WorkerPolicy, policy_from_mapping, read_policy

    base = read_policy(args.policy) if args.policy is not None else WorkerPolicy()
    given = {
        "protocols": args.protocols,
        "adversary": args.adversary,
        "threshold": args.min_threshold,
        "collusion": args.collusion,
        "dp": "required" if args.require_dp else None,
        "max_epsilon_round": args.max_epsilon_round,
        "max_epsilon_total": args.max_epsilon_total,
        "plugins": args.allow_plugins,
        "seeded_secrets": args.seeded_secrets,
        "trust_sampling": args.trust_sampling,
    }
    given = {key: value for key, value in given.items() if value is not None}
    if isinstance(given.get("collusion"), str) and given["collusion"].isdigit():
        given["collusion"] = int(given["collusion"])
    flags = {"threshold": "--min-threshold", "dp": "--require-dp", "plugins": "--allow-plugins"}
    try:
        return policy_from_mapping(
            {**base.as_dict(), **given}, lambda key: flags.get(key, f"--{key.replace('_', '-')}")
        )
    except PolicyError as exc:
        raise InputError(f"dropsim worker: {exc}") from None


def _read(load: Callable[[], T]) -> T:
    try:
        return load()
    except IdentityError as exc:
        raise InputError(str(exc)) from None


def cmd_validate(args: argparse.Namespace) -> int:
    # deferred: torch, kept out of the light commands
    from sim.deploy.deployment import SEEDED_SECRETS, check_deployable
    from sim.preflight import check_all  # deferred: torch, kept out of the light commands
    from sim.runner import run_scenario  # deferred: torch, kept out of the light commands

    emulation = [f"testbed.emulation={args.testbed}"] if args.testbed is not None else []
    cpu_scale = args.cpu_scale
    if args.testbed == "kernel" and cpu_scale is None:
        cpu_scale = 1.0  # the kernel testbed's profile is calibrated on it: its costs as they are
    grid = load(args.file, [*testbed_overrides(args.cores, cpu_scale), *emulation, *args.overrides])
    scenario = grid.base()
    run_in_private_network(scenario, args)
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
    if testbed.emulation == "kernel":
        slowdown = Population.build(scenario.population, scenario.clients, scenario.seed).slowdown
        f = run_dilation(scenario, slowdown.smallest(clients_per_round(scenario)))
        model = f"the kernel testbed on {testbed.cores} cores, time dilation f = {f:.4g}"
    print(f"simulating {scenario.name} under the testbed model ({model})")
    run_scenario(replace(scenario, output=str(simulated)), simulated, progress=not args.quiet)
    options = deploy_options(args, deployed)
    if options.seeded_secrets:
        print(f"WARNING: --seeded-secrets: {SEEDED_SECRETS}", file=sys.stderr)
    print(f"deploying {scenario.name} on this host" + (" with seeded secrets" if options.seeded_secrets else ""))
    run_scenario(
        replace(scenario, output=str(deployed)),
        deployed,
        progress=not args.quiet,
        engine=through_deployment(options),
        driver="deploy",
    )
    say_dilation(deployed)
    validation = compare(simulated, deployed, skip_first=args.skip_first)
    validation.per_round.to_csv(out / "validation.csv", index=False)
    validation.summary.to_csv(out / "summary.csv", index=False)
    plot(validation, out, f"{scenario.name}: simulated vs measured")
    table = validation.summary.copy()
    table["error"] = table["error"].map(lambda e: f"{e:+.1%}")
    for column in ("median_abs_error", "worst_abs_error"):
        table[column] = table[column].map(lambda e: f"{e:.1%}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    noisy = scenario.privacy.enabled and not options.seeded_secrets
    if noisy:
        # the deployed clients drew their DP noise from their operating systems: other noise, other models
        same = "identical (unexpected)" if validation.identical else "different, as expected"
        print(
            f"models after every round: {same}: with DP the deployed clients' noise comes from their operating "
            "systems (--seeded-secrets compares them bit for bit, without secrecy)"
        )
    else:
        same = "identical" if validation.identical else "DIFFERENT"
        print(f"models after every round: {same} (model_sha256, {validation.rounds} rounds)")
    if options.seeded_secrets:
        print(f"secrets: {SEEDED_SECRETS}")
    if math.isfinite(validation.cpu_scale):
        print(
            f"CPU: the deployed computations took {validation.cpu_scale / testbed.cpu_scale:.3g} times the simulated "
            f"CPU seconds; this host's testbed.cpu_scale is {validation.cpu_scale:.3g} (--cpu-scale, docs/deploy.md)"
        )
    advice = calibration_advice(validation, scenario)
    if advice:
        print(advice)
    print(f"results: {out}/ (summary.csv, validation.csv, validation.png/.pdf, simulated/, deployed/)")
    return 0 if validation.identical or noisy else 1


LARGE_ERROR = 0.10
"""A round-time error of ``dropsim validate`` beyond which it says how to calibrate this host."""


def calibration_advice(validation: Validation, scenario: Scenario) -> str:
    """On a kernel testbed whose simulated round time is more than :data:`LARGE_ERROR` off the measured one,
    what to do (empty otherwise): calibrate this host with ``dropsim calibrate --host`` where the profile
    was measured on another machine; where it was calibrated on this one, say that the rest is the model's.
    (On the process testbed the CPU line names ``--cpu-scale``.)"""
    from sim.preflight import measured_elsewhere  # deferred: torch, kept out of the light commands

    rounds = validation.summary[validation.summary["stage"] == "round"]
    error = float(rounds["error"].iloc[0]) if len(rounds) else math.nan
    if not (is_kernel(scenario) and math.isfinite(error) and abs(error) > LARGE_ERROR):
        return ""
    if measured_elsewhere(scenario):
        return (
            f"the simulated round time is {error:+.0%} off the measured one, with a profile measured on another "
            "machine: calibrate this host with `dropsim calibrate --host --out host.json` (as root, a few minutes), "
            'then validate again with --set costs.profile=host.json (docs/deploy.md, "Calibrating a new host")'
        )
    return (
        f"the simulated round time is {error:+.0%} off the measured one, with a profile of this machine: what is "
        "left is the model's (docs/deploy.md, \"Measuring the bias\"), or the calibration's, if it saw few rounds "
        "(calibrate --host --rounds, default 2)"
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    # deferred: torch, kept out of the light commands
    from sim.profiling.calibrate import calibrate, summary, write_profile

    if args.host == bool(args.runs):
        raise InputError("calibrate: give either folders of deployed runs, or --host (to deploy them here)")
    runs = deploy_host_grid(args) if args.host else args.runs
    doc = calibrate(runs, args.profile)
    write_profile(doc, args.out)
    print(summary(doc))
    print(f"profile: {args.out} (use it with `costs: {{profile: {args.out}}}` and testbed.cpu_scale 1)")
    if args.host:
        print(
            "  simulate this host's kernel testbed with it: dropsim run FILE --set testbed.emulation=kernel "
            f"--set testbed.cpu_scale=1 --set costs.profile={args.out}\n"
            "  and check it against a deployment: "
            f"dropsim validate FILE --testbed kernel --set costs.profile={args.out}"
        )
    return 0


def deploy_host_grid(args: argparse.Namespace) -> list[Path]:
    """``dropsim calibrate --host``: deploy 8 points of the kernel grid on this host's kernel testbed, each
    once (``sim.deploy.grid.repeated_points``: 5 clients, 10^4 and 10^5 parameters; a few minutes), from the
    shipped default profile; the folders of the deployed runs."""
    from sim.deploy.deployment import DeployOptions  # deferred: torch, kept out of the light commands
    from sim.runner import Deployed, run_scenario  # deferred: torch, kept out of the light commands

    if args.rounds < 1:
        raise InputError(f"calibrate: --rounds is {args.rounds}; it must be at least 1")
    if not SCENARIO.is_file():
        raise InputError(f"{SCENARIO}: the kernel grid's scenario is missing; run dropsim from a clone of the project")
    keep = args.keep or Path("results/calibrate-host")
    points = repeated_points(grid_for("usual"))
    base = [*testbed_overrides(), "testbed.emulation=kernel", "testbed.cpu_scale=1", f"costs.profile={DEFAULT_PROFILE}"]
    runs = [deployments(keep, point, 1)[0] for point in points]
    todo = [(point, run) for point, run in zip(points, runs, strict=True) if not complete(run)]
    if todo and not kernel.in_private_network():
        kernel.reexec_in_private_network([sys.executable, "-m", "sim", *args.argv])
    for k, (point, run) in enumerate(todo, start=1):
        print(f"[{k}/{len(todo)}] deploying {point.name} on this host's kernel testbed", file=sys.stderr)
        scenario = load(SCENARIO, [*base, *point.overrides(args.rounds)], output=str(run)).base()
        engine = partial(Deployed, options=DeployOptions(log_dir=run))
        run_scenario(scenario, run, progress=False, engine=engine, driver="deploy")
    print(f"deployed runs: {keep}/ (kept: `dropsim calibrate {keep}/*/deployed --out PROFILE` fits again)")
    return runs
