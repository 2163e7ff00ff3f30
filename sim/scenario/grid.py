"""Command-line overrides and sweep grids, applied to a scenario document before it is checked.

``--set key.path=value`` replaces one key (the value is read as YAML, so ``0.3``, ``[1, 2]`` and
``{rate: 0.1}`` all work). A ``sweep:`` mapping of key paths to lists of values defines the grid of runs
as the Cartesian product of its lists, in the order written, the last key varying fastest (like nested
loops). Each grid point is the base document with those keys set, checked like any scenario, and named
by its values: ``dropout.rate=0.1_seed=2``.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.parser import parse
from sim.scenario.reader import shown
from sim.scenario.source import Document, KeyPath, load_yaml
from sim.scenario.types import Scenario

_NOT_SWEEPABLE = {"sweep", "name", "output"}
MAX_POINTS = 100_000
"""Most points a sweep may have (its lists' lengths multiplied): a few aliased lists could ask for billions."""
_SAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """``'dropout.rate=0.3'`` -> ``(('dropout', 'rate'), 0.3)``; ``sweep.<key path>`` keeps the rest whole."""
    origin = option(text)
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(
            [Problem(origin, key or "(empty)", "must be written KEY.PATH=VALUE, e.g. dropout.rate=0.3")]
        )
    parts = key.split(".")
    path: KeyPath = ("sweep", ".".join(parts[1:])) if parts[0] == "sweep" and len(parts) > 1 else tuple(parts)
    if any(not p for p in path):
        raise ScenarioError([Problem(origin, key, "has an empty part; write key paths like dropout.rate")])
    if not value_text.strip():
        raise ScenarioError([Problem(origin, key, "has no value; write KEY.PATH=VALUE (null for the default)")])
    try:
        return path, load_yaml(value_text, origin)  # the scenario reader's bounded YAML
    except ScenarioError as exc:
        problems = [Problem(origin, key, f"value {shown(value_text)} {p.message}") for p in exc.problems]
        raise ScenarioError(problems) from None


def option(text: str) -> str:
    """The origin of a ``--set`` override, cut to 80 characters (its value may be of any length)."""
    return f"--set {text if len(text) <= 80 else text[:77] + '...'}"


def apply_overrides(doc: Document, overrides: list[str]) -> Document:
    """A copy of ``doc`` with each ``KEY.PATH=VALUE`` applied in order."""
    out = doc.copy()
    for text in overrides:
        path, value = parse_override(text)
        out.set(path, value, option(text))
    return out


@dataclass(frozen=True)
class Grid:
    """A scenario document and its sweep (``{}`` when it has none)."""

    document: Document
    """The scenario without its ``sweep`` key."""
    sweep: dict[str, list[Any]]

    @classmethod
    def from_document(cls, doc: Document) -> Grid:
        base = doc.copy()
        raw = base.data.pop("sweep", None)
        if raw is None:
            return cls(base, {})
        origin = doc.origin(("sweep",))
        if not isinstance(raw, dict) or not raw:
            raise ScenarioError(
                [
                    Problem(
                        origin,
                        "sweep",
                        f"is {shown(raw)}; a mapping of key paths to lists of values is expected, "
                        "e.g. {dropout.rate: [0, 0.2], seed: [1, 2]}",
                    )
                ]
            )
        problems = []
        for key, values in raw.items():
            where = doc.origin(("sweep", key))
            if not isinstance(key, str) or not key:
                problems.append(Problem(where, f"sweep.{shown(key)}", "is not a key path like dropout.rate"))
            elif key.split(".")[0] in _NOT_SWEEPABLE:
                problems.append(
                    Problem(
                        where,
                        f"sweep.{key}",
                        f"cannot be swept ({', '.join(sorted(_NOT_SWEEPABLE))} are fixed per file)",
                    )
                )
            if not isinstance(values, list) or not values:
                problems.append(
                    Problem(where, f"sweep.{key}", f"is {shown(values)}; a non-empty list of values is expected")
                )
        if problems:
            raise ScenarioError(problems)
        size = 1
        for values in raw.values():
            size *= len(values)
            if size > MAX_POINTS:  # before the product grows any further
                raise ScenarioError(
                    [Problem(origin, "sweep", f"has more than {MAX_POINTS} points; split it into several files")]
                )
        return cls(base, {str(k): list(v) for k, v in raw.items()})

    @property
    def size(self) -> int:
        n = 1
        for values in self.sweep.values():
            n *= len(values)
        return n

    def base(self) -> Scenario:
        """The scenario as written, without sweep values."""
        scenario = parse(self.document)
        return replace(scenario, run_id=scenario.name)

    def points(self) -> list[Scenario]:
        """Every run of the grid, checked; problems of all points are reported together."""
        if not self.sweep:
            return [self.base()]
        keys = list(self.sweep)
        scenarios: list[Scenario] = []
        problems: list[Problem] = []
        used: set[str] = set()
        for combo in itertools.product(*(self.sweep[k] for k in keys)):
            values = dict(zip(keys, combo, strict=True))
            doc = self.document.copy()
            label = run_label(values)
            try:
                for key, value in values.items():
                    doc.set(tuple(key.split(".")), value, f"{self.document.origin(('sweep', key))} (sweep {label})")
                scenario = parse(doc)
            except ScenarioError as exc:
                problems.extend(exc.problems)
                continue
            run_id = label
            n = 2
            while run_id in used:
                run_id = f"{label}_{n}"
                n += 1
            used.add(run_id)
            scenarios.append(replace(scenario, swept=values, run_id=run_id))
        if problems:
            raise ScenarioError(_unique(problems))
        return scenarios


def run_label(values: dict[str, Any]) -> str:
    """File-system-safe name of a grid point: ``key=value`` joined by ``_``."""
    parts = []
    for key, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
        parts.append(f"{key}={text}")
    return _SAFE.sub("-", "_".join(parts))[:180]


def _unique(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            out.append(p)
    return out
