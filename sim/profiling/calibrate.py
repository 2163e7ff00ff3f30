"""``dropsim calibrate``: a cost profile's scales per operation class, fitted to what deployed parties did.

A deployment writes ``operations.csv`` (:mod:`sim.deploy.operations`): for every computation of every
party, the CPU seconds its thread took and the operations the simulator charges for it, and for every
party's event loop in every round its other CPU seconds with the frames it moved. The profile (the runs'
own, or ``--profile``) predicts each of them as the sum of its operations' costs.

An operation's class is the operation itself (``x25519.agree``, ``wire.decode``, ``deploy.call``, and
each model's training, ``train.linear.1x99x101.10``): each is timed by the profile on its own, warm and
back to back, and each differs on a deployed party in its own way (measured on this project's machine: a
small frame's decoding takes some 60 us more than the profile's, a vector sum a third of it; over the
kernel grid's calibration half, at the median computation, a 10^4-parameter model's training took about
2 times the profile's CPU and a 10^6-parameter one's 3 to 5 times, its 4 MB of weights no longer held in
the caches of a host that up to 21 processes share). And each class is one at the server and another at
the clients (``x25519.agree@server``): the server's process runs one event loop for every connection and
aggregates, a client's trains and masks, and the same operation costs them differently. The profile
written has ``op@server`` and ``op@client`` entries, which the simulator charges each party by
(:meth:`sim.costs.model.CostModel.seconds`). The sockets' operations (kinds in :data:`BY_FEATURE`) are a
class per feature of their cost (``deploy.send:const``, ``deploy.send:bytes``, ``deploy.receive:bytes``):
on a deployed party a frame's fixed cost and its cost per byte differ from the profile's by different
factors (fitted on the kernel grid: a send about 11 times the profile's fixed cost and 1.2 times its cost
per byte at a client, so that one scale for both charged a large frame several times its CPU and a small
one a fraction). Classes are reported in six kinds (:data:`KINDS`):

- ``crypto``: key agreement, signatures, authenticated encryption, mask expansion, Shamir, DP noise;
- ``encoding``: fixed-point and DSkellam encodings, the wire codec, vector sums, FedAvg's arithmetic;
- ``framing``: the testbed's sockets (``deploy.send``, ``deploy.receive``), and the pipeline's
  interference (scaled as the clients' framing kind: a chunk's compute slowed by the others' network
  work);
- ``handover``: handing a computation to a party's compute thread (``deploy.call``), which the simulator
  charges once per computation and a deployed party pays partly in its event loop (a kind of its own:
  nothing in it scales as the sockets do);
- ``restart``: on a kernel testbed whose runs counted their throttles (``throttles.csv``), the CPU a
  party's computations take more after each CFS period its quota held them back (``deploy.restart``,
  feature ``count``; each party-round's throttled periods shared among its computations as their stalls,
  :func:`restart_shares`). A base profile without it starts from :data:`RESTART_UNIT_S` a period; runs
  without the counts fit none, and the profile written then has none;
- ``training``: local training.

The fit is in two stages, each minimising ``sum_i ((y_i - sum_k s_k p_ik) / sqrt(max(p_i, floor)))^2 +
RIDGE sum_k (s_k - prior_k)^2`` over the entries ``i`` with any predicted cost, where ``y_i`` is the
measured CPU seconds, ``p_ik`` the profile's prediction for ``k`` and ``p_i`` their sum, entries under
:data:`FLOOR_S` weighed as if they took that long. Dividing by the square root (:data:`WEIGHT_POWER`)
sits between absolute errors, which only the longest computations would decide, and relative ones, which
the thousands of sub-millisecond calls would: chosen on the calibration half of ``benchmarks/validate.py
--testbed kernel`` alone, where the round-time median error was 27.5% with relative, 13.5% with
absolute and 10.0% with this weighting. First ``k`` runs over the kinds at each role, without the ridge;
then over the classes, each with its kind's scale at its role as prior. Operations that always come
together in one computation (a client's key agreement and its mask expansion) cannot be told apart by the
entries alone; the ridge (:data:`RIDGE`: a class moves away from its kind's scale only as far as several
entries' errors ask) keeps such classes near their kind's scale instead of trading one's cost for
another's. It leaves alone the classes of the kinds in :data:`UNPULLED`, which the entries tell apart: a
training is a computation of its own, the frames a loop moves in a round vary in number and size from
round to round and run to run, and throttles come to some computations and not to others. Scales are
non-negative (:func:`sim.profiling.fit.fit_nonnegative`). The
new profile keeps the old one's operations and adds each at each role (``op@server``, ``op@client``) with
its coefficients times its class's scale there (each feature's own, for a kind in :data:`BY_FEATURE`); a
class the runs never charged (a model they did not train) takes its kind's scale at that role, or 1.
A ``calibration`` entry gives its provenance: the host, the date, the runs (their folders and scenario
digests), the base profile, the scales and the fit's quality (the CPU seconds measured, as the profile
charges them and as calibrated, per kind and role, and the median absolute relative error per entry
before and after).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sim.costs.model import (
    CLIENT_ROLE,
    DEFAULT_PROFILE,
    SERVER_ROLE,
    CostModel,
    CostModelError,
    LinearCost,
    read_profile,
    resolve_profile,
)
from sim.deploy.operations import (
    BASE_COLUMNS,
    COLUMNS,
    COMPUTE,
    FILE,
    THROTTLES_COLUMNS,
    THROTTLES_FILE,
    work_from_json,
)
from sim.errors import InputError
from sim.profiling.fit import fit_nonnegative
from sim.protocol.machine import Work
from sim.results.integrity import check_table
from sim.results.manifest import host
from sim.results.read import read_manifest
from sim.results.writer import write_json
from sim.world import RESTART_OP

KINDS = ("crypto", "encoding", "framing", "handover", "restart", "training")
ROLES = (SERVER_ROLE, CLIENT_ROLE)

_PREFIXES = {
    "crypto": ("aead.", "ed25519.", "x25519.", "prg.", "shamir.", "noise.", "secagg."),
    "encoding": ("encode.", "decode.", "wire.", "vector.", "fedavg."),
    "framing": ("deploy.send", "deploy.receive"),
    "handover": ("deploy.call",),
    "restart": (RESTART_OP,),
    "training": ("train.",),
}

MAX_CELL = 1 << 28
"""Longest cell of operations.csv read (characters)."""

FLOOR_S = 1e-3
"""Entries predicted to take less than this weigh in the fit as if they took this long (seconds)."""

WEIGHT_POWER = 0.5
"""Each entry's residual is divided by its predicted seconds to this power (1: relative errors, 0:
absolute; see the module's docstring)."""

