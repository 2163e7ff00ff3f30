"""Every registered protocol, privacy strategy and dropout mode keeps its interface.

Parametrised over the registries (:data:`sim.protocol.registry.PROTOCOLS`, :data:`sim.dp.strategies.STRATEGIES`,
:data:`sim.scenario.dropout_modes.MODES`): one registered later is checked by registering it. A protocol's
declared shape (steps, dropout stages, operations, pipeline shape) must match what its machines do in an
honest round, driven here by hand: the server's requests go to the clients, their answers back to the
server, and each step is closed once nobody is expected any more.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from sim.clients.dropout import DropoutModel
from sim.costs.model import CostModel
from sim.dp.strategies import ENCODED, NOTHING, SECURE, STRATEGIES, RoundNoise
from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import SERVER, ClientMachine, Reaction, ServerMachine
from sim.protocol.params import AFTER_SAMPLING, AggregationParams
from sim.protocol.registry import DRIVER_OPERATIONS, PROTOCOLS, register, spec_of
from sim.protocol.spec import ProtocolSpec, fixed_point
from sim.protocol.wire import Message
from sim.scenario.dropout_modes import MODES
from sim.scenario.types import Dropout
from sim.seeds import Stream, generator

SEED, ROUND, DIM = 7, 3, 8
SAMPLED = (1, 4, 6, 9, 12)


def _variants(spec: ProtocolSpec) -> list[AggregationParams]:
    """The protocol's default parameters, and its malicious variant where it has one."""
    variants = [AggregationParams(spec.name)]
    if spec.secure:
        variants.append(AggregationParams(spec.name, malicious=True))
    return variants


CASES = [
    pytest.param(params, id=f"{name}{'-malicious' if params.malicious else ''}")
    for name in PROTOCOLS
    for params in _variants(PROTOCOLS[name])
]


def _carry(message: Message) -> Message:
    """The message as the other side decodes it from the wire."""
    return wire.decode(message.encode())


class HonestRound:
    """One round's machines run to the end by hand, everybody answering everything."""

    def __init__(self, params: AggregationParams) -> None:
        self.params = params
        self.instances = RoundInstances(params, SEED, ROUND, SAMPLED, DIM)
        self.server: ServerMachine = self.instances.servers[0]
        self.clients: dict[int, ClientMachine] = {c: self.instances.client(c) for c in SAMPLED}
        rng = np.random.default_rng(0)
        self.updates = {c: rng.normal(0, 0.1, DIM).astype(np.float32) for c in SAMPLED}
        self.visited: list[str] = []
        """The server's steps, in the order it closed them."""
        self.collected: dict[str, list[Message]] = {}
        """Step -> the clients' messages the server received in it."""
        self.stages: set[str] = set()
        """What the clients' ``stage_of`` said of every server message they were handed."""
        self.ops: set[str] = set()
        """Every operation any machine reported."""
        self._to_server: list[tuple[int, Message]] = []
        self._to_clients: list[tuple[int, Message]] = []

    def _from_client(self, c: int, reaction: Reaction) -> None:
        self.ops.update(w.op for w in reaction.work)
        for send in reaction.sends:
            assert send.to == SERVER
            self._to_server.append((c, _carry(send.message)))

    def _from_server(self, reaction: Reaction) -> None:
        self.ops.update(w.op for w in reaction.work)
        for send in reaction.sends:
            assert send.to in self.clients
            self._to_clients.append((send.to, _carry(send.message)))

    def run(self) -> HonestRound:
        server = self.server
        self._from_server(server.begin())
        for c in SAMPLED:
            self._from_client(c, self.clients[c].start(self.updates[c], 1.0))
        while server.step not in ("done", "aborted"):
            step = server.step
            for c, message in self._to_server:
                assert c in server.expected(), f"client {c} answered in {step} unasked"
                self.collected.setdefault(step, []).append(message)
                self._from_server(server.receive(c, message))
            self._to_server.clear()
            assert not server.expected(), f"{step}: still waiting for {sorted(server.expected())}"
            self._from_server(server.close_step())
            self.visited.append(step)
            for c, message in self._to_clients:
                self.stages.add(self.clients[c].stage_of(message))
                self._from_client(c, self.clients[c].receive(message))
            self._to_clients.clear()
        return self


# -------------------------------------------------------------------------------------------- protocols


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_the_declared_shape_is_consistent(name: str) -> None:
    spec = PROTOCOLS[name]
    assert spec.name == name
    assert spec.steps and len(set(spec.steps)) == len(spec.steps)
    assert set(spec.optional_steps) <= set(spec.steps)
    assert set(spec.optional_stages) <= set(spec.dropout_stages)
    default = AggregationParams(name)
    steps = iter(spec.steps)
    assert all(step in steps for step in spec.steps_for(default)), "steps_for is not a subsequence of steps"
    for strategy in STRATEGIES:
        for variant in _variants(spec):
            params = AggregationParams(name, malicious=variant.malicious, strategy=strategy)
            steps_for = spec.steps_for(params)
            assert steps_for and set(steps_for) <= set(spec.steps)
            assert spec_of(params) is spec
            stages = spec.dropout_stages_for(params)
            assert stages[AFTER_SAMPLING] == ""
            assert all(step == "" or step in steps_for for step in stages.values()), stages
            assert spec.after_upload(params) <= set(steps_for)
    if spec.pipeline is not None:
        assert spec.pipeline.first_step == spec.steps[0]
        assert spec.pipeline.aggregate_from in spec.steps
        assert spec.pipeline.aggregate_from != spec.pipeline.first_step


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_the_operations_are_in_the_shipped_profile(name: str) -> None:
    costs = CostModel.load(None)  # a scenario's costs.profile when it names none: the shipped sim/costs/default.json
    missing = [op for op in (*PROTOCOLS[name].operations, *DRIVER_OPERATIONS) if not costs.has(op)]
    assert not missing, f"{name}: the shipped profile does not measure {missing}"


