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


def plugin_records(scenario: Scenario) -> list[dict[str, str | None]]:
    """What a run's manifest records of the plug-ins of ``scenario`` (:meth:`sim.plugins.PluginRef.record`)."""
    return [ref.record() for ref in plugin_refs(scenario)]


def plugin_refs(scenario: Scenario) -> list[PluginRef]:
    """Where each plug-in of ``scenario`` came from: its import path and its distribution's version."""
    return [
        resolve(kind, name, f"{scenario.origin(*key)}: {'.'.join(key)}")[1]
        for kind, name, key in named_plugins(scenario)
    ]


def written_plugins(document: object) -> list[str]:
    """``key: value`` of each plug-in a scenario document (a mapping, not yet parsed) names, found without
    importing anything: for a process that must decide whether to run a scenario's code before reading it (a
    deployment's worker: :mod:`sim.deploy.worker`)."""
    from sim.scenario.dropout_modes import MODES
    from sim.scenario.types import DATASETS, MODELS

    data = document if isinstance(document, dict) else {}
    built_in = {
        ("model", "name"): MODELS,
        ("data", "dataset"): DATASETS,
        ("dropout", "mode"): tuple(MODES),
        ("privacy", "strategy"): tuple(STRATEGIES),
    }
    found = []
    for (section, key), names in built_in.items():
        value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        if value is not None and value not in names:
            found.append(f"{section}.{key}: {value!r}")
    for section, key in (("model", "factory"), ("data", "loader"), ("dropout", "model")):
        value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        if value is not None:
            found.append(f"{section}.{key}: {value!r}")
    return found