RESTART_UNIT_S = 1e-4
"""Reference seconds per restart that the fit starts from when its base profile has no ``deploy.restart``
(its fitted scale times this is the coefficient it writes)."""

RIDGE = 4.0
"""Weight of a scale's distance from its prior, in entries: moving a class's scale by 100% of its prior
costs as much as 2 entries each 100% off (2^2 = 4)."""


class CalibrationError(InputError):
    """Runs that cannot be calibrated on, with why."""


FEATURE_SEP = ":"
BY_FEATURE = ("framing",)
"""Kinds whose operations are a class per feature of their cost (``deploy.send:const``, ``deploy.send:bytes``;
see the module's docstring)."""
UNPULLED = (*BY_FEATURE, "restart", "training")
"""Kinds whose classes the ridge leaves alone: the entries tell them apart (a loop's frames; a restart,
which comes to some computations only; a training, which is a computation of its own)."""
INTERFERENCE_KIND = f"framing@{CLIENT_ROLE}"
"""The kind whose scale the pipeline's interference (a client's network work slowing its compute) takes."""


def feature_class(op: str, feature: str) -> str:
    """The class of ``op``'s cost in ``feature``: the operation itself, with the feature for an operation of
    a kind in :data:`BY_FEATURE` (``deploy.send:bytes``)."""
    return f"{op}{FEATURE_SEP}{feature}" if kind(op) in BY_FEATURE else op