@pytest.mark.parametrize("params", CASES)
def test_an_honest_round_ends_done_with_the_exact_aggregate(params: AggregationParams) -> None:
    spec = spec_of(params)
    steps = spec.steps_for(params)
    run = HonestRound(params)
    assert all(machine.first_step == steps[0] for machine in run.clients.values())
    run.run()
    server = run.server
    assert server.step == "done", server.outcome
    assert run.visited == list(steps)
    assert run.stages <= set(steps)
    assert run.ops <= set(spec.operations), f"unlisted operations {run.ops - set(spec.operations)}"
    aggregate = server.aggregate
    assert aggregate is not None and aggregate.survivors == SAMPLED
    vector = np.asarray(aggregate.vector)
    if spec.encoded:
        enc = fixed_point(params, len(SAMPLED))
        encodings = [enc.encode(run.updates[c], generator(SEED, Stream.ENCODING, ROUND, c)) for c in SAMPLED]
        total = sum(e.astype(np.int64) for e in encodings) % (1 << params.bits)
        assert np.array_equal(vector, enc.decode_mean(total.astype(np.uint32), len(SAMPLED)))
        clipped = [run.updates[c] * min(1.0, params.clip / np.linalg.norm(run.updates[c])) for c in SAMPLED]
        assert np.abs(vector - np.mean(clipped, axis=0)).max() < 1 / enc.scale
    else:
        expected = sum(np.float64(1.0) * run.updates[c].astype(np.float64) for c in SAMPLED) / len(SAMPLED)
        assert np.array_equal(vector, expected.astype(np.float32))


@pytest.mark.parametrize("params", [p for p in CASES if spec_of(p.values[0]).pipeline is not None])
def test_the_pipeline_shape_matches_the_machines(params: AggregationParams) -> None:
    spec = spec_of(params)
    shape = spec.pipeline
    assert shape is not None
    run = HonestRound(params).run()
    assert shape.first_step == spec.steps_for(params)[0]
    assert shape.aggregate_from in spec.steps_for(params)
    uploads = run.collected[shape.aggregate_from]
    assert any(isinstance(m, shape.upload) for m in uploads), f"no {shape.upload.__name__} in {shape.aggregate_from}"
    assert not any(
        isinstance(m, shape.upload) for step, ms in run.collected.items() if step != shape.aggregate_from for m in ms
    )


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_a_protocol_is_registered_once(name: str) -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(PROTOCOLS[name])


# ------------------------------------------------------------------------------------------- strategies


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize(("n", "tolerance", "collusion"), [(1, 0, 0), (5, 0, 0), (10, 4, 0), (10, 7, 2), (33, 16, 3)])
def test_a_strategy_keeps_the_interface(name: str, n: int, tolerance: int, collusion: int) -> None:
    strategy = STRATEGIES[name]
    assert strategy.name == name
    assert strategy.requires in (NOTHING, ENCODED, SECURE)
    assert any(spec.supports(strategy) for spec in PROTOCOLS.values()), f"no protocol runs {name}"
    threshold = n // 2 + 1 if collusion else 0
    plan = RoundNoise(name, 0.5, n, tolerance, threshold, collusion, guessed_dropout=0.3)
    assert plan.strategy == name and plan.spec is strategy
    assert plan.components and all(v >= 0 for v in plan.components)
    assert plan.server >= 0
    assert plan.residual(0) >= 0 and plan.accounted(0) >= 0
    assert not strategy.enabled or plan.added > 0 or plan.server > 0
    for d in range(n + 1):
        removed = plan.removed(d)
        assert len(set(removed)) == len(removed) and all(1 <= k <= plan.removable for k in removed)
        assert strategy.removes or not removed
        assert plan.residual(d) >= 0 and plan.accounted(d) >= 0
    assert isinstance(plan.largest_residual, Fraction)


# ---------------------------------------------------------------------------------------- dropout modes


@pytest.mark.parametrize("name", list(MODES))
def test_a_dropout_mode_drops_sampled_clients_deterministically(name: str) -> None:
    mode = MODES[name]
    assert mode.name == name
    config = Dropout(name, 0.4, "before_upload", False, {"high": 0.9, "high_fraction": 0.5, "low": (0.0, 0.3)})
    sampled = np.array([3, 8, 11, 20, 21, 40, 55, 60, 71, 99])
    first, again, other = (DropoutModel(config, 100, seed) for seed in (5, 5, 6))
    plans = [first.plan(r, sampled) for r in range(1, 6)]
    assert plans == [again.plan(r, sampled) for r in range(1, 6)]
    for plan in plans:
        assert set(plan) <= set(sampled.tolist()) and set(plan.values()) <= {"before_upload"}
    assert any(plans), f"{name} never dropped anyone at rate 0.4"
    assert mode.can_drop(config)
    assert isinstance(other.plan(1, sampled), dict)
