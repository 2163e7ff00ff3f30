"""What drivers and the scenario parser need to know of each aggregation protocol, and its machines.

``steps`` are the server's collection steps in order (the keys of ``timeouts:``). ``dropout_stages`` map
each ``dropout.stage`` to the client step before which a dropping client leaves (``after_sampling``
means before the model download, which every protocol shares). :func:`round_machines` builds one
round's server machine and a factory for its client machines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from sim.crypto.randomness import RandomSource
from sim.dp.strategies import REMOVING
from sim.protocol import graph
from sim.protocol.encoding import FixedPoint
from sim.protocol.fedavg import FedAvgClient, FedAvgServer
from sim.protocol.machine import ClientMachine, ServerMachine
from sim.protocol.plain import PlainClient, PlainServer
from sim.protocol.private import PrivateRound
from sim.protocol.secagg import SecAggClient, SecAggConfig, SecAggServer, share_threshold
from sim.protocol.suite import Suite
from sim.protocol.wire import Data

AFTER_SAMPLING = "after_sampling"


@dataclass(frozen=True)
class ProtocolSpec:
    name: str
    steps: tuple[str, ...]
    dropout_stages: dict[str, str] = field(default_factory=dict)
    """``dropout.stage`` -> the client step it precedes (``after_sampling`` -> ``""``: before download)."""
    encoded: bool = True
    """Whether updates are fixed-point encoded (and ``aggregation.bits``/``clip`` apply)."""
    operations: tuple[str, ...] = ()
    """Cost-model operations the machines report (a profile must have them all)."""


_SECAGG_DROPOUT = {
    AFTER_SAMPLING: "",
    "before_share_keys": "share_keys",
    "before_upload": "masked_input",
    "during_unmasking": "unmasking",
    # XNoise's survivors send their excess seeds with their unmasking shares (Dordis Figure 5, stage 4): a
    # survivor dropping during noise removal leaves there, and its seeds are recovered from shares (stage 5).
    "during_noise_removal": "unmasking",
}
NOISE_REMOVAL_STAGES = ("during_noise_removal",)
"""Dropout stages that exist only where noise is removed (XNoise)."""
_SECAGG_STEPS = ("advertise_keys", "share_keys", "masked_input", "consistency_check", "unmasking", "noise_removal")

_PLAIN_DROPOUT = {AFTER_SAMPLING: "", "before_upload": "upload"}
_ENCODED_OPS = ("encode.fixed_point", "decode.fixed_point", "vector.add")
_DP_OPS = ("encode.dskellam", "decode.dskellam", "noise.skellam", "noise.gaussian", "noise.dgaussian")
_SECAGG_OPS = (
    *_ENCODED_OPS,
    *_DP_OPS,
    "x25519.keygen",
    "x25519.agree",
    "x25519.public",
    "ed25519.sign",
    "ed25519.verify",
    "aead.seal",
    "aead.open",
    "shamir.share",
    "shamir.reconstruct",
    "prg.expand",
    "secagg.entries",
)

PROTOCOLS: dict[str, ProtocolSpec] = {
    "fedavg": ProtocolSpec(
        "fedavg", ("upload",), _PLAIN_DROPOUT, encoded=False, operations=("fedavg.accumulate", "fedavg.finalize")
    ),
    "plain": ProtocolSpec("plain", ("upload",), _PLAIN_DROPOUT, operations=(*_ENCODED_OPS, *_DP_OPS)),
    "secagg": ProtocolSpec("secagg", _SECAGG_STEPS, _SECAGG_DROPOUT, operations=_SECAGG_OPS),
    "secagg+": ProtocolSpec("secagg+", _SECAGG_STEPS, _SECAGG_DROPOUT, operations=_SECAGG_OPS),
}
DRIVER_OPERATIONS = ("wire.encode", "wire.decode")
"""Operations every driver charges besides the machines' own: encoding and decoding frames."""