def kind(cls: str) -> str:
    """The kind of a class (:data:`KINDS`), whatever its feature and role (``deploy.send:bytes@server`` is
    ``framing``)."""
    bare = cls.split("@", 1)[0].split(FEATURE_SEP, 1)[0]
    if bare in KINDS:
        return bare
    for name, prefixes in _PREFIXES.items():
        if bare.startswith(prefixes):
            return name
    raise CalibrationError(f"operation {bare!r} is of no kind the calibration knows ({', '.join(KINDS)})")


def with_role(name: str, role: str) -> str:
    return f"{name}@{role}"


def role_of(cls: str) -> str:
    return cls.split("@", 1)[1]


def role_kind(cls: str) -> str:
    """A class's kind at its role (``crypto@server``): the first stage's groups."""
    return with_role(kind(cls), role_of(cls))


@dataclass(frozen=True)
class Observation:
    """One entry of ``operations.csv``: the measured CPU seconds and the profile's prediction per class
    (classes at the entry's role: ``x25519.agree@client``)."""

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
    return resolve_profile(profile) if profile else DEFAULT_PROFILE


def predicted(costs: CostModel, work: Sequence[Work], role: str = CLIENT_ROLE) -> dict[str, float]:
    """Reference seconds the profile charges a party of ``role`` for ``work``, by class at that role."""
    out: dict[str, float] = {}
    for w in work:
        for feature, seconds in costs.cost(w.op, role).terms(w.size).items():
            cls = with_role(feature_class(w.op, feature), role)  # an operation of no known kind is refused
            out[cls] = out.get(cls, 0.0) + seconds
    return out


def observations(folder: Path, costs: CostModel) -> list[Observation]:
    """Every entry of a run's ``operations.csv`` that the profile predicts some cost for. Where the run kept
    its throttles (a kernel testbed's ``throttles.csv``) and its computations' instants, each computation
    also charges its share of its party's restarts in the round (:func:`restart_shares`)."""
    path = folder / FILE
    csv.field_size_limit(MAX_CELL)  # a loop's row lists every frame it moved
    data = path.read_bytes()
    manifest = read_manifest(folder)
    check_table(path, data, manifest)  # a complete run's table as its run wrote it
    parsed = []
    with io.StringIO(data.decode("utf-8", errors="replace"), newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) not in (COLUMNS, BASE_COLUMNS):
            raise CalibrationError(
                f"{path}: columns {reader.fieldnames}; expected {', '.join(COLUMNS)} (or the first "
                f"{len(BASE_COLUMNS)} alone, as written before the instants were kept)"
            )
        for line, row in enumerate(reader, start=2):
            try:
                cpu = float(row["cpu_s"])
                work = work_from_json(row["work"])
                if not (math.isfinite(cpu) and cpu >= 0):
                    raise ValueError(f"cpu_s {row['cpu_s']!r}: a finite number >= 0 expected")
                stall = _stall(row, cpu)
            except (ValueError, TypeError, csv.Error) as exc:
                raise CalibrationError(f"{path}, line {line}: {exc}") from None
            parsed.append((line, row, cpu, work, stall))
    shares = restart_shares(
        [(row["round"], row["party"], stall) for _, row, _, _, stall in parsed], throttles(folder, manifest)
    )
    out = []
    for i, (line, row, cpu, charged, _) in enumerate(parsed):
        work = (*charged, Work(RESTART_OP, {"count": shares[i]})) if i in shares else charged
        try:
            by_class = predicted(costs, work, SERVER_ROLE if row["party"] == "server" else CLIENT_ROLE)
        except CostModelError as exc:
            raise CalibrationError(f"{path}, line {line}: {exc}") from None
        if sum(by_class.values()) > 0:
            out.append(Observation(str(folder), row["thread"], cpu, by_class))
    return out


