"""Scenario files: YAML documents, checked into frozen :class:`Scenario` objects, with sweeps.

``load(path, overrides, output)`` reads a file, applies ``--set`` overrides and ``--output``, and returns
its :class:`Grid`: ``grid.base()`` is the scenario as written, ``grid.points()`` every run of its sweep.
Every problem is raised together as one :class:`ScenarioError` naming file:line, key, value and what is
allowed. The keys are documented in ``docs/scenarios.md``.
"""

from __future__ import annotations

from pathlib import Path

from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.grid import Grid, apply_overrides
from sim.scenario.schema import Scenario
from sim.scenario.source import load_file

__all__ = ["Grid", "Problem", "Scenario", "ScenarioError", "load"]


def load(path: str | Path, overrides: list[str] | None = None, output: str | None = None) -> Grid:
    """Read a scenario file with command-line overrides applied."""
    doc = apply_overrides(load_file(path), list(overrides or []))
    if output is not None:
        doc.set(("output",), output, "--output")
    return Grid.from_document(doc)
