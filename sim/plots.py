"""Figures from result tables (never from a live simulation): PNG and vector PDF.

``plot_results`` reads the rounds of every run under the given folders and draws, one line per run (or,
with ``by=KEY``, one line per value of a swept key, the mean over the other runs with a band from their
minimum to maximum, taken round by round):

- ``accuracy_vs_round``: test accuracy against round;
- ``accuracy_vs_time``: test accuracy against virtual time since the start (seconds, minutes or hours,
  whichever reads best);
- ``round_time``: round duration (virtual seconds) against round;
- with distributed DP, ``epsilon_vs_round``: the cumulative epsilon spent against round; and for a sweep
  over ``privacy.strategy`` and ``dropout.rate``, ``epsilon_vs_dropout``: the epsilon each strategy ended
  at against the dropout rate (Dordis Figure 8; accuracy against round by strategy is Figure 9).

``plot_privacy`` draws ``epsilon_vs_dropout`` from the table of ``dropsim privacy``. Each strategy keeps
one colour and marker in every figure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from sim.results.read import read_manifest, read_run_table, run_dirs
from sim.results.writer import ResultsError, make_folder


def _budget(directory: Path) -> float:
    """The run's privacy budget (epsilon) from its manifest; NaN without distributed DP."""
    try:
        privacy = read_manifest(directory).get("scenario", {}).get("privacy", {})
    except ResultsError:
        return float("nan")
    if not isinstance(privacy, dict) or privacy.get("strategy", "none") == "none":
        return float("nan")
    return float(privacy.get("epsilon", float("nan")))


def load_rounds(paths: list[Path]) -> pd.DataFrame:
    """Rounds of every run under ``paths``, with a ``line`` column naming the run uniquely."""
    frames = []
    for path in paths:
        for directory in run_dirs(path):
            frame = read_run_table(directory, "rounds")
            if frame.empty:
                continue
            frame = frame.assign(source=str(directory), budget=_budget(directory))
            frames.append(frame)
    if not frames:
        raise ResultsError(f"no finished rounds under {', '.join(str(p) for p in paths)}")
    rounds = pd.concat(frames, ignore_index=True)
    ambiguous = rounds.groupby("run_id")["source"].nunique() > 1
    rounds["line"] = [
        f"{src} ({rid})" if ambiguous.get(rid, False) else str(rid)
        for rid, src in zip(rounds["run_id"], rounds["source"], strict=True)
    ]
    return rounds


def time_unit(seconds: float) -> tuple[float, str]:
    """Divisor and name of the unit that shows ``seconds`` best: s, min or h."""
    if seconds < 600:
        return 1.0, "s"
    if seconds < 36_000:
        return 60.0, "min"
    return 3600.0, "h"


def _lines(rounds: pd.DataFrame, by: str | None, x: str, y: str) -> Iterator[tuple[str, pd.DataFrame]]:
    """``(label, frame with x, mean, lo, hi)`` per line."""
    data = rounds.dropna(subset=[y])
    if by is None:
        for label, frame in data.groupby("line", sort=False):
            yield str(label), pd.DataFrame({x: frame[x], "mean": frame[y], "lo": frame[y], "hi": frame[y]})
        return
    if by not in data.columns:
        swept = [c for c in rounds.columns if "." in c or c == "seed"]
        raise ResultsError(f"--by {by}: no such column; swept keys in these results: {', '.join(swept) or 'none'}")
    for value, frame in data.groupby(by, sort=True):
        # Round by round: runs of one value agree on the round, not on the virtual time it ended.
        stats = frame.groupby("round").agg(at=(x, "mean"), mean=(y, "mean"), lo=(y, "min"), hi=(y, "max"))
        yield (
            str(value),
            pd.DataFrame({x: stats["at"].to_numpy(), "mean": stats["mean"], "lo": stats["lo"], "hi": stats["hi"]}),
        )


STRATEGY_STYLE = {
    name: (f"C{i}", marker, style)
    for i, (name, marker, style) in enumerate(
        zip(
            ("orig", "early", "con", "xnoise", "xnoise-appr", "rebasing", "committee", "central", "local", "none"),
            "osD^v<>ph*",
            ("-", "-", "--", "-", ":", "-.", ":", "--", (0, (1, 3)), "-"),
            strict=True,
        )
    )
}
"""One colour, marker and line style per strategy across all figures (strategies that coincide, such as
XNoise and rebasing at the budget, stay distinguishable)."""


