"""``dropsim reproduce``: the paper reproductions from the command line (see :mod:`sim.paper.reproduce`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.paper.catalog import CATALOG, load_catalog, select
from sim.paper.reproduce import markdown, reproduce, update_doc

__all__ = ["add_reproduce_parser", "cmd_reproduce"]


def add_reproduce_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` to the main parser's sub-parsers."""
    p = sub.add_parser(
        "reproduce",
        help="run the paper reproductions (scenarios/paper/) and write our numbers next to the papers'",
    )
    p.add_argument("items", nargs="*", metavar="ITEM", help="items of the catalog (default: all; --list names them)")
    p.add_argument("--reduced", action="store_true", help="the reduced form: fewer rounds and points (what CI runs)")
    p.add_argument(
        "--output", type=Path, metavar="DIR", help="results folder (default results/paper, or results/paper-reduced)"
    )
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes per sweep (default 1)")
    p.add_argument("--no-run", action="store_true", help="measure the results already in the folder; run nothing")
    p.add_argument(
        "--force", action="store_true", help="run the items' finished runs again too (one whose tables changed)"
    )
    p.add_argument("--doc", type=Path, metavar="FILE", help="also replace the generated table block of FILE")
    p.add_argument("--list", action="store_true", help="list the catalog's items and their run times, then stop")
    p.add_argument(
        "--catalog",
        type=Path,
        default=CATALOG,
        metavar="FILE",
        help="catalog of reproductions (default scenarios/paper/reproductions.yaml)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Run, measure and tabulate; exit 1 if a run failed (the tables still hold every item measured)."""
    catalog = load_catalog(args.catalog)
    if args.list:
        for item in catalog.values():
            files = ", ".join(p.name for p in item.scenarios)
            print(f"{item.name:32s} full {item.time_full:>7s}  reduced {item.time_reduced:>6s}  {files}")
            print(f"{'':32s} {item.source}")
        return 0
    if args.jobs < 1:
        print(f"dropsim: --jobs {args.jobs}: needs at least 1 worker", file=sys.stderr)
        return 2
    items = select(catalog, args.items)
    out = args.output or Path("results/paper-reduced" if args.reduced else "results/paper")
    if args.force and args.no_run:
        print("dropsim: --force runs the items again, --no-run runs nothing: give one of them", file=sys.stderr)
        return 2
    outcomes = reproduce(
        items,
        out,
        reduced=args.reduced,
        jobs=args.jobs,
        run=not args.no_run,
        progress=not args.quiet,
        force=args.force,
    )
    print(markdown(outcomes))
    if args.doc is not None:
        update_doc(args.doc, markdown(outcomes))
        print(f"updated: {args.doc}")
    print(f"tables: {out}/reproduction.csv, {out}/reproduction.md; figures: {out}/figures/")
    failed = [f for o in outcomes for f in o.failed]
    for failure in failed:
        print(f"failed: {failure}", file=sys.stderr)
    return 1 if failed else 0
