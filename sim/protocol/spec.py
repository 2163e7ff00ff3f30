"""What the registry (:mod:`sim.protocol.registry`) knows of an aggregation protocol: its :class:`ProtocolSpec`.

A protocol's entry declares its server's collection steps (the keys of ``timeouts:``) and which of them exist
only under some settings (:class:`Condition`), the ``dropout.stage`` values it supports and the client step
each precedes, whether updates are fixed-point encoded, whether it is secure aggregation (masks with
secret-shared seeds: distributed-DP strategies, the malicious adversary and collusion tolerance apply), the
cost-model operations its machines report, the shape of its pipelined rounds (:class:`PipelineShape`, or
None if it cannot be pipelined), how it builds one round's machines, and its part of the scenario checks.
Each protocol defines its entry in its own module (a subclass of :class:`ProtocolSpec` where it builds
machines or checks more); the registry registers the built-in ones. Nothing here imports a protocol or the
registry: the imports run one way, params <- spec <- the protocols <- registry, and what a check says of the
other protocols (``needs protocol secagg or secagg+``) it reads from the ``registered`` protocols it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.dp.strategies import ENCODED, SECURE, STRATEGIES, Strategy, strategy_named
from sim.protocol import graph
from sim.protocol.encoding import FixedPoint
from sim.protocol.params import AFTER_SAMPLING, AggregationParams

if TYPE_CHECKING:
    import numpy as np

    from sim.crypto.randomness import RandomSource
    from sim.protocol.machine import ClientMachine, ServerMachine
    from sim.protocol.private import PrivateRound
    from sim.protocol.suite import Suite
    from sim.protocol.wire import Data, Message

Fail = Callable[[str, str], None]
"""``fail(key, message)``: report a problem with ``key`` of the scenario section being checked."""

ENCODED_OPERATIONS = ("encode.fixed_point", "decode.fixed_point", "vector.add")
"""Operations of the fixed-point encoding and of summing encodings (every encoded protocol)."""
DP_OPERATIONS = ("encode.dskellam", "decode.dskellam", "noise.skellam", "noise.gaussian", "noise.dgaussian")
"""Operations of distributed DP (:mod:`sim.protocol.private`), for protocols that can add noise."""

ClientFactory = Callable[[int, "RandomSource", "np.random.Generator | None", "Data | None"], "ClientMachine"]
"""``(client, key randomness, encoding randomness, signing key) -> machine``."""


def either(names: Sequence[str], last: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c``: names as a sentence lists them."""
    if len(names) < 2:
        return "".join(names)
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


def protocols_where(registered: Mapping[str, ProtocolSpec], has: Callable[[ProtocolSpec], bool]) -> tuple[str, ...]:
    """Names of the ``registered`` protocols with a property (in registration order), for messages."""
    return tuple(name for name, spec in registered.items() if has(spec))


@dataclass(frozen=True)
class ChunkSlot:
    """Chunk ``index`` of ``count``: values ``[start, stop)`` of the encoded update."""

    index: int
    count: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def chunk_slots(length: int, count: int) -> tuple[ChunkSlot, ...]:
    """``length`` values cut into ``count`` contiguous chunks whose lengths differ by at most one (the first
    ``length % count`` are one longer)."""
    if not 1 <= count <= length:
        raise ValueError(f"cannot cut {length} values into {count} chunks")
    base, extra = divmod(length, count)
    slots, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        slots.append(ChunkSlot(i, count, start, stop))
        start = stop
    return tuple(slots)


def fixed_point(params: AggregationParams, n: int) -> FixedPoint:
    """The fixed-point encoding of a round of ``n`` sampled clients (without distributed DP)."""
    return FixedPoint.for_clients(params.bits, params.clip, max(n, 1))


@dataclass(frozen=True)
class PipelineShape:
    """How a pipelined round runs one instance of the protocol per chunk (Dordis section 4)."""

    first_step: str
    """The instances' first step (a client dropping before it leaves before encoding its update)."""
    upload: type[Message]
    """The message a client uploads as its chunk's input (its stage 2, Dordis Table 1)."""
    aggregate_from: str
    """The step whose collection ends where the server's aggregation stage (stage 3) starts: the uploads
    are in."""


@dataclass(frozen=True)
class InstanceRequest:
    """What a protocol needs to build one instance of a round (one per chunk when pipelined)."""

    params: AggregationParams
    round: int
    sampled: tuple[int, ...]
    dim: int
    """Model parameters (the update's length before any encoding)."""
    suite: Suite
    """The cryptography: real, or sized only (timing fidelity)."""
    graph_seed: int
    """Seed of the round's communication graph (SecAgg+)."""
    verification_keys: Mapping[int, Data] | None = None
    """The malicious variant's long-term verification keys of the sampled clients."""
    private: PrivateRound | None = None
    """Distributed DP: its encoding replaces the fixed-point one."""
    chunk: ChunkSlot | None = None
    """The instance of one chunk of a pipelined round: its clients start from their encoded slice and its
    server ends with the sum."""
    context: bytes = b""
    """What else its signatures are bound to (a deployment's id)."""


