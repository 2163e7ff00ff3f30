"""What a run will hold in memory, estimated from its scenario before anything is built, and the check
against what this process may still use: a run that cannot fit is refused up front, with the parts that
need the memory and the keys that set them, instead of being killed by the kernel mid-run.

The population itself costs nothing: profiles, drop probabilities and the sample are computed from client
ids (:mod:`sim.clients.population`, :mod:`sim.keyed`). What grows is what the run touches:

* **a trace**: read whole (its rows counted before reading: newlines of a CSV, Parquet's row count);
* **the round's sampled clients**: each holds its protocol state, its messages and, in ``full`` and
  ``learning`` fidelity, its update, encoded and masked (about :data:`FULL_BYTES_PER_VALUE` bytes per
  value); SecAgg's clients each keep keys and shares of every other (:data:`PAIR_BYTES` per pair);
* **the sampler's index**: numpy draws k of n by shuffling a list of all n ids (8 bytes each) when k is more
  than n / 50 (and n more than 10,000); below that, by Floyd's method, in memory of order k.

The constants are peak-memory differences measured on this project's scenarios (docs/performance.md,
section 3): estimates, set by the largest samples measured (smaller ones need less per client). The
memory a process may still use is the least of ``MemAvailable``, its cgroup's limit less its usage, and
its address-space and data rlimits less what it holds (Linux; elsewhere no check is made).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from pathlib import Path

try:
    import resource
except ImportError:  # not POSIX: no rlimits to read
    resource = None  # type: ignore[assignment]

from sim.errors import InputError
from sim.protocol.registry import secret_holders, spec_of
from sim.scenario.types import Scenario

TRACE_ROW_BYTES = 64
"""Peak bytes per interval of reading a CSV trace (60 measured reading 5 million rows)."""
PARQUET_ROW_BYTES = 128
"""Peak bytes per interval of reading a Parquet trace (pandas' frame, pyarrow's table, one object a row)."""
CLIENT_BYTES = 96_000
"""A sampled client's state and messages in a round in ``timing`` fidelity, besides its pairs: SecAgg+ peaked
at 124 KB a client at 10,000 sampled with 28 neighbours (``benchmarks/scale.py``; 54 KB at 1,000), so 124 KB
less 28 pairs, rounded up."""
PAIR_BYTES = 1_300
"""Keys, shares and their messages per pair of clients that exchange them (SecAgg: 1.25 KB measured)."""
FULL_BYTES_PER_VALUE = 16
"""A sampled client's update in ``full`` (and ``learning``) fidelity, per value: float32 weights, the
encoding, the masked copy (13 measured at 53,002 values; ``learning`` sends the encoding itself, counted
the same to be safe)."""
AHEAD_BYTES_PER_VALUE = 4
"""With the clients' calls made ahead on threads (``aggregation.threads`` > 1, :mod:`sim.engine.ahead`), per
value: each reply's copy decoded for the server, held from when it is made until the server takes it
(1.1 measured at n = 100, d = 10^6: 1.96 GB of peak against 1.85; 4 if every copy is made first)."""
SHUFFLE_CUTOFF = 50
"""numpy's ``Generator.choice`` shuffles all n ids when it draws more than n / 50 of them (n > 10,000)."""


class FootprintError(InputError):
    """A run that would need more memory than this process may use."""


@dataclass(frozen=True)
class Need:
    """One part of a run's memory: how many bytes, for what, set by which keys (``where``)."""

    bytes: float
    what: str
    where: str


def _count_lines(path: Path) -> int:
    count = 0
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            count += block.count(b"\n")
    return count


def trace_rows(path: Path) -> tuple[int, int] | None:
    """(intervals, bytes per interval at the peak of reading) of a trace file, or None if it cannot be told
    (missing, or Parquet without pyarrow): the reader then says what is wrong."""
    if not path.is_file():
        return None
    if path.suffix == ".parquet":
        try:
            parquet = importlib.import_module("pyarrow.parquet")  # optional: the reader says it is missing
        except ImportError:
            return None
        try:
            return int(parquet.ParquetFile(path).metadata.num_rows), PARQUET_ROW_BYTES
        except Exception:  # a damaged file: the reader names the defect
            return None
    return _count_lines(path), TRACE_ROW_BYTES


def most_sampled(scenario: Scenario) -> int:
    """The most clients a round of ``scenario`` samples (Poisson: its mean plus 6 standard deviations)."""
    n, sampling = scenario.population, scenario.sampling
    if sampling.clients_per_round is not None:
        return min(sampling.clients_per_round, n)
    q = sampling.rate or 0.0
    return min(n, math.ceil(q * n + 6 * math.sqrt(q * (1 - q) * n)) + 1)


