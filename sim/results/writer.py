"""Writing a run's results as rounds complete, so an interrupted run keeps what it finished.

Layout of a run folder: ``rounds.csv``, ``clients.csv``, ``stages.csv`` and ``manifest.json``. Each table
is created with its header, then every finished round's rows are appended with a single ``write`` per
table, clients and stages first and rounds last; only after that does the manifest (replaced atomically
through a temporary file and ``os.replace``) count the round in ``rounds_completed``. The manifest is the
commit record: a reader keeps the rows of rounds up to ``rounds_completed`` and ignores anything a kill
left beyond it. Floats are written in Python's shortest round-trip form, so tables are exact and
byte-identical across runs of the same scenario and seed; a missing value is an empty cell.

When the run completes, the manifest also records the SHA-256 of every table in the folder (``*.csv``: these
three and any a driver wrote beside them, such as a deployment's ``operations.csv``) under ``tables_sha256``,
computed once over the final bytes; :mod:`sim.results.integrity` checks them when the run is read back.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.results.tables import TABLES

MANIFEST = "manifest.json"
DIGESTS = "tables_sha256"
"""The manifest's key for a complete run's tables: ``{file name: SHA-256 as 64 hex digits}``."""


class ResultsError(InputError):
    """A folder that cannot hold, or holds no readable, dropsim results."""


def make_folder(directory: Path) -> None:
    """Create ``directory`` (and parents) for results; a path that cannot hold them is bad input."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ResultsError(f"{directory}: is a file, not a folder; choose another output folder") from None
    except OSError as exc:
        raise ResultsError(f"{directory}: cannot create the results folder: {exc.strerror}") from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def table_digests(directory: Path) -> dict[str, str]:
    """The SHA-256 of every table (``*.csv``, not a hidden temporary file) in ``directory``, by file name."""
    return {p.name: sha256(p.read_bytes()) for p in sorted(directory.glob("*.csv")) if not p.name.startswith(".")}


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once (temporary file in the same folder, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_json(path: Path, doc: Any) -> None:
    write_atomic(path, (json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n").encode())


def mark_interrupted(directory: Path) -> None:
    """Close as ``interrupted`` the manifest of a run whose process was stopped before it could (its status
    still ``running``); its committed rounds stay as they are. A folder without a readable manifest is left
    alone."""
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(doc, dict) and doc.get("status") == "running":
        doc["status"] = "interrupted"
        write_json(path, doc)


def cell(value: Any) -> Any:
    """A value as a CSV cell: NaN and None empty, floats in shortest round-trip form."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else repr(value)
    return value


def csv_bytes(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], header: bool = False) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if header:
        writer.writerow(columns)
    for row in rows:
        writer.writerow([cell(row.get(c)) for c in columns])
    return buf.getvalue().encode()


class RunWriter:
    """Appends one run's rows round by round and keeps its manifest current."""

    def __init__(
        self,
        directory: Path,
        manifest: dict[str, Any],
        extra_columns: Sequence[str] = (),
        round_columns: Sequence[str] = (),
    ) -> None:
        self.directory = directory
        make_folder(directory)
        self.columns = {name: (*cols, *extra_columns) for name, cols in TABLES.items()}
        self.columns["rounds"] = (*TABLES["rounds"], *round_columns, *extra_columns)
        self.manifest = dict(manifest)
        self.manifest.update(status="running", rounds_completed=0)
        write_json(directory / MANIFEST, self.manifest)
        self._files = {}
        for name, cols in self.columns.items():
            path = directory / f"{name}.csv"
            write_atomic(path, csv_bytes([], cols, header=True))
            self._files[name] = path.open("ab", buffering=0)

    def append(self, rows: Mapping[str, list[dict[str, Any]]]) -> None:
        """Add one finished round's rows and commit it in the manifest."""
        for name in ("clients", "stages", "rounds"):
            self._files[name].write(csv_bytes(rows.get(name, []), self.columns[name]))
        self.manifest["rounds_completed"] += 1
        write_json(self.directory / MANIFEST, self.manifest)

    def close(self, status: str, **fields: Any) -> None:
        """Close the tables and record the run's final status (``complete``, with the tables' digests;
        ``interrupted``; ``failed``)."""
        for f in self._files.values():
            os.fsync(f.fileno())
            f.close()
        self._files.clear()
        if status == "complete":
            fields[DIGESTS] = table_digests(self.directory)
        self.manifest.update(status=status, **fields)
        write_json(self.directory / MANIFEST, self.manifest)
