"""Typed, checked reading of one mapping of a scenario document.

A :class:`Reader` walks one mapping. Each getter checks a value's type and range, records a
:class:`~sim.scenario.errors.Problem` naming the key, the value and what is allowed when it is wrong
(and returns the default so reading goes on and every problem is reported at once), and writes the
resolved value (defaults filled) into a parallel "resolved" mapping that becomes the manifest's copy of
the scenario. :meth:`Reader.finish` reports keys nobody asked for, suggesting the closest known key.

Whole numbers are 64-bit: a key without a bound of its own takes at most :data:`MAX_INTEGER`. Numbers
written as text (``"0.5"``) are read only up to :data:`~sim.scenario.source.MAX_NUMBER_CHARS` characters,
with a pattern that takes time linear in its length; values are shown in messages cut short, whatever
their size.
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sim.scenario.errors import Problem
from sim.scenario.source import MAX_NUMBER_CHARS, Document, KeyPath, format_path

T = TypeVar("T")

MAX_INTEGER = 2**63 - 1
"""Largest whole number a key takes when it names no bound of its own: a 64-bit signed integer, as every
count and id of a run is."""

_MISSING: Any = object()
# One way to match each text (no optional part can take what another takes), so a failed match is linear.
_FLOAT_TEXT = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")


class Reader:
    """Reads the mapping at ``path`` of ``doc``; shares the problem list and resolved tree with its parent."""

    def __init__(
        self,
        doc: Document,
        data: Any,
        path: KeyPath = (),
        problems: list[Problem] | None = None,
        resolved: dict[str, Any] | None = None,
    ) -> None:
        self.doc = doc
        self.path = path
        self.problems: list[Problem] = [] if problems is None else problems
        self.resolved: dict[str, Any] = {} if resolved is None else resolved
        self._asked: set[str] = set()
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail((), f"is {shown(data)}; a mapping of keys to values is expected here")
            data = {}
        self.data: dict[str, Any] = data

    # -- reporting --------------------------------------------------------------------------------
    def fail(self, key: KeyPath | str, message: str) -> None:
        """Record a problem at ``key`` (relative to this mapping)."""
        rel: KeyPath = (key,) if isinstance(key, str) else key
        full = self.path + rel
        self.problems.append(Problem(self.doc.origin(full), format_path(full), message))

    def where(self, key: str) -> str:
        """``file:line: key.path`` of ``key``: how an error about it that is raised, not recorded, starts."""
        full = (*self.path, key)
        return f"{self.doc.origin(full)}: {format_path(full)}"

    def failed(self, key: str, exc: Exception) -> None:
        """Record ``exc`` (whose message starts with :meth:`where` of ``key``, or does not) as a problem at ``key``."""
        text, head = str(exc), self.where(key) + ": "
        self.fail(key, text[len(head) :] if text.startswith(head) else text)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> Any:
        """The unchecked value of ``key`` (marks it as known)."""
        self._asked.add(key)
        return self.data.get(key)

    def _take(self, key: str, default: Any) -> Any:
        self._asked.add(key)
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                self.fail(key, "is required")
            return _MISSING
        return value

    @staticmethod
    def _fallback(default: Any) -> Any:
        """What a getter returns after a problem: the default, or None for a required key."""
        return None if default is _MISSING else default

    def _put(self, key: str, value: Any) -> None:
        self.resolved[key] = value

    # -- getters --------------------------------------------------------------------------------
    def number(
        self,
        key: str,
        default: float | None = _MISSING,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        """A finite real number in ``[lo, hi]`` (bounds open where asked)."""
        value = self._take(key, default)
        if value is _MISSING:
            self._put(key, default)
            return self._fallback(default)
        allowed = _range_text("a number", lo, hi, lo_open, hi_open)
        number = as_number(value)
        if number is None or not math.isfinite(number):
            self.fail(key, f"is {shown(value)}; {allowed} is expected")
            return self._fallback(default)
        if not _in_range(number, lo, hi, lo_open, hi_open):
            self.fail(key, f"is {shown(value)}, out of range; allowed: {allowed}")
            return self._fallback(default)
        self._put(key, number)
        return number

    def integer(self, key: str, default: int | None = _MISSING, lo: int | None = None, hi: int | None = None) -> int:
        """A whole number in ``[lo, hi]``."""
        value = self._take(key, default)
        if value is _MISSING:
            self._put(key, default)
            return self._fallback(default)
        allowed = _range_text("a whole number", lo, hi, False, False)
        number: float | int | None = value if isinstance(value, int) and not isinstance(value, bool) else None
        if number is None:  # not an int as written: a float or a number in text, whole or not
            number = as_number(value)
            if number is None or not math.isfinite(number) or number != int(number):
                self.fail(key, f"is {shown(value)}; {allowed} is expected")
                return self._fallback(default)
        if not _in_range(number, lo, hi, False, False):  # an int compared exactly, beyond 2^53 too
            self.fail(key, f"is {shown(value)}, out of range; allowed: {allowed}")
            return self._fallback(default)
        if hi is None and number > MAX_INTEGER:
            self.fail(key, f"is {shown(value)}, out of range; allowed: {allowed}, at most 2^63 - 1 (64 bits)")
            return self._fallback(default)
        self._put(key, int(number))
        return int(number)

    def boolean(self, key: str, default: bool = _MISSING) -> bool:
        value = self._take(key, default)
        if value is _MISSING:
            self._put(key, self._fallback(default))
            return self._fallback(default)
        if not isinstance(value, bool):
            self.fail(key, f"is {shown(value)}; true or false is expected")
            return self._fallback(default)
        self._put(key, value)
        return value

    def choice(self, key: str, choices: Sequence[str], default: str = _MISSING) -> str:
        """One of ``choices``; a near miss gets a suggestion."""
        value = self._take(key, default)
        if value is _MISSING:
            self._put(key, self._fallback(default))
            return self._fallback(default)
        if not isinstance(value, str) or value not in choices:
            self.fail(key, f"is {shown(value)}; allowed: {_one_of(choices)}{_suggest(value, choices)}")
            return self._fallback(default)
        self._put(key, value)
        return value

    def string(self, key: str, default: str | None = _MISSING) -> str:
        value = self._take(key, default)
        if value is _MISSING:
            self._put(key, default)
            return self._fallback(default)
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"is {shown(value)}; a non-empty text is expected")
            return self._fallback(default)
        self._put(key, value)
        return value

    def interval(
        self,
        key: str,
        default: tuple[float, float] = _MISSING,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
    ) -> tuple[float, float]:
        """A pair ``[low, high]`` with ``low <= high``, both within ``[lo, hi]``."""
        value = self._take(key, default)
        if value is _MISSING:
            if default is not _MISSING:
                self._put(key, list(default))
            return self._fallback(default)
        allowed = "a pair [low, high] of " + _range_text("numbers", lo, hi, lo_open, False) + " with low <= high"
        if not isinstance(value, list | tuple) or len(value) != 2:
            self.fail(key, f"is {shown(value)}; {allowed} is expected")
            return self._fallback(default)
        low, high = (as_number(v) for v in value)
        if (
            low is None
            or high is None
            or not (math.isfinite(low) and math.isfinite(high))
            or not (_in_range(low, lo, hi, lo_open, False) and _in_range(high, lo, hi, lo_open, False))
            or low > high
        ):
            self.fail(key, f"is {shown(value)}; {allowed} is expected")
            return self._fallback(default)
        result = (low, high)
        self._put(key, list(result))
        return result

    def section(self, key: str) -> Reader:
        """A reader for the mapping under ``key`` (an absent key reads as an empty mapping)."""
        self._asked.add(key)
        value = self.data.get(key)
        sub_resolved: dict[str, Any] = {}
        self.resolved[key] = sub_resolved
        if value is not None and not isinstance(value, dict):
            self.fail(key, f"is {shown(value)}; a mapping of keys to values is expected here")
            value = {}
        return Reader(self.doc, value, (*self.path, key), self.problems, sub_resolved)

    def mapping(self, key: str) -> dict[str, Any]:
        """A mapping of names to values, taken as it is (a plug-in's ``args``); ``{}`` when absent."""
        value = self._take(key, {})
        if value is None or value is _MISSING:
            return {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
            self.fail(key, f"is {shown(value)}; a mapping of argument names to values is expected")
            return {}
        odd = _not_plain(value)
        if odd is not None:
            self.fail(
                (key, *odd[0]),
                f"is {shown(odd[1])}: arguments are plain data (numbers, strings, booleans, null, lists, and "
                "mappings with string keys), which every process reads alike",
            )
            return {}
        self._put(key, value)
        return dict(value)

    def custom(self, key: str, default: T, parse: Callable[[Any], tuple[T, Any]]) -> T:
        """A value parsed by ``parse(value) -> (parsed, resolved_form)``; ``parse`` raises ValueError
        with the allowed forms as its message."""
        value = self._take(key, default)
        if value is _MISSING:
            return self._fallback(default)
        try:
            parsed, resolved = parse(value)
        except ValueError as exc:
            self.fail(key, f"is {shown(value)}; {exc}")
            return self._fallback(default)
        self._put(key, resolved)
        return parsed

    def finish(self, extra_allowed: Sequence[str] = ()) -> None:
        """Report keys of this mapping that no getter asked for."""
        known = sorted(self._asked | set(extra_allowed))
        for key in self.data:
            if key in self._asked or key in extra_allowed:
                continue
            if not isinstance(key, str):
                self.fail((str(key),), f"is not a valid key (keys are names); allowed keys here: {', '.join(known)}")
                continue
            hint = _suggest(key, known, prefix=format_path(self.path) + "." if self.path else "")
            self.fail((key,), f"is not a known key{hint}; allowed keys here: {', '.join(known)}")


def _not_plain(value: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], Any] | None:
    """The key path and value of the first part of ``value`` that is not plain (JSON-like) data, or None."""
    if value is None or isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _not_plain(item, (*path, str(i)))
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return (*path, str(k)), k
            found = _not_plain(item, (*path, k))
            if found is not None:
                return found
        return None
    return path, value


class _Bounded(reprlib.Repr):
    """reprlib's bounded repr, with integers too long for ``repr`` given by their number of digits."""

    def repr_int(self, x: int, level: int) -> str:
        try:
            return repr(x)
        except ValueError:  # more digits than Python writes (4300 unless lifted)
            return f"an integer of {int(x.bit_length() * math.log10(2)) + 1} digits"


_BOUNDED = _Bounded()
_BOUNDED.maxstring = _BOUNDED.maxother = 80


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (a file may hold values of any size,
    and integers too long for ``repr``)."""
    try:
        text = repr(value)
    except ValueError:  # an integer of more than 4300 digits, alone or within a list or mapping
        text = _BOUNDED.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_number(value: Any) -> float | None:
    """An int, a float or a number written as text as a float (an int beyond floats is infinite, so out of
    every range); None for anything else, booleans and text longer than MAX_NUMBER_CHARS included."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an integer beyond any float: out of every range, and said so
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and len(value) <= MAX_NUMBER_CHARS and _FLOAT_TEXT.match(value.strip()):
        return float(value)
    return None


def _in_range(x: float, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (x < lo or (lo_open and x == lo)):
        return False
    return not (hi is not None and (x > hi or (hi_open and x == hi)))


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _range_text(what: str, lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        return f"{what} in {left}{_fmt(lo)}, {_fmt(hi)}{right}"
    if lo is not None:
        return f"{what} {'>' if lo_open else '>='} {_fmt(lo)}"
    if hi is not None:
        return f"{what} {'<' if hi_open else '<='} {_fmt(hi)}"
    return what


def _one_of(choices: Sequence[str]) -> str:
    return " | ".join(choices)


def _suggest(value: Any, choices: Sequence[str], prefix: str = "") -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""
