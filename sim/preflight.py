"""Checks of a scenario against the machine before anything runs: files, data sizes, the cost profile.

The scenario parser checks what a file says; these check what it needs from the machine it will run on
(that ``data.path`` is a folder, that digits has enough samples for every client, that the cost profile
exists and measures every operation the run will charge). ``dropsim check`` reports them with the
parser's problems; ``run`` and ``sweep`` refuse to start on them, before writing anything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sim import footprint
from sim.costs.estimate import estimate_training
from sim.costs.model import CostModel, CostModelError, read_profile, resolve_profile
from sim.errors import InputError
from sim.learning.datasets import digits_train_size
from sim.learning.device import cuda_problem
from sim.learning.federated import FederatedData, data_shape, load_federated
from sim.learning.flops import multiply_adds
from sim.learning.models import make_model, model_dimension, model_train_op, trains_at_rate, update_dimension
from sim.learning.plugin_model import check_model
from sim.plugins import where_raised
from sim.protocol.machine import RoundSetupError
from sim.protocol.registry import DRIVER_OPERATIONS, spec_of
from sim.results.manifest import host
from sim.round.privacy import PrivacyLedger, nominal_sampling, padded
from sim.scenario.dropout_modes import dropout_mode
from sim.scenario.errors import Problem, ScenarioError
from sim.scenario.plugins import written_key
from sim.scenario.types import Scenario
from sim.testbed import ENGINE, KERNEL, cost_profile


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
    if scenario.fidelity != "timing":  # training.device: cuda on a machine without one
        device = cuda_problem(scenario.training.device)
        if device is not None:
            problems.append(Problem(scenario.origin("training", "device"), "training.device", device))
    memory = footprint.refusal(scenario)  # before the trace is read
    if memory:
        problems.append(_memory(scenario, memory))
    elif scenario.trace is not None:
        problems += _trace(scenario)
    plugins, shaped = _plugins(scenario)
    problems += plugins
    if not memory and shaped is not None and scenario.fidelity != "timing":  # real updates: full, learning
        memory = footprint.refusal(scenario, update_dimension(scenario.model, *shaped))  # the trace counted again
        if memory:
            problems.append(_memory(scenario, memory))
    if scenario.privacy.enabled and shaped is not None:  # the noise is planned for the model's size
        problems += _privacy(scenario)
    try:
        costs = CostModel.load(cost_profile(scenario))
    except CostModelError as exc:
        problems.append(Problem(scenario.origin("costs", "profile"), "costs.profile", str(exc)))
        return problems
    if shaped is None:  # the data or model failed: nothing to size
        return problems
    shape, classes = shaped
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
    # an abstract model (model.params), or a factory's with train_seconds_per_sample, trains at its own rate
    training = () if trains_at_rate(scenario.model) else (model_train_op(scenario.model, shape, classes),)
    if training and not costs.has(training[0]) and scenario.model.factory is not None:
        problems.append(
            Problem(
                scenario.origin("model", "factory"),
                "model.factory",
                f"has no training time: {costs.source} does not measure {training[0]}; measure it with "
                "`dropsim profile --model SCENARIO --out PROFILE` (then costs.profile: PROFILE), or give "
                "model.train_seconds_per_sample",
            )
        )
        training = ()
    if training and scenario.model.factory is None:  # a built-in model at an unmeasured shape: estimated
        try:
            if estimate_training(costs, training[0], multiply_adds) is not None:
                training = ()
        except CostModelError as exc:  # the profile measures no shape of the model
            problems.append(Problem(scenario.origin("costs", "profile"), "costs.profile", str(exc)))
            training = ()
    needed = (*training, *DRIVER_OPERATIONS, *spec_of(scenario.aggregation).operations)
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


def _memory(scenario: Scenario, why: str) -> Problem:
    """A run that cannot fit in memory, filed under the sampling key (the sample is what grows)."""
    key = "clients_per_round" if scenario.sampling.clients_per_round is not None else "rate"
    return Problem(scenario.origin("sampling", key), f"sampling.{key}", why)


def plugin_problems(scenario: Scenario) -> list[Problem]:
    """The problems of the scenario's plug-ins alone (:func:`preflight` checks them too): for commands that use
    the scenario's model or data without running it (``dropsim privacy``, ``profile --model``)."""
    return _plugins(scenario)[0]


