"""``dropsim trace``: convert FedScale's pickles, synthesise a calibrated trace, summarise and plot a trace.

    dropsim trace import-fedscale client_behave_trace --capacity client_device_capacity --out fedscale.csv
    dropsim trace synth --clients 2000 --days 4 --seed 1 --out traces/synthetic_small.csv
    dropsim trace stats traces/synthetic_small.csv --plot figures/
    dropsim trace select traces/synthetic_small.csv --clients 100 --by online --out traces/available_100.csv

Each prints a short table. Bad input raises :class:`sim.errors.InputError` (the main command turns it into
exit status 2); the parser is added to the main one by :func:`add_trace_parser`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from sim.errors import InputError
from sim.traces.fedscale import import_fedscale_report
from sim.traces.io import load_trace, write_trace
from sim.traces.model import Trace
from sim.traces.select import RANKINGS, select_clients
from sim.traces.stats import dominant_period_h, online_series, session_stats, span_s
from sim.traces.synth import synthesize_counted

__all__ = ["add_trace_parser", "cmd_trace"]


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``trace`` and its sub-commands to the main parser's sub-parsers."""
    trace = sub.add_parser("trace", help="availability traces: import FedScale's, synthesise one, summarise one")
    actions = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")

    p = actions.add_parser(
        "import-fedscale", help="convert FedScale's client_behave_trace pickle (read safely) to a CSV trace"
    )
    p.add_argument("file", type=Path, help="FedScale client_behave_trace pickle")
    p.add_argument("--capacity", type=Path, metavar="FILE", help="FedScale client_device_capacity pickle")
    p.add_argument("--out", type=Path, required=True, metavar="OUT", help="trace to write (NAME.csv or .parquet)")

    p = actions.add_parser("synth", help="write a synthetic trace calibrated to FedScale's FLASH replay")
    p.add_argument("--clients", type=int, required=True, metavar="N", help="clients (ids 0..N-1)")
    p.add_argument("--days", type=float, required=True, metavar="D", help="length of the trace in days")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="trace to write (NAME.csv or .parquet)")

    p = actions.add_parser(
        "select", help="keep the N clients with the most time online (or sessions), renumbered 0..N-1"
    )
    p.add_argument("file", type=Path, help="trace (NAME.csv or NAME.parquet)")
    p.add_argument("--clients", type=int, required=True, metavar="N", help="clients to keep")
    p.add_argument("--by", choices=RANKINGS, default="online", help="ranking (default: online)")
    p.add_argument("--out", type=Path, required=True, metavar="OUT", help="trace to write (NAME.csv or .parquet)")

    p = actions.add_parser("stats", help="summarise a trace: sessions, clients online over time; optionally plot")
    p.add_argument("file", type=Path, help="trace (NAME.csv or NAME.parquet)")
    p.add_argument("--plot", type=Path, metavar="DIR", help="draw clients online against time (PNG and PDF)")
    p.add_argument(
        "--step-minutes", type=float, default=10.0, metavar="M", help="sampling step of the time series (default 10)"
    )
    p.add_argument(
        "--population", type=int, metavar="N", help="denominator of the online fraction (default: clients in trace)"
    )


def _table(rows: Sequence[Mapping[str, object]]) -> str:
    return pd.DataFrame(rows).to_string(index=False, na_rep="-", float_format=lambda x: f"{x:.4g}")


def _online_row(trace: Trace, step_s: float, population: int | None) -> tuple[pd.DataFrame, dict[str, object]]:
    series = online_series(trace, step_s, population=population)
    fraction = series["fraction"]
    row: dict[str, object] = {
        "online min %": 100 * float(fraction.min()) if len(series) else math.nan,
        "mean %": 100 * float(fraction.mean()) if len(series) else math.nan,
        "max %": 100 * float(fraction.max()) if len(series) else math.nan,
        "period (h)": dominant_period_h(series),
    }
    return series, row


