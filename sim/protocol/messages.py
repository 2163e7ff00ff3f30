"""Wire messages of the encoded protocols: ``plain`` and SecAgg/SecAgg+ (Dordis Figure 5).

Every message carries its round; client-to-server messages carry the sender, which the server checks
against the connection it came from. Vectors over Z_(2^bits) travel bit-packed (:class:`ModVector`), so a
20-bit update of d values costs 2.5 d bytes. In the semi-honest variant the signature fields are empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sim.protocol.wire import (
    BYTES,
    F32_VECTOR,
    KEY,
    PACKED,
    SIGNATURE,
    U8,
    U32,
    U64,
    Data,
    Items,
    Message,
    ModVector,
    Vector,
    list_of,
    tuple_of,
)


@dataclass(frozen=True, eq=False)
class EncodedUpdate(Message):
    """``plain``: a client's encoded update, unmasked."""

    TYPE: ClassVar[int] = 3
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("data", PACKED))
    round: int
    client: int
    data: ModVector


@dataclass(frozen=True)
class ModelDownload(Message):
    """The global model (float32 parameters) sent to a sampled client at the start of a round (every
    protocol's round begins with it)."""

    TYPE: ClassVar[int] = 1
    FIELDS: ClassVar = (("round", U32), ("params", F32_VECTOR))
    round: int
    params: Vector


@dataclass(frozen=True)
class AdvertiseKeys(Message):
    """Stage 0: a client's two X25519 public keys (c for encryption, s for masks) [and its signature]."""

    TYPE: ClassVar[int] = 10
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("c_pk", KEY), ("s_pk", KEY), ("signature", BYTES))
    round: int
    client: int
    c_pk: Data
    s_pk: Data
    signature: Data


@dataclass(frozen=True)
class KeyList(Message):
    """Server to client: the advertised keys of the clients in U1 the recipient deals with."""

    TYPE: ClassVar[int] = 11
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar = (("round", U32), ("entries", list_of(tuple_of(U64, KEY, KEY, BYTES))))
    round: int
    entries: tuple[tuple[int, Data, Data, Data], ...]
    """``(client, c_pk, s_pk, signature)`` sorted by client."""


@dataclass(frozen=True)
class ShareKeys(Message):
    """Stage 1: a client's encrypted shares, one ciphertext per other share holder."""

    TYPE: ClassVar[int] = 12
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("ciphertexts", list_of(tuple_of(U64, BYTES))))
    round: int
    client: int
    ciphertexts: tuple[tuple[int, Data], ...]
    """``(receiver, ciphertext)``."""


@dataclass(frozen=True)
class Ciphertexts(Message):
    """Server to client: the ciphertexts addressed to it by the clients in U2."""

    TYPE: ClassVar[int] = 13
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar = (("round", U32), ("ciphertexts", list_of(tuple_of(U64, BYTES))))
    round: int
    ciphertexts: tuple[tuple[int, Data], ...]
    """``(sender, ciphertext)`` sorted by sender."""


@dataclass(frozen=True, eq=False)
class MaskedInput(Message):
    """Stage 2: the masked encoded update y_u."""

    TYPE: ClassVar[int] = 14
    FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = (("round", U32), ("client", U64), ("y", PACKED))
    round: int
    client: int
    y: ModVector


@dataclass(frozen=True)
class Survivors(Message):
    """Server to client: U3, the clients whose masked input arrived (consistency check or unmasking)."""

    TYPE: ClassVar[int] = 15
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = (("round", U32), ("clients", list_of(U64)))
    round: int
    clients: tuple[int, ...]


@dataclass(frozen=True)
class ConsistencySignature(Message):
    """Stage 3 (malicious): the client's signature of the round and U3."""

    TYPE: ClassVar[int] = 16
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("signature", SIGNATURE))
    round: int
    client: int
    signature: Data


@dataclass(frozen=True)
class SignedSurvivors(Message):
    """Server to client (malicious): U4 with each member's signature of the round and U3."""

    TYPE: ClassVar[int] = 17
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar = (("round", U32), ("signatures", list_of(tuple_of(U64, SIGNATURE))))
    round: int
    signatures: tuple[tuple[int, Data], ...]


