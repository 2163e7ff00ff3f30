"""Paper-style figures of the reproductions: our numbers as lines, the paper's as hollow markers.

One figure per item, ``<item>.png`` (150 dpi) and vector ``<item>.pdf``, drawn from the measured rows and,
for curves over rounds, from the runs' ``rounds.csv`` (result tables only). Every strategy keeps its colour
and marker from :data:`sim.plots.STRATEGY_STYLE` across all figures; axes carry their units.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from sim.paper.catalog import Item
from sim.paper.measures import Row, runs, trace_label
from sim.plots import STRATEGY_STYLE, save_figure
from sim.protocol.registry import PROTOCOLS
from sim.results.writer import make_folder

_DROPOUT = re.compile(r"d=([0-9.]+)")
PAPER_MARKER: dict[str, Any] = {"markerfacecolor": "none", "markeredgewidth": 1.5, "markersize": 9, "linestyle": "none"}
"""How the paper's numbers are drawn: hollow markers in the strategy's colour."""


def style(strategy: str) -> tuple[str, str, object]:
    return STRATEGY_STYLE.get(strategy, ("0.3", ".", "-"))


def number(text: str) -> float:
    """The paper's value as a number, NaN for bounds, ranges and words ("<= 6", "1.3-1.5")."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def dropout_of(setting: str) -> float:
    match = _DROPOUT.search(setting)
    return float(match.group(1)) if match else math.nan


def _frame(rows: Sequence[Row]) -> pd.DataFrame:
    return pd.DataFrame([r.__dict__ for r in rows])


def _legend(ax: plt.Axes, fontsize: str = "small", **kwargs: Any) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=fontsize, framealpha=0.9, **kwargs)


def _paper_handle(ax: plt.Axes) -> None:
    ax.plot([], [], marker="o", color="0.3", label="paper", **PAPER_MARKER)


