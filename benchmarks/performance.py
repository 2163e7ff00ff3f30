"""Speed and scale in one command: the simulator's overhead, a peer's SecAgg+, populations of 10^6 and 10^9, and noise.

Six sections, each printed as a table and written as CSV under ``--out`` (``overhead.csv``,
``peer.csv``, ``scale.csv``, ``noise.csv``, ``cores.csv``, ``ahead.csv``), with the machine in ``machine.txt``:

1. **overhead** (:mod:`overhead`): full-fidelity rounds (real training, SecAgg and SecAgg+, XNoise) against
   the same primitive calls replayed alone; ``overhead`` = wall / primitives - 1, target at most 15 %.
2. **peer** (:mod:`sim.profiling.flower_rounds`): Flower's SecAgg+ (``flwr``, the ``peer`` extra; Ray inside a
   loopback-only network namespace) and ours at the same n, d and dropout, in this run. ``ours_round_s`` is
   one round of our SecAgg+ through the in-memory driver (every client in turn in this one process, every
   frame encoded and decoded; :mod:`secagg`), ``flower_round_s`` Flower's workflow round with its clients on
   Ray actors, ``ratio`` ours over theirs; the compute inside the clients and the server side by side.
   Skipped, with a note, when ``flwr`` is not installed or its round cannot run (it needs ``unshare`` and
   ``ip`` and unprivileged network namespaces).
3. **scale** (:mod:`scale`): timing fidelity, 10^6 clients with 100 to 10,000 sampled and 10^9 with 200:
   rounds/s, events/s, peak memory, bytes per idle client.
4. **noise** (:mod:`skellam`): Skellam noise from a seed (the XNoise hot path) against numpy's and torch's
   compiled Poisson samplers, nanoseconds per Poisson draw.
5. **cores** (:mod:`cores`): the same full-fidelity jobs (a SecAgg+ round at d = 10^6, XNoise sampling, and
   a pure Python loop for reference) one after another and at once on every core: the most that running
   clients' work in parallel could gain on this host.
6. **ahead** (:mod:`ahead`): the simulator's full-fidelity SecAgg+ rounds (real training, n in {16, 100}, d in
   {10^5, 10^6}) with its clients' protocol calls made ahead on every core (``aggregation.threads``) against
   every call made in turn, alternated round by round; the rounds checked identical.

Ratios are measured side by side in one run; absolute times on a shared machine drift.

    python benchmarks/performance.py                           # everything, about 15 minutes on 2 cores
    python benchmarks/performance.py --sections overhead scale --out results/performance
    python benchmarks/performance.py --doc docs/performance.md      # and rewrite its measured tables
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import pandas as pd

from sim.dp import noise
from sim.loopback import ClientSteps
from sim.results.manifest import host
from sim.results.writer import write_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ahead
import cores
import overhead
import scale
import secagg
import skellam

SECTIONS = ("overhead", "peer", "scale", "noise", "cores", "ahead")
PEER_POINTS = ((16, 100_000, 0.0), (16, 100_000, 0.1), (100, 100_000, 0.0), (16, 1_000_000, 0.0), (100, 1_000_000, 0.0))
"""(clients, dimension, dropout) compared with Flower."""


def machine() -> str:
    """One line naming the machine the numbers come from (as run manifests and profiles record it)."""
    here = host()
    system = f"{platform.system()} {platform.release()}"
    return f"{here['processor'] or here['machine']}, {here['cpus']} cores, {system}, Python {platform.python_version()}"


def peer(points: Sequence[tuple[int, int, float]], repeats: int = 3) -> pd.DataFrame | None:
    """Our SecAgg+ round and Flower's at each point, in this run; None without ``flwr``. Ours twice, in
    turn: every client's calls on this thread, and each step's clients on :func:`noise.usable_cores` threads
    (``run_loopback(..., workers=...)``); each the median of ``repeats`` rounds, the two kinds alternated."""
    if importlib.util.find_spec("flwr") is None:
        print("peer: skipped, flwr is not installed (pip install -e '.[peer]')", file=sys.stderr)
        return None
    from sim.costs.model import CostModel
    from sim.profiling.flower_rounds import flower_round

    costs = CostModel.load()
    threads = noise.usable_cores()
    with ClientSteps(threads) as steps:  # kept from round to round, as a long run would keep them
        kinds: dict[str, int | ClientSteps] = {"ours": 1, "threads": steps}
        for workers in kinds.values():  # warm-up
            secagg.one_round("secagg+", 8, 10_000, 0.0, costs, workers=workers)
        rows = []
        for n, d, dropout in points:
            runs: dict[str, list[dict[str, object]]] = {kind: [] for kind in kinds}
            for _ in range(repeats):
                for kind, workers in kinds.items():
                    runs[kind].append(secagg.one_round("secagg+", n, d, dropout, costs, workers=workers))
            ours, threaded = (sorted(runs[k], key=lambda r: float(r["round_s"]))[repeats // 2] for k in kinds)  # type: ignore[arg-type]
            try:
                theirs = flower_round(n, d, dropout)
            except RuntimeError as exc:  # no unshare, user namespaces not allowed, Ray failing to start, ...
                print(f"peer: skipped, Flower's round did not run: {str(exc).splitlines()[0]}", file=sys.stderr)
                return None
            rows.append(
                {
                    "clients": n,
                    "dim": d,
                    "dropout": dropout,
                    "ours_round_s": ours["round_s"],
                    "flower_round_s": theirs["round_s"],
                    "ratio": float(ours["round_s"]) / theirs["round_s"],  # type: ignore[arg-type]
                    "ours_masks_s": ours["masks_s"],
                    "over_masks": float(ours["round_s"]) / float(ours["masks_s"]),  # type: ignore[arg-type]
                    "threads": threads,
                    "threads_round_s": threaded["round_s"],
                    "threads_ratio": float(threaded["round_s"]) / theirs["round_s"],  # type: ignore[arg-type]
                    "threads_masks_s": threaded["masks_s"],
                    "threads_over_masks": float(threaded["round_s"]) / float(threaded["masks_s"]),  # type: ignore[arg-type]
                    "ours_client_s": ours["client_s_mean"],
                    "flower_client_s": theirs["client_s_mean"],
                    "ours_server_s": ours["server_s"],
                    "flower_server_s": theirs["server_s"],
                    "ours_mb_up": ours["client_mb_up"],
                    "flower_mb_up": theirs["client_mb_up"],
                    "flower_error": theirs["max_abs_error"],
                }
            )
            print(f"peer: n={n} d={d} dropout={dropout} done", file=sys.stderr)
    return pd.DataFrame(rows)


def _show(title: str, table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    shown = table[[c for c in columns if c in table.columns]]
    print(f"\n## {title}")
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return shown


def markdown(table: pd.DataFrame) -> str:
    """``table`` as a Markdown table, numbers to 4 significant digits."""

    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def rewrite_doc(path: Path, blocks: dict[str, str]) -> None:
    """Replace the text between ``<!-- performance:NAME:begin -->`` and ``<!-- performance:NAME:end -->`` of
    ``path`` with ``blocks[NAME]``, for the sections measured in this run."""
    text = path.read_text(encoding="utf-8")
    for name, body in blocks.items():
        begin, end = f"<!-- performance:{name}:begin -->", f"<!-- performance:{name}:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{path}: has no {begin} ... {end} block")
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    write_atomic(path, text.encode("utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--out", type=Path, default=Path("results/performance"))
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per overhead setup")
    parser.add_argument("--scale-rounds", type=int, default=5, help="measured rounds per scale setting")
    parser.add_argument("--population", type=int, default=1_000_000)
    parser.add_argument("--sampled", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--huge", type=int, default=scale.HUGE, help="the scale section's last population (0: none)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[noise.usable_cores()], help="the cores section's process counts"
    )
    parser.add_argument("--doc", type=Path, default=None, help="rewrite the measured sections' blocks of this file")
    args = parser.parse_args(argv)
    if "scale" in args.sections and args.population <= scale.IDLE_REFERENCE:
        parser.error(f"--population must exceed {scale.IDLE_REFERENCE:,}, the scale section's idle-memory reference")
    blocks: dict[str, str] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    where = machine()
    (args.out / "machine.txt").write_text(where + "\n")
    print(f"# {where}")
    stamp = f"Measured on {where}, {date.today().isoformat()}."
    if "overhead" in args.sections:
        table = overhead.run(list(overhead.SETUPS), args.rounds, [])
        table.to_csv(args.out / "overhead.csv", index=False)
        title = "overhead: full-fidelity rounds against their primitive work"
        blocks["overhead"] = stamp + "\n\n" + markdown(_show(title, table, overhead.SHOWN))
    if "peer" in args.sections:
        compared = peer(PEER_POINTS)
        if compared is not None:
            compared.to_csv(args.out / "peer.csv", index=False)
            title = "peer: our SecAgg+ round and Flower's, same n, d, dropout"
            blocks["peer"] = stamp + "\n\n" + markdown(_show(title, compared, list(compared.columns)))
    if "scale" in args.sections:
        table = scale.run(args.population, args.sampled, args.scale_rounds, args.huge)
        table.to_csv(args.out / "scale.csv", index=False)
        scaled = _show("scale: timing fidelity", table, scale.SHOWN)
        blocks["scale"] = stamp + "\n\n" + markdown(scaled)
    if "noise" in args.sections:
        table = skellam.run(skellam.VARIANCES, skellam.SIZES)
        table.to_csv(args.out / "noise.csv", index=False)
        title = "noise: Skellam from a seed against compiled Poisson samplers"
        blocks["noise"] = stamp + "\n\n" + markdown(_show(title, table, list(table.columns)))
    if "cores" in args.sections:
        table = cores.run(args.workers)
        table.to_csv(args.out / "cores.csv", index=False)
        title = "cores: the same jobs one after another and at once"
        blocks["cores"] = stamp + "\n\n" + markdown(_show(title, table, cores.SHOWN))
    if "ahead" in args.sections:
        table = ahead.run(ahead.POINTS, max(2, noise.usable_cores()), args.rounds)
        table.to_csv(args.out / "ahead.csv", index=False)
        title = "ahead: the simulator's full-fidelity rounds, clients' calls made ahead on threads and in turn"
        blocks["ahead"] = stamp + "\n\n" + markdown(_show(title, table, ahead.SHOWN))
    if args.doc is not None:
        rewrite_doc(args.doc, blocks)
    print(f"\nwritten: {args.out}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
