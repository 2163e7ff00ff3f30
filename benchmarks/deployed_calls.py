"""Where a deployed party's wall time goes, computation by computation, from the runs' ``operations.csv``.

A deployment keeps, for every computation of every party, the CPU seconds its thread took and five
instants on the run's clock (:data:`sim.deploy.compute.CALL_TIMES`): when the event loop asked for the
processor, when it held it, when the compute thread began, when the computation returned, and when the
event loop had the result back. This splits each computation's wall time into

- ``queue``: waiting for the party's processor (another computation held it);
- ``hand``: the hand-over to the compute thread;
- ``cpu`` and ``stall``: the computation, its CPU seconds and the rest of its wall time (its thread
  runnable but not running: a spent CFS quota, another process on the core);
- ``back``: the hand-back to the event loop (on a process testbed, after the slow-down's sleep, which it
  includes; on a kernel testbed the slow-down is in the quota and nothing sleeps);

summed per party and round and averaged per kind of party (``server``; ``client`` by slow-down; the
server's two lanes of a pipelined round overlap, and their sums with them), and tells how a
computation's CPU grows with the time its party was idle before it (``idle``: since the latest return of
the party's earlier computations of the round, 0 where they overlap): each computation's CPU less the
median of the warm computations of the same work (the same operations at the same sizes: idle under
0.5 ms, not stalled), by bins of idle time. With
``--profile`` (a calibrated profile), it also prints each party's CPU per round against what the profile
charges for the same operations (``sim.profiling.calibrate.predicted``), by round; and where the runs
kept ``throttles.csv`` (a kernel testbed's: how many CFS periods each party's quota held it back in a
round), the CPU a party spent over its charge against its throttles, fitted by least squares (``cpu -
charged = a + b * throttles`` over the party-rounds): ``b`` is the CPU a throttle cost. Where a run lies
in a ``--keep`` folder of ``benchmarks/validate.py`` beside its point's ``simulated-calibrated`` run, it
sets each round's error (simulated over measured, less 1) against the round's CPU over its charge.

    python benchmarks/deployed_calls.py results/validate-kernel                # a --keep folder
    python benchmarks/deployed_calls.py RUN [RUN ...] --csv calls.csv --profile results/validate-kernel/calibrated.json

docs/time-model.md, "Where a deployed computation's time goes", has what it found on this project's machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.model import CLIENT_ROLE, SERVER_ROLE, CostModel
from sim.deploy.compute import CALL_TIMES
from sim.deploy.operations import COMPUTE, FILE, THROTTLES_FILE, work_from_json
from sim.profiling.calibrate import predicted

PARTS = ("queue", "hand", "cpu", "stall", "back")
IDLE_BINS_MS = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, np.inf)
WARM_IDLE_MS = 0.5
"""A computation after less idle than this (milliseconds), and not stalled, is warm."""
STALLED_S = 2e-4
"""A computation whose wall time exceeds its CPU by more than this (seconds) was kept from a CPU: its CPU is
left out of the idle table (a spent quota may have cooled it)."""
SIMULATED = "simulated-calibrated"
"""The folder, beside a point's deployments in a ``--keep`` folder, of its calibrated simulation."""


def runs(paths: Iterable[Path]) -> list[Path]:
    """The deployment folders at or under ``paths`` (a folder with ``operations.csv``, or a ``--keep``
    folder of ``benchmarks/validate.py``, whose points hold ``deployed``, ``deployed-2`` ...)."""
    found = []
    for path in paths:
        if (path / FILE).is_file():
            found.append(path)
        else:
            found += sorted(p.parent for p in path.glob(f"*/deployed*/{FILE}"))
    return found


