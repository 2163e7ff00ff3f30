"""Checks of a scenario against the machine before anything runs: files, data sizes, the cost profile.

The scenario parser checks what a file says; these check what it needs from the machine it will run on
(that ``data.path`` is a folder, that digits has enough samples for every client, that the cost profile
exists and measures every operation the run will charge). ``dropsim check`` reports them with the
parser's problems; ``run`` and ``sweep`` refuse to start on them, before writing anything.
"""

from __future__ import annotations

from pathlib import Path

from sim.costs.model import CostModel, CostModelError
from sim.learning.datasets import digits_train_size
from sim.learning.federated import data_shape
from sim.learning.models import train_op, update_dimension
from sim.protocol.machine import RoundSetupError
from sim.protocol.registry import DRIVER_OPERATIONS
from sim.round.privacy import padded
from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.types import Scenario
from sim.testbed import cost_profile


def preflight(scenario: Scenario) -> list[Problem]:
    """What stands in the way of running ``scenario`` here (empty when nothing does)."""
    problems: list[Problem] = []
    data = scenario.data
    if data.path is not None and not Path(data.path).is_dir():
        problems.append(
            Problem(scenario.origin("data", "path"), "data.path", f"is {data.path!r}: there is no such folder")
        )
    if data.dataset == "digits" and scenario.population > digits_train_size(data.test_fraction):
        problems.append(
            Problem(
                scenario.origin("population"),
                "population",
                f"is {scenario.population}, more than the {digits_train_size(data.test_fraction)} training samples "
                "of digits, so some clients would have no data; lower it, or use dataset synthetic",
            )
        )
    if scenario.trace is not None:
        problems += _trace(scenario)
    if scenario.privacy.enabled:
        problems += _privacy(scenario)
    try:
        costs = CostModel.load(cost_profile(scenario))
    except CostModelError as exc:
        problems.append(Problem(scenario.origin("costs", "profile"), "costs.profile", str(exc)))
        return problems
    shape, classes = data_shape(data)
    pipeline = scenario.pipeline
    if pipeline is not None and pipeline.chunks is not None:
        dim = update_dimension(scenario.model, shape, classes)
        if scenario.privacy.enabled:
            dim = padded(dim)  # DSkellam's encoding is padded to a power of two
        if pipeline.chunks > dim:
            problems.append(
                Problem(
                    scenario.origin("pipeline", "chunks"),
                    "pipeline.chunks",
                    f"is {pipeline.chunks}, more chunks than the update has values ({dim}); use at most {dim}",
                )
            )
    # an abstract model (model.params) trains at its own rate: no profiled train op
    training = () if scenario.model.name is None else (train_op(scenario.model.name, shape, classes),)
    needed = (*training, *DRIVER_OPERATIONS, *scenario.aggregation.spec.operations)
    missing = [op for op in needed if not costs.has(op)]
    if missing:
        problems.append(
            Problem(
                scenario.origin("costs", "profile"),
                "costs.profile",
                f"{costs.source} does not measure {', '.join(missing)}; run `dropsim profile` to make one that does",
            )
        )
    return problems


def _trace(scenario: Scenario) -> list[Problem]:
    """The trace file loads, its clients fit the population, and the replayed hours lie within it."""
    import numpy as np

    from sim.errors import InputError
    from sim.traces.io import check_clients, load_trace

    replay = scenario.trace
    assert replay is not None
    if not Path(replay.file).is_file():
        where = scenario.origin("trace", "file")
        return [Problem(where, "trace.file", f"is {replay.file!r}: there is no such file (see traces/README.md)")]
    try:
        trace = load_trace(replay.file)
        check_clients(trace, scenario.population, scenario.origin("population"))
    except InputError as exc:
        return [Problem(scenario.origin("trace", "file"), "trace.file", str(exc))]
    if not bool(np.isnan(trace.periods).all()):
        return []  # some clients repeat for ever
    end_h = float(trace.ends.max()) / 3600
    problems = []
    for key, hours in (("offset_hours", replay.offset_hours), ("until_hours", replay.until_hours)):
        if hours is not None and hours > end_h:
            problems.append(
                Problem(
                    scenario.origin("trace", key),
                    f"trace.{key}",
                    f"is {hours:g}, past the end of the trace ({end_h:.2f} h, {replay.file}): nobody is online there",
                )
            )
    return problems


def _privacy(scenario: Scenario) -> list[Problem]:
    """Whether the noise can be planned for the budget and fits the bits (DP needs no machine, but a plan
    that cannot be made should stop the run before it starts, not in its first round)."""
    from sim.round.privacy import PrivacyLedger, nominal_sampling
    from sim.runner.privacy_table import model_dimension

    sc = scenario
    q, n = nominal_sampling(sc)
    try:
        ledger = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, n, model_dimension(sc), sc.seed)
        ledger.round(1, n)
    except (ValueError, RoundSetupError) as exc:
        return [Problem(sc.origin("privacy"), "privacy", f"cannot plan the noise: {exc}")]
    return []


def check_all(scenarios: list[Scenario]) -> None:
    """Raise one :class:`ScenarioError` with the preflight problems of every scenario."""
    problems: list[Problem] = []
    for scenario in scenarios:
        for p in preflight(scenario):
            if (p.key, p.message) not in {(q.key, q.message) for q in problems}:
                problems.append(p)
    if problems:
        raise ScenarioError(problems)
