"""dropsim's Python API: load a scenario, run it, sweep it, tabulate its privacy; tidy tables back.

    import sim

    result = sim.run("scenarios/quickstart.yaml", output="results/qs", overrides=["rounds=3"])
    result.rounds[["round", "accuracy", "round_time"]]          # pandas, the columns of rounds.csv

    grid = sim.load_scenario({"name": "mine", "rounds": 2, "population": 20}, overrides=["seed=3"])
    swept = sim.sweep("scenarios/dropout_sweep.yaml", jobs=2)  # every point; swept.rounds has them all

The ``dropsim`` command is a thin layer over these functions (:mod:`sim.cli.main`), so the two give the
same tables for the same scenario, and raise the same errors: a :class:`sim.scenario.ScenarioError` naming
file:line (or the option, or ``<mapping>``), the key path, the value and what is allowed; a
:class:`sim.errors.InputError` for bad traces, data folders and cost profiles. docs/api.md documents it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from sim.dp.strategies import STRATEGIES, strategy_named
from sim.results.integrity import is_verifiable
from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.source import load_file, parse_text
from sim.scenario.types import Scenario

if TYPE_CHECKING:
    import pandas as pd

    from sim.runner.run import RunSummary
    from sim.scenario.grid import Grid
    from sim.sweep_point import RunStatus

MAPPING_NAME = "<mapping>"
"""The origin errors give for keys of a scenario passed as a mapping."""


class RunResult:
    """One finished run: its folder and its tables, as pandas DataFrames with the CSV files' columns (read
    from the folder when first asked for: ``dropsim run`` prints the summary only)."""

    def __init__(self, path: Path, ran: bool = True, summary: RunSummary | None = None) -> None:
        self.path = path
        """The run's folder (``rounds.csv``, ``clients.csv``, ``stages.csv``, ``manifest.json``)."""
        self.ran = ran
        """False when the folder already held this scenario's complete run and it was not run again."""
        self._summary = summary

    @property
    def verified(self) -> bool:
        """Whether the run's tables are checked against its manifest's digests when read: True for a run made
        by this version; False for one an earlier dropsim finished, whose manifest holds none (it is read as
        found)."""
        return is_verifiable(self.manifest)

    @cached_property
    def rounds(self) -> pd.DataFrame:
        return self._table("rounds")

    @cached_property
    def clients(self) -> pd.DataFrame:
        return self._table("clients")

    @cached_property
    def stages(self) -> pd.DataFrame:
        return self._table("stages")

    @cached_property
    def manifest(self) -> dict[str, Any]:
        from sim.results.read import read_manifest  # deferred: pandas, loaded when a table is first read

        return read_manifest(self.path)

    @property
    def summary(self) -> RunSummary:
        """The one-line summary ``dropsim run`` prints (final accuracy, epsilon, mean round time, wall
        seconds)."""
        if self._summary is None:
            from sim.runner.run import summarize  # deferred: the runner loads torch; reading a run's tables needs none

            self._summary = summarize(self.path)
        return self._summary

    def _table(self, name: str) -> pd.DataFrame:
        """One table, cut to the rounds the manifest committed."""
        from sim.results.read import read_run_table  # deferred: pandas, loaded when a table is first read

        return read_run_table(self.path, name)


