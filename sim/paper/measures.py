"""Our numbers for a paper reproduction, measured from result tables or computed from the accounting.

Each measure returns :class:`Row` s: a quantity, the setting it was measured at (the text the catalog's
paper values match), the value and its unit. Settings spell a dropout rate ``d=0.2``, a protocol and a
strategy as the scenario keys do (``secagg+, xnoise, d=0``). Only ``privacy`` and ``baek`` compute without
results (the accounting a run would do, every round); the others read the runs' tables (``rounds.csv``,
``clients.csv``, ``manifest.json``) and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.paper.catalog import Item
from sim.results.read import read_manifest, read_run_table, run_dirs
from sim.results.writer import ResultsError
from sim.scenario import load

MIB = 2**20
"""Bytes per MiB. Dordis Table 3's "MB" are MiB: 5M weights of 2.5 bytes are its 11.9."""
TF_PRIVACY_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""Renyi orders of TensorFlow Privacy's examples (``compute_dp_sgd_privacy``), which Baek et al. used."""


@dataclass(frozen=True)
class Row:
    quantity: str
    setting: str
    value: float | str
    unit: str = ""


def dropout_label(rate: float) -> str:
    return f"d={rate:g}"


def resolved(manifest: dict[str, Any], key: str) -> Any:
    """A key path (``privacy.strategy``) of the run's resolved scenario."""
    node: Any = manifest.get("scenario", {})
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@dataclass(frozen=True)
class Run:
    """One finished (or stopped) run: its resolved scenario and its rounds."""

    directory: Path
    manifest: dict[str, Any]
    rounds: pd.DataFrame

    def key(self, path: str) -> Any:
        return resolved(self.manifest, path)

    @property
    def strategy(self) -> str:
        return str(self.key("privacy.strategy") or "none")

    @property
    def dropout(self) -> float:
        return float(self.key("dropout.rate") or 0.0)

    def final(self, column: str) -> float:
        """The last non-missing value of a rounds column (NaN if none)."""
        values = self.rounds[column].dropna() if column in self.rounds else pd.Series(dtype=float)
        return float(values.iloc[-1]) if len(values) else math.nan

    @property
    def completed(self) -> int:
        """Rounds that aggregated (``outcome == "ok"``)."""
        return int((self.rounds["outcome"] == "ok").sum())

    @property
    def budget_stops(self) -> pd.Series:
        """Which rounds were refused because they would pass the budget (Early's stop: its last row)."""
        return self.rounds["outcome"].astype(str).str.contains(BUDGET_STOP, regex=False)


BUDGET_STOP = "privacy budget: this round would bring epsilon"
"""How the outcome of the round Early refuses reads (after ``aborted: <step>: ``)."""


def runs(folder: Path) -> list[Run]:
    """The complete runs of a results folder (a sweep or a single run); none if the folder does not exist
    yet (an item not run). A run that was interrupted or failed is left out (:func:`unfinished` names it)."""
    if not folder.exists():
        return []
    found = []
    for directory in run_dirs(folder):
        manifest = read_manifest(directory)
        if manifest.get("status") == "complete":
            found.append(Run(directory, manifest, read_run_table(directory, "rounds")))
    return found


def unfinished(folder: Path) -> list[str]:
    """The run folders under ``folder`` whose manifest does not say ``complete``, with their status."""
    if not folder.exists():
        return []
    statuses = {d.name: read_manifest(d).get("status", "no status") for d in run_dirs(folder)}
    return [f"{folder.name}/{name}: {status}" for name, status in statuses.items() if status != "complete"]


def unique_key(seen: dict[Any, str], key: Any, run: Run) -> None:
    """Refuse a second run at the same setting: a measure compares settings, it does not average runs."""
    if key in seen:
        raise ResultsError(
            f"{run.directory.parent}: two runs at the same setting {key} ({seen[key]} and {run.directory.name}); "
            "measure one run per setting (sweep each key once)"
        )
    seen[key] = run.directory.name


# --------------------------------------------------------------------------------------------- privacy


def measure_privacy(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Epsilon after the scenario's rounds per strategy and dropout rate (the sweep's values), by the
    accounting alone (``dropsim privacy``: planned, noised and accounted as a run is), and, where the
    scenario was run, each run's final epsilon."""
    from sim.learning.models import model_dimension  # deferred: torch, kept out of the light commands
    from sim.runner.privacy_table import privacy_table  # deferred: torch, kept out of the light commands

    rows: list[Row] = []
    for path in item.scenarios:
        grid = load(path, item.overrides(reduced))
        base = grid.base()
        strategies = [str(s) for s in grid.sweep.get("privacy.strategy", [base.privacy.strategy])]
        dropouts = [float(x) for x in grid.sweep.get("dropout.rate", [base.dropout.rate])]
        for r in privacy_table(base, dropouts, model_dimension(base), strategies):
            setting = f"{r['strategy']}, {dropout_label(r['dropout'])}"
            rows.append(Row("epsilon", setting, float(r["epsilon"])))
            if r["strategy"] == "early":
                rows.append(Row("rounds completed", setting, float(r["rounds_completed"])))
        folder = results.get(path)
        if folder is not None:
            seen: dict[Any, str] = {}
            for run in runs(folder):
                unique_key(seen, (run.strategy, run.dropout), run)
                setting = f"{run.strategy}, {dropout_label(run.dropout)}"
                rows.append(Row("epsilon, simulated", setting, run.final("epsilon")))
    return rows


