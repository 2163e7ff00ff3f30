"""A run: the population, the SimPy world and the model, advanced one round at a time.

The server's clock runs continuously across rounds: round r+1 starts (samples its clients) the moment
round r ends. Each round's sample and dropouts come from their own seeded streams, so ``full`` and
``timing`` fidelity (which skips training and all payload arithmetic) produce identical virtual times.
Evaluation of the global model is the experimenter's measurement, not part of the protocol, and takes no
virtual time. With a ``testbed`` section every party's compute shares the host's cores
(:mod:`sim.engine.host`), one pool for the whole run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

from sim.costs.model import CostModel, LinearCost
from sim.engine.availability import Availability
from sim.engine.dropout import DropoutModel
from sim.engine.host import SharedCores
from sim.engine.network import Link, Network
from sim.engine.pipelined import PipelinedRound
from sim.engine.population import Population
from sim.engine.privacy import PrivacyLedger, RoundPrivacy, nominal_sampling
from sim.engine.round import CALL_OP, MBPS, TRANSPORT_OPS, PipelineParams, Round, RoundRecord, RoundSetup
from sim.engine.sampling import sample_clients
from sim.learning.federated import load_federated
from sim.learning.models import model_train_op, update_dimension
from sim.learning.trainer import Learner
from sim.protocol.machine import RoundSetupError
from sim.protocol.private import PrivateRound
from sim.scenario.schema import Scenario

if TYPE_CHECKING:
    from sim.pipeline.planner import ChunkPlan


@dataclass
class RoundResult:
    """A finished round with the model's state after it."""

    record: RoundRecord
    accuracy: float
    loss: float
    model_sha256: str
    privacy: RoundPrivacy | None = None