def _session_row(trace: Trace) -> dict[str, object]:
    st = session_stats(trace)
    return {
        "clients": st.clients,
        "intervals": st.intervals,
        "per client": st.intervals_per_client,
        "session median (min)": st.median_s / 60,
        "mean (min)": st.mean_s / 60,
        "span (h)": span_s(trace) / 3600,
    }


def _import_fedscale(args: argparse.Namespace) -> int:
    trace, report = import_fedscale_report(args.file, args.capacity)
    source = f"converted from FedScale {args.file.name}" + (f" and {args.capacity.name}" if args.capacity else "")
    written = write_trace(trace, args.out, comments=[source, "by dropsim trace import-fedscale (traces/README.md)"])
    print(_table([report.row()]))
    print(_table([_session_row(trace)]))
    for path in written:
        print(path)
    return 0


def _synth(args: argparse.Namespace) -> int:
    if args.clients < 1:
        raise InputError(f"--clients {args.clients}: a trace needs at least 1 client")
    if not (args.days > 0 and math.isfinite(args.days)):
        raise InputError(f"--days {args.days:g}: the trace must last a positive, finite number of days")
    if args.seed < 0:
        raise InputError(f"--seed {args.seed}: seeds are integers >= 0")
    trace, filled = synthesize_counted(args.clients, args.days, args.seed)
    written = write_trace(
        trace,
        args.out,
        comments=[
            f"synthetic: dropsim trace synth --clients {args.clients} --days {args.days:g} --seed {args.seed}",
            "model and calibration: traces/README.md (FedScale's 4-day FLASH availability replay)",
        ],
    )
    _, online = _online_row(trace, 600.0, None)
    print(_table([{**_session_row(trace), "given 1 session": filled, **online}]))
    for path in written:
        print(path)
    return 0


def _stats(args: argparse.Namespace) -> int:
    if not (args.step_minutes > 0 and math.isfinite(args.step_minutes)):
        raise InputError(f"--step-minutes {args.step_minutes:g}: the step must be a positive number of minutes")
    if args.population is not None and args.population < 1:
        raise InputError(f"--population {args.population}: must be at least 1")
    trace = load_trace(args.file)
    if args.population is not None and trace.size and args.population <= int(trace.clients.max()):
        raise InputError(
            f"--population {args.population}: the trace has client ids up to {int(trace.clients.max())}; the "
            "population must include them all"
        )
    series, online = _online_row(trace, args.step_minutes * 60.0, args.population)
    print(_table([_session_row(trace)]))
    print(_table([online]))
    if args.plot is not None:
        from sim.plots import plot_online  # deferred: matplotlib, loaded only to plot

        for path in plot_online(series, args.plot):
            print(path)
    return 0


def _select(args: argparse.Namespace) -> int:
    trace = load_trace(args.file)
    if not 1 <= args.clients <= trace.size:
        raise InputError(f"--clients {args.clients}: {args.file} has {trace.size} clients; keep 1 to {trace.size}")
    picked = select_clients(trace, args.clients, args.by)
    ranking = "time online" if args.by == "online" else "sessions"
    written = write_trace(
        picked,
        args.out,
        comments=[
            f"the {args.clients} clients of {args.file.name} with the most {ranking}, renumbered 0..{args.clients - 1}",
            f"by: dropsim trace select {args.file} --clients {args.clients} --by {args.by}",
        ],
    )
    _, online = _online_row(picked, 600.0, None)
    print(_table([{**_session_row(picked), **online}]))
    for path in written:
        print(path)
    return 0


_ACTIONS = {"import-fedscale": _import_fedscale, "synth": _synth, "select": _select, "stats": _stats}


def cmd_trace(args: argparse.Namespace) -> int:
    """Run the ``trace`` action named in ``args``; returns the exit status (InputError propagates)."""
    return _ACTIONS[args.trace_command](args)
