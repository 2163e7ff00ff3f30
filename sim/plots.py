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

When some run has a ``pipeline`` section (pipelined aggregation), ``plot_results`` also draws
``round_time_breakdown`` (:func:`plot_round_time_breakdown`, Dordis Figure 10): per protocol, strategy and
dropout rate, the mean round time of the finished rounds split into aggregation and the rest, plain against
pipelined, with the speedup. :func:`plot_gantt` draws one round of ``stages.csv`` as a Gantt chart (Dordis
Figure 6): by resource with a lane per chunk, and by chunk with the five stages of Dordis Table 1. The
numbers behind both come from pure functions (:func:`round_time_breakdown`, :func:`gantt_spans`).

``plot_privacy`` draws ``epsilon_vs_dropout`` from the table of ``dropsim privacy``; ``plot_online`` the
clients online over an availability trace, the count and the percentage against hours, as FedScale's
availability figures (and Dordis Figure 1a) do (``dropsim trace stats --plot``). Each strategy keeps one
colour and marker in every figure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from sim.dp.strategies import STRATEGIES
from sim.protocol.params import AggregationParams
from sim.results.read import read_manifest, read_run_table, run_dirs
from sim.results.writer import ResultsError, make_folder
from sim.round.stages import TABLE_1
from sim.traces.model import Trace
from sim.traces.stats import online_series


def _budget(directory: Path) -> float:
    """The run's privacy budget (epsilon) from its manifest; NaN without distributed DP."""
    try:
        privacy = read_manifest(directory).get("scenario", {}).get("privacy", {})
    except ResultsError:
        return float("nan")
    if not isinstance(privacy, dict):
        return float("nan")
    strategy = STRATEGIES.get(str(privacy.get("strategy", AggregationParams.strategy)))
    if strategy is not None and not strategy.enabled:  # a plug-in's, not imported here, is taken to add noise
        return float("nan")
    return float(privacy.get("epsilon", float("nan")))


def _pipelined(directory: Path) -> bool:
    """Whether the run's scenario has a ``pipeline`` section (then its rounds break down plain or pipelined)."""
    try:
        return read_manifest(directory).get("scenario", {}).get("pipeline") is not None
    except ResultsError:
        return False


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


