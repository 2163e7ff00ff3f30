"""Reading result folders back: a run folder, or a sweep folder holding many runs.

A run folder has ``manifest.json`` and the tables; rows of rounds beyond the manifest's
``rounds_completed`` (a run killed between writing a table and committing the round) are dropped. A
complete run's table is checked against the digest its manifest records, and refused if it changed
(:mod:`sim.results.integrity`). A sweep
folder has ``sweep.json``, ``runs.csv`` and ``runs/<run_id>/``; its combined tables are the
concatenation of its runs' tables in sweep order.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd

from sim.results.integrity import check_table
from sim.results.writer import MANIFEST, ResultsError

SWEEP = "sweep.json"


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read ({exc.strerror}); is {directory} a dropsim run folder?") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{path}: not a dropsim manifest")
    return doc


def read_run_table(directory: Path, table: str = "rounds") -> pd.DataFrame:
    """One table of one run, cut to the rounds its manifest committed; a complete run's table only as its run
    wrote it (:class:`~sim.results.integrity.ChangedTableError` otherwise)."""
    manifest = read_manifest(directory)
    path = directory / f"{table}.csv"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read: {exc}") from None
    check_table(path, data, manifest)
    try:
        frame = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""])
    except pd.errors.ParserError as exc:
        raise ResultsError(f"{path}: cannot be read: {exc}") from None
    done = int(manifest.get("rounds_completed", 0))
    if "round" in frame.columns:
        frame = frame[frame["round"] <= done]
    return frame.reset_index(drop=True)


def run_dirs(path: Path) -> list[Path]:
    """The run folders under ``path``: itself for a run, its runs (in sweep order) for a sweep."""
    if (path / SWEEP).is_file():
        doc = json.loads((path / SWEEP).read_text(encoding="utf-8"))
        return [path / "runs" / rid for rid in doc.get("run_ids", []) if (path / "runs" / rid / MANIFEST).is_file()]
    if (path / MANIFEST).is_file():
        return [path]
    if not path.exists():
        raise ResultsError(f"{path}: does not exist")
    raise ResultsError(f"{path}: neither a run folder (no {MANIFEST}) nor a sweep folder (no {SWEEP})")
