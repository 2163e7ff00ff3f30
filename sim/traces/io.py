"""Reading and writing availability traces: dropsim's plain-text format, and Parquet when pyarrow is there.

The format (specified in ``traces/README.md``): ``NAME.csv`` holds one row per online interval,
``client,start_s,end_s`` (integer client id >= 0; times in seconds, start inclusive, end exclusive), after
optional leading ``#`` comment lines and the header. Rows are sorted by client, then start; a client's
intervals neither overlap nor touch. An optional sidecar ``NAME.clients.csv`` (``client`` plus any of
``period_s``, ``compute_ms_per_sample``, ``bandwidth_kbps``; an empty cell is unknown) makes a client's
intervals repeat every ``period_s`` seconds (FedScale's ``finish_time``) and gives its device capacity.
``NAME.parquet`` / ``NAME.clients.parquet`` hold the same columns.

Loading is vectorised (pandas' C parser, then whole-array checks), so a million clients and ten million
intervals load in seconds. Every defect is reported as :class:`TraceError` naming the file and line (the
row's position plus the comment and header lines above it; ``row N`` for Parquet), the value (text from
the file cut to :data:`SHOWN_CHARS` characters), and what is allowed. Nothing is repaired silently: a file
either loads exactly as written or is refused.

A CSV file costs time and memory in proportion to its size. A Parquet file can describe far more rows than
it has bytes (a run of one value is stored once), so its footer is read first: its columns must be numbers
(integers or floats) and it may have at most :data:`PARQUET_ROWS_PER_BYTE` rows per byte of file (at least
:data:`MIN_PARQUET_ROWS`), checked before any column is read.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import InputError
from sim.traces.model import Trace

__all__ = [
    "CLIENT_COLUMNS",
    "MAGIC",
    "TRACE_COLUMNS",
    "TraceError",
    "check_clients",
    "load_trace",
    "sidecar_path",
    "write_trace",
]

MAGIC = "# dropsim availability trace v1"
"""First line :func:`write_trace` writes (readers only require the header after the comments)."""
SIDECAR_MAGIC = "# dropsim availability trace clients v1"
"""First line of a sidecar :func:`write_trace` writes."""
TRACE_COLUMNS = ("client", "start_s", "end_s")
"""Header of the main file, in this order."""
CLIENT_COLUMNS = ("client", "period_s", "compute_ms_per_sample", "bandwidth_kbps")
"""Columns a sidecar may have: ``client`` first, then any of the others, each at most once."""
SHOWN_CHARS = 60
"""Most characters of a file's text (a cell, a header, a line) that an error message quotes."""
PARQUET_ROWS_PER_BYTE = 8
"""Most rows a Parquet trace or sidecar may have per byte of file (traces that dropsim writes, however
regular, have fewer than 2)."""
MIN_PARQUET_ROWS = 1 << 20
"""...but at least this many rows may be read from any Parquet file."""
_EXTRA = "__extra__"
_HeaderCheck = Callable[[list[str], "int | None"], None]
"""Checks a table's column names (the header line's number, or None for Parquet); raises TraceError."""
_MAX_ID = 2**63 - 1


