"""What may name a results folder: a scenario's ``name`` is one folder name, never a path.

A run's default output folder is ``results/<name>`` (docs/scenarios.md), and a deployment's
``results/<name>-deploy``, so a name that held a path would put results anywhere: ``../../x`` outside
``results/``, ``/tmp/x`` at an absolute path. A name is therefore refused, not rewritten, unless it is one
folder name: not empty, not ``.`` or ``..``, without ``/`` or ``\\``, and without control characters (NUL,
newline, ...), which no folder name should hold. Everything else, spaces and any other text included, is
kept as written, so the output folder is exactly the one the name gives. An explicit output folder
(``output:``, ``--output``) is the user's own path and is not checked here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.scenario.errors import Problem, ScenarioError

if TYPE_CHECKING:
    from sim.scenario.types import Scenario

NAME_RULE = (
    "a name is one folder name (it names the run, and its default output folder results/<name>): text without "
    "'/', '\\' or control characters, other than '.' and '..'"
)


def name_problem(name: str) -> str | None:
    """Why ``name`` is not one folder name (see :data:`NAME_RULE`), or None when it is."""
    if not name:
        return "is empty"
    if name in (".", ".."):
        return "names the folder it is in (or its parent), not a folder of its own"
    bad = sorted({c for c in name if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        return "holds " + ", ".join(repr(c) for c in bad)
    return None


def check_name(scenario: Scenario) -> None:
    """Refuse ``scenario`` unless its ``name`` is one folder name: a :class:`~sim.scenario.ScenarioError`
    naming where the name was written, the name, and :data:`NAME_RULE`."""
    why = name_problem(scenario.name)
    if why is not None:
        problem = Problem(scenario.origin("name"), "name", f"is {scenario.name!r}, which {why}; {NAME_RULE}")
        raise ScenarioError([problem])