_MARKERS = "osD^v<>ph*"
_LINES: tuple[Any, ...] = ("-", "-", "--", "-", ":", "-.", ":", "--", (0, (1, 3)), "-")
STRATEGY_STYLE = {
    name: (f"C{i}", _MARKERS[i % len(_MARKERS)], _LINES[i % len(_LINES)])
    for i, name in enumerate(sorted(STRATEGIES, key=lambda name: not STRATEGIES[name].enabled))
}
"""One colour, marker and line style per strategy across all figures, in the order of
:data:`~sim.dp.strategies.STRATEGIES` with the strategy adding no noise last (strategies that coincide, such as
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
    if {"agg_time", "other_time", "chunks"} <= set(rounds.columns):
        finished = rounds[(rounds["outcome"] == "ok") & rounds["agg_time"].notna() & rounds["chunks"].notna()]
        pipelined = any(_pipelined(Path(source)) for source in finished["source"].unique())
        if not finished.empty and pipelined:
            written += plot_round_time_breakdown(rounds, out)
    return written


PIPELINE_STAGES = {stage.number: (stage.kind, stage.what) for stage in TABLE_1}
"""Dordis Table 1's five stages of a chunk (:mod:`sim.round.stages`): resource kind and what happens
(``pipeline_stage`` 1..5)."""

STAGE_COLOURS = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c", 4: "#fdae6b", 5: "#9ecae1"}
"""Client compute in blues, communication in oranges, server compute green: the colour says the resource."""

GANTT_CONTEXT = ("download", "train", "encode", "update")
"""Stages not tied to a chunk drawn (in grey) around the pipeline: before it, and ``update`` after it."""

GANTT_RESOURCES = ("client.cpu", "client.link", "server.cpu", "server.link")
"""Resource rows in this order first; any other resource of a chunk stage follows, sorted."""


def _pipeline_rows(stages: pd.DataFrame) -> pd.DataFrame:
    """The rows of per-chunk stages: a chunk index and a Table-1 stage number."""
    if not {"chunk", "pipeline_stage"} <= set(stages.columns):
        return stages.iloc[0:0]
    return stages[stages["chunk"].notna() & stages["pipeline_stage"].notna()]


def select_round(stages: pd.DataFrame, run_id: str | None = None, round: int | None = None) -> tuple[str, int]:
    """The run and round a Gantt chart shows: by default the first run of ``stages`` and its round with the
    most chunks (the first such), or round 1 when it has no pipeline rows."""
    if stages.empty:
        raise ResultsError("the stages table has no rows: no round of this run finished")
    runs = [str(r) for r in stages["run_id"].drop_duplicates()]
    if run_id is None:
        run_id = runs[0]
    elif run_id not in runs:
        raise ResultsError(f"run {run_id!r}: not in the stages table; its runs: {', '.join(runs)}")
    rows = stages[stages["run_id"].astype(str) == run_id]
    if round is None:
        chunked = _pipeline_rows(rows)
        if chunked.empty:
            return run_id, 1
        counts = chunked.groupby("round", sort=True)["chunk"].max()
        return run_id, int(counts.index[int(counts.to_numpy().argmax())])
    if round not in set(rows["round"]):
        have = sorted(int(r) for r in rows["round"].unique())
        raise ResultsError(
            f"run {run_id!r} has no round {round} in its stages table; its rounds: {have[0]} to {have[-1]}"
        )
    return run_id, round


def gantt_spans(stages: pd.DataFrame, run_id: str | None = None, round: int | None = None) -> pd.DataFrame:
    """The bars of one round's Gantt chart, one per row of ``stages`` drawn (rounds chosen by
    :func:`select_round`): the chunk stages and the context stages of :data:`GANTT_CONTEXT`.

    Columns: ``run_id, round, stage, resource, chunk`` (-1 for a context stage), ``pipeline_stage`` (0 for
    a context stage), ``t_start, t_end`` as in the table and ``start, end``, virtual seconds since the
    round's start (the earliest ``t_start`` of the round). Rows whose span never closed (NaN) are left out.
    """
    run_id, round = select_round(stages, run_id, round)
    rows = stages[(stages["run_id"].astype(str) == run_id) & (stages["round"] == round)]
    chunked = _pipeline_rows(rows)
    if chunked.empty:
        others = _pipeline_rows(stages[stages["run_id"].astype(str) == run_id])["round"].unique()
        hint = (
            f"rounds that have them: {', '.join(str(int(r)) for r in sorted(others))}"
            if len(others)
            else "simulate it with chunked aggregation (pipeline.chunks) to draw its pipeline"
        )
        raise ResultsError(
            f"run {run_id!r}, round {round}: the stages table has no pipeline rows (chunk.* stages with a chunk "
            f"and a pipeline_stage); {hint}"
        )
    origin = float(rows["t_start"].min())
    bars = rows[rows.index.isin(chunked.index) | rows["stage"].isin(GANTT_CONTEXT)]  # in the table's order
    bars = bars.dropna(subset=["t_start", "t_end"])
    return pd.DataFrame(
        {
            "run_id": run_id,
            "round": round,
            "stage": bars["stage"].astype(str).to_numpy(),
            "resource": bars["resource"].astype(str).to_numpy(),
            "chunk": bars["chunk"].fillna(-1).astype(int).to_numpy(),
            "pipeline_stage": bars["pipeline_stage"].fillna(0).astype(int).to_numpy(),
            "t_start": bars["t_start"].astype(float).to_numpy(),
            "t_end": bars["t_end"].astype(float).to_numpy(),
            "start": (bars["t_start"].astype(float) - origin).to_numpy(),
            "end": (bars["t_end"].astype(float) - origin).to_numpy(),
        }
    )


def _gantt_label(ax: Any, start: float, end: float, y: float, text: str, min_width: float, size: float) -> None:
    """Write ``text`` inside a bar that is wide enough to hold it."""
    if end - start >= min_width:
        ax.text((start + end) / 2, y, text, ha="center", va="center", fontsize=size, color="black")


def plot_gantt(
    stages: pd.DataFrame,
    out: Path,
    run_id: str | None = None,
    round: int | None = None,
    name: str | None = None,
) -> list[Path]:
    """Gantt chart of one round's pipelined aggregation (Dordis Figure 6) as ``out/name`` (default
    ``gantt_<run_id>_round<k>``): above, one row per resource with a lane per chunk (colour: chunk; number:
    Table-1 stage) and the context stages in grey; below, one row per chunk with its five stages coloured
    by stage. A stage's bar runs from the first party starting it to the last finishing it."""
    spans = gantt_spans(stages, run_id, round)
    run_id, round = str(spans["run_id"].iloc[0]), int(spans["round"].iloc[0])
    chunked = spans[spans["chunk"] >= 0]
    context = spans[spans["chunk"] < 0]
    m = int(chunked["chunk"].max()) + 1
    present = set(chunked["resource"])
    resources = [r for r in GANTT_RESOURCES if r in present] + sorted(present - set(GANTT_RESOURCES))
    before = [s for s in GANTT_CONTEXT if s != "update" and s in set(context["stage"])]
    after = ["update"] if "update" in set(context["stage"]) else []
    rows = [*before, *resources, *after]  # top to bottom, roughly in the order things happen
    level = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    extent = float(spans["end"].max()) or 1.0
    min_width = 0.025 * extent

    chunk_rows = min(0.42 * max(m, 2), 7.0)  # inches; many chunks share 7 in. rather than grow the page
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        sharex=True,
        figsize=(9.0, 1.6 + 0.42 * len(rows) + chunk_rows),
        height_ratios=[0.42 * len(rows), chunk_rows],
        layout="constrained",
    )
    cmap = matplotlib.colormaps["viridis"]
    chunk_colour = [cmap(0.1 + 0.8 * c / max(m - 1, 1)) for c in range(m)]
    for bar in context.to_dict("records"):
        y = level[bar["stage"]]
        top.barh(y, bar["end"] - bar["start"], left=bar["start"], height=0.6, color="0.75", edgecolor="0.5")
        _gantt_label(top, bar["start"], bar["end"], y, bar["stage"], 4 * min_width, 7)
    lane = 0.8 / m  # each chunk its own lane: spans of different chunks on one resource may overlap
    label_size = 7 if m <= 4 else 6
    for bar in chunked.to_dict("records"):
        y = level[bar["resource"]] + 0.4 - lane * (bar["chunk"] + 0.5)
        width = bar["end"] - bar["start"]
        top.barh(y, width, left=bar["start"], height=lane, color=chunk_colour[bar["chunk"]], linewidth=0)
        if m <= 8:
            _gantt_label(top, bar["start"], bar["end"], y, str(bar["pipeline_stage"]), min_width, label_size)
    top.set_yticks([level[r] for r in rows], labels=rows)
    for tick, row in zip(top.get_yticklabels(), rows, strict=True):
        if row not in present:
            tick.set_color("0.4")
    top.set_ylim(-0.6, len(rows) - 0.4)
    top.set_ylabel("Resource")
    top.grid(True, axis="x", alpha=0.3)
    top.set_title(
        f"{run_id}, round {round}: {m} chunk{'s' if m > 1 else ''}\nbars: first start to last end over the "
        "parties; number in a bar: its stage",
        fontsize="medium",
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=chunk_colour[c]) for c in range(m)]
    shown = range(m) if m <= 12 else sorted({0, m // 2, m - 1})
    top.legend(
        [handles[c] for c in shown],
        [f"chunk {c}" for c in shown],
        fontsize="x-small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="colour: chunk",
        title_fontsize="x-small",
    )

    # Stages 1, 3, 5 in the upper half of a chunk's row, 2 and 4 in the lower: neighbouring stages of a
    # chunk overlap (the first client uploads while the last still masks) and must not hide each other.
    for bar in chunked.to_dict("records"):
        stage = bar["pipeline_stage"]
        y = (m - 1 - bar["chunk"]) + (0.2 if stage % 2 else -0.2)
        width = bar["end"] - bar["start"]
        colour = STAGE_COLOURS.get(stage, "0.5")
        bottom.barh(y, width, left=bar["start"], height=0.4, color=colour, edgecolor="white", linewidth=0.5)
        if m <= 16:
            _gantt_label(bottom, bar["start"], bar["end"], y, str(stage), min_width, 7)
    step = -(-m // 20)  # at most about 20 chunk labels
    shown_chunks = range(0, m, step)
    bottom.set_yticks([m - 1 - c for c in shown_chunks], labels=[str(c) for c in shown_chunks])
    bottom.set_ylim(-0.6, m - 0.4)
    bottom.set_ylabel("Chunk")
    bottom.set_xlabel("Virtual time since the round's start (s)")
    bottom.set_xlim(0, extent * 1.01)
    bottom.grid(True, axis="x", alpha=0.3)
    bottom.legend(
        [plt.Rectangle((0, 0), 1, 1, color=STAGE_COLOURS[s]) for s in PIPELINE_STAGES],
        [f"{s} {kind}: {what}" for s, (kind, what) in PIPELINE_STAGES.items()],
        fontsize="x-small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="stage (Dordis Table 1)",
        title_fontsize="x-small",
    )
    make_folder(out)
    return save_figure(fig, out, name or gantt_name(run_id, round))


def gantt_name(run_id: str, round: int) -> str:
    """File name (no extension) of a round's Gantt chart: ``gantt_<run_id>_round<k>``, safe characters only."""
    safe = "".join(ch if ch.isalnum() or ch in "._=+-" else "_" for ch in run_id)
    return f"gantt_{safe}_round{round}"


BREAKDOWN_KEYS = {
    "protocol": ("aggregation.protocol", AggregationParams.protocol),
    "strategy": ("privacy.strategy", AggregationParams.strategy),
    "dropout": ("dropout.rate", 0.0),
}
"""Columns of a round-time breakdown group, the scenario key each is read from, and its default."""
_AVERAGED = {"pipeline.chunks", "seed"}
"""Swept keys a breakdown does not group by: the chunk count makes its bars, seeds are averaged."""


def breakdown_keys(rounds: pd.DataFrame) -> list[str]:
    """What a breakdown groups by: protocol, strategy, dropout rate, and any other swept key (a column named
    by its key path) but the chunk count and the seed, so that nothing else is silently averaged."""
    base = {key for key, _ in BREAKDOWN_KEYS.values()}
    extra = sorted(c for c in rounds.columns if "." in c and c not in base and c not in _AVERAGED)
    return [*BREAKDOWN_KEYS, *extra]


def _scenario_value(doc: dict[str, Any], key: str, default: Any) -> Any:
    node: Any = doc.get("scenario", {})
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def with_scenario_keys(rounds: pd.DataFrame) -> pd.DataFrame:
    """``rounds`` with ``protocol``, ``strategy`` and ``dropout`` columns: from the swept columns where they
    hold a value, else from the manifest of the run folder in ``source`` (as :func:`load_rounds` sets it)."""
    out = rounds.copy()
    manifests: dict[str, dict[str, Any]] = {}
    if "source" in out:
        for source in out["source"].dropna().unique():
            try:
                manifests[str(source)] = read_manifest(Path(str(source)))
            except ResultsError:
                manifests[str(source)] = {}
    sources = out["source"] if "source" in out else pd.Series([None] * len(out), index=out.index)
    for column, (key, default) in BREAKDOWN_KEYS.items():
        if column in rounds.columns:
            continue
        from_manifest = [_scenario_value(manifests.get(str(s), {}), key, default) for s in sources]
        values = pd.Series(from_manifest, index=out.index, dtype=object)
        if key in rounds.columns:
            values = rounds[key].astype(object).where(rounds[key].notna(), values)
        out[column] = values
    return out


def round_time_breakdown(rounds: pd.DataFrame) -> pd.DataFrame:
    """Mean round time of the finished rounds (``outcome == "ok"``), split into ``agg_time`` and
    ``other_time``, per ``protocol, strategy, dropout`` and chunk count ``chunks``: first per run (``line``,
    else ``run_id``), then the mean over the runs. One row per bar; ``runs`` and ``rounds`` count what it
    averages, and ``speedup`` is the plain (``chunks == 1``) mean round time of its group over its own
    (1 for the plain bar, NaN when the group has no plain bar). Virtual seconds."""
    run = "line" if "line" in rounds else "run_id"
    keys = breakdown_keys(rounds)
    ok = rounds[rounds["outcome"] == "ok"].dropna(subset=["round_time", "agg_time", "other_time", "chunks"])
    ok = ok.assign(chunks=ok["chunks"].astype(int))
    per_run = ok.groupby([*keys, "chunks", run], sort=False, dropna=False).agg(
        agg_time=("agg_time", "mean"),
        other_time=("other_time", "mean"),
        round_time=("round_time", "mean"),
        rounds=("round_time", "size"),
    )
    table = (
        per_run.groupby([*keys, "chunks"], sort=False, dropna=False)
        .agg(
            runs=("rounds", "size"),
            rounds=("rounds", "sum"),
            agg_time=("agg_time", "mean"),
            other_time=("other_time", "mean"),
            round_time=("round_time", "mean"),
        )
        .reset_index()
    )
    plain = table[table["chunks"] == 1].rename(columns={"round_time": "plain_time"})[[*keys, "plain_time"]]
    table = table.merge(plain, on=keys, how="left")  # NaN keys match NaN keys in a pandas merge
    table["speedup"] = table.pop("plain_time") / table["round_time"]
    strategies = list(STRATEGY_STYLE)
    table["order"] = [strategies.index(s) if s in strategies else len(strategies) for s in table["strategy"]]
    table = table.sort_values(["protocol", "order", "dropout", *keys[len(BREAKDOWN_KEYS) :], "chunks"], kind="stable")
    return table.drop(columns="order").reset_index(drop=True)


def plot_round_time_breakdown(rounds: pd.DataFrame, out: Path, name: str = "round_time_breakdown") -> list[Path]:
    """Dordis Figure 10: per (protocol, strategy, dropout rate) a plain and a pipelined bar (one per chunk
    count m > 1) of the mean round time of the finished rounds, split into ``agg_time`` (solid) and
    ``other_time`` (hatched), the speedup over plain written above each pipelined bar."""
    table = round_time_breakdown(with_scenario_keys(rounds))
    if table.empty:
        raise ResultsError("no finished round with agg_time, other_time and chunks to break down")
    keys = breakdown_keys(rounds)
    groups = list(table.groupby(keys, sort=False, dropna=False))
    constant = [k for k in keys if table[k].nunique() == 1]
    varying = [k for k in keys if k not in constant]

    def describe(key: str, value: Any) -> str:
        if key == "dropout":
            return f"d={float(value) * 100:g}%"
        return f"{key.rsplit('.', 1)[-1]}={value}" if "." in key else str(value)

    bars = sum(len(g) for _, g in groups)
    fig, ax = plt.subplots(
        figsize=(min(max(4.0, 1.4 + 0.75 * bars + 0.3 * len(groups)), 16.0) + 2.4, 4.2), layout="constrained"
    )
    ticks: list[float] = []
    tick_labels: list[str] = []
    centres: list[float] = []
    group_labels: list[str] = []
    x = 0.0
    width = 0.8
    top = float((table["agg_time"] + table["other_time"]).max())
    for values, group in groups:
        first = x
        colour = STRATEGY_STYLE.get(str(group["strategy"].iloc[0]), ("0.4", ".", "-"))[0]
        for bar in group.to_dict("records"):
            ax.bar(x, bar["agg_time"], width, color=colour, edgecolor=colour)
            ax.bar(
                x,
                bar["other_time"],
                width,
                bottom=bar["agg_time"],
                color=colour,
                alpha=0.35,
                hatch="//",
                edgecolor=colour,
                linewidth=0.8,
            )
            ticks.append(x)
            tick_labels.append("plain" if bar["chunks"] == 1 else f"m={bar['chunks']}")
            if bar["chunks"] > 1 and pd.notna(bar["speedup"]):  # NaN: the group has no plain bar
                ax.annotate(
                    f"{bar['speedup']:.2f}×",
                    (x, bar["agg_time"] + bar["other_time"]),
                    textcoords="offset points",
                    xytext=(0, 3),
                    ha="center",
                    va="bottom",
                    fontsize="small",
                )
            x += 1.0
        centres.append((first + x - 1.0) / 2)
        group_labels.append("\n".join(describe(k, v) for k, v in zip(keys, values, strict=True) if k in varying))
        x += 0.6  # gap between groups
    ax.set_xticks(ticks, labels=tick_labels, fontsize="small")
    if varying:
        groups_axis = ax.secondary_xaxis(location=0)
        groups_axis.set_xticks(centres, labels=[f"\n\n{label}" for label in group_labels], fontsize="small")
        groups_axis.tick_params("x", length=0)
    ax.set_xlim(-0.7, x - 0.9)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_ylabel("round time (virtual s)")
    ax.grid(True, axis="y", alpha=0.3)
    title = ", ".join(describe(k, table[k].iloc[0]) for k in constant)
    ax.set_title(
        f"{title + chr(10) if title else ''}mean over the finished rounds; × = speedup over plain", fontsize="medium"
    )
    strategies = list(dict.fromkeys(str(s) for s in table["strategy"]))
    handles = [plt.Rectangle((0, 0), 1, 1, color=STRATEGY_STYLE.get(s, ("0.4", ".", "-"))[0]) for s in strategies]
    handles += [
        plt.Rectangle((0, 0), 1, 1, facecolor="0.3", edgecolor="0.3"),
        plt.Rectangle((0, 0), 1, 1, facecolor=(0.3, 0.3, 0.3, 0.35), edgecolor="0.3", hatch="//"),
    ]
    ax.legend(
        handles,
        [*strategies, "agg: aggregation (after the last client trained)", "other: download, training"],
        fontsize="x-small",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    make_folder(out)
    return save_figure(fig, out, name)


def plot_online(
    data: Trace | pd.DataFrame,
    out_dir: str | Path,
    name: str = "online_clients",
    step_s: float = 600.0,
    population: int | None = None,
) -> list[Path]:
    """Draw clients online (count, and percent of the population) against trace hours: ``NAME.png`` and
    ``NAME.pdf`` in ``out_dir``. ``data`` is a trace (sampled every ``step_s`` seconds) or an
    :func:`sim.traces.stats.online_series` table. Returns the files written."""
    series = online_series(data, step_s, population=population) if isinstance(data, Trace) else data
    out = Path(out_dir)
    make_folder(out)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6), layout="constrained")
    left.plot(series["time_h"], series["online"], color="k", linewidth=1.2, label="Available clients")
    left.set_ylabel("Clients online (count)")
    right.plot(series["time_h"], series["fraction"] * 100.0, color="k", linewidth=1.2, label="Available clients")
    right.set_ylabel("Clients online (% of population)")
    hours = series["time_h"].to_numpy(dtype=np.float64)
    # the series covers [first, last + step): show that whole span
    last = float(hours[-1] + (hours[1] - hours[0])) if hours.size > 1 else (float(hours[0]) if hours.size else 1.0)
    for ax in (left, right):
        ax.set_xlabel("Trace time (h)")
        ax.set_xlim(0.0, max(last, 1e-9))
        ax.set_ylim(bottom=0.0)
        if last >= 24:
            ax.set_xticks(np.arange(0.0, last + 1e-9, 24.0 if last <= 24 * 8 else 24.0 * np.ceil(last / 24 / 8)))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower left", fontsize="small", framealpha=0.85)
    return save_figure(fig, out, name)
