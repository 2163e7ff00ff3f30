"""Availability traces at scale: wall time and memory to synthesise, write, load and query a large trace.

Steps (default: 1M clients over 4 days, about 10M intervals): ``synth``
(:func:`sim.traces.synth.synthesize`), ``write`` (:func:`sim.traces.io.write_trace`, CSV), ``load``
(:func:`sim.traces.io.load_trace`, with every check), ``online_mask`` (:meth:`Trace.online_mask` at
--queries evenly spaced times; per-call mean reported) and ``online_series`` (clients online every 10
minutes over the whole trace), then ``replay``: the engine replaying the trace in ``timing`` fidelity
(a population of that size, --sampled clients per round under SecAgg, --rounds rounds, a virtual second
per trace half hour; per-round mean reported). Synth and write run in one fresh process, load and the
queries in another, the replay in a third, so that memory is not carried over between them. Memory is
the process's peak resident set size (``resource.getrusage``) after each step -- cumulative within its
process -- next to the process's resident size before the first step (interpreter and libraries).
tracemalloc is not used: tracing every allocation slows pandas' CSV writer about thirtyfold.

    python benchmarks/trace.py                               # 1M clients, 4 days, 100 queries
    python benchmarks/trace.py --clients 100000 --csv out.csv
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.traces.io import load_trace, write_trace
from sim.traces.stats import online_series
from sim.traces.synth import synthesize


def _rss_mb() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage / 2**20 if sys.platform == "darwin" else usage / 2**10  # bytes on macOS, KiB on Linux


def _timed(rows: list[dict[str, object]], step: str, fn: Callable[[], Any], per: int = 1) -> Any:
    t0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - t0
    rows.append({"step": step, "wall_s": wall, "per_call_ms": 1000 * wall / per, "rss_peak_mb": _rss_mb()})
    print(f"  {step}: {wall:.2f} s", file=sys.stderr)
    return result


def make(clients: int, days: float, seed: int, path: Path) -> tuple[list[dict[str, object]], float, int]:
    """Child process: synthesise and write. Returns the rows, the starting RSS and the interval count."""
    base = _rss_mb()
    rows: list[dict[str, object]] = []
    trace = _timed(rows, "synth", lambda: synthesize(clients, days, seed))
    _timed(rows, "write", functools.partial(write_trace, trace, path))
    return rows, base, int(trace.intervals)


def use(path: Path, days: float, queries: int) -> tuple[list[dict[str, object]], float, list[int]]:
    """Child process: load and query. Returns the rows, the starting RSS and the clients online per query."""
    base = _rss_mb()
    rows: list[dict[str, object]] = []
    trace = _timed(rows, "load", lambda: load_trace(path))
    times = np.linspace(0.0, days * 86_400.0, queries, endpoint=False)
    online = _timed(rows, "online_mask", lambda: [int(trace.online_mask(t).sum()) for t in times], queries)
    _timed(rows, "online_series", lambda: online_series(trace, 600.0))
    return rows, base, online


REPLAY = """
name: replay-benchmark
seed: 1
rounds: {rounds}
population: {population}
sampling: {{clients_per_round: {sampled}}}
data: {{dataset: synthetic, samples_per_client: 20}}
model: {{name: mlp}}
aggregation: {{protocol: secagg, bits: 20}}
trace: {{file: {trace}, time_scale: 1800}}
fidelity: timing
"""


def replay(path: Path, clients: int, sampled: int, rounds: int) -> tuple[list[dict[str, object]], float, float]:
    """Child process: replay the trace in the engine. Returns the rows, the starting RSS and the mean number
    of clients that went offline mid-round."""
    from sim.runner import Simulation
    from sim.scenario import load

    base = _rss_mb()
    rows: list[dict[str, object]] = []
    file = path.with_suffix(".yaml")
    file.write_text(REPLAY.format(rounds=rounds, population=clients, sampled=sampled, trace=path))
    scenario = load(file).points()[0]
    sim = _timed(rows, "replay setup (load trace)", lambda: Simulation(scenario))
    results = _timed(rows, "replay round", lambda: [sim.step() for _ in range(rounds)], rounds)
    offline = [sum(c.dropped_stage.startswith("offline:") for c in r.record.clients) for r in results]
    return rows, base, float(np.mean(offline))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queries", type=int, default=100, help="online_mask calls")
    parser.add_argument("--sampled", type=int, default=100, help="clients sampled per replayed round")
    parser.add_argument("--rounds", type=int, default=50, help="rounds replayed in the engine")
    parser.add_argument("--dir", type=Path, help="folder for the trace file (default: a temporary folder)")
    parser.add_argument("--csv", type=Path, default=Path("trace.csv"), help="table of results to write")
    args = parser.parse_args(argv)

    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = (args.dir or Path(tmp)) / f"synthetic_{args.clients}.csv"
        with spawn.Pool(1) as pool:
            made, base_a, intervals = pool.apply(make, (args.clients, args.days, args.seed, path))
        size_mb = path.stat().st_size / 2**20
        with spawn.Pool(1) as pool:
            used, base_b, online = pool.apply(use, (path, args.days, args.queries))
        with spawn.Pool(1) as pool:
            replayed, base_c, offline = pool.apply(replay, (path, args.clients, args.sampled, args.rounds))
    rows = [{**r, "rss_start_mb": base_a} for r in made] + [{**r, "rss_start_mb": base_b} for r in used]
    rows += [{**r, "rss_start_mb": base_c} for r in replayed]
    table = pd.DataFrame(rows)
    table.insert(0, "clients", args.clients)
    table.insert(1, "intervals", intervals)
    table["file_mb"] = size_mb
    print(
        f"{args.clients} clients x {args.days:g} days: {intervals} intervals, CSV {size_mb:.0f} MiB; "
        f"online at the queries: {min(online)}..{max(online)} clients; "
        f"replay: {args.sampled} sampled per round, {offline:.2f} going offline mid-round on average; "
        f"python {platform.python_version()}, numpy {np.__version__}, pandas {pd.__version__}, "
        f"{platform.machine()}"
    )
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.csv, index=False)
    print(f"table: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
