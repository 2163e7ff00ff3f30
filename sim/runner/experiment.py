"""A run, round by round, through any driver: plan each round, have the driver play it, account it.

The round plan (:class:`sim.round.plan.RoundPlan`) comes from the scenario's seeded streams: the sample
(among the clients online, under a trace with ``sample_from: online``), the planned dropouts, the
clients' offline times and the privacy plan. The driver (:class:`sim.round.driver.Driver`: the simulator,
the deployment) plays it and returns its record. Then the run accounts the privacy the round spent,
applies the aggregate to the model and evaluates it. Evaluation is the experimenter's measurement, not
part of the protocol, and takes no time on the driver's clock.

``pipeline.chunks: auto`` is resolved here, before any driver exists (:mod:`sim.runner.chunks`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sim.clients.sampling import sample_clients
from sim.costs.model import CostModel
from sim.protocol.machine import RoundSetupError
from sim.round.driver import Driver
from sim.round.plan import RoundPlan
from sim.round.privacy import PrivacyLedger, nominal_sampling
from sim.round.records import RoundPrivacy, RoundRecord, RoundResult
from sim.runner.chunks import ChunkPlan, plan_chunks
from sim.scenario.types import Scenario
from sim.world import World, build

if TYPE_CHECKING:
    import simpy

    from sim.clients.population import Population
    from sim.deploy.deployment import Deployment, DeployOptions
    from sim.engine.simulator import Simulator
    from sim.engine.virtual_round import RoundSetup
    from sim.learning.federated import FederatedData
    from sim.learning.trainer import Learner

DriverFactory = Callable[[World], Driver]
"""What builds a run's driver from its world (e.g. :class:`sim.engine.simulator.Simulator`)."""


