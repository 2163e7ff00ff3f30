"""The plug-ins a scenario names (:mod:`sim.plugins`): its model factory, data loader, dropout model and privacy
strategy, where each was named, and where each came from (for the run's manifest)."""

from __future__ import annotations

from sim.dp.strategies import STRATEGIES
from sim.plugins import PluginRef, resolve
from sim.scenario.dropout_modes import MODES
from sim.scenario.types import DATASETS, MODELS, Scenario

_WRITTEN = {
    "model": ("model", "factory", "name"),
    "dataset": ("data", "loader", "dataset"),
    "dropout": ("dropout", "model", "mode"),
}
"""Kind -> the section, its plug-in key, and the built-in key that may hold an installed plug-in's name."""


def written_key(scenario: Scenario, kind: str) -> tuple[str, str]:
    """The key path the scenario's ``kind`` of plug-in was written under (``model.factory`` or ``model.name``,
    ``data.loader`` or ``data.dataset``, ``dropout.model`` or ``dropout.mode``)."""
    section, own, built_in = _WRITTEN[kind]
    written = scenario.resolved.get(section, {})
    return section, own if isinstance(written, dict) and own in written else built_in


def named_plugins(scenario: Scenario) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(kind, name, key path)`` of each plug-in ``scenario`` names."""
    sc = scenario
    found: list[tuple[str, str, tuple[str, ...]]] = []
    for kind, name in (("model", sc.model.factory), ("dataset", sc.data.loader), ("dropout", sc.dropout.model)):
        if name is not None:
            found.append((kind, name, written_key(sc, kind)))
    if sc.privacy.strategy not in STRATEGIES:
        found.append(("strategy", sc.privacy.strategy, ("privacy", "strategy")))
    return found


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