def needs(scenario: Scenario, dim: int | None = None, trace: bool = True) -> list[Need]:
    """The large parts of a run of ``scenario`` (``dim``: its update's values, if known; ``trace``: whether to
    count the trace, which is not yet read)."""
    sc = scenario
    out: list[Need] = []
    if sc.trace is not None and trace:
        # deferred: sim.traces.io loads pandas; this module stays importable without it
        from sim.traces.io import sidecar_path

        path = Path(sc.trace.file)
        rows = trace_rows(path)
        if rows is not None:
            count, per_row = rows
            side_rows = trace_rows(sidecar_path(path))
            count += side_rows[0] if side_rows is not None else 0
            out.append(Need(count * per_row, f"the trace's {count:,} rows", sc.origin("trace", "file")))
    k = most_sampled(sc)
    key = "clients_per_round" if sc.sampling.clients_per_round is not None else "rate"
    where = sc.origin("sampling", key)
    params = sc.aggregation
    peers = secret_holders(params, k) - 1 if spec_of(params).secure else 0
    per_client = CLIENT_BYTES + PAIR_BYTES * max(peers, 0)
    if sc.fidelity != "timing" and dim is not None:  # full and learning hold real updates
        per_client += FULL_BYTES_PER_VALUE * dim
        if sc.fidelity == "full" and sc.protocol_threads != 1:  # calls made ahead (full only); auto may be one core
            per_client += AHEAD_BYTES_PER_VALUE * dim
    out.append(Need(k * per_client, f"{k:,} sampled clients a round at about {_size(per_client)} each", where))
    n = sc.population
    if n > 10_000 and k > n // SHUFFLE_CUTOFF:
        out.append(Need(8.0 * n, f"an index of all {n:,} clients to draw {k:,} of them", where))
    return out


def _size(b: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} bytes"


def _read(path: str | Path) -> str:
    """A kernel file's text, or empty where it cannot be read."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _kib(text: str, key: str) -> int | None:
    """``key: N kB`` of a ``/proc`` file in bytes, or None where it is missing or malformed."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name == key and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            return int(parts[0]) * 1024
    return None


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _cgroup_room() -> int | None:
    """This process's memory cgroup's limit less its usage, less the page cache it could drop (v2 or v1), or
    None where there is no limit or it cannot be read."""
    for line in _read("/proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            limit_file, usage_file, cache_key = "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            limit_file, usage_file, cache_key = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
        else:
            continue
        limit, usage = _number(_read(base / limit_file)), _number(_read(base / usage_file))
        if limit is None or usage is None or limit >= 2**60:  # "max", unreadable, or no limit set
            continue
        cache = 0
        for stat in _read(base / "memory.stat").splitlines():
            key, _, value = stat.partition(" ")
            if key == cache_key and value.strip().isdigit():
                cache = int(value)
        return max(0, limit - usage + cache)
    return None


def room() -> tuple[int, str] | None:
    """The bytes this process may still allocate, and what bounds them; None where that cannot be told."""
    bounds: list[tuple[int, str]] = []
    available = _kib(_read("/proc/meminfo"), "MemAvailable")
    if available is not None:
        bounds.append((available, "available on this machine"))
    cgroup = _cgroup_room()
    if cgroup is not None:
        bounds.append((cgroup, "left in this process's memory cgroup"))
    if resource is not None:
        status = _read("/proc/self/status")
        for limit, held, name in (
            (resource.RLIMIT_AS, "VmSize", "RLIMIT_AS"),
            (resource.RLIMIT_DATA, "VmData", "RLIMIT_DATA"),
        ):
            soft = resource.getrlimit(limit)[0]
            used = _kib(status, held)
            if soft != resource.RLIM_INFINITY and soft >= 0 and used is not None:
                bounds.append((max(0, soft - used), f"left under this process's {name}"))
    return min(bounds) if bounds else None


def refusal(scenario: Scenario, dim: int | None = None, trace: bool = True) -> str:
    """Why a run of ``scenario`` cannot fit in the memory this process may still use, naming the parts and the
    keys that set them; empty if it fits (or if the room cannot be told)."""
    parts = needs(scenario, dim, trace)
    total = sum(p.bytes for p in parts)
    bound = room()
    if bound is None or total <= bound[0]:
        return ""
    big = sorted(parts, key=lambda p: -p.bytes)
    listed = "; ".join(f"{p.what}: {_size(p.bytes)} ({p.where})" for p in big if p.bytes >= total / 100)
    return (
        f"this run would need about {_size(total)} of memory, more than the {_size(bound[0])} {bound[1]}: "
        f"{listed}. Sample fewer clients a round, or run it on a larger machine"
    )


def check(scenario: Scenario, dim: int | None = None, trace: bool = True) -> None:
    """Raise :class:`FootprintError` if a run of ``scenario`` cannot fit (:func:`refusal`)."""
    why = refusal(scenario, dim, trace)
    if why:
        raise FootprintError(f"{scenario.name}: {why}")