class TraceError(InputError):
    """A trace file that cannot be used. ``path`` is the file; ``line`` the 1-based line of a CSV file (or
    the 1-based row of a Parquet file) where the defect is, None when it concerns the whole file."""

    def __init__(self, message: str, *, path: str, line: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


def sidecar_path(path: str | Path) -> Path:
    """The per-client sidecar of a trace file: ``NAME.csv`` -> ``NAME.clients.csv`` (same for Parquet)."""
    p = Path(path)
    return p.with_name(f"{p.name[: -len(p.suffix)]}.clients{p.suffix}")


# ---------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Table:
    """A table as read, before checks: its columns, and how to name the place of row i."""

    path: Path
    frame: pd.DataFrame
    first_line: int | None
    """CSV: the file line (1-based) of the first data row; None for Parquet (rows are numbered from 1)."""

    def line(self, row: int) -> int:
        return (self.first_line + row) if self.first_line is not None else row + 1

    def where(self, row: int) -> str:
        if self.first_line is None:
            return f"{self.path}: row {row + 1}"
        return f"{self.path}:{self.first_line + row}"

    def fail(self, row: int, message: str) -> TraceError:
        return TraceError(f"{self.where(row)}: {message}", path=str(self.path), line=self.line(row))


def _fail(path: Path, message: str, line: int | None = None) -> TraceError:
    where = f"{path}:{line}" if line is not None else str(path)
    return TraceError(f"{where}: {message}", path=str(path), line=line)


def _cut(text: str) -> str:
    """``text`` (a library's message, say) cut to SHOWN_CHARS characters."""
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def _quoted(text: str) -> str:
    """``repr(text)`` for a message, cut to SHOWN_CHARS characters of the text (a cell may be megabytes)."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    return f"{text[:SHOWN_CHARS]!r}... ({len(text)} characters)"


def _prelude(path: Path) -> tuple[list[str], int, str | None]:
    """Header fields, the file line of the header, and the first data line's text (None if there is none).

    Blank lines and lines starting with ``#`` before the header are skipped."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            for number, raw in enumerate(f, start=1):
                text = raw.rstrip("\r\n")
                if not text.strip() or text.lstrip().startswith("#"):
                    continue
                first = next(f, None)
                return [c.strip() for c in text.split(",")], number, (None if first is None else first.rstrip("\r\n"))
    except UnicodeDecodeError as exc:
        raise _fail(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start}); a trace is a CSV text file") from None
    raise _fail(path, "is empty; a trace starts with the header 'client,start_s,end_s' (after optional # lines)")


_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


def _read_csv(path: Path, check_header: _HeaderCheck) -> _Table:
    """Read a CSV trace table with pandas' C parser, keeping a row <-> file line correspondence."""
    header, header_line, first = _prelude(path)
    check_header(header, header_line)
    if first is not None and first.strip() and len(first.split(",")) > len(header):
        # pandas would silently take the surplus leading fields of a first row as an index
        raise _fail(
            path,
            f"{len(first.split(','))} fields; expected {len(header)} ({','.join(header)}): {_quoted(first.strip())}",
            header_line + 1,
        )
    try:
        frame = pd.read_csv(
            path,
            header=None,
            names=[*header, _EXTRA],
            skiprows=header_line,
            skip_blank_lines=False,
            keep_default_na=False,
            na_values=[""],
            encoding="utf-8",
            dtype={_EXTRA: str},
        )
    except pd.errors.ParserError as exc:
        found = _FIELDS.search(str(exc))
        if found:
            line = int(found.group(2))
            raise _fail(path, f"{found.group(3)} fields; expected {len(header)} ({','.join(header)})", line) from None
        raise _fail(path, f"cannot be read as CSV: {exc}") from None
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame({name: pd.Series([], dtype=float) for name in [*header, _EXTRA]})
    except UnicodeDecodeError as exc:
        raise _fail(path, f"is not UTF-8 text ({exc.reason}); a trace is a CSV text file") from None
    table = _Table(path, frame, header_line + 1)
    # Blank lines are kept as all-empty rows so that row numbers stay line numbers; allow them only at the end.
    empty = frame.isna().all(axis=1).to_numpy()
    if empty.any():
        tail = len(empty) - int(np.argmin(empty[::-1])) if not empty.all() else 0
        inner = np.flatnonzero(empty[:tail])
        if inner.size:
            raise table.fail(int(inner[0]), "blank line; blank lines are allowed only at the end of the file")
        table = _Table(path, frame.iloc[:tail], header_line + 1)
    extra = table.frame[_EXTRA].notna().to_numpy()
    if extra.any():
        row = int(np.argmax(extra))
        raise table.fail(row, f"more than {len(header)} fields; expected {len(header)} ({','.join(header)})")
    return table


def _require_pyarrow(path: Path, doing: str) -> None:
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        raise _fail(
            path,
            f"{doing} Parquet needs the optional package pyarrow, which is not installed: `pip install pyarrow`, "
            "or use the CSV format (NAME.csv)",
        ) from None