@dataclass(frozen=True)
class AggregationParams:
    """The ``aggregation:`` section of a scenario."""

    protocol: str = "fedavg"
    bits: int = 20
    clip: float = 1.0
    """L2 norm bound of updates in the fixed-point encoding (model units)."""
    threshold: float = 0.5
    """Fraction of share holders strictly exceeded by the reconstruction threshold."""
    neighbours: int | None = None
    """SecAgg+ degree; None for ``auto`` (2 ceil(log2 n))."""
    malicious: bool = False
    strategy: str = "none"
    """The ``privacy.strategy`` (XNoise adds the ``noise_removal`` step)."""
    collusion: int = 0
    """The ``privacy.collusion`` T_C: clients that may collude with the server. The malicious variant's
    consistency check must withstand them (:mod:`sim.protocol.collusion`)."""

    @property
    def spec(self) -> ProtocolSpec:
        return PROTOCOLS[self.protocol]

    def steps(self) -> tuple[str, ...]:
        """The server's steps under this adversary model and privacy strategy."""
        return tuple(
            s
            for s in self.spec.steps
            if (s != "consistency_check" or self.malicious) and (s != "noise_removal" or self.strategy in REMOVING)
        )

    def after_upload(self) -> frozenset[str]:
        """Steps after the masked inputs are in: a pipelined client dropping before one of them has uploaded
        every chunk's masked input first (see docs/pipeline.md, "Dropout across chunks")."""
        steps = self.steps()
        return frozenset(steps[steps.index("masked_input") + 1 :]) if "masked_input" in steps else frozenset()

    def dropout_stages(self) -> dict[str, str]:
        """``dropout.stage`` values allowed with this privacy strategy -> the client step they precede."""
        stages = self.spec.dropout_stages
        if self.strategy in REMOVING:
            return dict(stages)
        return {k: v for k, v in stages.items() if k not in NOISE_REMOVAL_STAGES}


PIPELINED = ("secagg", "secagg+")
"""Protocols whose rounds can be pipelined in chunks (one protocol instance per chunk)."""


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


ClientFactory = Callable[[int, RandomSource, "np.random.Generator | None", "Data | None"], ClientMachine]
"""``(client, key randomness, encoding randomness, signing key) -> machine``."""


def fixed_point(params: AggregationParams, n: int) -> FixedPoint:
    """The fixed-point encoding of a round of ``n`` sampled clients (without distributed DP)."""
    return FixedPoint.for_clients(params.bits, params.clip, max(n, 1))


def secret_holders(params: AggregationParams, n: int) -> int:
    """|H(u)|, the holders of each client's secrets in a round of ``n`` sampled clients: everyone for SecAgg,
    the client and its neighbours (the degree rounded up to even, as :func:`neighbourhoods` does) for SecAgg+."""
    if params.protocol != "secagg+":
        return n
    degree = graph.auto_degree(n) if params.neighbours is None else params.neighbours
    return min(n, degree + degree % 2 + 1)


def reconstruction_threshold(params: AggregationParams, n: int) -> int:
    """t of a round of ``n`` sampled clients: SecAgg's, or SecAgg+'s per neighbourhood (``plain``: n)."""
    if params.protocol not in ("secagg", "secagg+") or n < 1:
        return n
    return share_threshold(params.threshold, secret_holders(params, n))


def neighbourhoods(params: AggregationParams, sampled: tuple[int, ...], graph_seed: int) -> dict[int, tuple[int, ...]]:
    """The round's communication graph: complete for SecAgg, sparse for SecAgg+."""
    if params.protocol != "secagg+":
        return graph.complete(sampled)
    degree = graph.auto_degree(len(sampled)) if params.neighbours is None else params.neighbours
    if degree < len(sampled) - 1 and degree % 2:
        degree += 1  # the ring graph needs an even degree
    return graph.harary(sampled, degree, graph_seed)


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
    if chunk is not None and params.protocol not in PIPELINED:
        raise ValueError(f"protocol {params.protocol} cannot be pipelined (only {', '.join(PIPELINED)})")
    if params.protocol == "fedavg":
        return FedAvgServer(round, sampled, dim), lambda c, _rng, _enc, _sig: FedAvgClient(round, c)
    encoding = fixed_point(params, len(sampled))
    if params.protocol == "plain":
        return PlainServer(round, sampled, dim, encoding, private), lambda c, rng, enc, _sig: PlainClient(
            round, c, dim, encoding, enc, private, rng
        )
    if chunk is not None and private is not None:
        private = private.chunk(chunk.start, chunk.stop)
    config = SecAggConfig(
        round=round,
        sampled=sampled,
        dim=chunk.length if chunk is not None else dim if private is None else private.length,
        encoding=encoding,
        neighbours=neighbourhoods(params, sampled, graph_seed),
        threshold_fraction=params.threshold,
        malicious=params.malicious,
        collusion=params.collusion,
        verification_keys=dict(verification_keys or {}),
        private=private,
        chunk=chunk.index if chunk is not None else 0,
        chunks=chunk.count if chunk is not None else 1,
        prepared=chunk is not None,
        context=context,
    )
    return SecAggServer(config, suite), lambda c, rng, enc, sig: SecAggClient(config, c, suite, rng, enc, sig)