class Experiment:
    """Everything one run holds; :meth:`step` plays the next round through ``driver``."""

    def __init__(self, scenario: Scenario, driver: DriverFactory) -> None:
        self.world = world = build(scenario)
        self.chunk_plan: ChunkPlan | None = None
        """How ``pipeline.chunks: auto`` chose (None otherwise)."""
        try:
            if scenario.pipeline is not None and scenario.pipeline.chunks is None:
                self.chunk_plan = plan_chunks(scenario, world.dim)
                pipeline = dataclasses.replace(scenario.pipeline, chunks=self.chunk_plan.chunks)
                scenario = world.scenario = dataclasses.replace(scenario, pipeline=pipeline)
            self.scenario = sc = scenario
            self.privacy: PrivacyLedger | None = None
            if sc.privacy.enabled:  # planned before any driver exists: a budget no noise meets fails here
                q, nominal = nominal_sampling(sc)
                self.privacy = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, nominal, world.dim, sc.seed)
            self.driver: Driver = driver(world)
        except BaseException:
            world.close()
            raise
        self.round = 0
        self._exhausted = ""

    @property
    def dim(self) -> int:
        """Number of model parameters (the length of every update)."""
        return self.world.dim

    @property
    def costs(self) -> CostModel:
        return self.world.costs

    @property
    def learner(self) -> Learner | None:
        """The real model (``full`` and ``learning`` fidelity), or None."""
        return self.world.learner

    @property
    def population(self) -> Population:
        return self.world.population

    @property
    def data(self) -> FederatedData:
        return self.world.data

    @property
    def chunks(self) -> int | None:
        """Chunks of a pipelined round (None: not pipelined)."""
        return self.scenario.pipeline.chunks if self.scenario.pipeline is not None else None

    def manifest_entries(self) -> dict[str, object]:
        return self.driver.manifest_entries()

    def close(self) -> None:
        """Release the driver (processes, sockets) and the model's training workers."""
        try:
            self.driver.close()
        finally:
            self.world.close()

    def _online(self) -> np.ndarray:
        """The clients online now; when nobody is, the server waits for the next one to come online."""
        availability = self.world.availability
        assert availability is not None
        now = self.driver.now
        online = availability.online(now)
        if online.size == 0:
            later = availability.next_online(now)
            if later < float("inf"):
                self.driver.wait_until(later + 1e-9)
                online = availability.online(self.driver.now)
            else:
                hours = availability.trace_time(now) / 3600
                self._exhausted = f"no client of the trace is online after trace hour {hours:.2f}"
        return online

    @property
    def stopped(self) -> str:
        """Why training stopped before its last round (``early``'s budget, the end of the trace replay), or
        empty."""
        if self.privacy is not None and self.privacy.stopped:
            return self.privacy.stopped
        if self._exhausted:
            return self._exhausted
        replay, availability = self.scenario.trace, self.world.availability
        if availability is not None and replay is not None and replay.until_hours is not None:
            hours = availability.trace_time(self.driver.now) / 3600
            if hours >= replay.until_hours:
                return f"the trace replay reached hour {hours:.2f} (trace.until_hours {replay.until_hours:g})"
        return ""

    def plan(self) -> tuple[RoundPlan, int]:
        """Plan the next round (numbered from 1): the plan and how many clients the server could sample
        from."""
        self.round += 1
        sc, r, availability = self.scenario, self.round, self.world.availability
        offline: dict[int, float] = {}
        available: np.ndarray | int = sc.population  # everyone, never listed
        online = sc.population
        by_trace = availability is not None and sc.trace is not None and sc.trace.sample_from == "online"
        if availability is not None:
            # sample_from: population samples everyone; a sampled client offline now leaves at once
            online_now = self._online() if by_trace else availability.online(self.driver.now)
            online = len(online_now)
            if by_trace:
                available = online_now
        sampled = sample_clients(available, sc.sampling, sc.seed, r)
        if availability is not None:
            now = self.driver.now
            offline = {int(c): availability.offline_at(int(c), now) for c in sampled}
        drops = self.world.dropout.plan(r, sampled)
        private = None
        refused = ""
        rate = None
        if by_trace and sc.sampling.clients_per_round is not None and online:
            # k of the clients online now: each had chance k / online, the others 0 (Hyades Theorem 1: the
            # round is accounted at that upper rate)
            rate = min(1.0, sc.sampling.clients_per_round / online)
        if self.privacy is not None and len(sampled):
            try:
                _, private = self.privacy.round(r, len(sampled), rate)
            except RoundSetupError as exc:  # e.g. too few clients this round for the collusion tolerance
                refused = str(exc)
        chosen = tuple(int(c) for c in sampled)
        plan = RoundPlan(r, chosen, drops, private, refused, offline, rate, self.chunks)
        return plan, online

    def step(self) -> RoundResult:
        """Play the next round and return what happened."""
        plan, online = self.plan()
        record = self.driver.play(plan)
        record.online = online  # at the round's start (without a trace: everyone)
        return self.conclude(plan, record)

    def conclude(self, plan: RoundPlan, record: RoundRecord) -> RoundResult:
        """Account a played round, apply its aggregate to the model and evaluate it."""
        sc, r = self.scenario, plan.number
        privacy: RoundPrivacy | None = None
        if self.privacy is not None:
            private = plan.private
            if private is not None and not plan.refused:
                # A sum unmasked before an abort (XNoise's noise removal short of shares) was seen: it is
                # accounted as if every excess component had been removed (it had more noise: conservative).
                revealed = record.exposed
                if record.exposures:  # a pipelined round: the chunk whose release costs the most
                    revealed = self.privacy.worst_exposure(
                        private.plan, private.encoding.scale, record.exposures, plan.rate
                    )
                privacy = self.privacy.account(private.plan, private.encoding.scale, revealed, plan.rate)
            else:
                privacy = self.privacy.account_empty()
        accuracy = loss = math.nan
        digest = ""
        learner = self.world.learner
        if learner is not None:
            if record.aggregate is not None:
                assert isinstance(record.aggregate.vector, np.ndarray)
                learner.apply(record.aggregate.vector)
            if r % sc.evaluation.every == 0 or r == sc.rounds or self.stopped:
                accuracy, loss = learner.evaluate()
            digest = learner.model_sha256()
        return RoundResult(record, accuracy, loss, digest, privacy)


class Simulation(Experiment):
    """A run in virtual time: an :class:`Experiment` through the simulator (``observe``: see
    :class:`~sim.engine.simulator.Simulator`)."""

    driver: Simulator

    def __init__(self, scenario: Scenario, observe: Callable[..., None] | None = None) -> None:
        # deferred: the engine loads simpy, which a deployed run never needs
        from sim.engine.simulator import Simulator

        super().__init__(scenario, lambda world: Simulator(world, observe))

    @property
    def env(self) -> simpy.Environment:
        """The simulator's SimPy environment (its ``now``: virtual seconds)."""
        return self.driver.env

    @property
    def setup(self) -> RoundSetup:
        """What the simulator's rounds share."""
        return self.driver.setup


class Deployed(Experiment):
    """A run over real sockets: an :class:`Experiment` through the deployment
    (:class:`~sim.deploy.deployment.Deployment`: the server here, the clients in worker processes)."""

    driver: Deployment

    def __init__(self, scenario: Scenario, options: DeployOptions | None = None) -> None:
        # deferred: the socket deployment (asyncio, its worker, the kernel testbed), which a simulated run never needs
        from sim.deploy.deployment import Deployment, check_deployable

        check_deployable(scenario)  # before the data and the model are loaded
        super().__init__(scenario, lambda world: Deployment(world, options))
