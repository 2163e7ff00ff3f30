"""``dropsim validate``: the same scenario simulated and deployed, stage by stage.

The scenario runs twice with the same seed: in the simulator under the testbed model (``testbed: {cores:
K}``, K the host's cores: every party's compute shares them, a slow client sleeps its slow-down off; see
docs/time-model.md) and over real sockets on this host (:mod:`sim.deploy`). Both write the usual tables;
this compares them per round and stage (the round, the model download, local training, each server step,
the aggregation) as simulated seconds, measured seconds and the relative error (simulated - measured) /
measured, and checks that every round's model is bit-identical (``model_sha256``; with DP only under
``--seeded-secrets``, since the deployed clients otherwise draw their noise from their operating systems).
It writes
``validation.csv`` (per round and stage), ``summary.csv`` (per stage) and the figure
``validation.png``/``.pdf``.

It also compares the CPU seconds of every party's computations per round (the ``cpu`` row: the cost
profile's as charged by the simulator, against the compute threads' CPU time measured in the deployment).
Their ratio times the simulation's ``testbed.cpu_scale`` is this host's scale (:attr:`Validation.cpu_scale`),
to be simulated with (docs/deploy.md, "Calibrating the testbed model").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.results.read import read_manifest, read_run_table

STAGES = ("round_time", "download_s", "train_s", "aggregate_s")
"""Columns of rounds.csv compared besides each server step's ``time_<step>``."""


@dataclass
class Validation:
    """The comparison of one scenario's simulated and deployed runs."""

    per_round: pd.DataFrame
    """round, stage, simulated, measured, error."""
    summary: pd.DataFrame
    """stage, simulated (mean s), measured (mean s), error of the means, median and worst per-round error."""
    identical: bool
    """Whether every round's model_sha256 is the same in both."""
    rounds: int
    cpu_scale: float
    """The ``testbed.cpu_scale`` that would have charged the deployment's CPU seconds: the simulated run's
    scale times measured / simulated CPU seconds over the rounds compared (NaN without CPU columns)."""


def stage_columns(rounds: pd.DataFrame) -> list[str]:
    steps = [c for c in rounds.columns if c.startswith("time_")]
    return [c for c in (*STAGES[:3], *steps, STAGES[3]) if c in rounds.columns]


def compare(simulated: Path, deployed: Path, skip_first: bool = False) -> Validation:
    """Compare the run folders ``simulated`` and ``deployed`` (``skip_first``: leave round 1 out of the
    errors, a warm-up)."""
    sim = read_run_table(simulated, "rounds").set_index("round")
    dep = read_run_table(deployed, "rounds").set_index("round")
    common = sim.index.intersection(dep.index)
    identical = bool(len(common)) and bool((sim.loc[common, "model_sha256"] == dep.loc[common, "model_sha256"]).all())
    compared = list(common[1:]) if skip_first and len(common) > 1 else list(common)
    rows: list[dict[str, Any]] = []

    def add(r: int, stage: str, s: float, m: float) -> None:
        if not (math.isnan(s) and math.isnan(m)):
            rows.append(
                {"round": int(r), "stage": stage, "simulated_s": s, "measured_s": m, "error": relative_error(s, m)}
            )

    for column in stage_columns(sim):
        if column in dep.columns:
            for r in compared:
                add(r, _stage_name(column), float(sim.loc[r, column]), float(dep.loc[r, column]))
    sim_cpu, dep_cpu = cpu_seconds(simulated), cpu_seconds(deployed)
    for r in compared:
        if r in sim_cpu.index and r in dep_cpu.index:
            add(r, "cpu", float(sim_cpu[r]), float(dep_cpu[r]))
    per_round = pd.DataFrame(rows, columns=["round", "stage", "simulated_s", "measured_s", "error"])
    summary_rows = []
    for stage, group in per_round.groupby("stage", sort=False):
        s, m = group["simulated_s"].mean(), group["measured_s"].mean()
        errors = group["error"].abs()
        summary_rows.append(
            {
                "stage": stage,
                "simulated_s": s,
                "measured_s": m,
                "error": relative_error(s, m),
                "median_abs_error": float(errors.median()),
                "worst_abs_error": float(errors.max()),
                "rounds": len(group),
            }
        )
    summary = pd.DataFrame(summary_rows)
    cpu = per_round[per_round["stage"] == "cpu"]
    scale = math.nan
    if len(cpu) and cpu["simulated_s"].sum() > 0:
        scale = simulated_scale(simulated) * float(cpu["measured_s"].sum() / cpu["simulated_s"].sum())
    return Validation(per_round, summary, identical, len(common), scale)


