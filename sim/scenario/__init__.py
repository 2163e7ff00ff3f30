"""Scenario files: YAML documents, checked into frozen :class:`Scenario` objects, with sweeps.

``load(path, overrides, output)`` reads a file, applies ``--set`` overrides and ``--output``, and returns
its :class:`Grid`: ``grid.base()`` is the scenario as written, ``grid.points()`` every run of its sweep.
Every problem is raised together as one :class:`ScenarioError` naming file:line, key, value and what is
allowed. The keys are documented in ``docs/scenarios.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.source import load_file
from sim.scenario.types import Scenario

if TYPE_CHECKING:
    from sim.scenario.grid import Grid

__all__ = ["Grid", "Problem", "Scenario", "ScenarioError", "load"]


def load(path: str | Path, overrides: list[str] | None = None, output: str | None = None) -> Grid:
    """Read a scenario file with command-line overrides applied."""
    # deferred: the parser loads the protocol stack and cryptography; the scenario types must stay light
    from sim.scenario.grid import Grid, apply_overrides

    doc = apply_overrides(load_file(path), list(overrides or []))
    if output is not None:
        doc.set(("output",), output, "--output")
    return Grid.from_document(doc)


def __getattr__(name: str) -> Any:
    """``Grid``, imported on first use (so that importing :mod:`sim.scenario.types` stays light)."""
    if name == "Grid":
        from sim.scenario.grid import Grid  # deferred: as in load (the parser loads cryptography)

        return Grid
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
