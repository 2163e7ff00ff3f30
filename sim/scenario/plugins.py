"""The plug-ins a scenario names (:mod:`sim.plugins`): its model factory, data loader, dropout model and privacy
strategy, where each was named, and where each came from (for the run's manifest)."""

from __future__ import annotations

from sim.dp.strategies import STRATEGIES
from sim.plugins import PluginRef, resolve
from sim.scenario.types import Scenario


def named_plugins(scenario: Scenario) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(kind, name, key path)`` of each plug-in ``scenario`` names."""
    sc = scenario
    found: list[tuple[str, str, tuple[str, ...]]] = []
    if sc.model.factory is not None:
        found.append(("model", sc.model.factory, ("model", "factory" if "factory" in _keys(sc, "model") else "name")))
    if sc.data.loader is not None:
        found.append(("dataset", sc.data.loader, ("data", "loader" if "loader" in _keys(sc, "data") else "dataset")))
    if sc.dropout.model is not None:
        found.append(("dropout", sc.dropout.model, ("dropout", "model" if "model" in _keys(sc, "dropout") else "mode")))
    if sc.privacy.strategy not in STRATEGIES:
        found.append(("strategy", sc.privacy.strategy, ("privacy", "strategy")))
    return found


def _keys(scenario: Scenario, section: str) -> dict[str, object]:
    value = scenario.resolved.get(section, {})
    return value if isinstance(value, dict) else {}


def plugin_refs(scenario: Scenario) -> list[PluginRef]:
    """Where each plug-in of ``scenario`` came from: its import path and its distribution's version."""
    return [
        resolve(kind, name, f"{scenario.origin(*key)}: {'.'.join(key)}")[1]
        for kind, name, key in named_plugins(scenario)
    ]
