"""Bytes on the wire as another implementation encodes the protocol's messages (a cost profile's ``wire``).

dropsim's own frames pack a vector of b-bit values into ``ceil(b d / 8)`` bytes and carry 32-byte X25519
keys (:mod:`sim.protocol.wire`). Other implementations send the same messages differently: Flower's SecAgg+
sends every masked value as an int64 in a ``.npy`` array and its keys as 215-byte PEM text; Dordis packs
three 20-bit values into a 60-bit Python integer and pickles the list. A profile that describes such an
implementation declares its sizes in a ``wire`` section, and the simulator charges every transfer at
:meth:`WireSizes.size` instead of dropsim's frame size (docs/profiles.md):

    "wire": {"encoding": "what it is and how it was measured",
             "frame": 200, "integer": 8, "public_key": 215, "signature": 0,
             "ciphertext": 612, "ciphertext_per_share": 0,
             "key_share": 324, "seed_share": 52, "noise_seed": 8, "noise_seed_share": 52,
             "vector": 128, "word_bits": 64, "word": 8, "packed": false, "parameter": 4}

All sizes are bytes. A vector of d values of b bits takes ``vector + words * word`` bytes, with ``words =
ceil(d / floor(word_bits / b))`` when ``packed`` (several values share a word) and ``d`` otherwise. A share
ciphertext holding s shares takes ``ciphertext + (s - 2) * ciphertext_per_share`` (two shares, of the mask
key and the self-mask seed, in every protocol; XNoise adds one per removable noise seed). Each message is
``frame`` plus its fields; the client ids and indices in its lists take ``integer`` each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from sim.crypto import aead
from sim.errors import InputError
from sim.protocol import messages as m
from sim.protocol.fedavg import ClientUpdate
from sim.protocol.suite import SHARE_BYTES, plaintext_bytes
from sim.protocol.wire import Data, Message, ModVector, Vector, vector_length


class WireSizesError(InputError):
    """A profile's ``wire`` section that cannot be used."""


@dataclass(frozen=True)
class WireSizes:
    """An implementation's bytes per message part (see the module docstring)."""

    encoding: str
    frame: float
    integer: float
    public_key: float
    signature: float
    ciphertext: float
    ciphertext_per_share: float
    key_share: float
    seed_share: float
    noise_seed: float
    noise_seed_share: float
    vector: float
    word_bits: int
    word: float
    packed: bool
    parameter: float

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> WireSizes:
        """The ``wire`` section of profile ``source``: every size a finite number >= 0, ``word_bits`` an
        integer in 1..64, ``packed`` a boolean, ``encoding`` a string."""
        if not isinstance(doc, dict):
            raise WireSizesError(f"cost profile {source}: 'wire' must be a mapping of sizes in bytes")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - names)
        missing = sorted(names - set(doc))
        if unknown or missing:
            raise WireSizesError(
                f"cost profile {source}: 'wire' "
                + (f"has unknown keys {unknown}" if unknown else "")
                + ("; " if unknown and missing else "")
                + (f"lacks {missing}" if missing else "")
            )
        values: dict[str, Any] = {}
        for f in fields(cls):
            v = doc[f.name]
            where = f"cost profile {source}: wire.{f.name} is {v!r}"
            if f.name == "encoding":
                if not isinstance(v, str):
                    raise WireSizesError(f"{where}; it must be a string")
            elif f.name == "packed":
                if not isinstance(v, bool):
                    raise WireSizesError(f"{where}; it must be true or false")
            elif f.name == "word_bits":
                if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 64:
                    raise WireSizesError(f"{where}; it must be an integer number of bits in 1..64")
            elif not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise WireSizesError(f"{where}; it must be a number of bytes >= 0")
            values[f.name] = v
        return cls(**values)

    def values(self, vector: ModVector) -> float:
        """Bytes of a vector of ``bits``-bit values."""
        n = vector.length
        if self.packed:
            per = max(1, self.word_bits // vector.bits)
            words = math.ceil(n / per)
        else:
            words = n
        return self.vector + words * self.word

    def parameters(self, params: Vector) -> float:
        """Bytes of the model's float parameters."""
        return self.vector + vector_length(params) * self.parameter

    def sealed(self, ciphertext: Data) -> float:
        """Bytes of a share ciphertext as this implementation seals the shares inside dropsim's
        ``ciphertext`` (whose length says how many)."""
        shares = (len(ciphertext) - aead.OVERHEAD - plaintext_bytes(0)) // SHARE_BYTES
        return self.ciphertext + max(0, shares - 2) * self.ciphertext_per_share

    def size(self, message: Message) -> int:
        """Bytes of ``message`` as this implementation sends it (rounded up to a whole byte)."""
        body = _BODIES.get(type(message))
        if body is None:
            raise WireSizesError(
                f"the cost profile's wire sizes do not cover {type(message).__name__} messages "
                "(a protocol the implementation does not run)"
            )
        return math.ceil(self.frame + body(message, self))


def _unmask_shares(msg: m.UnmaskShares, w: WireSizes) -> float:
    return sum(w.integer + (w.key_share if kind == m.SHARE_OF_KEY else w.seed_share) for _, kind, _ in msg.shares)


def _key_entry(entry: tuple[int, Any, Any, Any], w: WireSizes) -> float:
    signature = entry[3]
    return w.integer + 2 * w.public_key + (w.signature if len(signature) else 0.0)


_BODIES: Mapping[type, Callable[[Any, WireSizes], float]] = {
    m.ModelDownload: lambda msg, w: w.parameters(msg.params),
    ClientUpdate: lambda msg, w: w.integer + w.parameters(msg.delta),  # FedAvg: its weight, its float delta
    m.EncodedUpdate: lambda msg, w: w.values(msg.data),
    m.AdvertiseKeys: lambda msg, w: 2 * w.public_key + (w.signature if len(msg.signature) else 0.0),
    m.KeyList: lambda msg, w: sum(_key_entry(e, w) for e in msg.entries),
    m.ShareKeys: lambda msg, w: sum(w.integer + w.sealed(c) for _, c in msg.ciphertexts),
    m.Ciphertexts: lambda msg, w: sum(w.integer + w.sealed(c) for _, c in msg.ciphertexts),
    m.MaskedInput: lambda msg, w: w.values(msg.y),
    m.SignedMaskedInput: lambda msg, w: w.values(msg.y) + w.signature,
    m.Survivors: lambda msg, w: len(msg.clients) * w.integer,
    m.SignedUploads: lambda msg, w: len(msg.clients) * (w.integer + w.signature),
    m.ConsistencySignature: lambda msg, w: w.signature,
    m.SignedSurvivors: lambda msg, w: len(msg.signatures) * (w.integer + w.signature),
    m.UnmaskShares: _unmask_shares,
    m.UnmaskSharesAndSeeds: lambda msg, w: _unmask_shares(msg, w) + len(msg.seeds) * (w.integer + w.noise_seed),
    m.RemovalRequest: lambda msg, w: len(msg.clients) * w.integer,
    m.SeedShares: lambda msg, w: len(msg.shares) * (2 * w.integer + w.noise_seed_share),
    m.RebaseAndUnmask: lambda msg, w: _unmask_shares(msg, w) + w.values(msg.z),
    m.AggregateChunk: lambda msg, w: w.integer + w.values(msg.total),
}
"""Each message's bytes beyond ``frame``, by its type (exact types: a subclass adds fields)."""
