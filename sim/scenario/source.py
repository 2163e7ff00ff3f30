"""Scenario documents: YAML text to plain data, remembering where each key came from.

A scenario is composed once into PyYAML's node tree, whose marks tell, for every key path, the file and
line it was written on (errors name that origin), and the tree is then constructed into plain data (only
mappings, lists, strings, numbers, booleans, null and timestamps: no Python objects are ever made). Keys
given on the command line (``--set``) or by a sweep carry their own origin.

Before that, the text's event stream (PyYAML's parser is iterative) is checked for what would make the
recursive composer, the key-path walk or a later deep copy fail or blow up: lists and mappings nested
deeper than :data:`MAX_DEPTH`, an alias inside the node it names (a document that contains itself), and
aliases that expand to more than :data:`MAX_VALUES` values ("billion laughs"). Each is a
:class:`ScenarioError` naming the line.

The loader (:func:`load_yaml`, the one every YAML file and value of a scenario goes through) is PyYAML's
safe loader, which reads YAML 1.1, with two changes that bound the work of turning a scalar into a number:

* YAML 1.1's base-60 numbers (``1:30`` for 90, ``1:30.5`` for 90.5) are not taken: such a scalar is text.
  Each ``:`` group multiplies the whole value read so far, so that conversion takes time quadratic in the
  scalar's length, and YAML 1.2 dropped the form. Every other YAML 1.1 form is kept (``0x1F``, ``0b101``,
  ``010`` for 8, ``1_000``, ``.inf``, ``yes``/``no``...): each converts in linear time, and dropping one
  would change what a file already written means.
* An integer or float, implicit or tagged (``!!int``), may be written with at most :data:`MAX_NUMBER_CHARS`
  characters, checked before it is converted (and ``!!int``/``!!float`` refuse a base-60 value), whatever
  limit on digits the interpreter has.
"""

from __future__ import annotations

import copy
import re
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
MAX_NUMBER_CHARS = 1000
"""Most characters an integer or float may be written with (sign, prefix and underscores included): far
more than any 64-bit value or float needs."""

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_WITHOUT_BASE_60 = {
    # PyYAML's YAML 1.1 patterns (yaml/resolver.py), less their base-60 alternatives.
    _INT: re.compile(
        r"""^(?:[-+]?0b[0-1_]+
            |[-+]?0[0-7_]+
            |[-+]?(?:0|[1-9][0-9_]*)
            |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    _FLOAT: re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
            |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
}


class _Refused(yaml.MarkedYAMLError):
    """A scalar the loader refuses to convert (a number too long, a base-60 number); names its line."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without base-60 numbers, and with numbers of at most MAX_NUMBER_CHARS characters."""

    def _number_text(self, node: yaml.ScalarNode, kind: str) -> None:
        """Refuse the scalar of an ``int`` or ``float`` node before it is converted, if too long or base-60."""
        text = str(node.value)
        problem = ""
        if len(text) > MAX_NUMBER_CHARS:
            problem = (
                f"holds {'an integer' if kind == 'int' else 'a float'} of {len(text)} characters; a number may "
                f"have at most {MAX_NUMBER_CHARS}"
            )
        elif ":" in text:
            problem = f"holds the base-60 number {text!r}, which is not read; write it in base 10"
        if problem:
            raise _Refused(problem=problem, problem_mark=node.start_mark)

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        self._number_text(node, "int")
        return int(self.construct_yaml_int(node))

    def construct_bounded_float(self, node: yaml.ScalarNode) -> float:
        self._number_text(node, "float")
        return float(self.construct_yaml_float(node))


_Loader.yaml_implicit_resolvers = {  # the safe loader's, in their order, the two patterns replaced
    first: [(tag, _WITHOUT_BASE_60.get(tag, pattern)) for tag, pattern in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_constructor(_INT, _Loader.construct_bounded_int)
_Loader.add_constructor(_FLOAT, _Loader.construct_bounded_float)


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


def load_yaml(text: str, name: str) -> Any:
    """The plain data of YAML ``text`` (from ``name``, a file or an option), read as a scenario is: shape
    checked, base-60 numbers not taken, numbers bounded (see the module's docstring). Raises
    :class:`ScenarioError` naming ``name`` and the line."""
    return _read(text, name, None)


def parse_text(text: str, name: str) -> Document:
    """Parse YAML ``text`` (from file ``name``) into a :class:`Document`."""
    origins: dict[KeyPath, str] = {}
    problems: list[Problem] = []
    data = _read(text, name, (origins, problems))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(
            [Problem(name, "(file)", f"must be a mapping of keys to values, not a {type(data).__name__}")]
        )
    if problems:
        raise ScenarioError(problems)
    return Document(data, origins, name)


def _read(text: str, name: str, walk: tuple[dict[KeyPath, str], list[Problem]] | None) -> Any:
    """The plain data of ``text``, after its shape is checked. With ``walk``, the node tree's origins and
    duplicate keys are recorded there first, before constructing merges ``<<`` keys into their mappings."""
    try:
        _check_shape(text, name)
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None
            if walk is not None:
                _walk(root, (), name, *walk)
            return loader.construct_document(root)
        finally:
            loader.dispose()
    except _Refused as exc:
        mark = exc.problem_mark
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        raise ScenarioError([Problem(where, "(file)", str(exc.problem))]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem(where, "(file)", f"is not valid YAML: {problem}")]) from None
    except ValueError as exc:  # a value YAML cannot construct (a date that does not exist, say)
        raise ScenarioError([Problem(name, "(file)", f"holds a value that cannot be read: {exc}")]) from None


def _check_shape(text: str, name: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, self-containing aliases and more than MAX_VALUES expanded values.

    Reads only the event stream, tracking for each open list or mapping its anchor and its expanded size
    (an alias counts the size of the node it names); raises :class:`ScenarioError`, or lets the parser's
    ``yaml.YAMLError`` through."""
    expanded: dict[str, int] = {}
    open_nodes: list[tuple[str | None, list[int]]] = []  # (anchor, [expanded size so far])
    for event in yaml.parse(text, Loader=_Loader):
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
