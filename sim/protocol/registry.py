"""The aggregation protocols by name: what drivers and the scenario parser need to know of each, and its machines.

Each protocol's entry is a :class:`~sim.protocol.spec.ProtocolSpec` defined in the protocol's own module
(:data:`~sim.protocol.fedavg.FEDAVG`, :data:`~sim.protocol.plain.PLAIN`, :data:`~sim.protocol.secagg.spec.SECAGG`,
:data:`~sim.protocol.secagg.spec.SECAGG_PLUS`): its server's collection steps in order (the keys of ``timeouts:``),
the ``dropout.stage`` values it supports and the client step before which each leaves (``after_sampling``,
before the model download, every protocol shares), its cost-model operations, its pipeline shape, how it
builds machines and its part of the scenario checks. :func:`register` adds one (a plug-in's too); nothing
outside the protocols' modules and this one names a protocol. :func:`spec_of` gives the entry of a scenario's
:class:`~sim.protocol.params.AggregationParams` (plain data, which holds only the protocol's name): callers
resolve it here and pass it on. :func:`round_machines` builds one round's server machine and a factory for
its client machines.

The imports run one way: :mod:`sim.protocol.params` <- :mod:`sim.protocol.spec` <- the protocols <- this
module; each name is imported from the module that defines it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sim.protocol.fedavg import FEDAVG
from sim.protocol.machine import ServerMachine
from sim.protocol.params import AggregationParams
from sim.protocol.plain import PLAIN
from sim.protocol.private import PrivateRound
from sim.protocol.secagg.spec import SECAGG, SECAGG_PLUS
from sim.protocol.spec import (
    ChunkSlot,
    ClientFactory,
    Condition,
    InstanceRequest,
    ProtocolSpec,
    pipelined,
    protocols_where,
)
from sim.protocol.suite import Suite
from sim.protocol.wire import Data

__all__ = [
    "DRIVER_OPERATIONS",
    "PROTOCOLS",
    "neighbourhoods",
    "optional_stages",
    "reconstruction_threshold",
    "register",
    "round_machines",
    "secret_holders",
    "spec_of",
]

DRIVER_OPERATIONS = ("wire.encode", "wire.decode")
"""Operations every driver charges besides the machines' own: encoding and decoding frames."""

PROTOCOLS: dict[str, ProtocolSpec] = {}
"""Every ``aggregation.protocol``, by name, in registration order (the order messages list them in)."""


def register(spec: ProtocolSpec) -> ProtocolSpec:
    """Make ``spec`` an ``aggregation.protocol`` (its name must be new)."""
    if spec.name in PROTOCOLS:
        raise ValueError(f"protocol {spec.name!r} is registered already")
    PROTOCOLS[spec.name] = spec
    return spec


for _spec in (FEDAVG, PLAIN, SECAGG, SECAGG_PLUS):
    register(_spec)


def spec_of(params: AggregationParams) -> ProtocolSpec:
    """The registry entry of ``params.protocol`` (a name the scenario parser checked; KeyError otherwise)."""
    return PROTOCOLS[params.protocol]


def optional_stages() -> dict[str, Condition]:
    """Dropout stages some protocol has only under a condition (e.g. while noise is removed), with it."""
    return {stage: c for spec in PROTOCOLS.values() for stage, c in spec.optional_stages.items()}


def secret_holders(params: AggregationParams, n: int) -> int:
    """|H(u)|, the holders of each client's secrets in a round of ``n`` sampled clients: everyone for SecAgg,
    the client and its neighbours (the degree rounded up to even, as :func:`neighbourhoods` does) for SecAgg+."""
    return spec_of(params).holders(params, n)


def reconstruction_threshold(params: AggregationParams, n: int) -> int:
    """t of a round of ``n`` sampled clients: SecAgg's, or SecAgg+'s per neighbourhood (``plain``: n)."""
    return spec_of(params).threshold(params, n)


def neighbourhoods(params: AggregationParams, sampled: tuple[int, ...], graph_seed: int) -> dict[int, tuple[int, ...]]:
    """The round's communication graph: complete for SecAgg, sparse for SecAgg+."""
    return spec_of(params).neighbourhoods(params, sampled, graph_seed)


def round_machines(
    params: AggregationParams,
    round: int,
    sampled: tuple[int, ...],
    dim: int,
    suite: Suite,
    graph_seed: int,
    verification_keys: Mapping[int, Data] | None = None,
    private: PrivateRound | None = None,
    chunk: ChunkSlot | None = None,
    context: bytes = b"",
) -> tuple[ServerMachine, ClientFactory]:
    """The server machine of one round and a factory of its client machines (``private``: with
    distributed DP, whose encoding replaces the fixed-point one; ``chunk``: the instance of one chunk of a
    pipelined round, whose clients start from their encoded slice and whose server ends with the sum;
    ``context``: what else its signatures are bound to, a deployment's id)."""
    spec = spec_of(params)
    if chunk is not None and spec.pipeline is None:
        raise ValueError(
            f"protocol {params.protocol} cannot be pipelined (only {', '.join(protocols_where(PROTOCOLS, pipelined))})"
        )
    request = InstanceRequest(
        params, round, sampled, dim, suite, graph_seed, verification_keys, private, chunk, context
    )
    return spec.machines(request)
