"""Scenario documents: YAML text to plain data, remembering where each key came from.

A scenario is read twice from the same text: ``yaml.safe_load`` gives the plain data (only mappings,
lists, strings, numbers, booleans and null: no Python objects are ever constructed), and ``yaml.compose``
gives the node tree whose marks tell, for every key path, the file and line it was written on. Errors
name that origin. Keys given on the command line (``--set``) or by a sweep carry their own origin.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.scenario.errors import Problem, ScenarioError

KeyPath = tuple[str | int, ...]


def format_path(path: KeyPath) -> str:
    """``('dropout', 'rate')`` -> ``dropout.rate``; list indices as ``[i]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + part
    return text or "(top level)"


@dataclass
class Document:
    """Plain scenario data and the origin (``file:line`` or a command-line option) of each key path."""

    data: dict[str, Any]
    origins: dict[KeyPath, str] = field(default_factory=dict)
    name: str = "<scenario>"
    """The file the document was read from, for messages about keys without a recorded origin."""

    def origin(self, path: KeyPath) -> str:
        """Where ``path`` (or its nearest recorded parent) was written."""
        for end in range(len(path), 0, -1):
            found = self.origins.get(path[:end])
            if found is not None:
                return found
        return self.name

    def copy(self) -> Document:
        return Document(copy.deepcopy(self.data), dict(self.origins), self.name)

    def set(self, path: KeyPath, value: Any, origin: str) -> None:
        """Set ``path`` to ``value``, creating missing mappings on the way; record ``origin``."""
        node: Any = self.data
        for depth, part in enumerate(path[:-1]):
            child = node.get(part) if isinstance(node, dict) else None
            if child is None:
                child = {}
                node[part] = child
                self.origins[path[: depth + 1]] = origin
            elif not isinstance(child, dict):
                raise ScenarioError(
                    [
                        Problem(
                            origin,
                            format_path(path[: depth + 1]),
                            f"is {child!r}, not a mapping, so it has no key {path[depth + 1]!r}",
                        )
                    ]
                )
            node = child
        node[path[-1]] = value
        stale = [p for p in self.origins if p[: len(path)] == path]
        for p in stale:
            del self.origins[p]
        self.origins[path] = origin


def parse_text(text: str, name: str) -> Document:
    """Parse YAML ``text`` (from file ``name``) into a :class:`Document`."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem(where, "(file)", f"is not valid YAML: {problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(
            [Problem(name, "(file)", f"must be a mapping of keys to values, not a {type(data).__name__}")]
        )
    origins: dict[KeyPath, str] = {}
    problems: list[Problem] = []
    if root is not None:
        _walk(root, (), name, origins, problems)
    if problems:
        raise ScenarioError(problems)
    return Document(data, origins, name)


def load_file(path: str | Path) -> Document:
    """Read a scenario file; a missing or unreadable file is a :class:`ScenarioError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError([Problem(str(p), "(file)", f"cannot be read: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise ScenarioError([Problem(str(p), "(file)", "is not UTF-8 text")]) from None
    return parse_text(text, str(p))


def _walk(node: yaml.Node, path: KeyPath, name: str, origins: dict[KeyPath, str], problems: list[Problem]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(
                        f"{name}:{line}",
                        format_path((*path, key)),
                        f"is given twice (first on line {seen[key]}); keep one",
                    )
                )
            seen[key] = line
            origins[(*path, key)] = f"{name}:{line}"
            _walk(value_node, (*path, key), name, origins, problems)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            origins[(*path, index)] = f"{name}:{item.start_mark.line + 1}"
            _walk(item, (*path, index), name, origins, problems)


def as_plain(value: Any) -> Any:
    """Deep copy of plain data with tuples turned into lists (for YAML/JSON dumps)."""
    if isinstance(value, Mapping):
        return {k: as_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_plain(v) for v in value]
    return value