def epsilon_after(rdp: np.ndarray, orders: Sequence[float], delta: float, rounds: int, classic: bool = False) -> float:
    """Epsilon after ``rounds`` identical rounds of per-round RDP ``rdp``.

    ``classic``: the conversion eps = min over orders of (R rdp - log(delta) / (a - 1)) (Mironov 2017; the
    one TensorFlow Privacy used when Baek et al. wrote); otherwise dropsim's (``sim.dp.accounting.epsilon``).
    """
    from sim.dp.accounting import epsilon  # deferred: dp_accounting, kept out of the light commands

    total = rdp * rounds
    if classic:
        a = np.asarray(orders, dtype=float)
        return float(np.min(total - math.log(delta) / (a - 1)))
    return epsilon(total, orders, delta)[0]


def rounds_below(budget: float, eps: Callable[[int], float], limit: int = 10**8) -> int:
    """The most rounds R with eps(R) < budget (eps increasing in R); 0 if even one round passes it."""
    if eps(1) >= budget:
        return 0
    lo, hi = 1, 2
    while hi < limit and eps(hi) < budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) < budget else (lo, mid)
    return lo


def measure_baek(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Baek et al. Table 2: the Poisson-subsampled Gaussian at noise multiplier z, dropout d leaving
    z sqrt(1 - d) (the aggregate keeps (1 - d) of the noise variance, the sensitivity unchanged: their
    section IV.B), epsilon after R rounds and the rounds a budget allows, by dropsim's accountant
    (integer orders 2..128 and 256, the conversion of Canonne et al.) and by the paper's (TensorFlow Privacy's
    orders, the classic conversion). Rate q and delta come from the scenario; where it was run, each run's
    final epsilon too (its noise planned by dropsim for the scenario's budget)."""
    # deferred: dp_accounting, kept out of the light commands
    from sim.dp.accounting import ORDERS, gaussian_subsampled_rdp

    path = item.scenarios[0]
    grid = load(path, item.overrides(reduced))
    base = grid.base()
    q = base.sampling.rate
    if q is None:
        raise ResultsError(f"{path}: the Baek reproduction needs Poisson sampling (sampling.rate)")
    delta = base.privacy.delta
    z = float(item.params["noise_multiplier"])
    dropouts = [float(x) for x in grid.sweep.get("dropout.rate", [base.dropout.rate])]
    rows: list[Row] = []
    for d in dropouts:
        zd = z * math.sqrt(1 - d)
        curves = {
            "epsilon": (np.asarray(gaussian_subsampled_rdp(ORDERS, zd, q)), ORDERS, False),
            "epsilon, TF Privacy accountant": (
                np.asarray(gaussian_subsampled_rdp(TF_PRIVACY_ORDERS, zd, q)),
                TF_PRIVACY_ORDERS,
                True,
            ),
        }
        for name, (rdp, orders, classic) in curves.items():
            for rounds in item.params["rounds"]:
                value = epsilon_after(rdp, orders, delta, int(rounds), classic)
                rows.append(Row(name, f"{dropout_label(d)}, {int(rounds)} rounds", value))
            suffix = name.removeprefix("epsilon")
            for budget in item.params["budgets"]:
                count = rounds_below(float(budget), partial(epsilon_after, rdp, orders, delta, classic=classic))
                rows.append(Row(f"rounds within budget{suffix}", f"{dropout_label(d)}, eps<{float(budget):g}", count))
    folder = results.get(path)
    if folder is not None:
        for run in runs(folder):
            setting = f"{dropout_label(run.dropout)}, {run.completed} rounds"
            rows.append(Row("simulated epsilon (noise planned by dropsim)", setting, run.final("epsilon")))
    return rows


# -------------------------------------------------------------------------------------------- accuracy


def measure_accuracy(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Final accuracy (%) and epsilon per strategy and dropout rate; XNoise's and Early's accuracy against
    Orig's and XNoise's at the same rate (points); the rounds Early completed."""
    rows: list[Row] = []
    final: dict[tuple[str, float], float] = {}
    seen: dict[Any, str] = {}
    for path in item.scenarios:
        for run in runs(results[path]):
            s, d = run.strategy, run.dropout
            unique_key(seen, (s, d), run)
            setting = f"{s}, {dropout_label(d)}"
            accuracy = 100 * run.final("accuracy")
            final[(s, d)] = accuracy
            rows.append(Row("final accuracy", setting, accuracy, "%"))
            if s != "none":
                rows.append(Row("epsilon", setting, run.final("epsilon")))
            if s == "early":
                rows.append(Row("rounds completed", setting, float(run.completed)))
    rates = sorted({d for _, d in final})
    for name, (a, b) in {
        "accuracy, XNoise - Orig (points)": ("xnoise", "orig"),
        "accuracy, Early - XNoise (points)": ("early", "xnoise"),
        "accuracy, XNoise - non-private (points)": ("xnoise", "none"),
        "accuracy, XNoise-Appr - Orig (points)": ("xnoise-appr", "orig"),
    }.items():
        for d in rates:
            if (a, d) in final and (b, d) in final:
                rows.append(Row(name, dropout_label(d), final[(a, d)] - final[(b, d)], "points"))
    return rows


# -------------------------------------------------------------------------------------------- pipeline


def pipeline_table(folder: Path) -> pd.DataFrame:
    """One row per run: the cost profile (``dropsim`` when the scenario names none), protocol, strategy,
    dropout, plain (one chunk) or not, chunks used, mean round time and aggregation time (s) over the rounds
    that finished."""
    records = []
    for run in runs(folder):
        done = run.rounds[run.rounds["outcome"] == "ok"]
        if done.empty:
            continue
        records.append(
            {
                "profile": str(run.key("costs.profile") or "dropsim"),
                "protocol": str(run.key("aggregation.protocol")),
                "strategy": run.strategy,
                "dropout": run.dropout,
                "plain": run.key("pipeline.chunks") == 1,
                "chunks": int(done["chunks"].iloc[0]),
                "round_time": float(done["round_time"].mean()),
                "agg_time": float(done["agg_time"].mean()),
            }
        )
    return pd.DataFrame.from_records(records)


OVERHEAD_NAMES = {"xnoise": "XNoise", "xnoise-appr": "XNoise-Appr"}
"""Strategies whose plain round time is compared with Orig's at the same point, and their names."""


def measure_pipeline(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Per protocol, strategy and dropout rate: round time plain and pipelined (s), the chunks dropsim
    chose, the speedup, the aggregation's share of the plain round (Amdahl's p) and the aggregation's own
    speedup; XNoise's and XNoise-Appr's plain overhead over Orig; the ranges over all settings. Where the
    item's runs use more than one cost profile (docs/profiles.md), every setting starts with the profile's
    name (``dordis: secagg, orig, d=0``; ``dordis: range``) and the ranges are per profile."""
    rows: list[Row] = []
    speedups: dict[str, list[float]] = {}
    shares: dict[str, list[float]] = {}
    tables = [pipeline_table(results[path]) for path in item.scenarios]
    profiles = sorted({p for table in tables if not table.empty for p in table["profile"]})

    def label(profile: str, setting: str) -> str:
        return f"{profile}: {setting}" if len(profiles) > 1 else setting

    for path, table in zip(item.scenarios, tables, strict=True):
        if table.empty:
            continue
        plain: dict[tuple[str, str, str, float], dict[Any, Any]] = {}
        piped: dict[tuple[str, str, str, float], dict[Any, Any]] = {}
        for record in table.to_dict("records"):
            key = (str(record["profile"]), str(record["protocol"]), str(record["strategy"]), float(record["dropout"]))
            target = plain if record["plain"] else piped
            if key in target:
                raise ResultsError(f"{results[path]}: two {'plain' if record['plain'] else 'pipelined'} runs at {key}")
            target[key] = record
        for key, p in plain.items():
            profile, protocol, strategy, d = key
            setting = label(profile, f"{protocol}, {strategy}, {dropout_label(d)}")
            share = p["agg_time"] / p["round_time"]
            shares.setdefault(profile, []).append(share)
            rows.append(Row("round time, plain", setting, p["round_time"], "s"))
            rows.append(Row("aggregation share, plain", setting, 100 * share, "%"))
            if key in piped:
                q = piped[key]
                speedup = p["round_time"] / q["round_time"]
                speedups.setdefault(profile, []).append(speedup)
                rows.append(Row("round time, pipelined", setting, q["round_time"], "s"))
                rows.append(Row("chunks", setting, float(q["chunks"])))
                rows.append(Row("speedup", setting, speedup, "x"))
                if q["agg_time"] > 0:
                    rows.append(Row("aggregation speedup", setting, p["agg_time"] / q["agg_time"], "x"))
            orig = plain.get((profile, protocol, "orig", d))
            if strategy in OVERHEAD_NAMES and orig is not None:
                overhead = 100 * (p["round_time"] / orig["round_time"] - 1)
                quantity = f"{OVERHEAD_NAMES[strategy]} overhead, plain"
                rows.append(Row(quantity, label(profile, f"{protocol}, {dropout_label(d)}"), overhead, "%"))
    for profile in profiles:
        if speedups.get(profile):
            low, high = min(speedups[profile]), max(speedups[profile])
            rows.append(Row("speedup", label(profile, "range"), f"{low:.2f}-{high:.2f}", "x"))
        if shares.get(profile):
            low, high = 100 * min(shares[profile]), 100 * max(shares[profile])
            rows.append(Row("aggregation share, plain", label(profile, "range"), f"{low:.0f}-{high:.0f}", "%"))
    return rows


# ------------------------------------------------------------------------------------------- footprint


def footprint_table(folder: Path) -> pd.DataFrame:
    """One row per run: parameters, clients sampled, dropout, strategy and the mean bytes a client whose
    update is in the aggregate uploaded."""
    records = []
    for run in runs(folder):
        clients = read_run_table(run.directory, "clients")
        survivors = clients[clients["in_aggregate"].astype(str).str.lower().isin(["true", "1"])]
        records.append(
            {
                "params": int(run.key("model.params")),
                "clients": int(run.key("sampling.clients_per_round")),
                "dropout": run.dropout,
                "strategy": run.strategy,
                "bytes_up": float(survivors["bytes_up"].mean()) if len(survivors) else math.nan,
            }
        )
    return pd.DataFrame.from_records(records)


def measure_footprint(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Dordis Table 3: the extra MiB a surviving client uploads in one round under each strategy over
    Orig at the same model size, sample size and dropout rate (real frames' sizes)."""
    rows: list[Row] = []
    for path in item.scenarios:
        table = footprint_table(results[path])
        if table.empty:
            continue
        records = table.to_dict("records")
        keys = [(r["strategy"], r["params"], r["clients"], r["dropout"]) for r in records]
        if len(set(keys)) < len(keys):
            raise ResultsError(f"{results[path]}: two runs at the same strategy, size, sample size and dropout")
        orig = {
            (r["params"], r["clients"], r["dropout"]): float(r["bytes_up"]) for r in records if r["strategy"] == "orig"
        }
        for r in records:
            key = (r["params"], r["clients"], r["dropout"])
            if r["strategy"] == "orig" or key not in orig:
                continue
            setting = (
                f"{r['strategy']}, {int(r['params']) / 1e6:g}M, n={r['clients']}, {dropout_label(float(r['dropout']))}"
            )
            rows.append(Row("extra MiB up", setting, (float(r["bytes_up"]) - orig[key]) / MIB, "MiB"))
    return rows


# ----------------------------------------------------------------------------------------------- trace


def trace_label(run: Run) -> str:
    """``orig``, or ``con, x=0.2`` for Con with its guessed dropout rate."""
    if run.strategy == "con":
        return f"con, x={float(run.key('privacy.guessed_dropout')):g}"
    return run.strategy


def measure_trace(item: Item, results: dict[Path, Path], reduced: bool) -> list[Row]:
    """Per strategy under trace-driven dropout: epsilon at the end, the rounds that aggregated and that
    aborted (too few survivors), the round Early refused, and the share of sampled clients the trace took
    offline (offline when sampled, or during the round)."""
    rows: list[Row] = []
    seen: dict[Any, str] = {}
    for path in item.scenarios:
        for run in runs(results[path]):
            label = trace_label(run)
            unique_key(seen, label, run)
            stops = run.budget_stops
            rows.append(Row("epsilon", label, run.final("epsilon")))
            rows.append(Row("rounds completed", label, float(run.completed)))
            rows.append(Row("rounds aborted", label, float(((run.rounds["outcome"] != "ok") & ~stops).sum())))
            if stops.any():
                stop = float(run.rounds.loc[stops, "round"].iloc[0])
                rows.append(Row("refused by the budget at round", label, stop))
            clients = read_run_table(run.directory, "clients")
            offline = clients["dropped_stage"].fillna("").astype(str).str.startswith("offline")
            rows.append(Row("sampled clients gone offline", label, 100 * float(offline.mean()), "%"))
    return rows


MEASURE_FUNCTIONS: dict[str, Callable[[Item, dict[Path, Path], bool], list[Row]]] = {
    "privacy": measure_privacy,
    "baek": measure_baek,
    "accuracy": measure_accuracy,
    "pipeline": measure_pipeline,
    "footprint": measure_footprint,
    "trace": measure_trace,
}
