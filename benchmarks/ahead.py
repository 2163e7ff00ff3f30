"""The simulator's full-fidelity rounds with its clients' protocol calls made ahead on threads, against every
call made in turn, side by side in one run (``aggregation.threads``; :mod:`sim.engine.ahead`).

Each point is a SecAgg+ scenario run by ``dropsim run``'s simulator: n clients sampled of 10 n, 10% of them
dropping before they upload, each really training a linear model on 10 synthetic samples of 1x99x101 (d =
10^5 parameters with 10 classes, 10^6 with 100: shapes the shipped cost profile measures), then really
masking, encoding and packing its update, every frame encoded and decoded. A fresh process simulates the
scenario with every call made in turn (``threads`` 1), then another on ``--threads`` threads (the cores this
process may use), ``--repeats`` times alternately; each plays a warm-up round, then ``--rounds`` rounds.
``round_s`` is the median wall time of a round in turn, ``threads_round_s`` with threads, ``speedup`` the
first over the second. ``identical`` says whether every process's rounds agreed: model digests, virtual
end times, outcomes and survivors. (Both kinds in one process, alternated round by round, made the rounds
in turn slower than they are alone: 3.4 s against 2.7 s at n = 100, d = 10^6.)

    python benchmarks/ahead.py                          # about 4 minutes on 2 cores
    python benchmarks/ahead.py --points 16:1000000 --rounds 5 --csv ahead.csv
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pandas as pd

from sim.dp import noise
from sim.runner import Simulation
from sim.scenario import load

POINTS = ((16, 100_000), (16, 1_000_000), (100, 100_000), (100, 1_000_000))
"""(clients sampled, parameters) measured by default."""
CLASSES = {100_000: 10, 1_000_000: 100}
"""A linear model on 1x99x101 inputs has 9,999 c + c parameters: 10^5 with 10 classes, 10^6 with 100."""
SHOWN = ["clients", "dim", "threads", "rounds", "round_s", "threads_round_s", "speedup", "identical"]

SCENARIO = """
name: ahead-{n}-{d}
seed: 1
rounds: 1000
population: {population}
sampling: {{clients_per_round: {n}}}
clients:
  compute: {{zipf_a: 1.2, slowdown: [1.0, 3.0]}}
  bandwidth_mbps: {{zipf_a: 1.2, range: [21, 210]}}
dropout: {{rate: 0.1, stage: before_upload}}
data: {{dataset: synthetic, samples_per_client: 10, input_shape: [1, 99, 101], classes: {classes}}}
model: {{name: linear}}
training: {{local_epochs: 1, batch_size: 10}}
aggregation: {{protocol: secagg+, bits: 20, threads: {threads}}}
fidelity: full
"""


def child(n: int, d: int, threads: int, rounds: int) -> dict[str, object]:
    """In this process: a warm-up round, then ``rounds`` rounds at (n, d) on ``threads`` threads; each round's
    wall time and what it gave (model digest, virtual end, outcome, survivors)."""
    if d not in CLASSES:
        raise ValueError(f"dimension {d} is not one of {sorted(CLASSES)} (a linear model on 1x99x101)")
    with tempfile.TemporaryDirectory(prefix="dropsim-ahead-") as folder:
        path = Path(folder) / "ahead.yaml"
        path.write_text(SCENARIO.format(n=n, d=d, population=10 * n, classes=CLASSES[d], threads=threads))
        simulation = Simulation(load(path).base())
    walls: list[float] = []
    seen: list[list[object]] = []
    try:
        for i in range(rounds + 1):  # the first round warms up
            start = time.perf_counter()
            result = simulation.step()
            wall = time.perf_counter() - start
            record = result.record
            seen.append([result.model_sha256, record.t_end, record.outcome, record.survivors])
            if i > 0:
                walls.append(wall)
    finally:
        simulation.close()
    return {"walls": walls, "seen": seen}


def _in_child(n: int, d: int, threads: int, rounds: int) -> dict[str, object]:
    """:func:`child` in a fresh interpreter (each kind of run alone in its process, its memory its own)."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(n), str(d), str(threads), str(rounds)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks/ahead.py --child {n} {d} {threads} {rounds} failed:\n{done.stderr}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def point(n: int, d: int, threads: int, rounds: int, repeats: int = 2) -> dict[str, object]:
    """One row: ``repeats`` times, a process playing ``rounds`` rounds at (n, d) in turn, then one on
    ``threads`` threads."""
    if d not in CLASSES:
        raise ValueError(f"dimension {d} is not one of {sorted(CLASSES)} (a linear model on 1x99x101)")
    walls: dict[int, list[float]] = {1: [], threads: []}
    seen: dict[int, list[object]] = {1: [], threads: []}
    for _ in range(repeats):
        for count in (1, threads):
            result = _in_child(n, d, count, rounds)
            walls[count] += cast(list[float], result["walls"])
            seen[count].append(result["seen"])
    serial, parallel = statistics.median(walls[1]), statistics.median(walls[threads])
    return {
        "clients": n,
        "dim": d,
        "threads": threads,
        "rounds": rounds * repeats,
        "round_s": serial,
        "threads_round_s": parallel,
        "speedup": serial / parallel,
        "identical": all(s == seen[1][0] for s in seen[1] + seen[threads]),
    }


def run(points: Sequence[tuple[int, int]], threads: int, rounds: int, repeats: int = 2) -> pd.DataFrame:
    return pd.DataFrame([point(n, d, threads, rounds, repeats) for n, d in points])


def _point(text: str) -> tuple[int, int]:
    n, _, d = text.partition(":")
    return int(n), int(d)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points", type=_point, nargs="+", default=list(POINTS), help="CLIENTS:DIM, with DIM 100000 or 1000000"
    )
    parser.add_argument("--threads", type=int, default=noise.usable_cores())
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per process")
    parser.add_argument("--repeats", type=int, default=2, help="processes of each kind, alternated")
    parser.add_argument("--csv", type=Path, default=Path("ahead.csv"))
    parser.add_argument("--child", type=int, nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if args.threads < 2:
        parser.error("--threads must be at least 2 (1 is the run in turn it is compared with)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    table = run(args.points, args.threads, args.rounds, args.repeats)
    print(table[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0 if table["identical"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