def computations(run: Path) -> pd.DataFrame:
    """The computations of one run with their instants, one row each: ``round``, ``party``, ``kind``
    (``server``, or ``client s=<slow-down>``), ``ops`` (the operations charged, ``+``-joined), ``cpu``,
    the parts of :data:`PARTS` and ``idle`` (seconds; NaN for a party's first computation of a round).
    Empty for a run written before the instants were kept."""
    ops = pd.read_csv(run / FILE, dtype={"party": str})
    if not set(CALL_TIMES) <= set(ops.columns):
        return pd.DataFrame()
    calls = ops[(ops["thread"] == COMPUTE) & ops["began_s"].notna()].copy()  # a worker may keep no instants
    if not (run / "clients.csv").is_file():
        raise SystemExit(f"{run}: no clients.csv beside its {FILE} (an unfinished run?)")
    slowdown = pd.read_csv(run / "clients.csv").drop_duplicates("client").set_index("client")["slowdown"]
    calls["kind"] = [
        "server" if p == "server" else f"client s={float(slowdown.get(int(p), np.nan)):.2f}" for p in calls["party"]
    ]
    works = [[w for w in work_from_json(text) if w.op != "deploy.call"] for text in calls["work"]]
    calls["ops"] = ["+".join(w.op for w in work) for work in works]
    calls["size"] = [json.dumps([[w.op, w.size] for w in work], sort_keys=True) for work in works]
    calls["cpu"] = calls["cpu_s"]
    calls["queue"] = calls["acquired_s"] - calls["requested_s"]
    calls["hand"] = calls["began_s"] - calls["acquired_s"]
    calls["stall"] = (calls["returned_s"] - calls["began_s"] - calls["cpu_s"]).clip(lower=0.0)
    calls["back"] = calls["resumed_s"] - calls["returned_s"]
    calls = calls.sort_values(["round", "party", "began_s"])
    latest = calls.groupby(["round", "party"])["returned_s"].transform(lambda s: s.cummax().shift())
    calls["idle"] = (calls["began_s"] - latest).clip(lower=0.0)
    calls["run"] = str(run)
    return calls


def split_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Per kind of party, the mean over its rounds of each part's sum (ms) and of the computations' count."""
    per = calls.groupby(["run", "round", "party", "kind"]).agg(
        computations=("cpu", "size"), **{part: (part, "sum") for part in PARTS}
    )
    table = per.groupby("kind").mean()
    table[list(PARTS)] *= 1e3
    table["wall"] = table[list(PARTS)].sum(axis=1)
    return table.reset_index()


def idle_table(calls: pd.DataFrame) -> pd.DataFrame:
    """Per kind of party (server, clients) and bin of idle time: a computation's CPU over its operations'
    warm median (ms), mean and median, without the stalled ones (whose CPU a spent quota may have cooled)."""
    idle_ms, stalled = calls["idle"] * 1e3, calls["stall"] > STALLED_S
    warm = calls[(idle_ms < WARM_IDLE_MS) & ~stalled].groupby("size")["cpu"].median()
    seen = calls[idle_ms.notna() & ~stalled & calls["size"].isin(warm.index)].copy()
    seen["extra_ms"] = (seen["cpu"] - seen["size"].map(warm)) * 1e3
    seen["warm_ms"] = seen["size"].map(warm) * 1e3
    seen["who"] = np.where(seen["party"] == "server", "server", "clients")
    seen["idle_ms"] = pd.cut(seen["idle"] * 1e3, IDLE_BINS_MS, right=False)
    table = seen.groupby(["who", "idle_ms"], observed=True).agg(
        computations=("extra_ms", "size"),
        extra_mean_ms=("extra_ms", "mean"),
        extra_median_ms=("extra_ms", "median"),
        warm_median_ms=("warm_ms", "median"),
    )
    return table.reset_index().assign(idle_ms=lambda t: t["idle_ms"].astype(str))


def charged_rounds(paths: Sequence[Path], costs: CostModel) -> pd.DataFrame:
    """Per run, round and party: its CPU seconds (compute thread and event loop), what ``costs`` charges for
    the same operations, and its throttled CFS periods where the run kept them (else NaN)."""
    rows = []
    for run in paths:
        ops = pd.read_csv(run / FILE, dtype={"party": str})
        for row in ops.itertuples():
            role = SERVER_ROLE if row.party == "server" else CLIENT_ROLE
            charged = sum(predicted(costs, work_from_json(str(row.work)), role).values())
            rows.append({"run": str(run), "round": row.round, "party": row.party, "cpu": row.cpu_s, "charged": charged})
    per = pd.DataFrame(rows).groupby(["run", "round", "party"], as_index=False)[["cpu", "charged"]].sum()
    throttles = [
        pd.read_csv(run / THROTTLES_FILE, dtype={"party": str}).assign(run=str(run))
        for run in paths
        if (run / THROTTLES_FILE).is_file()
    ]
    if throttles:
        per = per.merge(pd.concat(throttles)[["run", "round", "party", "throttled_periods"]], how="left")
    else:
        per["throttled_periods"] = np.nan
    return per


def profile_table(per: pd.DataFrame) -> pd.DataFrame:
    """Per round number and party, its CPU over its charge, both summed over the runs (a round of the same
    number plays the same clients in every point of one grid)."""
    summed = per.groupby(["round", "party"])[["cpu", "charged"]].sum()
    return (summed["cpu"] / summed["charged"]).unstack("party").round(3).reset_index()


def throttle_fit(per: pd.DataFrame) -> tuple[float, float, float, int] | None:
    """``(a, b, r, n)``: the least-squares line ``cpu - charged = a + b * throttled_periods`` (seconds) over
    the ``n`` party-rounds with throttle counts, and its correlation ``r``; None without two distinct counts."""
    known = per.dropna(subset=["throttled_periods"])
    x, y = known["throttled_periods"].to_numpy(float), (known["cpu"] - known["charged"]).to_numpy(float)
    if len(known) < 2 or np.ptp(x) == 0:
        return None
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b), float(np.corrcoef(x, y)[0, 1]), len(known)


def round_errors(per: pd.DataFrame) -> pd.DataFrame:
    """Per deployed round whose point was simulated beside it (:data:`SIMULATED`): its error (simulated over
    measured round time, less 1) and its parties' CPU over their charge, both from the same run."""
    rows = []
    for run, parties in per.groupby("run"):
        folder = Path(str(run))
        simulated = folder.parent / SIMULATED / "rounds.csv"
        if not simulated.is_file():
            continue
        sim = pd.read_csv(simulated).set_index("round")["round_time"]
        measured = pd.read_csv(folder / "rounds.csv").set_index("round")["round_time"]
        spent = parties.groupby("round")[["cpu", "charged"]].sum()
        for number in measured.index.intersection(sim.index).intersection(spent.index):
            ratio = spent.loc[number, "cpu"] / spent.loc[number, "charged"]
            rows.append({"run": str(run), "round": number, "error": sim[number] / measured[number] - 1, "ratio": ratio})
    return pd.DataFrame(rows)