class SweepResult:
    """A finished sweep: every point's status and the points' tables together (a ``run_id`` column tells
    them apart; the swept keys are columns of their own), read when first asked for."""

    def __init__(self, path: Path, statuses: list[RunStatus]) -> None:
        self.path = path
        """The sweep's folder (``runs.csv``, ``rounds.csv``, ``runs/<run_id>/``)."""
        self.statuses = statuses
        self.runs = {
            s.run_id: RunResult(path / "runs" / s.run_id, ran=s.status == "complete", summary=s.summary)
            for s in statuses
            if s.status in ("complete", "skipped")
        }
        """The finished points by run id."""

    @property
    def failed(self) -> list[RunStatus]:
        return [s for s in self.statuses if s.status == "failed"]

    @cached_property
    def rounds(self) -> pd.DataFrame:
        return self._together("rounds")

    @cached_property
    def clients(self) -> pd.DataFrame:
        return self._together("clients")

    @cached_property
    def stages(self) -> pd.DataFrame:
        return self._together("stages")

    def _together(self, table: str) -> pd.DataFrame:
        import pandas as pd  # deferred: pandas, loaded only to make a table

        frames = [getattr(run, table) for run in self.runs.values()]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_scenario(
    source: str | Path | Mapping[str, Any], overrides: Sequence[str] | None = None, output: str | None = None
) -> Grid:
    """A scenario file, or a mapping of a scenario's keys (as a YAML file would hold them), read and checked
    with ``overrides`` (``--set`` strings, e.g. ``"dropout.rate=0.2"``) and ``output`` applied. The result is
    its :class:`~sim.scenario.grid.Grid`: ``.base()`` the scenario as written, ``.points()`` its sweep.
    Raises :class:`~sim.scenario.ScenarioError` listing every problem."""
    # deferred: the parser loads the protocol stack (cryptography); reading a run needs none
    from sim.scenario.grid import Grid, apply_overrides

    if isinstance(source, Mapping):
        try:
            text = yaml.safe_dump(dict(source), sort_keys=False)
        except yaml.YAMLError as exc:
            raise ScenarioError([Problem(MAPPING_NAME, "(top level)", f"is not plain data: {exc}")]) from None
        doc = parse_text(text, MAPPING_NAME)
    else:
        doc = load_file(source)
    doc = apply_overrides(doc, list(overrides or []))
    if output is not None:
        doc.set(("output",), str(output), "--output")
    return Grid.from_document(doc)


def _grid(scenario: Any, overrides: Sequence[str] | None, output: str | Path | None) -> Grid:
    # deferred: the parser loads the protocol stack (cryptography); reading a run needs none
    from sim.scenario.grid import Grid

    if isinstance(scenario, Grid):
        if overrides:
            raise TypeError("overrides apply to a scenario's file or mapping, not to a loaded Grid")
        if output is None:
            return scenario
        doc = scenario.document.copy()
        doc.set(("output",), str(output), "output=")
        return Grid(doc, dict(scenario.sweep))
    return load_scenario(scenario, overrides, None if output is None else str(output))


def _one(scenario: Any, overrides: Sequence[str] | None, output: str | Path | None) -> Scenario:
    if isinstance(scenario, Scenario):
        if overrides:
            raise TypeError("overrides apply to a scenario's file or mapping, not to a loaded Scenario")
        return scenario if output is None else replace(scenario, output=str(output))
    return _grid(scenario, overrides, output).base()


def run(
    scenario: Any,
    output: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    progress: bool = True,
    force: bool = False,
) -> RunResult:
    """Run a scenario (a file's path, a mapping, a :class:`Grid` or a :class:`Scenario`; a sweep's base
    scenario, as ``dropsim run``) into ``output`` (default: the scenario's ``output``) and return its tables.
    A folder that already holds this scenario's complete run is read, not run again, unless ``force``; if one
    of its tables changed since the run completed, :class:`sim.results.integrity.ChangedTableError` (an
    :class:`~sim.errors.InputError`) names it. A scenario whose ``name`` is not one folder name is refused
    (:mod:`sim.results.folders`)."""
    from sim.preflight import check_all  # deferred: torch; reading a finished run needs none
    from sim.runner import prepare_output, run_scenario  # deferred: torch; reading a finished run needs none

    one = _one(scenario, overrides, output)
    check_all([one])
    out = Path(one.output)
    if prepare_output(out, one, force=force):
        return RunResult(out, True, run_scenario(one, out, progress=progress))
    return RunResult(out, ran=False)