def save_figure(fig: plt.Figure, out: Path, name: str) -> list[Path]:
    """Write ``fig`` as ``out/name.png`` (150 dpi) and vector ``out/name.pdf``, close it; the paths."""
    paths = []
    for ext in ("png", "pdf"):
        path = out / f"{name}.{ext}"
        fig.savefig(path, dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths


def plot_privacy(
    table: pd.DataFrame, out: Path, budget: float | None = None, name: str = "epsilon_vs_dropout"
) -> list[Path]:
    """Epsilon against dropout rate, one line per strategy (columns ``strategy, dropout, epsilon``)."""
    make_folder(out)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
    longest = int(table["rounds_completed"].max()) if "rounds_completed" in table else 0
    for strategy, group in table.groupby("strategy", sort=False):
        line = group.sort_values("dropout")
        colour, marker, style = STRATEGY_STYLE.get(str(strategy), ("k", ".", "-"))
        x = line["dropout"] * 100
        ax.plot(x, line["epsilon"], label=str(strategy), color=colour, marker=marker, linestyle=style, alpha=0.9)
        if "rounds_completed" in line:  # say where training stopped short (early) or never ran
            for xi, eps, done in zip(x, line["epsilon"], line["rounds_completed"], strict=True):
                if done < longest:
                    ax.annotate(
                        f"{int(done)} rnd",
                        (xi, eps),
                        textcoords="offset points",
                        xytext=(4, -10),
                        fontsize="x-small",
                        color=colour,
                    )
    if budget is not None:
        ax.axhline(budget, color="grey", linestyle="--", linewidth=1, label=f"budget ({budget:g})")
    ax.set_xlabel("Dropout rate (% of sampled clients); 'n rnd': rounds completed, if fewer")
    ax.set_ylabel("Privacy spent, epsilon")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=2, loc="best", framealpha=0.85)
    return save_figure(fig, out, name)


def plot_results(paths: list[Path], out: Path, by: str | None = None) -> list[Path]:
    """Draw the figures for the runs under ``paths`` into ``out``; returns the files written."""
    rounds = load_rounds(paths)
    scale, unit = time_unit(float(rounds["t_end"].max()))
    rounds["elapsed"] = rounds["t_end"] / scale
    make_folder(out)
    written: list[Path] = []
    specs = [
        ("accuracy_vs_round", "round", "accuracy", "Round", "Test accuracy"),
        ("accuracy_vs_time", "elapsed", "accuracy", f"Virtual time ({unit})", "Test accuracy"),
        ("round_time", "round", "round_time", "Round", "Round duration (virtual seconds)"),
    ]
    private = "epsilon" in rounds and bool((rounds["epsilon"].astype(float) < float("inf")).any())
    if private:
        specs.append(("epsilon_vs_round", "round", "epsilon", "Round", "Privacy spent, cumulative epsilon"))
    strategies = "privacy.strategy" in rounds
    for name, x, y, xlabel, ylabel in specs:
        # Epsilon is a per-run total: never averaged over runs (of different lengths, strategies).
        line_by = None if y == "epsilon" else by
        lines = list(_lines(rounds, line_by, x, y))
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
        seen: dict[str, int] = {}
        for label, frame in lines:
            style = None
            dash: Any = "-"
            if line_by == "privacy.strategy":
                style = STRATEGY_STYLE.get(label)
                dash = style[2] if style else "-"
            elif line_by is None and strategies:
                # one colour per strategy; its runs (other swept values) told apart by their dashes
                run = rounds[rounds["line"] == label]
                strategy = str(run["privacy.strategy"].iloc[0]) if len(run) else ""
                style = STRATEGY_STYLE.get(strategy)
                seen[strategy] = seen.get(strategy, -1) + 1
                dash = ("-", "--", ":", "-.")[seen[strategy] % 4]
            (handle,) = ax.plot(
                frame[x],
                frame["mean"],
                label=label,
                linewidth=1.5,
                color=style[0] if style else None,
                linestyle=dash,
            )
            if line_by is not None:
                ax.fill_between(frame[x], frame["lo"], frame["hi"], color=handle.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if y == "accuracy":
            ax.set_ylim(0, 1)
        if x == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if y == "epsilon":
            for budget in sorted(rounds["budget"].dropna().unique()):
                ax.axhline(budget, color="grey", linestyle="--", linewidth=1)
                ax.annotate(
                    f"budget {budget:g}",
                    (0.01, budget),
                    xycoords=("axes fraction", "data"),
                    textcoords="offset points",
                    xytext=(2, 3),
                    fontsize="x-small",
                    color="grey",
                )
        title = f"{line_by}: mean, band min-max" if line_by is not None else None
        if len(lines) <= 5:
            ax.legend(fontsize="small", loc="best", framealpha=0.85, title=title, title_fontsize="small")
        else:  # many lines: beside the axes, so that no data hides behind the legend
            fig.set_size_inches(6.4 + (3.6 if len(lines) <= 16 else 6.8), 4.0)
            ax.legend(
                fontsize="x-small",
                ncol=1 if len(lines) <= 16 else 2,
                loc="upper left",
                bbox_to_anchor=(1.02, 1.0),
                title=title,
                title_fontsize="x-small",
            )
        written += save_figure(fig, out, name)
    if private and {"privacy.strategy", "dropout.rate"} <= set(rounds.columns):
        final = rounds.sort_values("round").groupby("line").tail(1).set_index("line")
        final["rounds_completed"] = rounds[rounds["outcome"] == "ok"].groupby("line").size()
        final["rounds_completed"] = final["rounds_completed"].fillna(0)
        renamed = final.rename(columns={"privacy.strategy": "strategy", "dropout.rate": "dropout"})
        table = renamed.groupby(["strategy", "dropout"], as_index=False, sort=False)[
            ["epsilon", "rounds_completed"]
        ].mean()
        budgets = rounds["budget"].dropna().unique()
        written += plot_privacy(pd.DataFrame(table), out, budget=float(budgets[0]) if len(budgets) == 1 else None)
    return written