def error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """The rounds' errors by bins of their CPU over the charge."""
    bins = pd.cut(errors["ratio"], [0, 0.9, 1.0, 1.1, 1.3, 1.6, np.inf])
    table = errors.groupby(bins, observed=True)["error"].agg(rounds="size", error_mean="mean", error_median="median")
    return table.reset_index().assign(ratio=lambda t: t["ratio"].astype(str))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="deployment folders, or --keep folders of validate.py")
    parser.add_argument("--csv", type=Path, help="write every computation with its parts here")
    parser.add_argument("--profile", type=Path, help="a (calibrated) profile to set each party's CPU against")
    args = parser.parse_args(argv)
    found = runs(args.paths)
    if not found:
        parser.error(f"no {FILE} at or under {', '.join(map(str, args.paths))}")
    parts = [computations(run) for run in found]
    calls = pd.concat(parts, ignore_index=True)
    if calls.empty:
        parser.error(f"the {len(found)} run(s) keep no instants: deploy them again with this version")
    pd.set_option("display.width", 200)
    timed = sum(1 for part in parts if not part.empty)
    print(f"{len(calls)} computations of {timed} run(s)", end="")
    print(f" ({len(found) - timed} more left out: written before the instants were kept)" if timed < len(found) else "")
    print("\nper party and round (ms), averaged over the rounds of each kind of party:")
    print(split_table(calls).to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"\nCPU over the warm median of the same operations (idle < {WARM_IDLE_MS} ms, not stalled), by idle time:")
    print(idle_table(calls).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if args.profile is not None:
        per = charged_rounds(found, CostModel.load(args.profile))
        print(f"\nCPU per round over what {args.profile.name} charges, by party:")
        print(profile_table(per).to_string(index=False))
        errors = round_errors(per)
        if not errors.empty:
            r = errors["error"].corr(errors["ratio"])
            print(f"\neach round's error (simulated / measured - 1) by its CPU over the charge ({len(errors)} rounds, "
                  f"correlation {r:.2f}):")  # fmt: skip
            print(error_table(errors).to_string(index=False, float_format=lambda x: f"{x:+.3f}"))
        fit = throttle_fit(per)
        if fit is not None:
            a, b, r, n = fit
            print(
                f"\nCPU over the charge against the throttles, over {n} party-rounds: {a * 1e3:+.3f} ms "
                f"{b * 1e3:+.3f} ms a throttled period (correlation {r:.2f})"
            )
    if args.csv:
        columns = ["run", "round", "party", "kind", "ops", "size", *PARTS, "idle"]
        calls[columns].to_csv(args.csv, index=False)
        print(f"\nwrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
