"""A run: the population, the SimPy world and the model, advanced one round at a time.

The server's clock runs continuously across rounds: round r+1 starts (samples its clients) the moment
round r ends. Each round's sample and dropouts come from their own seeded streams, so ``full`` and
``timing`` fidelity (which skips training and all payload arithmetic) produce identical virtual times.
Evaluation of the global model is the experimenter's measurement, not part of the protocol, and takes no
virtual time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from sim.costs.model import CostModel
from sim.engine.dropout import DropoutModel
from sim.engine.network import Link, Network
from sim.engine.population import Population
from sim.engine.privacy import PrivacyLedger, RoundPrivacy
from sim.engine.round import MBPS, Round, RoundRecord, RoundSetup
from sim.engine.sampling import sample_clients
from sim.learning.federated import load_federated
from sim.learning.models import count_parameters, train_op
from sim.learning.trainer import Learner
from sim.protocol.machine import RoundSetupError
from sim.scenario.schema import Scenario


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
        self.dropout = DropoutModel(sc.dropout, sc.population, sc.seed)
        self.costs = CostModel.load(sc.cost_profile)
        self.data = load_federated(sc.data, sc.population, sc.seed)
        self.learner = Learner(sc.model.name, self.data, sc.training, sc.seed) if sc.fidelity == "full" else None
        shape, classes = self.data.input_shape, self.data.num_classes
        dim = self.learner.dim if self.learner is not None else count_parameters(sc.model.name, shape, classes)
        op = train_op(sc.model.name, shape, classes)
        self.costs.seconds(op, {})  # fail now, not mid-run, if the profile lacks this model
        self.env = simpy.Environment()
        self.network = Network(self.env)
        bps = sc.server.bandwidth_mbps * MBPS
        self.setup = RoundSetup(
            env=self.env,
            network=self.network,
            server_up=Link("server.up", bps),
            server_down=Link("server.down", bps),
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
        )
        self._everyone = np.arange(sc.population, dtype=np.int64)
        self.round = 0
        self.privacy: PrivacyLedger | None = None
        if sc.privacy.enabled:
            k, rate = sc.sampling.clients_per_round, sc.sampling.rate
            q = k / sc.population if k is not None else float(rate or 0.0)
            nominal = k if k is not None else max(1, round(q * sc.population))
            self.privacy = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, nominal, dim, sc.seed)

    @property
    def stopped(self) -> str:
        """Why training stopped before its last round (``early``'s budget), or empty."""
        return self.privacy.stopped if self.privacy is not None else ""

    @property
    def dim(self) -> int:
        """Number of model parameters (the length of every update)."""
        return self.setup.dim

    def step(self) -> RoundResult:
        """Simulate the next round (numbered from 1) and return what happened."""
        self.round += 1
        sc, r = self.scenario, self.round
        sampled = sample_clients(self._everyone, sc.sampling, sc.seed, r)
        drops = self.dropout.plan(r, sampled)
        plan = private = None
        refused = ""
        if self.privacy is not None and len(sampled):
            try:
                plan, private = self.privacy.round(r, len(sampled))
            except RoundSetupError as exc:  # e.g. too few clients this round for the collusion tolerance
                refused = str(exc)
        process = self.env.process(Round(self.setup, r, sampled, drops, private, refused).run())
        self.env.run(until=process)
        record = process.value
        assert isinstance(record, RoundRecord)
        privacy = None
        if self.privacy is not None:
            if plan is not None and private is not None and not refused:
                # A sum unmasked before an abort (XNoise's noise removal short of shares) was seen: it is
                # accounted as if every excess component had been removed (it had more noise: conservative).
                privacy = self.privacy.account(plan, private.encoding.scale, record.exposed)
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
