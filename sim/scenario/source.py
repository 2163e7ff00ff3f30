"""Scenario documents: YAML text to plain data, remembering where each key came from.

A scenario is read twice from the same text: ``yaml.safe_load`` gives the plain data (only mappings,
lists, strings, numbers, booleans and null: no Python objects are ever constructed), and ``yaml.compose``
gives the node tree whose marks tell, for every key path, the file and line it was written on. Errors
name that origin. Keys given on the command line (``--set``) or by a sweep carry their own origin.

Before either, the text's event stream (PyYAML's parser is iterative) is checked for what would make the
recursive composer, the key-path walk or a later deep copy fail or blow up: lists and mappings nested
deeper than :data:`MAX_DEPTH`, an alias inside the node it names (a document that contains itself), and
aliases that expand to more than :data:`MAX_VALUES` values ("billion laughs"). Each is a
:class:`ScenarioError` naming the line.
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

MAX_DEPTH = 50
"""Deepest nesting of lists and mappings a scenario document may have (the shipped ones nest 4 deep)."""
MAX_VALUES = 100_000
"""Most values (scalars, lists and mappings) a document may hold once its aliases are expanded."""


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
        _check_shape(text, name)
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem(where, "(file)", f"is not valid YAML: {problem}")]) from None
    except ValueError as exc:  # a value YAML cannot construct, e.g. an integer of more than 4300 digits
        raise ScenarioError([Problem(name, "(file)", f"holds a value that cannot be read: {exc}")]) from None
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


def _check_shape(text: str, name: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, self-containing aliases and more than MAX_VALUES expanded values.

    Reads only the event stream, tracking for each open list or mapping its anchor and its expanded size
    (an alias counts the size of the node it names); raises :class:`ScenarioError`, or lets the parser's
    ``yaml.YAMLError`` through."""
    expanded: dict[str, int] = {}
    open_nodes: list[tuple[str | None, list[int]]] = []  # (anchor, [expanded size so far])
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        problem = ""
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_nodes) >= MAX_DEPTH:
                problem = f"nests lists and mappings more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH} are allowed"
            open_nodes.append((event.anchor, [1]))
            size = 0
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, (size,) = open_nodes.pop()
            if anchor is not None:
                expanded[anchor] = size
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor is not None:
                expanded[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if any(event.anchor == anchor for anchor, _ in open_nodes):
                problem = (
                    f"alias *{event.anchor} is inside the node &{event.anchor} it names; a document cannot hold itself"
                )
            size = expanded.get(str(event.anchor), 1)
        else:
            continue  # stream and document boundaries
        if size > MAX_VALUES:
            problem = f"expands to more than {MAX_VALUES} values through its aliases; at most {MAX_VALUES} are allowed"
        if problem:
            line = event.start_mark.line + 1 if event.start_mark is not None else 1
            raise ScenarioError([Problem(f"{name}:{line}", "(file)", problem)])
        if open_nodes and not isinstance(event, yaml.CollectionStartEvent):
            open_nodes[-1][1][0] += size


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
