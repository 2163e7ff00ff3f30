"""Scale: timing-fidelity rounds over a population of 1,000,000 clients, 100 to 1,000 sampled per round.

Each setting runs in a fresh Python process (so its peak memory is its own) on ``scenarios/scale.yaml``
(SecAgg+, 20-bit values, 10% of the sampled clients leaving after sharing their keys, the CNN's update
size, no training). After one warm-up round it runs ``--rounds`` rounds and reports:

* ``rounds_per_s``: simulated rounds per wall-clock second (``Simulation.step`` only);
* ``events_per_s``: SimPy events processed per wall-clock second, and ``events_per_round``;
* ``setup_s``: building the population, the data partition and the cost model;
* ``peak_rss_mb``: the process's peak resident set size (MB; it includes Python, numpy and torch, about
  350 MB before any client exists);
* ``bytes_per_idle_client``: the peak-RSS difference between a population of 1,000,000 and one of
  100,000 at the same 100 sampled, over the 900,000 clients between them: what a client that is never
  sampled costs.

    python benchmarks/scale.py                                 # 10^6 clients, 100 / 300 / 1000 sampled
    python benchmarks/scale.py --sampled 1000 --rounds 3 --csv scale.csv
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "scale.yaml"
IDLE_REFERENCE = 100_000
"""The smaller population the idle-client memory is measured against."""


def peak_rss_mb() -> float:
    """This process's peak resident set size, MB: ``VmHWM`` of ``/proc/self/status`` (unlike ``ru_maxrss``,
    it does not include the parent's memory copied by the fork before ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("scale: /proc/self/status has no VmHWM (this benchmark needs Linux)")


def child(population: int, sampled: int, rounds: int) -> dict[str, float]:
    """Run in this process: one warm-up round, then ``rounds`` timed rounds, events counted."""
    import simpy

    from sim.runner import Simulation
    from sim.scenario import load

    events = 0
    step = simpy.Environment.step

    def counted(env: simpy.Environment) -> None:
        nonlocal events
        events += 1
        step(env)

    simpy.Environment.step = counted  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        sc = load(
            SCENARIO, [f"population={population}", f"sampling.clients_per_round={sampled}", f"rounds={rounds + 1}"]
        )
        simulation = Simulation(sc.base())
        setup = time.perf_counter() - start
        simulation.step()
        events = 0
        start = time.perf_counter()
        virtual = simulation.env.now
        for _ in range(rounds):
            simulation.step()
        wall = time.perf_counter() - start
    finally:
        simpy.Environment.step = step  # type: ignore[method-assign]
    return {
        "population": population,
        "sampled": sampled,
        "rounds": rounds,
        "setup_s": setup,
        "wall_s": wall,
        "rounds_per_s": rounds / wall,
        "events_per_round": events / rounds,
        "events_per_s": events / wall,
        "virtual_s_per_round": (simulation.env.now - virtual) / rounds,
        "peak_rss_mb": peak_rss_mb(),
    }


def measure(population: int, sampled: int, rounds: int) -> dict[str, float]:
    """:func:`child` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(population), str(sampled), str(rounds)],
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scale: population {population}, {sampled} sampled failed:\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


SHOWN = ["population", "sampled", "rounds_per_s", "events_per_s", "events_per_round", "peak_rss_mb"]
SHOWN += ["bytes_per_idle_client"]
"""The columns the tables print (the CSV has every one)."""


def run(population: int, sampled: Sequence[int], rounds: int) -> pd.DataFrame:
    if population <= IDLE_REFERENCE:
        raise ValueError(f"scale: the population must exceed {IDLE_REFERENCE:,}, the idle-memory reference")
    rows = [measure(population, k, rounds) for k in sampled]
    table = pd.DataFrame(rows)
    base = min(sampled)
    reference = measure(IDLE_REFERENCE, base, rounds)
    big = table.loc[table["sampled"] == base, "peak_rss_mb"].iloc[0]
    idle = (big - reference["peak_rss_mb"]) * 2**20 / (population - IDLE_REFERENCE)
    table["bytes_per_idle_client"] = idle
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=1_000_000)
    parser.add_argument("--sampled", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", type=Path, default=None)
    parser.add_argument("--child", type=int, nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    try:
        table = run(args.population, args.sampled, args.rounds)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(table[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
