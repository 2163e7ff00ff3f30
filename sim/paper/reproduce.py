"""``dropsim reproduce``: run the paper reproductions, measure them, and write the comparison table.

For each catalog item (``scenarios/paper/reproductions.yaml``) it runs the item's scenario files as sweeps
into ``OUT/<scenario name>/`` (finished runs are found and kept, so an interrupted reproduction resumes),
measures our numbers (:mod:`sim.paper.measures`), attaches the paper's, and rewrites, after every item:

- ``OUT/reproduction.csv``: ``item, source, quantity, setting, paper, dropsim, unit, form``, every row;
- ``OUT/reproduction.md``: per item, its source, form and command, and the rows the paper gives a number
  for (plus the item's ``show`` quantities);
- ``OUT/figures/<item>.png`` and ``.pdf`` (:mod:`sim.paper.figures`).

``--doc FILE`` replaces the text between ``<!-- reproduction:begin -->`` and ``<!-- reproduction:end -->``
in FILE with the markdown, so the documentation's table is generated, never typed.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.paper.catalog import Item
from sim.paper.measures import MEASURE_FUNCTIONS, Row, unfinished
from sim.results.writer import ResultsError, csv_bytes, make_folder, write_atomic
from sim.scenario import load

COLUMNS = ("item", "source", "quantity", "setting", "paper", "dropsim", "unit", "form")
BEGIN, END = "<!-- reproduction:begin -->", "<!-- reproduction:end -->"


@dataclass
class Outcome:
    """One item's rows (``COLUMNS``) and the runs that failed."""

    item: Item
    form: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    wall_seconds: float = 0.0


def format_value(value: float | str, unit: str) -> str:
    """A measured value as the table shows it (its unit decides the digits)."""
    if isinstance(value, str):  # a range such as "1.04-1.20": its unit after it
        return value + unit if unit in ("%", "x") else value
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "inf"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "points":
        return f"{value:+.2f}"
    if unit == "s":
        return f"{value:.3g} s"
    if unit == "MiB":
        return f"{value:.4g}"
    if float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.4g}"


def results_folders(item: Item, out: Path) -> dict[Path, Path]:
    """Where each of the item's scenarios writes its sweep: ``out/<file stem>``."""
    return {path: out / path.stem for path in item.scenarios}


def run_item(item: Item, out: Path, reduced: bool, jobs: int, progress: bool, force: bool = False) -> list[str]:
    """Run the item's scenarios (its reduced form if asked; with ``force`` the finished runs again too); the
    ids of runs that failed."""
    from sim.sweeps import run_sweep  # deferred: torch, kept out of the light commands

    failed = []
    for path, folder in results_folders(item, out).items():
        grid = load(path, item.overrides(reduced), output=str(folder))
        for status in run_sweep(grid, str(path), jobs=jobs, progress=progress, force=force):
            if status.status == "failed":
                failed.append(f"{path.stem}/{status.run_id}: {status.error}")
    return failed


def command(item: Item, reduced: bool) -> str:
    return f"dropsim reproduce {item.name}" + (" --reduced" if reduced else "")


def item_rows(item: Item, measured: Sequence[Row], form: str) -> list[dict[str, Any]]:
    """Table rows; the paper's values only next to the full form (a 3-round epsilon is no 50-round one)."""
    return [
        {
            "item": item.name,
            "source": item.source,
            "quantity": r.quantity,
            "setting": r.setting,
            "paper": item.paper_value(r.quantity, r.setting) if form == "full" else "",
            "dropsim": r.value,
            "unit": r.unit,
            "form": form,
        }
        for r in measured
    ]


def markdown(outcomes: Sequence[Outcome]) -> str:
    """The comparison as markdown: one section per item (rows with a paper value, and ``show`` rows)."""
    parts = []
    for o in outcomes:
        item = o.item
        expected = item.time_reduced if o.form == "reduced" else item.time_full
        lines = [
            f"### {item.name}",
            "",
            f"{item.source}. Form: {o.form} (about {expected} on 2 cores); `{command(item, o.form == 'reduced')}`.",
            "",
            "| quantity | setting | paper | dropsim |",
            "| --- | --- | --- | --- |",
        ]
        shown = [r for r in o.rows if r["paper"] or item.shows(r["quantity"])]
        for r in shown:
            ours = format_value(r["dropsim"], r["unit"])
            lines.append(f"| {r['quantity']} | {r['setting']} | {r['paper'] or '-'} | {ours} |")
        if not shown:
            lines.append("| (no results) | | | |")
        hidden = len(o.rows) - len(shown)
        if hidden:
            lines += ["", f"{hidden} more rows in `reproduction.csv`."]
        if o.failed:
            lines += ["", "Runs failed or not finished (left out): " + "; ".join(o.failed)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def write_tables(out: Path, outcomes: Sequence[Outcome]) -> None:
    rows = [r for o in outcomes for r in o.rows]
    write_atomic(out / "reproduction.csv", csv_bytes(rows, COLUMNS, header=True))
    write_atomic(out / "reproduction.md", markdown(outcomes).encode())


def update_doc(doc: Path, text: str) -> None:
    """Replace the generated block of ``doc`` (between :data:`BEGIN` and :data:`END`) with ``text``."""
    try:
        content = doc.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultsError(f"{doc}: cannot be read ({exc.strerror})") from None
    start, end = content.find(BEGIN), content.find(END)
    if start < 0 or end < start:
        raise ResultsError(f"{doc}: has no block between {BEGIN} and {END} to replace")
    write_atomic(doc, (content[: start + len(BEGIN)] + "\n\n" + text + "\n" + content[end:]).encode())


def reproduce(
    items: Sequence[Item],
    out: Path,
    reduced: bool = False,
    jobs: int = 1,
    run: bool = True,
    progress: bool = True,
    figures: bool = True,
    force: bool = False,
) -> list[Outcome]:
    """Run (unless ``run`` is false; with ``force``, the runs already finished too), measure and tabulate
    ``items``; tables rewritten after each item."""
    from sim.paper.figures import plot_item  # deferred: matplotlib, loaded only to plot

    make_folder(out)
    form = "reduced" if reduced else "full"
    outcomes: list[Outcome] = []
    for item in items:
        started = time.monotonic()
        outcome = Outcome(item, form)
        if run and (reduced or item.simulate):
            print(f"{item.name}: running {', '.join(p.name for p in item.scenarios)} ({form})", file=sys.stderr)
            outcome.failed = run_item(item, out, reduced, jobs, progress, force)
        folders = results_folders(item, out)
        named = {failure.split(": ", 1)[0] for failure in outcome.failed}  # runs that failed just now
        for folder in folders.values():
            outcome.failed += [f"not finished: {u}" for u in unfinished(folder) if u.split(": ", 1)[0] not in named]
        measured = MEASURE_FUNCTIONS[item.measure](item, folders, reduced)
        outcome.rows = item_rows(item, measured, form)
        if figures and measured:
            outcome.figures = plot_item(item, measured, folders, out / "figures")
        outcome.wall_seconds = time.monotonic() - started
        print(f"{item.name}: {len(outcome.rows)} rows in {outcome.wall_seconds:.0f} s", file=sys.stderr)
        outcomes.append(outcome)
        write_tables(out, outcomes)
    return outcomes