def _plugins(scenario: Scenario) -> tuple[list[Problem], tuple[tuple[int, ...], int] | None]:
    """The checks of a scenario's plug-ins that need them run (:mod:`sim.plugins`): its data loader's data, its
    model on those data, its dropout model's draws. Returns the problems and the data's (input shape,
    classes), or None where the data or model cannot be had."""
    sc = scenario
    data = sc.data
    if data.loader is None:
        shaped: tuple[tuple[int, ...], int] | None = data_shape(data)
        federated = None
    else:
        try:
            federated = load_federated(data, sc.population, sc.seed)
        except InputError as exc:
            return [_problem(sc, written_key(sc, "dataset"), exc)], None
        shaped = (federated.input_shape, federated.num_classes)
    problems = []
    if sc.dropout.model is not None:
        problems += _dropout_plugin(sc)
    if sc.model.params is not None or (federated is None and sc.model.factory is None):
        return problems, shaped
    model_key = written_key(sc, "model")
    try:
        wrong = _model_plugin(sc, federated, shaped, model_key)
    except InputError as exc:
        wrong = [_problem(sc, model_key, exc)]
    return [*problems, *wrong], None if wrong else shaped


def _problem(scenario: Scenario, key: tuple[str, ...], exc: Exception) -> Problem:
    """``exc``, raised about ``key``, as the problem there (its message without a ``key: `` it starts with)."""
    dotted = ".".join(key)
    text = str(exc)
    for head in (f"{dotted}: ", f"{scenario.origin(*key)}: {dotted}: "):
        if text.startswith(head):
            text = text[len(head) :]
    return Problem(scenario.origin(*key), dotted, text)


def _model_plugin(
    scenario: Scenario, federated: object, shaped: tuple[tuple[int, ...], int] | None, key: tuple[str, ...]
) -> list[Problem]:
    """The scenario's model builds on its data's shape and gives one logit per class on a few test inputs (a
    loader's), or random inputs of the data's shape (a built-in data set's, which is not read for this)."""
    assert shaped is not None
    if isinstance(federated, FederatedData):
        inputs = federated.test_data()[0][:2]
    else:
        inputs = np.random.default_rng(0).random((2, *shaped[0]), dtype=np.float32)
    model = scenario.model
    what = model.factory or f"model {model.name}"
    with torch.random.fork_rng(devices=[]):
        try:
            built = make_model(model, *shaped, ".".join(key))
        except InputError:
            raise
        except ValueError as exc:  # a built-in model on inputs it cannot take
            return [Problem(scenario.origin(*key), ".".join(key), str(exc))]
        check_model(built, inputs, shaped[1], what, ".".join(key))
    workers = scenario.training.workers
    if workers > 1 and scenario.fidelity != "timing" and next(built.buffers(), None) is not None:
        return [
            Problem(
                scenario.origin("training", "workers"),
                "training.workers",
                f"is {workers}, which needs a model whose state is its parameters; {what} has buffers (e.g. "
                "batch-norm statistics) that would differ between processes: use 1, or a model without buffers",
            )
        ]
    return []


def _dropout_plugin(scenario: Scenario) -> list[Problem]:
    """The plug-in dropout model prepares for the population and draws, for two rounds, a subset of the sampled
    clients (each client at most once, in the sample's order)."""
    sc = scenario
    config = sc.dropout
    key = written_key(sc, "dropout")
    where, dotted = sc.origin(*key), ".".join(key)
    method = "prepare"
    try:
        mode = dropout_mode(config, dotted)
        state = mode.prepare(config, sc.population, sc.seed)
        method = "drops"
        k = sc.sampling.clients_per_round or max(1, round((sc.sampling.rate or 0) * sc.population))
        sampled = np.arange(min(k, sc.population))
        for round_ in (1, 2):
            dropped = np.asarray(mode.drops(config, state, np.random.default_rng(round_), sampled))
            whole = dropped.size == 0 or np.issubdtype(dropped.dtype, np.integer)  # none dropping is an empty list
            inside = whole and np.isin(dropped, sampled).all() and np.unique(dropped).size == dropped.size
            if dropped.ndim != 1 or not inside:
                return [
                    Problem(
                        where,
                        dotted,
                        f"{config.model}.drops returned {dropped!r} for sampled clients {sampled!r}: a subset of the "
                        "sampled clients (an integer array) is expected (docs/plugins.md)",
                    )
                ]
    except InputError as exc:
        return [_problem(sc, key, exc)]
    except Exception as exc:
        return [
            Problem(
                where,
                dotted,
                f"{config.model}.{method} raised {type(exc).__name__}: {exc}{where_raised(exc)} (docs/plugins.md)",
            )
        ]
    return []