def _stall(row: dict[str, str], cpu: float) -> float | None:
    """A computation's wall time beyond its CPU seconds (seconds), where its row kept its instants."""
    if row["thread"] != COMPUTE or not row.get("began_s"):
        return None
    began, returned = float(row["began_s"]), float(row["returned_s"])
    if not (math.isfinite(began) and math.isfinite(returned) and began <= returned):
        raise ValueError(f"began_s {row['began_s']!r}, returned_s {row['returned_s']!r}: finite, in order expected")
    return max(0.0, returned - began - cpu)


def throttles(folder: Path, manifest: dict[str, Any]) -> dict[tuple[str, str], float]:
    """``(round, party) -> throttled CFS periods`` from a run's ``throttles.csv`` (a kernel testbed's), empty
    where it has none; a file anyone may have written, checked."""
    path = folder / THROTTLES_FILE
    if not path.is_file():
        return {}
    data = path.read_bytes()
    check_table(path, data, manifest)
    out: dict[tuple[str, str], float] = {}
    with io.StringIO(data.decode("utf-8", errors="replace"), newline="") as f:
        try:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != THROTTLES_COLUMNS:
                raise CalibrationError(f"{path}: columns {reader.fieldnames}; expected {', '.join(THROTTLES_COLUMNS)}")
            for line, row in enumerate(reader, start=2):
                try:
                    periods = int(row["throttled_periods"])
                    if periods < 0:
                        raise ValueError(f"throttled_periods {periods}: a count >= 0 expected")
                    key = (row["round"], row["party"])
                    if key in out:
                        raise ValueError(f"round {key[0]}, party {key[1]} listed twice")
                    out[key] = float(periods)
                except (ValueError, TypeError) as exc:
                    raise CalibrationError(f"{path}, line {line}: {exc}") from None
        except csv.Error as exc:
            raise CalibrationError(f"{path}: {exc}") from None
    return out


def restart_shares(
    rows: Sequence[tuple[str, str, float | None]], throttled: dict[tuple[str, str], float]
) -> dict[int, float]:
    """Each computation's share of its party's throttled periods in its round (``rows``: ``(round, party,
    stall)``, stall None for an entry without instants; ``throttled``: :func:`throttles`), by index: the
    periods split in proportion to the computations' stalls (their wall time beyond their CPU, which the
    throttles make), evenly where none stalled. A computation whose party-round has no count has none."""
    by_round: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for i, (number, party, stall) in enumerate(rows):
        if stall is not None and (number, party) in throttled:
            by_round.setdefault((number, party), []).append((i, stall))
    shares = {}
    for key, calls in by_round.items():
        total = sum(stall for _, stall in calls)
        for i, stall in calls:
            shares[i] = throttled[key] * (stall / total if total > 0 else 1 / len(calls))
    return shares


def _fit(
    rows: Sequence[Observation], group: Callable[[str], str], prior: dict[str, float], ridge: float
) -> dict[str, float]:
    """Scales of the groups of classes (``group``) that the rows predict some cost for, each pulled towards
    its ``prior`` by ``ridge`` (none if 0)."""
    predicted = [{} for _ in rows]  # type: list[dict[str, float]]
    for r, by_group in zip(rows, predicted, strict=True):
        for k, v in r.predicted.items():
            by_group[group(k)] = by_group.get(group(k), 0.0) + v
    present = sorted({g for by_group in predicted for g, v in by_group.items() if v > 0})
    if not present:
        raise CalibrationError("the runs hold no computation the profile charges for: nothing to calibrate")
    features, targets = [], []
    for r, by_group in zip(rows, predicted, strict=True):
        w = max(r.total, FLOOR_S) ** -WEIGHT_POWER
        features.append({g: by_group.get(g, 0.0) * w for g in present})
        targets.append(r.cpu_s * w)
    for g in present if ridge > 0 else ():  # the ridge: one row per group, its scale against its prior
        if g not in prior:
            continue
        features.append({h: math.sqrt(ridge) if h == g else 0.0 for h in present})
        targets.append(math.sqrt(ridge) * prior[g])
    fit = fit_nonnegative(present, features, targets)
    return {g: float(fit["coef"].get(g, 0.0)) for g in present}


