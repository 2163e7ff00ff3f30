"""The catalog of paper reproductions: ``scenarios/paper/reproductions.yaml`` read and checked.

Each item names the scenario files it runs (relative to the catalog), how its numbers are measured
(:data:`MEASURES`), the ``--set`` overrides of its reduced form, the run times of both forms, and the paper's
numbers to compare with. A paper value is attached to every measured row whose quantity and setting match
its patterns (shell-style: ``*`` and ``?``), so one line can stand for "6 at every dropout rate".
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.scenario.errors import ScenarioError
from sim.scenario.source import load_yaml

MEASURES = ("privacy", "baek", "accuracy", "pipeline", "footprint", "trace")
"""How an item's numbers are measured (``sim.paper.measures``)."""
DEFAULT_SHOW = {
    "privacy": ("epsilon*", "rounds completed"),
    "baek": (),
    "accuracy": ("final accuracy", "rounds completed", "accuracy, *"),
    "pipeline": ("speedup", "chunks", "XNoise* overhead, plain"),
    "footprint": (),
    "trace": ("*",),
}
"""Quantities the markdown table shows even where the paper gives no number (others are in the CSV)."""
CATALOG = Path("scenarios/paper/reproductions.yaml")
"""The catalog shipped with dropsim, relative to the repository root."""


class CatalogError(InputError):
    """A catalog that cannot be used; the message names the file, the item and the key."""


@dataclass(frozen=True)
class PaperValue:
    """One number (or bound, or range) as the paper prints it, and the rows it applies to."""

    quantity: str
    setting: str
    value: str

    def matches(self, quantity: str, setting: str) -> bool:
        return fnmatch.fnmatchcase(quantity, self.quantity) and fnmatch.fnmatchcase(setting, self.setting)


@dataclass(frozen=True)
class Item:
    """One reproduction: a figure or table of a paper."""

    name: str
    source: str
    scenarios: tuple[Path, ...]
    measure: str
    reduced: dict[str, Any]
    time_full: str
    time_reduced: str
    paper: tuple[PaperValue, ...]
    simulate: bool = True
    """Whether the full form runs the scenarios (``False``: the numbers are computed without a run)."""
    params: dict[str, Any] = field(default_factory=dict)
    show: tuple[str, ...] = ()
    """Quantity patterns shown in the markdown even without a paper value."""

    def shows(self, quantity: str) -> bool:
        return any(fnmatch.fnmatchcase(quantity, pattern) for pattern in self.show)

    def overrides(self, reduced: bool) -> list[str]:
        """``--set`` strings of the form asked for (none for the full form)."""
        if not reduced:
            return []
        return [f"{key}={json.dumps(value)}" for key, value in self.reduced.items()]  # JSON is YAML

    def paper_value(self, quantity: str, setting: str) -> str:
        """The paper's value for a measured row ("" when the paper gives none); the first match wins."""
        for value in self.paper:
            if value.matches(quantity, setting):
                return value.value
        return ""


def _need(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise CatalogError(f"{where}: missing key {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise CatalogError(f"{where}.{key}: is {value!r}; expected a {kind.__name__}")
    return value


def _item(name: str, doc: Any, folder: Path, where: str) -> Item:
    if not isinstance(doc, dict):
        raise CatalogError(f"{where}: must be a mapping of keys, got {doc!r}")
    known = {"source", "scenarios", "measure", "reduced", "time", "paper", "simulate", "params", "show"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise CatalogError(f"{where}: unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
    measure = _need(doc, "measure", str, where)
    if measure not in MEASURES:
        raise CatalogError(f"{where}.measure: is {measure!r}; allowed: {', '.join(MEASURES)}")
    files = _need(doc, "scenarios", list, where)
    if not files or not all(isinstance(f, str) for f in files):
        raise CatalogError(f"{where}.scenarios: must list scenario files, got {files!r}")
    scenarios = tuple(folder / f for f in files)
    for path in scenarios:
        if not path.is_file():
            raise CatalogError(f"{where}.scenarios: {path} does not exist")
    times = _need(doc, "time", dict, where)
    paper = []
    for i, entry in enumerate(_need(doc, "paper", list, where)):
        at = f"{where}.paper[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"quantity", "setting", "value"}:
            raise CatalogError(f"{at}: must be {{quantity, setting, value}}, got {entry!r}")
        paper.append(PaperValue(str(entry["quantity"]), str(entry["setting"]), str(entry["value"])))
    show = doc.get("show", list(DEFAULT_SHOW[measure]))
    if not isinstance(show, list) or not all(isinstance(q, str) for q in show):
        raise CatalogError(f"{where}.show: must list quantity patterns, got {show!r}")
    simulate = doc.get("simulate", True)
    if not isinstance(simulate, bool):
        raise CatalogError(f"{where}.simulate: is {simulate!r}; expected true or false")
    return Item(
        name=name,
        source=_need(doc, "source", str, where),
        scenarios=scenarios,
        measure=measure,
        reduced=dict(_need(doc, "reduced", dict, where)),
        time_full=str(times.get("full", "?")),
        time_reduced=str(times.get("reduced", "?")),
        paper=tuple(paper),
        simulate=simulate,
        params=dict(doc.get("params") or {}),
        show=tuple(show),
    )


def load_catalog(path: str | Path = CATALOG) -> dict[str, Item]:
    """The items of the catalog at ``path``, in file order."""
    p = Path(path)
    try:
        doc = load_yaml(p.read_text(encoding="utf-8"), str(p))  # the scenario reader's bounded YAML
    except OSError as exc:
        raise CatalogError(f"{p}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise CatalogError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ScenarioError as exc:
        raise CatalogError(str(exc)) from None
    if not isinstance(doc, dict) or not doc:
        raise CatalogError(f"{p}: must map item names to their descriptions")
    return {str(name): _item(str(name), body, p.parent, f"{p}: {name}") for name, body in doc.items()}


def select(items: dict[str, Item], names: list[str]) -> list[Item]:
    """The items named (all when ``names`` is empty); an unknown name is an error listing the known ones."""
    if not names:
        return list(items.values())
    unknown = [n for n in names if n not in items]
    if unknown:
        raise CatalogError(f"unknown reproduction {', '.join(unknown)}; known: {', '.join(items)}")
    return [items[n] for n in names]
