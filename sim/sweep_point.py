"""One point of a sweep, run into its folder, and its status: the worker side that :mod:`sim.sweeps` (local
worker processes) and :mod:`sim.cluster` (Dask workers) share, so neither imports the other for it."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

from sim.runner import RunSummary, run_scenario
from sim.scenario.types import Scenario


@dataclass
class RunStatus:
    run_id: str
    status: str
    error: str = ""
    summary: RunSummary | None = None


def run_point(scenario: Scenario, directory: str) -> RunStatus:
    """Worker: one grid point (exceptions become a ``failed`` status; the run folder keeps details)."""
    try:
        summary = run_scenario(scenario, Path(directory), progress=False)
    except Exception as exc:
        (Path(directory) / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return RunStatus(scenario.run_id, "failed", f"{type(exc).__name__}: {exc}")
    return RunStatus(scenario.run_id, "complete", summary=summary)
