"""One command that measures a host for the kernel testbed's validation and keeps everything in one folder.

It runs, one after the other, as root (the kernel testbed needs it: docs/deploy.md, "The kernel testbed"):

1. ``benchmarks/host_speed.py``: how steady the host's cores are (``host_speed.csv``);
2. ``benchmarks/testbed_effects.py``: the testbed's own effects, each measured apart (``testbed_effects.csv``);
3. ``benchmarks/validate.py --testbed kernel``: the grid deployed, calibrated on its calibration half and
   simulated (``validate_kernel.csv``, ``validate_kernel_stages.csv``, ``validate_kernel_bias.csv``), with
   every deployed run kept in ``runs/`` (its ``operations.csv`` included), so that the calibration and
   the simulations can be redone on any other machine: ``python benchmarks/validate.py --testbed kernel
   --keep OUT/runs`` with the same options deploys nothing that is already there, and simulates the
   cores of the host the runs were deployed on;

and writes ``host.txt``: the machine, the kernel, the CPU, the Python, dropsim's commit and every installed
package's version, and each step's command line, exit status and wall seconds. A step that fails is
reported and the next one still runs; a folder already holding some of the grid goes on where it stopped.

    python benchmarks/host_grid.py --out host-grid                       # the 16 points of 5 clients, ~25 min
    python benchmarks/host_grid.py --out host-grid --points n5_ n10_ n20_   # the 48 points
    python benchmarks/host_grid.py --out host-grid --repeats 8            # 8 points, 8 times each, interleaved
    python benchmarks/host_grid.py --out host-grid --quick                # one point of each half, a few minutes
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from sim.deploy.grid import F1_CLIENTS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def environment() -> list[str]:
    """What the host and the software are, one ``key: value`` per line."""
    lines = [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"machine: {platform.machine()}, {os.cpu_count()} cores",
        f"kernel: {platform.release()}",
        f"python: {sys.version.split()[0]} ({sys.executable})",
    ]
    try:
        model = next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")),
            "unknown",
        )  # fmt: skip
        lines.append(f"cpu: {model}")
    except OSError:
        pass
    commit = _output(["git", "-C", str(ROOT), "describe", "--always", "--dirty"])
    lines.append(f"dropsim commit: {commit or 'unknown (not a git checkout)'}")
    packages = _output([sys.executable, "-m", "pip", "freeze", "--all"])
    lines.append("packages: " + ", ".join(packages.split()) if packages else "packages: unknown")
    return lines


def _output(command: list[str]) -> str:
    """``command``'s standard output, stripped; empty if it cannot run or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def step(command: list[str], log: list[str]) -> int:
    """Run ``command`` (its output to this terminal), note it in ``log``; its exit status."""
    print("$ " + " ".join(command), flush=True)
    start = time.perf_counter()
    code = subprocess.call(command)
    wall = time.perf_counter() - start
    log.append(f"step: {' '.join(command)} -> exit {code} after {wall:.0f} s")
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the folder for everything (made if missing)")
    parser.add_argument("--seconds", type=float, default=45.0, help="host_speed.py's sampling time (default 45)")
    parser.add_argument("--rounds", type=int, default=3, help="validate.py --rounds (default 3)")
    parser.add_argument("--repeats", type=int, default=1, help="validate.py --repeats (default 1)")
    parser.add_argument("--regime", choices=("usual", "f1"), default="usual", help="validate.py --regime")
    parser.add_argument(
        "--points",
        nargs="+",
        default=None,
        metavar="TEXT",
        help="validate.py --points (default: n5_ without --repeats)",
    )
    parser.add_argument("--quick", action="store_true", help="a short check of every step (minutes)")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = environment()
    python = sys.executable
    codes = [
        step([python, str(HERE / "host_speed.py"), "--seconds", str(10 if args.quick else args.seconds),
              "--csv", str(out / "host_speed.csv")], log),
        step([python, str(HERE / "testbed_effects.py"), *(["--quick"] if args.quick else []),
              "--csv", str(out / "testbed_effects.csv")], log),
    ]  # fmt: skip
    points = args.points
    if points is None and args.repeats == 1:  # the grid's smallest client count: 16 points
        fewest = f"n{F1_CLIENTS if args.regime == 'f1' else 5}_"
        quick = [f"{fewest}d10000_secagg_plain_before", f"{fewest}d10000_secagg+_plain_before"]
        points = quick if args.quick else [fewest]
    validate = [
        python, str(HERE / "validate.py"), "--testbed", "kernel", "--keep", str(out / "runs"),
        "--rounds", str(1 if args.quick else args.rounds), "--repeats", str(args.repeats), "--regime", args.regime,
        "--csv", str(out / "validate_kernel.csv"), "--stages-csv", str(out / "validate_kernel_stages.csv"),
        "--bias-csv", str(out / "validate_kernel_bias.csv"),
    ]  # fmt: skip
    if points:
        validate += ["--points", *points]
    codes.append(step(validate, log))
    (out / "host.txt").write_text("\n".join(log) + "\n")
    print(f"everything in {out}/ (host.txt says what ran); exit statuses {codes}")
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