def fit_scales(rows: Sequence[Observation]) -> tuple[dict[str, float], dict[str, float]]:
    """The scale of every class the rows predict some cost for, and of every kind (see the module's
    docstring): first one scale per kind, then one per class pulled towards its kind's."""
    kinds = _fit(rows, role_kind, {}, 0.0)
    prior = {k: kinds[role_kind(k)] for r in rows for k in r.predicted if kind(k) not in UNPULLED}
    classes = _fit(rows, lambda k: k, prior, RIDGE)
    return classes, kinds


def _model(r: Observation, scales: dict[str, float]) -> float:
    return sum(scales.get(k, 1.0) * v for k, v in r.predicted.items())


def quality(rows: Sequence[Observation], scales: dict[str, float]) -> dict[str, Any]:
    """How well the profile predicts the runs, as is and calibrated."""

    def error(r: Observation, s: dict[str, float]) -> float:
        model = _model(r, s)
        return abs(r.cpu_s - model) / max(model, FLOOR_S)

    per_kind: dict[str, Any] = {}
    for name in (with_role(k, role) for role in ROLES for k in KINDS):
        of_kind = [r for r in rows if all(role_kind(k) == name for k in r.predicted)]
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
    doc = read_profile(Path(base))
    restart = {"coef": {"count": RESTART_UNIT_S}}  # a base without restarts: a unit to scale
    if not costs.has(RESTART_OP):
        costs = costs.with_operations({RESTART_OP: LinearCost(restart["coef"])})
    rows = [row for f in folders for row in observations(f, costs)]
    scales, kinds = fit_scales(rows)
    operations = {op: entry for op, entry in doc["operations"].items() if "@" not in op}
    if any(kind(k) == "restart" for k in scales):
        operations.setdefault(RESTART_OP, restart)  # fitted on a kernel testbed's throttles
    else:  # no run counted its throttles: the operations' scales take their CPU in, and no restart is charged
        operations.pop(RESTART_OP, None)
    for op in list(operations):
        for role in ROLES:
            source = doc["operations"].get(with_role(op, role), operations[op])
            entry = {k: v for k, v in source.items() if k not in ("coef", "calibration_scale", "calibration_scales")}
            used = {}  # by feature: a class the runs never charged takes its kind's scale at that role, or 1
            for feature in source["coef"]:
                cls = with_role(feature_class(op, feature), role)
                fallback = 1.0
                if kind(cls) == "restart":  # a role whose computations no quota stopped: the other role's
                    fallback = next((v for k, v in scales.items() if kind(k) == "restart"), 1.0)
                used[feature] = scales.get(cls, kinds.get(role_kind(cls), fallback))
            entry["coef"] = {k: float(v) * used[k] for k, v in source["coef"].items()}
            entry["calibration_scales"] = used
            operations[with_role(op, role)] = entry
    doc["operations"] = operations
    if isinstance(doc.get("pipeline"), dict) and "interference_s" in doc["pipeline"]:
        doc["pipeline"]["interference_s"] = float(doc["pipeline"]["interference_s"]) * kinds.get(INTERFERENCE_KIND, 1.0)
    doc["calibration"] = {
        "method": "dropsim calibrate: per-class scales of the base profile fitted to deployed parties' CPU "
        f"seconds (least squares of residuals over the square root of the predicted seconds, at least "
        f"{FLOOR_S * 1000:g} ms; per kind and role, then per class with a ridge of {RIDGE:g} to its kind's scale; "
        "each model's training and each feature of a frame's cost a class of its own, without the ridge)",
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
        lines.append(f"  {kind(k):9s} {k:29s} x{scale:.4g}")
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