def _read_parquet(path: Path, check_header: _HeaderCheck) -> _Table:
    _require_pyarrow(path, "reading")
    parquet = importlib.import_module("pyarrow.parquet")  # optional: only Parquet needs it (checked just above)
    types = importlib.import_module("pyarrow.types")
    try:
        footer = parquet.read_metadata(path)
        schema = footer.schema.to_arrow_schema()
        rows = footer.num_rows
        index = {c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
    except Exception as exc:  # pyarrow raises its own error types for damaged files
        raise _fail(path, f"cannot be read as Parquet: {type(exc).__name__}: {_cut(str(exc))}") from None
    columns = [field for field in schema if field.name not in index]
    check_header([str(field.name) for field in columns], None)
    for field in columns:
        kind = field.type
        if not (types.is_integer(kind) or types.is_floating(kind) or types.is_null(kind)):
            raise _fail(path, f"column {field.name} holds {_cut(str(kind))}; a trace's columns hold numbers")
    most = max(MIN_PARQUET_ROWS, PARQUET_ROWS_PER_BYTE * path.stat().st_size)
    if rows > most:
        raise _fail(
            path,
            f"claims {rows} rows in {path.stat().st_size} bytes; a Parquet trace may have at most "
            f"{PARQUET_ROWS_PER_BYTE} rows per byte (at least {MIN_PARQUET_ROWS}), here {most}",
        )
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises its own error types for damaged files
        raise _fail(path, f"cannot be read as Parquet: {type(exc).__name__}: {_cut(str(exc))}") from None
    check_header([str(c) for c in frame.columns], None)
    frame = frame.reset_index(drop=True)
    frame[_EXTRA] = pd.Series([None] * len(frame), dtype=object)
    return _Table(path, frame, None)


def _read_table(path: Path, check_header: _HeaderCheck) -> _Table:
    return _read_parquet(path, check_header) if path.suffix == ".parquet" else _read_csv(path, check_header)


def _fmt(value: object) -> str:
    """A cell's value for a message: text quoted as written, numbers plainly (``20``, ``2.5``, ``inf``)."""
    if isinstance(value, str):
        return _quoted(value)
    x = float(value)  # type: ignore[arg-type]
    return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(x)


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True, or None."""
    return int(np.argmax(mask)) if mask.size and mask.any() else None


def _numbers(table: _Table, column: str, allowed: str, *, optional: bool = False) -> np.ndarray:
    """float64 values of ``column``; a non-numeric cell (or an empty one, unless ``optional``) is refused."""
    series = table.frame[column]
    if pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype):
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        coerced = pd.to_numeric(series, errors="coerce")
        values = coerced.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = _first(np.isnan(values) & series.notna().to_numpy())
        if bad is not None:
            raise table.fail(bad, f"{column} {_fmt(series.iloc[bad])} is not a number; expected {allowed}")
    if not optional:
        bad = _first(np.isnan(values))
        if bad is not None:
            raise table.fail(bad, f"{column} is empty; expected {allowed}")
    return values


def _client_ids(table: _Table) -> np.ndarray:
    """int64 client ids of ``table``; empty, non-integer, negative or too large ids are refused."""
    allowed = f"an integer client id in 0..{_MAX_ID}"
    series = table.frame["client"]
    if series.dtype == np.int64:
        ids = series.to_numpy()
    else:
        values = _numbers(table, "client", allowed)
        bad = _first((values != np.floor(values)) | ~np.isfinite(values) | (values >= 2.0**63))
        if bad is not None:
            raise table.fail(bad, f"client {_fmt(series.iloc[bad])} is not {allowed}")
        ids = values.astype(np.int64)
    bad = _first(ids < 0)
    if bad is not None:
        raise table.fail(bad, f"client {int(ids[bad])} is negative; expected {allowed}")
    return ids


def _check_trace_header(path: Path) -> _HeaderCheck:
    def check(fields: list[str], line: int | None) -> None:
        if tuple(fields) != TRACE_COLUMNS:
            where = "columns" if line is None else "header"
            raise _fail(
                path,
                f"{where} {_quoted(','.join(fields))}; a trace's {where} must be {','.join(TRACE_COLUMNS)!r}",
                line,
            )

    return check


def _check_sidecar_header(path: Path) -> _HeaderCheck:
    def check(fields: list[str], line: int | None) -> None:
        allowed = ", ".join(CLIENT_COLUMNS[1:])
        what = "columns" if line is None else "header"
        if not fields or fields[0] != "client":
            raise _fail(path, f"{what} {_quoted(','.join(fields))}: the first column must be 'client'", line)
        for name in fields[1:]:
            if name not in CLIENT_COLUMNS[1:]:
                raise _fail(path, f"{what}: unknown column {_quoted(name)}; allowed after 'client': {allowed}", line)
        if len(set(fields)) != len(fields):
            raise _fail(path, f"{what} {_quoted(','.join(fields))} names a column twice", line)

    return check


def _intervals(table: _Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked (client, start, end) arrays of a main trace table, in file order."""
    seconds = "a finite time in seconds >= 0"
    clients = _client_ids(table)
    starts = _numbers(table, "start_s", seconds)
    ends = _numbers(table, "end_s", seconds)
    for name, values in (("start_s", starts), ("end_s", ends)):
        bad = _first(~np.isfinite(values) | (values < 0))
        if bad is not None:
            raise table.fail(bad, f"{name} {_fmt(table.frame[name].iloc[bad])} is not {seconds}")
    bad = _first(ends <= starts)
    if bad is not None:
        raise table.fail(
            bad, f"end_s {_fmt(ends[bad])} is not after start_s {_fmt(starts[bad])}; an interval needs end_s > start_s"
        )
    # The first row breaking any ordering rule; each rule compares a row with the one above it.
    same = clients[1:] == clients[:-1]
    rules = (
        (clients[1:] < clients[:-1], "unsorted"),
        (same & (starts[1:] < starts[:-1]), "out of order"),
        (same & (starts[1:] >= starts[:-1]) & (starts[1:] < ends[:-1]), "overlap"),
        (same & (starts[1:] == ends[:-1]), "touch"),
    )
    found = [(row, kind) for mask, kind in rules if (row := _first(mask)) is not None]
    if found:
        above, kind = min(found)
        row = above + 1
        client = int(clients[row])
        this = f"[{_fmt(starts[row])}, {_fmt(ends[row])})"
        previous = f"[{_fmt(starts[above])}, {_fmt(ends[above])}) on line {table.line(above)}"
        message = {
            "unsorted": f"client {client} after client {int(clients[above])} (line {table.line(above)}); rows must "
            "be sorted by client (all of a client's intervals together), then by start_s",
            "out of order": f"client {client}: interval {this} starts before the previous one {previous}; a "
            "client's intervals must be sorted by start_s",
            "overlap": f"client {client}: interval {this} overlaps the previous one {previous}; a client's "
            "intervals must be disjoint",
            "touch": f"client {client}: interval {this} touches the previous one {previous}; write one session as "
            f"one row [{_fmt(starts[above])}, {_fmt(ends[row])})",
        }[kind]
        raise table.fail(row, message)
    return clients, starts, ends


def _apply_sidecar(
    main: _Table, table: _Table, clients: np.ndarray, offsets: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """periods, compute and bandwidth per client from a sidecar table (NaN where the sidecar is silent)."""
    n = clients.size
    ids = _client_ids(table)
    dup = _first(pd.Series(ids).duplicated().to_numpy())
    if dup is not None:
        raise table.fail(dup, f"client {int(ids[dup])} appears twice; give each client one row")
    index = np.searchsorted(clients, ids)
    found = (index < n) & (clients[np.minimum(index, n - 1)] == ids)
    bad = _first(~found)
    if bad is not None:
        raise table.fail(
            bad,
            f"unknown client {int(ids[bad])}: it has no interval in {main.path.name}; list only the trace's clients",
        )
    columns: dict[str, np.ndarray | None] = {}
    for name, allowed in (
        ("period_s", "a period in seconds > 0 (or empty: the intervals do not repeat)"),
        ("compute_ms_per_sample", "milliseconds per sample > 0 (or empty: unknown)"),
        ("bandwidth_kbps", "kbit/s > 0 (or empty: unknown)"),
    ):
        if name not in table.frame.columns:
            columns[name] = None
            continue
        values = _numbers(table, name, allowed, optional=True)
        bad = _first(~np.isnan(values) & (~np.isfinite(values) | (values <= 0)))
        if bad is not None:
            raise table.fail(bad, f"{name} {_fmt(table.frame[name].iloc[bad])} is not {allowed}")
        full = np.full(n, np.nan)
        full[index] = values
        columns[name] = full
    periods = columns["period_s"] if columns["period_s"] is not None else np.full(n, np.nan)
    owner = np.repeat(np.arange(n), np.diff(offsets))
    late = _first(ends > periods[owner])
    if late is not None:
        client = int(clients[owner[late]])
        row = int(np.flatnonzero(ids == client)[0])
        raise table.fail(
            row,
            f"client {client}: period_s {_fmt(periods[owner[late]])} is shorter than its interval ending at "
            f"{_fmt(ends[late])} ({main.where(late)}); a repeating client's intervals must end at or before its period",
        )
    return periods, columns["compute_ms_per_sample"], columns["bandwidth_kbps"]


def _check_suffix(path: Path) -> None:
    if path.suffix not in (".csv", ".parquet"):
        raise _fail(path, f"unknown trace file type {path.suffix!r}; a trace is NAME.csv or NAME.parquet")
    if path.name.endswith((".clients.csv", ".clients.parquet")):
        main = path.name.replace(".clients.", ".")
        raise _fail(path, f"is a per-client sidecar; load the trace itself ({main}), which reads its sidecar")


def load_trace(path: str | Path) -> Trace:
    """Read and check a trace (``NAME.csv`` or ``NAME.parquet``, with its sidecar if present).

    Times are trace seconds; ``period_s`` seconds; ``compute_ms_per_sample`` ms per training sample;
    ``bandwidth_kbps`` kbit/s. Raises :class:`TraceError` at the first defect (file, line, value, rule).
    """
    p = Path(path)
    _check_suffix(p)
    if not p.is_file():
        raise _fail(p, "no such trace file" if not p.exists() else "is not a file")
    table = _read_table(p, _check_trace_header(p))
    if table.frame.shape[0] == 0:
        raise _fail(p, "has a header but no intervals; a trace needs at least one 'client,start_s,end_s' row")
    clients, starts, ends = _intervals(table)
    change = np.flatnonzero(clients[1:] != clients[:-1]) + 1
    first_rows = np.concatenate([[0], change])
    ids = clients[first_rows]
    offsets = np.concatenate([first_rows, [clients.size]]).astype(np.int64)
    periods = np.full(ids.size, np.nan)
    compute: np.ndarray | None = None
    bandwidth: np.ndarray | None = None
    side = sidecar_path(p)
    if side.is_file():
        side_table = _read_table(side, _check_sidecar_header(side))
        periods, compute, bandwidth = _apply_sidecar(table, side_table, ids, offsets, ends)
    return Trace(
        clients=ids.astype(np.int64),
        offsets=offsets,
        starts=starts,
        ends=ends,
        periods=periods,
        compute_ms_per_sample=compute,
        bandwidth_kbps=bandwidth,
        source=str(p),
    )


# ---------------------------------------------------------------------------------------------------- checks


def _data_start(source: str) -> tuple[Path, int | None] | None:
    """(file, line of the first data row) of a CSV trace that a Trace was loaded from; line None for Parquet."""
    p = Path(source)
    if p.suffix not in (".csv", ".parquet") or not p.is_file():
        return None
    if p.suffix == ".parquet":
        return p, None
    try:
        _, header_line, _ = _prelude(p)
    except TraceError:
        return None
    return p, header_line + 1


def check_clients(trace: Trace, population: int, where: str) -> None:
    """Refuse a trace that names a client outside the population (ids 0..population-1).

    ``where`` says where the population was set (e.g. ``"scenario.yaml:4"``). The error names the trace
    file and the line of the first interval of the first such client (rows are sorted by client)."""
    k = int(np.searchsorted(trace.clients, population))
    if k >= trace.size:
        return
    client = int(trace.clients[k])
    row = int(trace.offsets[k])
    message = (
        f"unknown client {client}: the population is {population} ({where}), so trace client ids must be "
        f"0..{population - 1}; raise the population or drop the trace's clients >= {population}"
    )
    located = _data_start(trace.source)
    if located is None:
        raise TraceError(f"{trace.source}: {message}", path=trace.source)
    p, first = located
    if first is None:
        raise TraceError(f"{p}: row {row + 1}: {message}", path=str(p), line=row + 1)
    raise TraceError(f"{p}:{first + row}: {message}", path=str(p), line=first + row)


# ---------------------------------------------------------------------------------------------------- writing


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _number_column(values: np.ndarray) -> np.ndarray | pd.Series:
    """Whole numbers as integers (shorter files, faster writes; NaN stays an empty cell); other values in
    Python's shortest round-trip form."""
    known = values[~np.isnan(values)]
    if known.size and np.all(known == np.floor(known)) and float(np.max(np.abs(known))) < 2.0**53:
        if known.size == values.size:
            return values.astype(np.int64)
        return pd.Series(values).astype("Int64")
    return values


def _write_table(frame: pd.DataFrame, path: Path, comments: Sequence[str]) -> None:
    with _atomic(path) as tmp:
        if path.suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
            return
        with tmp.open("w", encoding="utf-8", newline="") as f:
            for line in comments:
                f.write(f"# {line}\n" if not line.startswith("#") else f"{line}\n")
            frame.to_csv(f, index=False, lineterminator="\n", na_rep="")


def write_trace(trace: Trace, path: str | Path, comments: Sequence[str] = ()) -> list[Path]:
    """Write ``trace`` to ``NAME.csv`` (or ``NAME.parquet``), atomically; returns the files written.

    The sidecar ``NAME.clients.csv`` is written only for clients with a period or a capacity (and a stale
    sidecar from an earlier trace of that name is removed). ``comments`` become ``#`` lines after
    :data:`MAGIC` (CSV only). Times that are whole seconds are written as integers, others in Python's
    shortest round-trip form, so ``load_trace(write_trace(t))`` reproduces ``t`` exactly.
    """
    p = Path(path)
    _check_suffix(p)
    if p.suffix == ".parquet":
        _require_pyarrow(p, "writing")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(p, f"cannot create the folder {p.parent}: {exc.strerror}") from None
    owner = trace.owner()
    main = pd.DataFrame(
        {
            "client": trace.clients[owner].astype(np.int64),
            "start_s": _number_column(np.asarray(trace.starts, dtype=np.float64)),
            "end_s": _number_column(np.asarray(trace.ends, dtype=np.float64)),
        }
    )
    side_columns: dict[str, np.ndarray] = {}
    for name, values in (
        ("period_s", trace.periods),
        ("compute_ms_per_sample", trace.compute_ms_per_sample),
        ("bandwidth_kbps", trace.bandwidth_kbps),
    ):
        if values is not None and not np.all(np.isnan(values)):
            side_columns[name] = np.asarray(values, dtype=np.float64)
    side = sidecar_path(p)
    written = []
    if side_columns:
        known = np.zeros(trace.size, dtype=bool)
        for values in side_columns.values():
            known |= ~np.isnan(values)
        frame = pd.DataFrame({"client": trace.clients[known].astype(np.int64)})
        for name, values in side_columns.items():
            frame[name] = _number_column(values[known])
        _write_table(frame, side, [SIDECAR_MAGIC, f"per-client columns of {p.name}"])
        written.append(side)
    else:
        with contextlib.suppress(FileNotFoundError):
            side.unlink()
    _write_table(main, p, [MAGIC, *comments])
    return [p, *written]
