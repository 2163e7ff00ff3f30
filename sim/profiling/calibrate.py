"""``dropsim calibrate``: a cost profile's scales per operation class, fitted to what deployed parties did.

A deployment writes ``operations.csv`` (:mod:`sim.deploy.operations`): for every computation of every
party, the CPU seconds its thread took and the operations the simulator charges for it, and for every
party's event loop in every round its other CPU seconds with the frames it moved. The profile (the runs'
own, or ``--profile``) predicts each of them as the sum of its operations' costs.

An operation's class is the operation itself (``x25519.agree``, ``wire.decode``, ``deploy.call``, ...),
except that every model's training is one class, ``train``: each is timed by the profile on its own, warm
and back to back, and each differs on a deployed party in its own way (measured on this project's machine:
a small frame's decoding takes some 60 us more than the profile's, a vector sum a third of it). Classes
are reported in five kinds (:data:`KINDS`):

- ``crypto``: key agreement, signatures, authenticated encryption, mask expansion, Shamir, DP noise;
- ``encoding``: fixed-point and DSkellam encodings, the wire codec, vector sums, FedAvg's arithmetic;
- ``framing``: the testbed's sockets (``deploy.send``, ``deploy.receive``), and the pipeline's
  interference (scaled as ``deploy.send``: a chunk's compute slowed by the others' network work);
- ``handover``: handing a computation to a party's compute thread (``deploy.call``), which the simulator
  charges once per computation and a deployed party pays partly in its event loop (a kind of its own:
  nothing in it scales as the sockets do);
- ``training``: local training.

The fit is in two stages, each minimising ``sum_i ((y_i - sum_k s_k p_ik) / max(p_i, floor))^2 +
RIDGE sum_k (s_k - prior_k)^2`` over the entries ``i`` with any predicted cost, where ``y_i`` is the
measured CPU seconds, ``p_ik`` the profile's prediction for ``k`` and ``p_i`` their sum: a relative error,
with entries under :data:`FLOOR_S` weighed as if they took that long (sub-millisecond calls are many and
noisy, and matter little to a round). First ``k`` runs over the kinds, with priors 1; then over the
classes, each with its kind's scale as prior. Operations that always come together in one computation
(a client's key agreement and its mask expansion) cannot be told apart by the entries alone; the ridge
(:data:`RIDGE`: a class moves away from its kind's scale only as far as several entries' errors ask)
keeps such classes near their kind's scale instead of trading one's cost for another's. Scales are
non-negative (:func:`sim.profiling.fit.fit_nonnegative`); a class with no predicted cost in the runs
keeps 1. The new profile is the old one with every operation's coefficients
times its class's scale, and a ``calibration`` entry with its provenance: the host, the date, the runs
(their folders and scenario digests), the base profile, the scales and the fit's quality (per class, the
median ratio of measured to calibrated seconds over the entries of that class alone, and over all entries
the median absolute relative error before and after).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sim.costs.model import DEFAULT_PROFILE, CostModel, CostModelError, read_profile
from sim.deploy.operations import COLUMNS, FILE, work_from_json
from sim.errors import InputError
from sim.protocol.machine import Work
from sim.results.manifest import host
from sim.results.read import read_manifest
from sim.results.writer import write_json

KINDS = ("crypto", "encoding", "framing", "handover", "training")

_PREFIXES = {
    "crypto": ("aead.", "ed25519.", "x25519.", "prg.", "shamir.", "noise.", "secagg."),
    "encoding": ("encode.", "decode.", "wire.", "vector.", "fedavg."),
    "framing": ("deploy.send", "deploy.receive"),
    "handover": ("deploy.call",),
    "training": ("train.",),
}

FLOOR_S = 1e-3
"""Entries predicted to take less than this weigh in the fit as if they took this long (seconds)."""

RIDGE = 4.0
"""Weight of a scale's distance from its prior, in entries: moving a class's scale by 100% of its prior
costs as much as 2 entries each 100% off (2^2 = 4)."""


class CalibrationError(InputError):
    """Runs that cannot be calibrated on, with why."""


TRAIN = "train"
INTERFERENCE_CLASS = "deploy.send"
"""The class whose scale the pipeline's interference takes."""


def op_class(op: str) -> str:
    """The calibration class of operation ``op``: itself, or :data:`TRAIN` for every model's training."""
    return TRAIN if op.startswith("train.") else op


def kind(cls: str) -> str:
    """The kind of a class (:data:`KINDS`)."""
    for name, prefixes in _PREFIXES.items():
        if (cls == TRAIN and name == "training") or cls.startswith(prefixes):
            return name
    raise CalibrationError(f"operation {cls!r} is of no kind the calibration knows ({', '.join(KINDS)})")