def _trace(scenario: Scenario) -> list[Problem]:
    """The trace file loads, its clients fit the population, and the replayed hours lie within it."""
    # deferred: sim.traces.io loads pandas; only a scenario with a trace reads one
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
    sc = scenario
    q, n = nominal_sampling(sc)
    try:
        ledger = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, n, model_dimension(sc), sc.seed)
        ledger.round(1, n)
    except (ValueError, RoundSetupError) as exc:
        return [Problem(sc.origin("privacy"), "privacy", f"cannot plan the noise: {exc}")]
    return []


def warnings(scenario: Scenario) -> list[Problem]:
    """What ``dropsim check`` points out about ``scenario`` without refusing it: settings that run as written
    but rest on an assumption a reader may not see."""
    found = []
    agg = scenario.aggregation
    if spec_of(agg).secure and agg.malicious and scenario.privacy.collusion == 0:
        found.append(
            Problem(
                scenario.origin("privacy", "collusion"),
                "privacy.collusion",
                "is 0: no colluders are assumed; the malicious variant's threshold is checked against a server "
                "alone, not against clients colluding with it (set it to the clients that may collude with the "
                "server: docs/security.md)",
            )
        )
    if scenario.model.factory is None and not trains_at_rate(scenario.model):  # a built-in's training
        try:
            costs = CostModel.load(cost_profile(scenario))
            shape, classes = data_shape(scenario.data, scenario.population, scenario.seed)
            estimate = estimate_training(costs, model_train_op(scenario.model, shape, classes), multiply_adds)
        except InputError:  # an unusable profile or data: preflight's problems, not a warning
            estimate = None
        if estimate is not None:
            found.append(Problem(scenario.origin("costs", "profile"), "costs.profile", estimate.note()))
    elsewhere = measured_elsewhere(scenario)
    if elsewhere:
        found.append(Problem(scenario.origin("costs", "profile"), "costs.profile", elsewhere))
    return found


def how_to_measure(emulation: str, doc: dict[str, object]) -> str:
    """How to measure this host's own profile for a testbed of ``emulation`` whose profile is ``doc``: the
    command that measured it (a simulation engine's implementation), or the kernel testbed's calibration."""
    if emulation == ENGINE:
        implementation = doc.get("implementation")
        measured_by = implementation.get("measured_by") if isinstance(implementation, dict) else None
        command = measured_by if isinstance(measured_by, str) else "dropsim profile --impl NAME"
        return (
            f"profile this host with `{command} --out here.json` (the implementation installed: docs/profiles.md) "
            "and simulate with --set costs.profile=here.json"
        )
    return (
        "calibrate this host with `dropsim calibrate --host --out host.json` (as root) and simulate with "
        '--set costs.profile=host.json (docs/deploy.md, "Calibrating a new host")'
    )


def measured_elsewhere(scenario: Scenario) -> str:
    """Where ``scenario`` models a testbed of one host (a kernel testbed, or a profile's simulation engine:
    ``testbed.emulation``) with a cost profile measured or calibrated on another machine (another processor
    or core count), a note saying so and how to measure this one; else empty. Such a profile's times are
    its machine's: the flower profile of a 2-core AMD EPYC under-estimated Flower's rounds on a 2-core
    Intel Xeon by 33 to 48%."""
    testbed = scenario.testbed
    if testbed is None or testbed.emulation not in (ENGINE, KERNEL):
        return ""
    try:
        doc = read_profile(resolve_profile(cost_profile(scenario)))
    except (InputError, OSError, ValueError):
        return ""  # an unusable profile: preflight's problem
    measured = doc.get("calibration", {}).get("host") or doc.get("machine") or {}
    if not isinstance(measured, dict) or "processor" not in measured:
        return ""
    here = host()
    if (measured.get("processor"), measured.get("cpus")) == (here["processor"], here["cpus"]):
        return ""
    return (
        f"was measured on a {measured.get('cpus')}-core {measured.get('processor')}, not this host (a "
        f"{here['cpus']}-core {here['processor']}): its times are that machine's; "
        + how_to_measure(testbed.emulation, doc)
    )


def check_all(scenarios: list[Scenario]) -> None:
    """Raise one :class:`ScenarioError` with the preflight problems of every scenario."""
    problems: list[Problem] = []
    for scenario in scenarios:
        for p in preflight(scenario):
            if (p.key, p.message) not in {(q.key, q.message) for q in problems}:
                problems.append(p)
    if problems:
        raise ScenarioError(problems)
