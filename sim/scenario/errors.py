"""Errors about scenario files: each problem names where, which key, the value, and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.errors import InputError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario.

    ``origin`` is ``file:line`` (or a command-line option), ``key`` the dotted key path, ``message``
    says what the value is and what would be accepted.
    """

    origin: str
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.key}: {self.message}"


class ScenarioError(InputError):
    """A scenario that cannot be run, with every problem found in it."""

    def __init__(self, problems: Sequence[Problem], context: str = "") -> None:
        self.problems = list(problems)
        self.context = context
        super().__init__(str(self))

    def __str__(self) -> str:
        head = f"{self.context}: " if self.context else ""
        lines = [str(p) for p in self.problems]
        if len(lines) == 1:
            return head + lines[0]
        return head + f"{len(lines)} problems\n" + "\n".join(f"  {line}" for line in lines)