@dataclass(frozen=True)
class Observation:
    """One entry of ``operations.csv``: the measured CPU seconds and the profile's prediction per class."""

    run: str
    thread: str
    cpu_s: float
    predicted: dict[str, float]
    """Reference seconds by class (only the classes it has)."""

    @property
    def total(self) -> float:
        return sum(self.predicted.values())


def run_folder(path: Path) -> Path:
    """The deployment folder of ``path``: itself, or a validation's ``deployed``."""
    if (path / FILE).is_file():
        return path
    if (path / "deployed" / FILE).is_file():
        return path / "deployed"
    raise CalibrationError(
        f"{path}: no {FILE} here nor in {path / 'deployed'}: calibrate on the folders of `dropsim deploy` or "
        "`dropsim validate` runs (made by this version)"
    )


def run_profile(folder: Path) -> Path:
    """The cost profile the run at ``folder`` was simulated with (its scenario's ``costs.profile``)."""
    scenario = read_manifest(folder).get("scenario") or {}
    costs = scenario.get("costs") or {}
    profile = costs.get("profile") if isinstance(costs, dict) else None
    return Path(profile) if profile else DEFAULT_PROFILE


def predicted(costs: CostModel, work: Sequence[Work]) -> dict[str, float]:
    """Reference seconds the profile charges for ``work``, by class."""
    out: dict[str, float] = {}
    for w in work:
        cls = op_class(w.op)
        kind(cls)  # an operation of no known kind is refused
        out[cls] = out.get(cls, 0.0) + costs.seconds(w.op, w.size)
    return out


