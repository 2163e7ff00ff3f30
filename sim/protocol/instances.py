"""The protocol instances of one round, built as every driver builds them from the scenario seed.

A round of ``chunks`` instances (1 when it is not pipelined; Dordis section 4) has one server machine per
instance and, for each sampled client, one client machine per instance. The round's SecAgg+ graph comes
from the scenario seed (``GRAPH`` stream). In the simulator, where nobody is on the wire, every party also
derives its key material from the scenario seed (``KEYS`` stream, per round, client and chunk) and the
malicious variant's long-term identities from the ``IDENTITY`` stream, so that every run is reproducible.
A deployment gives each client machine its own randomness instead (``keys``: the operating system's) and
the identities it provisioned (``identities``, ``signing``), so that no party can derive another's secrets
(docs/security.md); the deployment's client processes build only their own client's machines. A pipelined
client encodes its whole update once (DSkellam's clipping and rotation need all of it) and gives each
instance its slice of the encoding.

The ``fidelity`` names the suite of every machine (:data:`sim.protocol.suite.SUITES`): ``full`` (real
cryptography and vectors), ``learning`` (real vectors, encodings and noise; sized stand-ins for the
cryptography) or ``timing`` (sizes only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from sim.crypto import signatures
from sim.crypto.randomness import RandomSource, SeededRandom
from sim.protocol import wire
from sim.protocol.machine import Aggregate, ClientMachine, ServerMachine, Work
from sim.protocol.params import AggregationParams
from sim.protocol.private import PrivateRound
from sim.protocol.registry import round_machines
from sim.protocol.spec import ChunkSlot, ClientFactory, chunk_slots, fixed_point
from sim.protocol.suite import SUITES
from sim.protocol.wire import Blank, Opaque, Vector
from sim.seeds import Stream, generator, int_seed, seed_bytes


@dataclass
class RoundInstances:
    """The machines of round ``number`` over ``sampled`` in ``fidelity`` (``full``, ``learning``, ``timing``)."""

    aggregation: AggregationParams
    seed: int
    number: int
    sampled: tuple[int, ...]
    dim: int
    private: PrivateRound | None = None
    chunks: int | None = None
    """Pipelined: the number of protocol instances (None: one unpipelined instance)."""
    fidelity: str = "full"
    """``full``: real cryptography and payloads; ``learning``: real payloads, sized cryptography; ``timing``:
    sizes only."""
    servers: list[ServerMachine] = field(default_factory=list)
    factories: list[ClientFactory] = field(default_factory=list)
    slots: tuple[ChunkSlot, ...] = ()
    """Pipelined: each instance's slice of the encoded update."""
    signing: dict[int, wire.Data] = field(default_factory=dict)
    """Long-term signing keys of the sampled clients (malicious variant; derived from the seed)."""
    context: bytes = b""
    """What every signature of the round is also bound to (a deployment's random id; none in the simulator)."""
    identities: Mapping[int, wire.Data] | None = None
    """Verification keys of the sampled clients provisioned outside the scenario (a deployment: each
    client's signing key is its own, given to :meth:`client`); None: derived from the scenario seed."""

    def __post_init__(self) -> None:
        if self.fidelity not in SUITES:
            raise ValueError(f"fidelity {self.fidelity!r} is none of {', '.join(SUITES)}")
        suite = SUITES[self.fidelity]()
        verification = self._identities()
        graph_seed = int_seed(self.seed, Stream.GRAPH, self.number)
        common = (self.aggregation, self.number, self.sampled, self.dim, suite, graph_seed, verification)
        if self.chunks is None:
            server, factory = round_machines(*common, private=self.private, context=self.context)
            self.servers, self.factories = [server], [factory]
            return
        length = self.private.length if self.private is not None else self.dim
        self.slots = chunk_slots(length, self.chunks)
        for slot in self.slots:
            server, factory = round_machines(*common, private=self.private, chunk=slot, context=self.context)
            self.servers.append(server)
            self.factories.append(factory)

    def _identities(self) -> dict[int, wire.Data]:
        """Verification keys of the sampled clients (malicious variant; signing keys go to ``signing``)."""
        verification: dict[int, wire.Data] = {}
        if self.aggregation.malicious and self.identities is not None:
            missing = [c for c in self.sampled if c not in self.identities]
            if missing:
                raise ValueError(f"no verification key for sampled clients {missing}")
            return {c: self.identities[c] for c in self.sampled}
        if self.aggregation.malicious:
            for c in self.sampled:
                if self.full:
                    self.signing[c], verification[c] = signatures.generate(
                        SeededRandom(seed_bytes(self.seed, Stream.IDENTITY, c))
                    )
                else:
                    self.signing[c], verification[c] = Opaque(32), Opaque(32)
        return verification

    @property
    def full(self) -> bool:
        """Whether the cryptography is real (``full`` fidelity)."""
        return self.fidelity == "full"

    @property
    def vectors(self) -> bool:
        """Whether the payloads are real (``full`` and ``learning`` fidelity): updates are encoded and summed."""
        return self.fidelity != "timing"

    @property
    def pipelined(self) -> bool:
        return self.chunks is not None

    def client(
        self, c: int, chunk: int | None = None, keys: RandomSource | None = None, signing: wire.Data | None = None
    ) -> ClientMachine:
        """Client ``c``'s machine (of instance ``chunk`` in a pipelined round). ``keys``: the randomness of
        its key pairs, self-mask seed, noise seeds and Shamir polynomials (default: derived from the scenario
        seed); ``signing``: its long-term signing key (default: derived from the scenario seed)."""
        signing = self.signing.get(c) if signing is None else signing
        if chunk is None:
            keys = keys or SeededRandom(seed_bytes(self.seed, Stream.KEYS, self.number, c))
            encoding = generator(self.seed, Stream.ENCODING, self.number, c) if self.vectors else None
            return self.factories[0](c, keys, encoding, signing)
        keys = keys or SeededRandom(seed_bytes(self.seed, Stream.KEYS, self.number, c, chunk))
        return self.factories[chunk](c, keys, None, signing)

    def encode(self, c: int, update: Vector) -> Vector:
        """Pipelined: client ``c``'s whole update encoded (fixed point mod 2^bits, or DSkellam before noise)."""
        if not self.vectors:
            return Blank(self.slots[-1].stop, np.uint32)
        assert isinstance(update, np.ndarray)
        rng = generator(self.seed, Stream.ENCODING, self.number, c)
        if self.private is None:
            return fixed_point(self.aggregation, len(self.sampled)).encode(update, rng)
        return self.private.encoding.encode(update, self.private.rotation_seed, rng)

    def combine(self, aggregates: list[Aggregate]) -> Aggregate:
        """Pipelined: the round's aggregate from every instance's sum (each chunk's mean over its own
        survivors); the round's survivors are those in every chunk's sum."""
        survivors = set(aggregates[0].survivors).intersection(*(a.survivors for a in aggregates[1:]))
        vector: Vector = Blank(self.dim, np.float32)
        if self.vectors:
            counts = [len(a.survivors) for a in aggregates]
            total = np.concatenate([np.asarray(a.vector) for a in aggregates])
            per_value: int | np.ndarray = counts[0]
            if len(set(counts)) > 1:
                per_value = np.repeat(np.asarray(counts, dtype=np.float64), [slot.length for slot in self.slots])
            if self.private is None:
                vector = fixed_point(self.aggregation, len(self.sampled)).decode_mean(total, per_value)
            else:
                vector = self.private.decode_mean(total, per_value)
        return Aggregate(vector, tuple(sorted(survivors)), float(len(survivors)))

    def combine_work(self) -> list[Work]:
        """Work of :meth:`combine` (the server's decoding of the concatenated sums)."""
        if self.private is None:
            return [Work("decode.fixed_point", {"elements": self.dim})]
        return list(self.private.decode_work())