def plot_privacy(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Epsilon against the dropout rate per strategy (Dordis Figure 8, Hyades Figure 7)."""
    frame = _frame(rows)
    ours = frame[frame["quantity"] == "epsilon"].copy()
    ours["strategy"] = ours["setting"].str.split(",").str[0]
    ours["d"] = ours["setting"].map(dropout_of)
    fig, ax = plt.subplots(figsize=(5.2, 3.6), layout="constrained")
    for strategy, line in ours.groupby("strategy", sort=False):
        colour, marker, dash = style(str(strategy))
        ax.plot(100 * line["d"], line["value"], color=colour, marker=marker, linestyle=dash, label=str(strategy))
        paper = [(d, number(item.paper_value("epsilon", s))) for d, s in zip(line["d"], line["setting"], strict=True)]
        px = [100 * d for d, v in paper if not math.isnan(v)]
        ax.plot(px, [v for _, v in paper if not math.isnan(v)], marker=marker, color=colour, **PAPER_MARKER)
    simulated = frame[frame["quantity"] == "epsilon, simulated"]
    if len(simulated):
        ax.plot(
            100 * simulated["setting"].map(dropout_of), simulated["value"], "k+", markersize=7, label="simulated run"
        )
    _paper_handle(ax)
    ax.set_xlabel("per-round dropout rate (%)")
    ax.set_ylabel("privacy spent, epsilon")
    ax.set_title(item.source.split(", ", 1)[-1], fontsize="medium")
    _legend(ax, loc="upper left")
    return save_figure(fig, out, item.name)


def plot_baek(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Epsilon against rounds per dropout rate: dropsim's accountant, the paper's, the paper's table."""
    frame = _frame(rows)
    frame = frame[frame["quantity"].isin(["epsilon", "epsilon, TF Privacy accountant"])].copy()
    frame["d"] = frame["setting"].map(dropout_of)
    frame["rounds"] = frame["setting"].str.extract(r"(\d+) rounds")[0].astype(float)
    fig, ax = plt.subplots(figsize=(5.2, 3.6), layout="constrained")
    colours = plt.get_cmap("viridis")
    rates = sorted(frame["d"].unique())
    for i, d in enumerate(rates):
        colour = colours(0.15 + 0.7 * i / max(len(rates) - 1, 1))
        for quantity, dash in (("epsilon", "-"), ("epsilon, TF Privacy accountant", "--")):
            line = frame[(frame["d"] == d) & (frame["quantity"] == quantity)].sort_values("rounds")
            label = f"d = {100 * d:g}%" + (", dropsim" if quantity == "epsilon" else ", TF Privacy")
            ax.plot(line["rounds"], line["value"], color=colour, linestyle=dash, label=label)
            if quantity == "epsilon":
                paper = [number(item.paper_value(quantity, s)) for s in line["setting"]]
                ax.plot(line["rounds"], paper, marker="o", color=colour, **PAPER_MARKER)
    _paper_handle(ax)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rounds")
    ax.set_ylabel("privacy spent, epsilon (delta = 1e-5)")
    _legend(ax, loc="upper left", ncol=1)
    return save_figure(fig, out, item.name)


def plot_accuracy(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Left: accuracy against round per strategy at the middle dropout rate (Dordis Figure 9); right: final
    accuracy against the dropout rate (Table 2)."""
    found = [run for folder in results.values() for run in runs(folder)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    rates = sorted({run.dropout for run in found})
    middle = rates[len(rates) // 2] if rates else math.nan
    for run in found:
        if run.dropout != middle:
            continue
        colour, marker, dash = style(run.strategy)
        curve = run.rounds.dropna(subset=["accuracy"])
        left.plot(curve["round"], 100 * curve["accuracy"], color=colour, linestyle=dash, label=run.strategy)
    left.set_xlabel("round")
    left.set_ylabel("test accuracy (%)")
    left.set_title(f"dropout {100 * middle:g}% per round", fontsize="medium")
    _legend(left, loc="lower right")
    frame = _frame(rows)
    final = frame[frame["quantity"] == "final accuracy"].copy()
    final["strategy"] = final["setting"].str.split(",").str[0]
    final["d"] = final["setting"].map(dropout_of)
    for strategy, group in final.groupby("strategy", sort=False):
        colour, marker, dash = style(str(strategy))
        line = group.sort_values("d")
        right.plot(100 * line["d"], line["value"], color=colour, marker=marker, linestyle=dash, label=str(strategy))
    right.set_xlabel("per-round dropout rate (%)")
    right.set_ylabel("final test accuracy (%)")
    _legend(right, loc="lower left")
    return save_figure(fig, out, item.name)


def plot_pipeline(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Left: round time plain (dotted) and pipelined (solid) against dropout; right: the speedup, with the
    paper's range shaded (Dordis Figure 10). Colour: strategy; filled markers SecAgg, hollow SecAgg+. One row
    of panels per cost profile when the settings name one (``dordis: secagg, orig, d=0``)."""
    frame = _frame(rows)
    named = frame["setting"].str.contains(": ", regex=False)
    frame["profile"] = frame["setting"].where(named, "").str.split(": ").str[0]
    frame["setting"] = frame["setting"].where(~named, frame["setting"].str.split(": ", n=1).str[1])
    profiles = sorted(frame["profile"].unique())
    fig, axes = plt.subplots(len(profiles), 2, figsize=(9, 3.6 * len(profiles)), layout="constrained", squeeze=False)
    paper = item.paper_value("speedup", "range")
    bounds = [number(x) for x in paper.split("-")] if "-" in paper else []
    strategies: list[str] = []
    for profile, (left, right) in zip(profiles, axes, strict=True):
        mine = frame[frame["profile"] == profile]
        for quantity, ax in (("round time, plain", left), ("round time, pipelined", left), ("speedup", right)):
            part = mine[(mine["quantity"] == quantity) & (mine["setting"] != "range")].copy()
            if part.empty:
                continue
            parts = part["setting"].str.split(", ")
            part["protocol"], part["strategy"] = parts.str[0], parts.str[1]
            part["d"] = part["setting"].map(dropout_of)
            for (protocol, strategy), group in part.groupby(["protocol", "strategy"], sort=False):
                colour, marker, _ = style(str(strategy))
                strategies += [] if strategy in strategies else [str(strategy)]
                dash = ":" if quantity == "round time, plain" else "-"
                spec = PROTOCOLS.get(str(protocol))  # filled: secure aggregation on the complete graph (SecAgg)
                face = colour if spec is not None and spec.secure and not spec.sparse_graph else "white"
                line = group.sort_values("d")
                ax.plot(
                    100 * line["d"], line["value"], color=colour, marker=marker, markerfacecolor=face, linestyle=dash
                )
        if len(bounds) == 2 and not any(math.isnan(b) for b in bounds):
            right.axhspan(bounds[0], bounds[1], color="0.85", label=f"paper: {paper}x")
        right.axhline(1.0, color="0.5", linewidth=0.8)
        title = f"cost profile: {profile}" if profile else ""
        left.set_title(title, fontsize="small", loc="left")
        left.set_xlabel("per-round dropout rate (%)")
        left.set_ylabel("round time (virtual s)")
        right.set_xlabel("per-round dropout rate (%)")
        right.set_ylabel("speedup (plain / pipelined)")
        _legend(right, loc="best")
    left = axes[0][0]
    for strategy in strategies:
        colour, marker, _ = style(strategy)
        left.plot([], [], color=colour, marker=marker, label=strategy)
    left.plot([], [], color="0.3", linestyle=":", label="plain")
    left.plot([], [], color="0.3", linestyle="-", label="pipelined")
    left.plot([], [], color="0.3", marker="o", linestyle="none", label="SecAgg")
    left.plot([], [], color="0.3", marker="o", markerfacecolor="white", linestyle="none", label="SecAgg+")
    _legend(left, fontsize="x-small", loc="best", ncol=3)
    return save_figure(fig, out, item.name)


def plot_footprint(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Extra MiB a surviving client uploads over Orig against the model size, at each sample size and the
    highest dropout rate in the table (Dordis Table 3)."""
    frame = _frame(rows)
    part = frame[frame["quantity"] == "extra MiB up"].copy()
    parts = part["setting"].str.split(", ")
    part["strategy"] = parts.str[0]
    part["params"] = parts.str[1].str.rstrip("M").astype(float) * 1e6
    part["n"] = parts.str[2].str.removeprefix("n=").astype(int)
    part["d"] = part["setting"].map(dropout_of)
    d = sorted(part["d"].unique())[-1] if len(part) else 0.0
    part = part[part["d"] == d]
    fig, ax = plt.subplots(figsize=(7, 3.6), layout="constrained")
    dashes = {100: "-", 200: "--", 300: ":"}
    for (strategy, n), group in part.groupby(["strategy", "n"], sort=False):
        colour, marker, _ = style(str(strategy))
        line = group.sort_values("params")
        dash = dashes.get(int(str(n)), "-.")
        label = f"{strategy}, n = {n}"
        ax.plot(line["params"], line["value"], color=colour, marker=marker, linestyle=dash, label=label)
        paper = [number(item.paper_value("extra MiB up", s)) for s in line["setting"]]
        ax.plot(line["params"], paper, marker=marker, color=colour, **PAPER_MARKER)
    _paper_handle(ax)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model size (parameters)")
    ax.set_ylabel("extra upload per survivor (MiB)")
    ax.set_title(f"dropout {100 * d:g}%", fontsize="medium")
    _legend(ax, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)  # beside the axes
    return save_figure(fig, out, item.name)


def plot_trace(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """Left: sampled clients and survivors (0 when the round aborted), per round, under Orig (Dordis Figure 1a); right:
    epsilon against round per strategy (Figure 1b)."""
    found = [run for folder in results.values() for run in runs(folder)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    con_dash = {"0.2": (0, (1, 1)), "0.5": "--", "0.8": "-."}
    budget = math.nan
    for run in found:
        label = trace_label(run)
        colour, _, dash = style(run.strategy)
        if run.strategy == "con":
            dash = con_dash.get(label.rsplit("=", 1)[-1], "--")
        r = run.rounds
        right.plot(r["round"], r["epsilon"], color=colour, linestyle=dash, label=label)
        budget = float(run.key("privacy.epsilon") or math.nan)
        if run.strategy == "orig":
            left.plot(r["round"], r["sampled"], color="0.6", label="sampled")
            left.plot(r["round"], r["survivors"], color=colour, label="survivors (orig)")
    if not math.isnan(budget):
        right.axhline(budget, color="grey", linestyle="--", linewidth=1, label=f"budget ({budget:g})")
    paper = number(item.paper_value("epsilon", "orig"))
    if not math.isnan(paper) and found:
        last = max(len(run.rounds) for run in found)
        right.plot([last], [paper], marker="o", color=style("orig")[0], label="paper (orig)", **PAPER_MARKER)
    left.set_xlabel("round")
    left.set_ylabel("clients")
    _legend(left, loc="lower right")
    right.set_xlabel("round")
    right.set_ylabel("privacy spent, epsilon")
    _legend(right, loc="upper left", ncol=2, fontsize="x-small")
    return save_figure(fig, out, item.name)


PLOTS: dict[str, Callable[[Item, Sequence[Row], dict[Path, Path], Path], list[Path]]] = {
    "privacy": plot_privacy,
    "baek": plot_baek,
    "accuracy": plot_accuracy,
    "pipeline": plot_pipeline,
    "footprint": plot_footprint,
    "trace": plot_trace,
}


def plot_item(item: Item, rows: Sequence[Row], results: dict[Path, Path], out: Path) -> list[Path]:
    """The item's figure in ``out`` (PNG and PDF)."""
    make_folder(out)
    return PLOTS[item.measure](item, rows, results, out)