def sweep(
    scenario: Any,
    output: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    jobs: int = 1,
    scheduler: str | None = None,
    progress: bool = True,
    on_status: Callable[[RunStatus], None] | None = None,
    force: bool = False,
) -> SweepResult:
    """Run every point of a scenario's sweep (``jobs`` worker processes, or the Dask cluster at
    ``scheduler``) into ``output``, as ``dropsim sweep``; points already finished there are kept, unless
    ``force`` (a finished point whose table changed since stops the sweep before anything runs:
    :class:`sim.results.integrity.ChangedTableError`). Returns every point's status and the finished points'
    tables together."""
    from sim.preflight import check_all  # deferred: torch; reading a finished run needs none
    from sim.sweeps import run_sweep  # deferred: torch; reading a finished run needs none

    if jobs < 1:
        raise ValueError(f"jobs is {jobs}; at least 1 is expected")
    grid = _grid(scenario, overrides, output)
    check_all(grid.points())
    source = str(scenario) if isinstance(scenario, str | Path) else MAPPING_NAME
    statuses = run_sweep(
        grid, source, jobs=jobs, progress=progress, on_status=on_status, scheduler=scheduler, force=force
    )
    return SweepResult(Path(grid.base().output), statuses)


def privacy_table(
    scenario: Any,
    dropouts: Sequence[float] = (0.0, 0.1, 0.2, 0.3),
    strategies: Sequence[str] | None = None,
    dim: int | None = None,
    overrides: Sequence[str] | None = None,
) -> pd.DataFrame:
    """``dropsim privacy``'s table: per privacy strategy and dropout rate, the epsilon the scenario's rounds
    spend and the noise they leave (docs/privacy.md). ``strategies``: those the scenario's protocol supports
    by default; ``dim``: the scenario's model's parameters by default. Raises ``ValueError`` for a strategy
    the protocol does not support, a rate outside [0, 1), a ``dim`` below 1 or noise that cannot be planned."""
    import pandas as pd  # deferred: pandas, loaded only to make a table

    return pd.DataFrame(privacy_rows(_one(scenario, overrides, None), dropouts, strategies, dim))


def privacy_rows(
    scenario: Scenario, dropouts: Sequence[float], strategies: Sequence[str] | None, dim: int | None
) -> list[dict[str, Any]]:
    """The rows of :func:`privacy_table` as plain dicts (what ``dropsim privacy`` prints and writes)."""
    from sim.learning.models import model_dimension  # deferred: torch; reading a finished run needs none
    from sim.preflight import plugin_problems  # deferred: torch; reading a finished run needs none
    from sim.protocol.registry import spec_of  # deferred: the protocol stack (cryptography); reading a run needs none
    from sim.runner.privacy_table import planned  # deferred: torch; reading a finished run needs none
    from sim.runner.privacy_table import privacy_table as table  # deferred: torch; reading a finished run needs none

    problems = plugin_problems(scenario)  # the model's size, if a plug-in's, needs them
    if problems:
        raise ScenarioError(problems)
    own = scenario.privacy.strategy
    named = (*planned(), *([own] if own not in STRATEGIES and strategy_named(own).enabled else []))
    supported = [s for s in named if spec_of(scenario.aggregation).supports(strategy_named(s))]
    chosen = list(strategies) if strategies is not None else supported
    unknown = [s for s in chosen if s not in supported]
    if unknown:
        raise ValueError(
            f"strategies {unknown} are unknown or need another protocol than {scenario.aggregation.protocol} "
            f"(allowed here: {', '.join(supported) or 'none: set aggregation.protocol'})"
        )
    bad = [x for x in dropouts if not 0 <= x < 1]
    if bad:
        raise ValueError(f"dropout rates {bad} outside [0, 1)")
    if dim is not None and dim < 1:
        raise ValueError(f"dim {dim} is below 1")
    try:
        return table(scenario, list(dropouts), dim or model_dimension(scenario), chosen)
    except ValueError as exc:
        raise ValueError(f"cannot plan the noise: {exc}") from None