SHARE_OF_KEY = 0
"""Kind of an unmasking share: of the client's mask private key s_sk (it dropped)."""
SHARE_OF_SEED = 1
"""Kind of an unmasking share: of the client's self-mask seed b (it survived)."""


@dataclass(frozen=True)
class UnmaskShares(Message):
    """Stage 4: shares of s_sk for clients in U2 \\ U3 and of b for clients in U3."""

    TYPE: ClassVar[int] = 18
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = (
        ("round", U32),
        ("client", U64),
        ("shares", list_of(tuple_of(U64, U8, BYTES))),
    )
    round: int
    client: int
    shares: tuple[tuple[int, int, Data], ...]
    """``(about, kind, share)`` with kind ``SHARE_OF_KEY`` or ``SHARE_OF_SEED``."""


# -- distributed DP (Dordis Figure 5, underlined parts; rebasing) --------------------------------------
@dataclass(frozen=True)
class UnmaskSharesAndSeeds(UnmaskShares):
    """Stage 4 under XNoise: the unmasking shares and the client's own seeds g_(u,k) of the components
    every survivor removes (k > |U \\ U3| for XNoise-Prec)."""

    TYPE: ClassVar[int] = 19
    ITEMS: ClassVar[Items] = Items.CLIENT_COMPONENTS
    FIELDS: ClassVar = (*UnmaskShares.FIELDS, ("seeds", list_of(tuple_of(U32, BYTES))))
    seeds: tuple[tuple[int, Data], ...]
    """``(component, seed)``."""


@dataclass(frozen=True)
class RemovalRequest(Message):
    """Server to client, stage 5 (ExcessiveNoiseRemoval): U5, the survivors whose seeds arrived; the
    recipient sends its shares of the excess seeds of the survivors in U3 \\ U5."""

    TYPE: ClassVar[int] = 20
    ITEMS: ClassVar[Items] = Items.CLIENTS
    FIELDS: ClassVar = (("round", U32), ("clients", list_of(U64)))
    round: int
    clients: tuple[int, ...]


@dataclass(frozen=True)
class SeedShares(Message):
    """Stage 5: the client's shares of excess noise seeds of survivors that did not send them."""

    TYPE: ClassVar[int] = 21
    ITEMS: ClassVar[Items] = Items.CLIENT_COMPONENTS
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("shares", list_of(tuple_of(U64, U32, BYTES))))
    round: int
    client: int
    shares: tuple[tuple[int, int, Data], ...]
    """``(about, component, share)``."""


@dataclass(frozen=True, eq=False)
class RebaseAndUnmask(UnmaskShares):
    """Stage 4 under rebasing (Baek et al.): the unmasking shares and z = n' - n_0 - PRG(b_y) + PRG(b),
    which replaces the client's first noise n_0 with fresh noise n' sized for the survivors and swaps the
    unshared self mask of y for the shared one, so that only y + z can ever be unmasked."""

    TYPE: ClassVar[int] = 22
    FIELDS: ClassVar = (*UnmaskShares.FIELDS, ("z", PACKED))
    z: ModVector


@dataclass(frozen=True, eq=False)
class SignedMaskedInput(MaskedInput):
    """Stage 2 under distributed DP, malicious variant: the masked input and the client's signature that it
    uploaded in this round (Dordis 3.3)."""

    TYPE: ClassVar[int] = 23
    FIELDS: ClassVar = (*MaskedInput.FIELDS, ("signature", SIGNATURE))
    signature: Data


@dataclass(frozen=True)
class SignedUploads(Survivors):
    """Server to client under distributed DP, malicious variant: U3 with every member's upload signature,
    which each client verifies before it computes |U \\ U3| and releases any noise seed."""

    TYPE: ClassVar[int] = 24
    FIELDS: ClassVar = (*Survivors.FIELDS, ("signatures", list_of(SIGNATURE)))
    signatures: tuple[Data, ...]
    """One per client of ``clients``, in the same order."""


@dataclass(frozen=True, eq=False)
class AggregateChunk(Message):
    """Pipelined rounds (Dordis Table 1, stage 4): the server dispatches one chunk's unmasked sum mod 2^bits
    (residual noise included) to the clients of that chunk, which decode it (stage 5)."""

    TYPE: ClassVar[int] = 25
    FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = (("round", U32), ("chunk", U32), ("total", PACKED))
    round: int
    chunk: int
    total: ModVector
