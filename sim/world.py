"""What a run is made of, whatever driver plays its rounds: the scenario's population, availability,
dropout plan, cost model, federated data and model.

:func:`build` makes it from a scenario once per run. The runner plans rounds with it
(:mod:`sim.runner.experiment`), the simulator charges its costs and trains its model
(:class:`sim.engine.simulator.Simulator`), and a deployment's server updates the same model
(:class:`sim.deploy.deployment.Deployment`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import footprint
from sim.clients.availability import Availability
from sim.clients.dropout import DropoutModel
from sim.clients.population import Population
from sim.costs.estimate import TrainingEstimate, estimate_training
from sim.costs.model import CostModel, LinearCost
from sim.learning.federated import FederatedData, load_federated
from sim.learning.flops import multiply_adds
from sim.learning.models import model_train_op, trains_at_rate, update_dimension
from sim.learning.trainer import Learner
from sim.scenario.types import Scenario
from sim.testbed import clients_per_round, cost_profile, is_engine, is_kernel, run_dilation

TRANSPORT_OPS = ("deploy.send", "deploy.receive")
"""Cost-model operations of the testbed's sockets per message (:mod:`sim.profiling.transport`): the sender's
framing and writing, the receiver's reading and checking, each a job on the host's cores while the bytes
flow."""
CALL_OP = "deploy.call"
"""Cost-model operation of handing one computation to a party's compute thread on the testbed."""
RESTART_OP = "deploy.restart"
"""Cost-model operation of the CPU a party's computations take more, together, after each CFS period in
which its quota held them back, on the kernel testbed (feature ``count``: throttled periods;
:class:`sim.engine.host.Pool`). A profile without it charges none; ``dropsim calibrate`` fits it on the
throttles a deployment counted (``throttles.csv``)."""


@dataclass
class World:
    """One run's parts (built by :func:`build`)."""

    scenario: Scenario
    population: Population
    availability: Availability | None
    """Replayed availability (a ``trace`` section), or None."""
    dropout: DropoutModel
    costs: CostModel
    data: FederatedData
    learner: Learner | None
    """The real model (``full`` and ``learning`` fidelity), or None (``timing``)."""
    dim: int
    """Number of model parameters (the length of every update)."""
    train_op: str
    """The cost-model operation of local training."""
    dilation: float = 1.0
    """f, the kernel testbed's time dilation (``testbed.emulation: kernel``; 1 otherwise): a client of
    slow-down s computes on f / s of a core, the server on f times its speed (:mod:`sim.testbed`)."""
    training_estimate: TrainingEstimate | None = None
    """How ``train_op`` is charged where the profile does not measure it: estimated from a measured shape of
    the same built-in model (:mod:`sim.costs.estimate`); None where it is measured, or trains at a rate."""

    def close(self) -> None:
        """Stop the model's training workers."""
        if self.learner is not None:
            self.learner.close()


def build(scenario: Scenario) -> World:
    """The parts of a run of ``scenario``; raises what a bad trace, data folder or cost profile raises."""
    sc = scenario
    footprint.check(sc)  # before a trace is read or a round is sampled
    population = Population.build(sc.population, sc.clients, sc.seed)
    availability: Availability | None = None
    if sc.trace is not None:
        # deferred: sim.traces.io loads pandas; this module stays importable without it
        from sim.traces.io import check_clients, load_trace

        trace = load_trace(sc.trace.file)
        check_clients(trace, sc.population, sc.origin("trace", "file"))
        availability = Availability(trace, sc.population, sc.trace.offset_hours * 3600, sc.trace.time_scale)
        if sc.trace.capacity:
            population = population.with_capacity(trace.clients, trace.compute_ms_per_sample, trace.bandwidth_kbps)
    dropout = DropoutModel(sc.dropout, sc.population, sc.seed)
    costs = CostModel.load(cost_profile(sc))
    data = load_federated(sc.data, sc.population, sc.seed)
    learner: Learner | None = None
    if sc.fidelity in ("full", "learning"):
        assert sc.model.params is None  # the parser allows model.params only with fidelity timing
        learner = Learner(sc.model, data, sc.training, sc.seed, (sc.data, sc.population, sc.seed))
    shape, classes = data.input_shape, data.num_classes
    dim = learner.dim if learner is not None else update_dimension(sc.model, shape, classes)
    if learner is not None:  # the sampled clients' updates, now that their size is known
        footprint.check(sc, dim, trace=False)
    op = model_train_op(sc.model, shape, classes)
    if trains_at_rate(sc.model):  # an abstract model (or a factory's given one) trains at the scenario's rate
        costs = costs.with_operations({op: LinearCost({"samples": sc.model.train_seconds_per_sample})})
    estimate = estimate_training(costs, op, multiply_adds) if sc.model.factory is None else None
    if estimate is not None:  # a built-in model at a shape the profile has not measured
        costs = estimate.applied(costs)
    costs.seconds(op, {})  # fail now, not mid-run, if the profile lacks this model
    if sc.testbed is not None and sc.testbed.cpu_scale != 1.0:  # the profile's costs as a deployed party's
        costs = costs.scaled(sc.testbed.cpu_scale, keep=(*TRANSPORT_OPS, CALL_OP, RESTART_OP))
    if is_engine(sc) and costs.engine is not None:  # the parties' work inside the engine's processes
        costs = costs.inside_engine()
    f = run_dilation(sc, population.slowdown.smallest(clients_per_round(sc))) if is_kernel(sc) else 1.0
    return World(sc, population, availability, dropout, costs, data, learner, dim, op, f, estimate)