class Condition:
    """When an optional step or dropout stage of a protocol exists."""

    purpose = ""
    """What happens in it, for messages (``noise is removed``)."""

    def holds(self, params: AggregationParams) -> bool:
        raise NotImplementedError

    def needs(self) -> str:
        """What a scenario must set for it, in its keys (``aggregation.adversary: malicious``)."""
        raise NotImplementedError


class _Malicious(Condition):
    purpose = "the consistency check runs"

    def holds(self, params: AggregationParams) -> bool:
        return params.malicious

    def needs(self) -> str:
        return "aggregation.adversary: malicious"


class _RemovesNoise(Condition):
    purpose = "noise is removed"

    def holds(self, params: AggregationParams) -> bool:
        return strategy_named(params.strategy).removes

    def needs(self) -> str:
        return "privacy.strategy " + either([name for name, s in STRATEGIES.items() if s.removes])


MALICIOUS: Condition = _Malicious()
"""Only in the malicious variant (``aggregation.adversary: malicious``)."""
REMOVES_NOISE: Condition = _RemovesNoise()
"""Only under a strategy whose server removes excess noise (:attr:`sim.dp.strategies.Strategy.removes`)."""


@dataclass(frozen=True)
class ProtocolSpec:
    """One aggregation protocol's registry entry (see the module docstring). Subclasses override the methods
    where the protocol differs; :meth:`machines` has no default."""

    name: str
    steps: tuple[str, ...]
    """Every server collection step, in order (optional ones included)."""
    dropout_stages: Mapping[str, str] = field(default_factory=dict)
    """``dropout.stage`` -> the client step it precedes, besides ``after_sampling`` (before the model download,
    which every protocol has)."""
    optional_steps: Mapping[str, Condition] = field(default_factory=dict)
    """Steps that exist only when their condition holds."""
    optional_stages: Mapping[str, Condition] = field(default_factory=dict)
    """Dropout stages that exist only when their condition holds."""
    encoded: bool = True
    """Whether updates are fixed-point encoded (``aggregation.bits``/``clip`` apply, and DP noise can be added)."""
    secure: bool = False
    """Whether inputs are masked with secret-shared seeds: the server sees only the sum, so clients can share
    the central noise (distributed DP), and the malicious adversary and collusion tolerance apply."""
    sparse_graph: bool = False
    """Whether clients mask with and share among only their neighbours (``aggregation.neighbours`` applies)."""
    operations: tuple[str, ...] = ()
    """Cost-model operations the machines report (a profile must have them all)."""
    pipeline: PipelineShape | None = None
    """How its rounds are pipelined; None if they cannot be."""

    # -- shape ------------------------------------------------------------------------------------
    def steps_for(self, params: AggregationParams) -> tuple[str, ...]:
        """The server's steps under ``params`` (adversary model, privacy strategy)."""
        return tuple(s for s in self.steps if s not in self.optional_steps or self.optional_steps[s].holds(params))

    def step_needs(self, step: str) -> str:
        """What a scenario must set for optional ``step`` to exist (for messages)."""
        condition = self.optional_steps.get(step)
        return condition.needs() if condition is not None else "other settings"

    def dropout_stages_for(self, params: AggregationParams) -> dict[str, str]:
        """``dropout.stage`` values allowed under ``params`` -> the client step they precede (``""``: before
        the model download)."""
        stages = {AFTER_SAMPLING: ""}
        for stage, step in self.dropout_stages.items():
            condition = self.optional_stages.get(stage)
            if condition is None or condition.holds(params):
                stages[stage] = step
        return stages

    def after_upload(self, params: AggregationParams) -> frozenset[str]:
        """Steps after the uploads are in: a pipelined client dropping before one of them has uploaded every
        chunk's input first (see docs/pipeline.md, "Dropout across chunks")."""
        steps = self.steps_for(params)
        if self.pipeline is None or self.pipeline.aggregate_from not in steps:
            return frozenset()
        return frozenset(steps[steps.index(self.pipeline.aggregate_from) + 1 :])

    def supports(self, strategy: Strategy) -> bool:
        """Whether ``strategy`` can run on this protocol (from what it requires)."""
        if strategy.requires == SECURE:
            return self.secure
        if strategy.requires == ENCODED:
            return self.encoded
        return True

    # -- rounds -----------------------------------------------------------------------------------
    def holders(self, params: AggregationParams, n: int) -> int:
        """|H(u)|, the holders of each client's secrets in a round of ``n`` sampled clients."""
        return n

    def threshold(self, params: AggregationParams, n: int) -> int:
        """t, the reconstruction threshold of a round of ``n`` sampled clients (n where nothing is shared)."""
        return n

    def neighbourhoods(
        self, params: AggregationParams, sampled: tuple[int, ...], graph_seed: int
    ) -> dict[int, tuple[int, ...]]:
        """The round's communication graph."""
        return graph.complete(sampled)

    def machines(self, request: InstanceRequest) -> tuple[ServerMachine, ClientFactory]:
        """The server machine of one protocol instance and a factory of its client machines (see
        :func:`sim.protocol.registry.round_machines`)."""
        raise NotImplementedError(f"protocol {self.name} builds no machines")

    # -- scenario checks --------------------------------------------------------------------------
    def check_aggregation(
        self, params: AggregationParams, clients: int | None, registered: Mapping[str, ProtocolSpec], fail: Fail
    ) -> None:
        """The ``aggregation:`` section (``clients``: per round, None under Poisson sampling; ``registered``:
        every protocol, to name the ones that would do). Values the parser refused are None in ``params``."""
        if params.neighbours is not None and not self.sparse_graph:
            sparse = either(protocols_where(registered, lambda s: s.sparse_graph))
            fail("neighbours", f"only applies to protocol {sparse}, not {self.name!r}")
        if params.malicious and not self.secure:
            secure = either(protocols_where(registered, lambda s: s.secure))
            fail("adversary", f"malicious needs protocol {secure} (signatures), not {self.name!r}")
        threshold, bits, k = params.threshold, params.bits, clients
        if params.malicious and threshold is not None and threshold < 0.5:
            fail(
                "threshold",
                f"is {threshold}; the malicious variant needs threshold >= 0.5 so that more than half "
                "the clients must take part (Dordis footnote 3)",
            )
        if self.encoded and bits is not None and k is not None and 2 ** (bits - 1) - 1 - k <= 0:
            fail("bits", f"is {bits}: too few to sum {k} clients' updates; need 2^(bits-1) > {k + 1}")

    def check_privacy(
        self,
        params: AggregationParams,
        strategy: Strategy,
        collusion: int,
        registered: Mapping[str, ProtocolSpec],
        fail: Fail,
    ) -> None:
        """The ``privacy:`` section's strategy and collusion tolerance against this protocol (``registered``:
        every protocol, to name the ones that would do)."""
        if strategy.enabled and not self.supports(strategy):  # say why, in the user's terms
            name = strategy.name
            secure = either(protocols_where(registered, lambda s: s.secure))
            if not self.encoded:
                fail(
                    "strategy",
                    f"is {name!r}, which needs an encoded protocol: set aggregation.protocol to "
                    f"{either(protocols_where(registered, lambda s: s.encoded))} ({self.name} sends float updates)",
                )
            if strategy.removes or strategy.rebasing:
                fail(
                    "strategy",
                    f"is {name!r}, which removes noise with seeds shared under secure aggregation: set "
                    f"aggregation.protocol to {secure}, not {self.name!r}",
                )
            elif self.encoded:
                alone = either([n for n, s in STRATEGIES.items() if s.enabled and self.supports(s)])
                fail(
                    "strategy",
                    f"is {name!r}, whose clients share the noise: under {self.name} the server sees every noisy "
                    f"update alone, so only {alone} DP hold; use {secure} (or strategy {alone})",
                )
        if collusion and not self.secure:
            fail(
                "collusion",
                f"is {collusion}: collusion tolerance scales noise by SecAgg's t / (t - T_C); "
                f"it needs protocol {either(protocols_where(registered, lambda s: s.secure))}, not {self.name!r}",
            )

    def check_collusion(
        self,
        params: AggregationParams,
        collusion: int,
        private: bool,
        clients: int | None,
        rate: float | None,
        population: int | None,
        fail: Fail,
    ) -> None:
        """The collusion tolerance T_C against the round's thresholds (``private``: a strategy adds noise;
        ``clients`` per round, or Poisson sampling at ``rate`` of ``population``)."""

    def check_pipeline(self, params: AggregationParams, registered: Mapping[str, ProtocolSpec], fail: Fail) -> None:
        """The ``pipeline:`` section (``registered``: every protocol, to name the ones that can be pipelined)."""
        if self.pipeline is None:
            fail(
                "chunks",
                f"pipelines the protocol, but aggregation.protocol is {self.name!r}: pipelining runs one "
                f"secure-aggregation instance per chunk, so it needs {either(protocols_where(registered, pipelined))}",
            )


def pipelined(spec: ProtocolSpec) -> bool:
    """Whether ``spec``'s rounds can be pipelined."""
    return spec.pipeline is not None
