"""Scale: timing-fidelity rounds over a population of 1,000,000 clients, 100 to 10,000 sampled per round, and
over a population of 10^9.

Each setting runs in a fresh Python process (so its peak memory is its own) on ``scenarios/scale.yaml``
(SecAgg+, 20-bit values, 10% of the sampled clients leaving after sharing their keys, the CNN's update
size, no training). After one warm-up round it runs ``--rounds`` rounds and reports:

* ``rounds_per_s``: simulated rounds per wall-clock second (``Simulation.step`` only);
* ``events_per_s``: SimPy events processed per wall-clock second, and ``events_per_round``;
* ``setup_s``: building the population, the data partition and the cost model;
* ``peak_rss_mb``: the process's peak resident set size (MB; it includes Python, numpy and torch, about
  350 MB before any client exists);
* ``process_s``: the whole process, from start to exit (``setup_s`` and the warm-up round included);
* ``bytes_per_idle_client``: the peak-RSS difference between the ``--huge`` population (10^9) and one of
  100,000, both at ``--huge-sampled`` (200) sampled, over the clients between them: what a client that is
  never sampled costs (on the 10^9 row; the others repeat it).

    python benchmarks/scale.py                                 # 10^6: 100 / 1000 / 10000 sampled; 10^9: 200
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
HUGE = 10**9
"""The population of the row that shows memory independent of the population's size."""
HUGE_SAMPLED = 200


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
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(population), str(sampled), str(rounds)],
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"scale: population {population}, {sampled} sampled failed:\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


SHOWN = ["population", "sampled", "rounds_per_s", "events_per_s", "events_per_round", "peak_rss_mb"]
SHOWN += ["process_s", "bytes_per_idle_client"]
"""The columns the tables print (the CSV has every one)."""


def run(
    population: int, sampled: Sequence[int], rounds: int, huge: int = HUGE, huge_sampled: int = HUGE_SAMPLED
) -> pd.DataFrame:
    """Rows for ``population`` at each of ``sampled``, then ``huge`` at ``huge_sampled`` (0: no such row)."""
    if population <= IDLE_REFERENCE:
        raise ValueError(f"scale: the population must exceed {IDLE_REFERENCE:,}, the idle-memory reference")
    rows = [measure(population, k, rounds) for k in sampled]
    big, base = (huge, huge_sampled) if huge else (population, min(sampled))
    if huge:
        rows.append(measure(huge, huge_sampled, rounds))
    table = pd.DataFrame(rows)
    reference = measure(IDLE_REFERENCE, base, rounds)
    peak = table.loc[(table["population"] == big) & (table["sampled"] == base), "peak_rss_mb"].iloc[0]
    table["bytes_per_idle_client"] = (peak - reference["peak_rss_mb"]) * 2**20 / (big - IDLE_REFERENCE)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--population", type=int, default=1_000_000)
    parser.add_argument("--sampled", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--huge", type=int, default=HUGE, help="the population of the last row (0: none)")
    parser.add_argument("--huge-sampled", type=int, default=HUGE_SAMPLED)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--csv", type=Path, default=None)
    parser.add_argument("--child", type=int, nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    try:
        table = run(args.population, args.sampled, args.rounds, args.huge, args.huge_sampled)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(table[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