class Simulation:
    """Everything one run holds; :meth:`step` simulates the next round."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = sc = scenario
        self.population = Population.build(sc.population, sc.clients, sc.seed)
        self.availability: Availability | None = None
        self._exhausted = ""
        if sc.trace is not None:
            from sim.traces.io import check_clients, load_trace

            trace = load_trace(sc.trace.file)
            check_clients(trace, sc.population, sc.origin("trace", "file"))
            self.availability = Availability(trace, sc.population, sc.trace.offset_hours * 3600, sc.trace.time_scale)
            if sc.trace.capacity:
                self.population = self.population.with_capacity(
                    trace.clients, trace.compute_ms_per_sample, trace.bandwidth_kbps
                )
        self.dropout = DropoutModel(sc.dropout, sc.population, sc.seed)
        self.costs = CostModel.load(sc.cost_profile)
        self.data = load_federated(sc.data, sc.population, sc.seed)
        self.learner: Learner | None = None
        if sc.fidelity == "full":
            assert sc.model.name is not None  # the parser allows model.params only with fidelity timing
            self.learner = Learner(sc.model.name, self.data, sc.training, sc.seed, (sc.data, sc.population, sc.seed))
        shape, classes = self.data.input_shape, self.data.num_classes
        dim = self.learner.dim if self.learner is not None else update_dimension(sc.model, shape, classes)
        op = model_train_op(sc.model, shape, classes)
        if sc.model.params is not None:  # an abstract model trains at the scenario's rate, not a profiled one
            rate = LinearCost({"samples": sc.model.train_seconds_per_sample})
            self.costs = CostModel({**self.costs.operations, op: rate}, self.costs.machine, self.costs.source)
        self.costs.seconds(op, {})  # fail now, not mid-run, if the profile lacks this model
        if sc.testbed is not None and sc.testbed.cpu_scale != 1.0:  # the profile's costs as a deployed party's
            self.costs = self.costs.scaled(sc.testbed.cpu_scale, keep=(*TRANSPORT_OPS, CALL_OP))
        self.env = simpy.Environment()
        self.network = Network(self.env)
        bps = sc.server.bandwidth_mbps * MBPS
        self.setup = RoundSetup(
            env=self.env,
            network=self.network,
            server_up=Link("server.up", bps, shared=True),
            server_down=Link("server.down", bps, shared=True),
            population=self.population,
            costs=self.costs,
            server_speed=sc.server.speed,
            timeouts=sc.timeouts,
            silent_dropout=sc.dropout.silent,
            dim=dim,
            train_op=op,
            local_epochs=sc.training.local_epochs,
            batch_size=sc.training.batch_size,
            samples=self.data.num_samples,
            learner=self.learner,
            aggregation=sc.aggregation,
            seed=sc.seed,
            latency_s=sc.server.latency_ms / 1000,
            host=SharedCores(self.env, sc.testbed.cores) if sc.testbed is not None else None,
        )
        if sc.testbed is not None:  # the testbed's own costs: fail now, not mid-run, if the profile lacks them
            for op in TRANSPORT_OPS:
                self.costs.seconds(op, {"bytes": 1.0})
            self.setup.call_s = self.costs.seconds(CALL_OP, {})
        self.chunk_plan: ChunkPlan | None = None
        """How ``pipeline.chunks: auto`` chose (None otherwise)."""
        if sc.pipeline is not None:
            chunks = sc.pipeline.chunks if sc.pipeline.chunks is not None else self._auto_chunks()
            self.setup.pipeline = PipelineParams(chunks, sc.pipeline.dispatch, sc.pipeline.links == "duplex")
        self._everyone = np.arange(sc.population, dtype=np.int64)
        self.round = 0
        self.privacy: PrivacyLedger | None = None
        if sc.privacy.enabled:
            q, nominal = nominal_sampling(sc)
            self.privacy = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, nominal, dim, sc.seed)

    def _online(self) -> np.ndarray:
        """The clients online now; when nobody is, the server waits for the next one to come online."""
        assert self.availability is not None
        online = self.availability.online(self.env.now)
        if online.size == 0:
            later = self.availability.next_online(self.env.now)
            if later < float("inf"):
                self.env.run(until=later + 1e-9)
                online = self.availability.online(self.env.now)
            else:
                hours = self.availability.trace_time(self.env.now) / 3600
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
        replay = self.scenario.trace
        if self.availability is not None and replay is not None and replay.until_hours is not None:
            hours = self.availability.trace_time(self.env.now) / 3600
            if hours >= replay.until_hours:
                return f"the trace replay reached hour {hours:.2f} (trace.until_hours {replay.until_hours:g})"
        return ""

    def _auto_chunks(self) -> int:
        """``pipeline.chunks: auto``: the chunk count the fitted performance model predicts fastest."""
        from sim.pipeline.planner import plan_chunks

        self.chunk_plan = plan_chunks(self.scenario, self.setup.dim)
        return self.chunk_plan.chunks

    def _play(
        self,
        r: int,
        sampled: np.ndarray,
        drops: dict[int, str],
        private: PrivateRound | None,
        refused: str,
        offline: dict[int, float],
    ) -> RoundRecord:
        """Run round ``r`` (in virtual time here; over sockets in :class:`sim.deploy.deployment.Deployment`)."""
        kind = PipelinedRound if self.setup.pipeline is not None else Round
        process = self.env.process(kind(self.setup, r, sampled, drops, private, refused, offline).run())
        self.env.run(until=process)
        record = process.value
        assert isinstance(record, RoundRecord)
        return record

    def manifest_entries(self) -> dict[str, object]:
        """What this driver adds to the run's manifest (none for the simulator)."""
        return {}

    def close(self) -> None:
        """Release what the run holds (in virtual time, the training workers; the deployment's processes and
        sockets)."""
        if self.learner is not None:
            self.learner.close()

    @property
    def dim(self) -> int:
        """Number of model parameters (the length of every update)."""
        return self.setup.dim

    def step(self) -> RoundResult:
        """Simulate the next round (numbered from 1) and return what happened."""
        self.round += 1
        sc, r = self.scenario, self.round
        offline: dict[int, float] = {}
        available = online = self._everyone
        by_trace = self.availability is not None and sc.trace is not None and sc.trace.sample_from == "online"
        if self.availability is not None:
            # sample_from: population samples everyone; a sampled client offline now leaves at once
            online = self._online() if by_trace else self.availability.online(self.env.now)
            available = online if by_trace else self._everyone
        sampled = sample_clients(available, sc.sampling, sc.seed, r)
        if self.availability is not None:
            offline = {int(c): self.availability.offline_at(int(c), self.env.now) for c in sampled}
        drops = self.dropout.plan(r, sampled)
        plan = private = None
        refused = ""
        rate = None
        if by_trace and sc.sampling.clients_per_round is not None and len(available):
            # k of the clients online now: each had chance k / online, the others 0 (Hyades Theorem 1: the
            # round is accounted at that upper rate)
            rate = min(1.0, sc.sampling.clients_per_round / len(available))
        if self.privacy is not None and len(sampled):
            try:
                plan, private = self.privacy.round(r, len(sampled), rate)
            except RoundSetupError as exc:  # e.g. too few clients this round for the collusion tolerance
                refused = str(exc)
        record = self._play(r, sampled, drops, private, refused, offline)
        record.online = len(online)  # at the round's start (without a trace: everyone)
        privacy = None
        if self.privacy is not None:
            if plan is not None and private is not None and not refused:
                # A sum unmasked before an abort (XNoise's noise removal short of shares) was seen: it is
                # accounted as if every excess component had been removed (it had more noise: conservative).
                revealed = record.exposed
                if record.exposures:  # a pipelined round: the chunk whose release costs the most
                    revealed = self.privacy.worst_exposure(plan, private.encoding.scale, record.exposures, rate)
                privacy = self.privacy.account(plan, private.encoding.scale, revealed, rate)
            else:
                privacy = self.privacy.account_empty()
        accuracy = loss = math.nan
        digest = ""
        if self.learner is not None:
            if record.aggregate is not None:
                assert isinstance(record.aggregate.vector, np.ndarray)
                self.learner.apply(record.aggregate.vector)
            if r % sc.evaluation.every == 0 or r == sc.rounds or self.stopped:
                accuracy, loss = self.learner.evaluate()
            digest = self.learner.model_sha256()
        return RoundResult(record, accuracy, loss, digest, privacy)