def observations(folder: Path, costs: CostModel) -> list[Observation]:
    """Every entry of a run's ``operations.csv`` that the profile predicts some cost for."""
    path = folder / FILE
    out = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise CalibrationError(f"{path}: columns {reader.fieldnames}; expected {', '.join(COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            try:
                cpu = float(row["cpu_s"])
                work = work_from_json(row["work"])
                if not (math.isfinite(cpu) and cpu >= 0):
                    raise ValueError(f"cpu_s {row['cpu_s']!r}: a finite number >= 0 expected")
                by_class = predicted(costs, work)
            except (ValueError, TypeError) as exc:
                raise CalibrationError(f"{path}, line {line}: {exc}") from None
            except CostModelError as exc:
                raise CalibrationError(f"{path}, line {line}: {exc}") from None
            if sum(by_class.values()) > 0:
                out.append(Observation(str(folder), row["thread"], cpu, by_class))
    return out


def _fit(rows: Sequence[Observation], group: Callable[[str], str], prior: dict[str, float]) -> dict[str, float]:
    """Scales of the groups of classes (``group``) that the rows predict some cost for, each pulled towards
    ``prior`` (its group's, default 1) by :data:`RIDGE`."""
    from sim.profiling.fit import fit_nonnegative

    predicted = [{} for _ in rows]  # type: list[dict[str, float]]
    for r, by_group in zip(rows, predicted, strict=True):
        for k, v in r.predicted.items():
            by_group[group(k)] = by_group.get(group(k), 0.0) + v
    present = sorted({g for by_group in predicted for g, v in by_group.items() if v > 0})
    if not present:
        raise CalibrationError("the runs hold no computation the profile charges for: nothing to calibrate")
    features, targets = [], []
    for r, by_group in zip(rows, predicted, strict=True):
        w = 1.0 / max(r.total, FLOOR_S)
        features.append({g: by_group.get(g, 0.0) * w for g in present})
        targets.append(r.cpu_s * w)
    for g in present:  # the ridge: one row per group, its scale against its prior
        features.append({h: math.sqrt(RIDGE) if h == g else 0.0 for h in present})
        targets.append(math.sqrt(RIDGE) * prior.get(g, 1.0))
    fit = fit_nonnegative(present, features, targets)
    return {g: float(fit["coef"].get(g, 0.0)) for g in present}


def fit_scales(rows: Sequence[Observation]) -> tuple[dict[str, float], dict[str, float]]:
    """The scale of every class the rows predict some cost for, and of every kind (see the module's
    docstring): first one scale per kind, then one per class pulled towards its kind's."""
    kinds = _fit(rows, kind, {})
    classes = _fit(rows, lambda k: k, {k: kinds[kind(k)] for r in rows for k in r.predicted})
    return classes, kinds


def _model(r: Observation, scales: dict[str, float]) -> float:
    return sum(scales.get(k, 1.0) * v for k, v in r.predicted.items())


def quality(rows: Sequence[Observation], scales: dict[str, float]) -> dict[str, Any]:
    """How well the profile predicts the runs, as is and calibrated."""

    def error(r: Observation, s: dict[str, float]) -> float:
        model = _model(r, s)
        return abs(r.cpu_s - model) / max(model, FLOOR_S)

    per_kind: dict[str, Any] = {}
    for name in KINDS:
        of_kind = [r for r in rows if all(kind(k) == name for k in r.predicted)]
        if of_kind:
            per_kind[name] = {
                "entries": len(of_kind),
                "measured_s": sum(r.cpu_s for r in of_kind),
                "profile_s": sum(r.total for r in of_kind),
                "calibrated_s": sum(_model(r, scales) for r in of_kind),
            }
    return {
        "entries": len(rows),
        "median_abs_relative_error_as_is": statistics.median(error(r, {}) for r in rows),
        "median_abs_relative_error_calibrated": statistics.median(error(r, scales) for r in rows),
        "measured_s": sum(r.cpu_s for r in rows),
        "profile_s": sum(r.total for r in rows),
        "calibrated_s": sum(_model(r, scales) for r in rows),
        "per_kind": per_kind,
    }


def calibrate(runs: Sequence[Path], base: Path | None = None) -> dict[str, Any]:
    """The calibrated profile (a JSON document) from the deployments at ``runs`` (folders of ``dropsim
    deploy`` or ``dropsim validate``), scaling ``base`` (default: the runs' own profile, which must be one)."""
    if not runs:
        raise CalibrationError("calibrate needs at least one run folder")
    folders = [run_folder(Path(r)) for r in runs]
    if base is None:
        profiles = {run_profile(f).resolve() for f in folders}
        if len(profiles) > 1:
            raise CalibrationError(
                f"the runs were simulated with {len(profiles)} profiles ({', '.join(map(str, sorted(profiles)))}): "
                "name the one to scale with --profile"
            )
        base = profiles.pop()
    costs = CostModel.load(base)
    rows = [row for f in folders for row in observations(f, costs)]
    scales, kinds = fit_scales(rows)
    doc = read_profile(Path(base))
    for op, entry in doc["operations"].items():
        scale = scales.get(op_class(op), 1.0)  # a class the runs never charged keeps its cost
        entry["coef"] = {k: float(v) * scale for k, v in entry["coef"].items()}
    if isinstance(doc.get("pipeline"), dict) and "interference_s" in doc["pipeline"]:
        scale = scales.get(INTERFERENCE_CLASS, 1.0)
        doc["pipeline"]["interference_s"] = float(doc["pipeline"]["interference_s"]) * scale
    doc["calibration"] = {
        "method": "dropsim calibrate: per-class scales of the base profile fitted to deployed parties' CPU "
        f"seconds (relative least squares, entries under {FLOOR_S * 1000:g} ms weighed as {FLOOR_S * 1000:g} ms)",
        "host": host(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "base_profile": str(base),
        "runs": [{"folder": str(f), "scenario_sha256": read_manifest(f).get("scenario_sha256")} for f in folders],
        "scales": scales,
        "kind_scales": kinds,
        "ridge": RIDGE,
        "fit": quality(rows, scales),
    }
    return doc


def write_profile(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, doc)


def summary(doc: dict[str, Any]) -> str:
    """What the calibration found, for the terminal."""
    cal = doc["calibration"]
    fit = cal["fit"]
    lines = [f"calibrated on {len(cal['runs'])} run(s), {fit['entries']} entries; scales of {cal['base_profile']}:"]
    lines.append("  by kind: " + ", ".join(f"{k} x{v:.4g}" for k, v in cal["kind_scales"].items()))
    for k, scale in sorted(cal["scales"].items(), key=lambda item: (kind(item[0]), item[0])):
        lines.append(f"  {kind(k):9s} {k:22s} x{scale:.4g}")
    for name, info in fit["per_kind"].items():
        lines.append(
            f"  {name} alone: {info['entries']} entries, CPU seconds measured {info['measured_s']:.4g}, profile "
            f"{info['profile_s']:.4g}, calibrated {info['calibrated_s']:.4g}"
        )
    lines.append(
        "median |error| per entry: "
        f"{fit['median_abs_relative_error_as_is']:.1%} as is, {fit['median_abs_relative_error_calibrated']:.1%} "
        f"calibrated; CPU seconds measured {fit['measured_s']:.4g}, profile {fit['profile_s']:.4g}, calibrated "
        f"{fit['calibrated_s']:.4g}"
    )
    return "\n".join(lines)
