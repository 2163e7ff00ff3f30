"""Converting FedScale's device traces (pickles) into a :class:`~sim.traces.model.Trace`, once.

FedScale (Lai et al., ICML'22) ships two pickled dicts, keyed by client id (an int, or a numeric string):

* ``client_behave_trace``: ``{"duration": s, "active": [t0, t1, ...], "inactive": [u0, u1, ...],
  "finish_time": F, "model": "..."}``, derived from the 136k-device FLASH study (Yang et al., WWW'21).
  FedScale's ``ClientMetadata.is_active`` treats a client as online while ``active[i] <= t mod F <=
  inactive[i]``; here that is the half-open interval ``[active[i], inactive[i])`` (the end is a single
  instant, and dropsim intervals are half-open throughout), repeating with period ``F`` seconds.
* ``client_device_capacity``: ``{"computation": ms per sample, "communication": kbit/s}``.

The pickles are read with :func:`sim.safepickle.restricted_load` (plain containers, numbers and plain numpy
arrays/scalars only): a pickle naming any other global is refused before anything is called. The conversion
is strict about structure (missing keys, lists of different lengths, unsorted or overlapping intervals,
times outside ``[0, F]`` each raise :class:`FedScaleError` naming the file and the client) and makes two
documented, counted normalisations: zero-length intervals (``active == inactive``, online for an instant)
are dropped, and intervals that touch (``inactive[i] == active[i+1]``) are merged into one session.
Clients without any interval left are left out of the trace. Client ids are kept as they are.

A pickle can name one list for many clients (through its memo), so its size alone does not bound the work of
converting it: before converting, the intervals of all clients are counted (a shared list for each client
naming it), and a trace may hold at most :data:`INTERVALS_PER_BYTE` per byte of its file (at least
:data:`MIN_INTERVALS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.safepickle import restricted_load, short_repr
from sim.traces.model import Trace

__all__ = ["FedScaleError", "ImportReport", "import_fedscale", "import_fedscale_report"]

_MAX_ID_DIGITS = 19
"""Digits of the largest client id, 2^63 - 1."""
INTERVALS_PER_BYTE = 1
"""Most intervals a behaviour trace may hold per byte of its file: an interval written out takes at least 4
bytes (two one-byte ints), so only lists shared between clients come near it."""
MIN_INTERVALS = 1 << 16
"""...but at least this many may be read from any file."""


class FedScaleError(InputError):
    """A FedScale pickle whose structure or values cannot be converted (names file and client)."""


@dataclass(frozen=True)
class ImportReport:
    """What a conversion kept and changed (counts)."""

    clients: int
    """Clients in the behaviour pickle."""
    kept_clients: int
    """Clients with at least one interval, i.e. in the trace."""
    intervals: int
    """Intervals in the trace (after the normalisations below)."""
    zero_length: int
    """Intervals dropped because ``active == inactive``."""
    merged: int
    """Intervals merged into the one before because they touched it."""
    with_capacity: int
    """Trace clients that have a capacity entry."""
    capacity_unused: int
    """Capacity entries for clients not in the trace (ignored)."""

    def row(self) -> dict[str, int]:
        return {
            "clients": self.clients,
            "in trace": self.kept_clients,
            "intervals": self.intervals,
            "zero-length dropped": self.zero_length,
            "touching merged": self.merged,
            "with capacity": self.with_capacity,
            "capacity unused": self.capacity_unused,
        }


def _client_id(key: object, path: Path) -> int:
    """A FedScale client key as a non-negative int (ints, numpy ints and numeric strings are accepted)."""
    text = key.strip() if isinstance(key, str) else ""
    if isinstance(key, Integral) and not isinstance(key, bool):
        value = int(key)
    elif text.isascii() and text.isdigit() and len(text) <= _MAX_ID_DIGITS:
        value = int(text)  # ASCII digits only: str.isdigit also admits digits int() refuses, such as "²"
    else:
        raise FedScaleError(
            f"{path}: client key {short_repr(key)} is not a client id; expected an integer or a numeric string"
        )
    if value < 0 or value > 2**63 - 1:  # (a file's int may have more digits than str() will write)
        raise FedScaleError(f"{path}: client id {short_repr(value)} is outside 0..2^63-1")
    return value


def _number(value: object, path: Path, client: int, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise FedScaleError(f"{path}: client {client}: {what} is {short_repr(value)}, not a number")
    try:
        x = float(value)
    except OverflowError:  # an int beyond float's range
        raise FedScaleError(f"{path}: client {client}: {what} is {short_repr(value)}, beyond any float") from None
    if not math.isfinite(x):
        raise FedScaleError(f"{path}: client {client}: {what} is {x}, not a finite number")
    return x


def _times(value: object, path: Path, client: int, key: str) -> list[Any]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise FedScaleError(f"{path}: client {client}: {key!r} is a {type(value).__name__}; expected a list of seconds")
    return list(value)


def _load_dict(path: Path, what: str) -> Mapping[Any, Any]:
    if not path.is_file():
        raise FedScaleError(f"{path}: no such file ({what})")
    try:
        data = restricted_load(path, allow_numpy=True)
    except OSError as exc:
        raise FedScaleError(f"{path}: cannot read ({what}): {exc.strerror or exc}") from None
    if not isinstance(data, Mapping):
        raise FedScaleError(f"{path}: holds a {type(data).__name__}; a FedScale {what} is a dict client id -> entry")
    return data


def _keyed(data: Mapping[Any, Any], path: Path) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for key, entry in data.items():
        client = _client_id(key, path)
        if client in out:
            raise FedScaleError(f"{path}: client {client} appears twice (as {short_repr(key)} and another spelling)")
        out[client] = entry
    return out


def _check_intervals(behave: Mapping[int, Any], path: Path) -> None:
    """Refuse a trace of more intervals than its file's size allows, counted before any is converted (an
    entry that is not a dict of lists is refused later, with its client)."""
    total = 0
    for entry in behave.values():
        active = entry.get("active") if isinstance(entry, Mapping) else None
        if isinstance(active, list | tuple) or (isinstance(active, np.ndarray) and active.ndim):
            total += len(active)
    size = path.stat().st_size
    most = max(MIN_INTERVALS, INTERVALS_PER_BYTE * size)
    if total > most:
        raise FedScaleError(
            f"{path}: {total} intervals (a list that clients share counted for each) in a file of {size} bytes; a "
            f"trace may hold at most {INTERVALS_PER_BYTE} per byte (at least {MIN_INTERVALS}), here {most}"
        )


def import_fedscale_report(
    behave_path: str | Path, capacity_path: str | Path | None = None
) -> tuple[Trace, ImportReport]:
    """Convert FedScale's ``client_behave_trace`` (and optionally ``client_device_capacity``) pickles.

    Times in seconds as in FedScale; periods = ``finish_time`` (s); compute in ms per sample; bandwidth in
    kbit/s. Returns the trace (source ``behave_path``) and counts of what the conversion normalised.
    """
    bpath = Path(behave_path)
    behave = _keyed(_load_dict(bpath, "client_behave_trace"), bpath)
    _check_intervals(behave, bpath)
    ids = sorted(behave)
    counts = np.zeros(len(ids), dtype=np.int64)
    periods = np.empty(len(ids))
    starts: list[float] = []
    ends: list[float] = []
    zero = merged = 0
    for i, client in enumerate(ids):
        entry = behave[client]
        if not isinstance(entry, Mapping):
            raise FedScaleError(f"{bpath}: client {client}: entry is a {type(entry).__name__}; expected a dict")
        missing = [k for k in ("active", "inactive", "finish_time") if k not in entry]
        if missing:
            raise FedScaleError(
                f"{bpath}: client {client}: missing key(s) {', '.join(missing)}; an entry needs active, inactive "
                f"and finish_time (duration and model are ignored)"
            )
        period = _number(entry["finish_time"], bpath, client, "finish_time")
        if period <= 0:
            raise FedScaleError(f"{bpath}: client {client}: finish_time {period:g} must be > 0 seconds")
        active = _times(entry["active"], bpath, client, "active")
        inactive = _times(entry["inactive"], bpath, client, "inactive")
        if len(active) != len(inactive):
            raise FedScaleError(
                f"{bpath}: client {client}: {len(active)} active times but {len(inactive)} inactive times; "
                "they pair up, so their lengths must match"
            )
        previous_end = -math.inf
        for k, (a_raw, b_raw) in enumerate(zip(active, inactive, strict=True)):
            a = _number(a_raw, bpath, client, f"active[{k}]")
            b = _number(b_raw, bpath, client, f"inactive[{k}]")
            if not 0 <= a <= b <= period:
                raise FedScaleError(
                    f"{bpath}: client {client}: interval {k} is active {a:g} .. inactive {b:g}; expected "
                    f"0 <= active <= inactive <= finish_time ({period:g})"
                )
            if a < previous_end:
                raise FedScaleError(
                    f"{bpath}: client {client}: interval {k} starts at {a:g}, before the previous one ends "
                    f"({previous_end:g}); intervals must be sorted and disjoint"
                )
            if a == b:
                zero += 1
                continue
            if a == previous_end:
                ends[-1] = b
                merged += 1
            else:
                starts.append(a)
                ends.append(b)
                counts[i] += 1
            previous_end = b
        periods[i] = period
    keep = counts > 0
    kept_ids = np.asarray(ids, dtype=np.int64)[keep]
    offsets = np.concatenate([[0], np.cumsum(counts[keep])]).astype(np.int64)
    compute: np.ndarray | None = None
    bandwidth: np.ndarray | None = None
    with_capacity = unused = 0
    if capacity_path is not None:
        cpath = Path(capacity_path)
        capacity = _keyed(_load_dict(cpath, "client_device_capacity"), cpath)
        compute = np.full(kept_ids.size, np.nan)
        bandwidth = np.full(kept_ids.size, np.nan)
        position = {int(c): j for j, c in enumerate(kept_ids)}
        for client, entry in capacity.items():
            j = position.get(client)
            if j is None:
                unused += 1
                continue
            if not isinstance(entry, Mapping) or not {"computation", "communication"} <= set(entry):
                raise FedScaleError(
                    f"{cpath}: client {client}: entry {short_repr(entry)} lacks computation and communication; "
                    "expected {'computation': ms per sample, 'communication': kbit/s}"
                )
            for key, out in (("computation", compute), ("communication", bandwidth)):
                x = _number(entry[key], cpath, client, key)
                if x <= 0:
                    raise FedScaleError(f"{cpath}: client {client}: {key} {x:g} must be > 0")
                out[j] = x
            with_capacity += 1
    trace = Trace(
        clients=kept_ids,
        offsets=offsets,
        starts=np.asarray(starts, dtype=np.float64),
        ends=np.asarray(ends, dtype=np.float64),
        periods=periods[keep],
        compute_ms_per_sample=compute,
        bandwidth_kbps=bandwidth,
        source=str(bpath),
    )
    report = ImportReport(
        clients=len(ids),
        kept_clients=int(kept_ids.size),
        intervals=trace.intervals,
        zero_length=zero,
        merged=merged,
        with_capacity=with_capacity,
        capacity_unused=unused,
    )
    return trace, report


def import_fedscale(behave_path: str | Path, capacity_path: str | Path | None = None) -> Trace:
    """The trace of :func:`import_fedscale_report`, without the counts."""
    return import_fedscale_report(behave_path, capacity_path)[0]