def cpu_seconds(run: Path) -> pd.Series:
    """Per round, the CPU seconds of every party's computations (the clients' ``cpu_s`` and the server's
    ``server_cpu_s``); empty for tables written before those columns."""
    rounds = read_run_table(run, "rounds")
    clients = read_run_table(run, "clients")
    if "server_cpu_s" not in rounds.columns or "cpu_s" not in clients.columns:
        return pd.Series(dtype=float)
    total = rounds.set_index("round")["server_cpu_s"].astype(float)
    return total.add(clients.groupby("round")["cpu_s"].sum(), fill_value=0.0)


def simulated_scale(run: Path) -> float:
    """The ``testbed.cpu_scale`` a run was simulated with (1 if none)."""
    testbed = read_manifest(run).get("scenario", {}).get("testbed") or {}
    return float(testbed.get("cpu_scale", 1.0))


def signed_error(errors: pd.Series | list[float], level: float = 0.95) -> dict[str, float]:
    """The bias of relative errors ``errors`` ((simulated - measured) / measured, one per deployment) with its
    uncertainty: their mean, the two ends of its ``level`` confidence interval (Student's t with n - 1
    degrees of freedom, the deployments taken as independent draws), the interval's half-width, and the
    median and worst absolute error. NaNs are left out; with fewer than two errors the interval is NaN.

    A bias shows in the mean and does not shrink with more deployments; the noise of single deployments
    shrinks in the interval with the square root of their count (docs/time-model.md, "Measuring the bias")."""
    # deferred: scipy is heavy and only the interval needs it
    from scipy.stats import t as student  # type: ignore[import-untyped]  # scipy comes with scikit-learn

    values = pd.Series(errors, dtype=float).dropna()
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    half = math.nan
    if n >= 2:
        half = float(student.ppf(0.5 + level / 2, n - 1) * values.std(ddof=1) / math.sqrt(n))
    absolute = values.abs()
    return {
        "n": float(n),
        "mean_error": mean,
        "ci_low": mean - half,
        "ci_high": mean + half,
        "ci_half_width": half,
        "median_abs_error": float(absolute.median()) if n else math.nan,
        "worst_abs_error": float(absolute.max()) if n else math.nan,
    }


def relative_error(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured; NaN where either is missing or the measurement is 0."""
    if not (math.isfinite(simulated) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return (simulated - measured) / measured


def _stage_name(column: str) -> str:
    if column.startswith("time_"):
        return "step." + column.removeprefix("time_")
    return {"round_time": "round", "download_s": "download", "train_s": "train", "aggregate_s": "aggregate"}[column]


def testbed_overrides(cores: int | None = None, cpu_scale: float | None = None) -> list[str]:
    """``--set`` overrides that make the simulator model this host's testbed (``cpu_scale``: None keeps the
    scenario's ``testbed.cpu_scale``, or 1)."""
    sets = [f"testbed.cores={cores or os.cpu_count() or 1}", "server.speed=1"]
    return sets if cpu_scale is None else [*sets, f"testbed.cpu_scale={cpu_scale}"]


def plot(validation: Validation, out: Path, title: str) -> list[Path]:
    """Simulated against measured seconds per stage, with the relative error on each pair (PNG and PDF)."""
    # deferred: matplotlib is heavy and only the plot needs it
    import matplotlib

    matplotlib.use("Agg")
    # deferred: after matplotlib.use: pyplot picks its backend when imported
    import matplotlib.pyplot as plt

    summary = validation.summary
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(summary) + 2), 4))
    x = range(len(summary))
    width = 0.4
    ax.bar([i - width / 2 for i in x], summary["simulated_s"], width, label="simulated (testbed model)")
    ax.bar([i + width / 2 for i in x], summary["measured_s"], width, label="measured (sockets)")
    for i, (s, m, e) in enumerate(zip(summary["simulated_s"], summary["measured_s"], summary["error"], strict=True)):
        if math.isfinite(e):
            ax.annotate(f"{e:+.0%}", (i, max(s, m)), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), list(summary["stage"]), rotation=30, ha="right")
    ax.set_ylabel("mean time per round (s)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    paths = [out / "validation.png", out / "validation.pdf"]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths
