"""The cryptographic operations of secure aggregation, for real or by size only.

The SecAgg machines (:mod:`sim.protocol.secagg`) call these compositions of the primitives in
:mod:`sim.crypto`; everything protocol-specific about them (what is encrypted, bound or derived) is here,
in one place. :class:`RealSuite` performs them (``full`` fidelity). :class:`SizedSuite` is the ``timing``
fidelity: it returns :class:`~sim.protocol.wire.Opaque` bytes and :class:`~sim.protocol.wire.Blank` vectors
of exactly the sizes the real operations produce, so the machines send the same messages with the same
sizes and report the same work, without the arithmetic. :class:`LearningSuite` is the ``learning``
fidelity: sized stand-ins for keys, signatures and ciphertexts, no masks, but real vectors, real noise
seeds, and shares that carry their secret, so that the server sums the survivors' inputs mod 2^bits and
gets what unmasking would give: the masks cancel in the sum (Bonawitz et al.), so nothing is lost by never
adding them.

Two flags tell the machines what a suite does: ``full`` (the cryptography is real: keys can be compared,
masks are added and removed) and ``vectors`` (the inputs, sums and noise are real arrays).

Domain separation (HKDF ``info``, AEAD associated data, signed bytes) binds every derived key, ciphertext
and signature to the protocol version, the round and the parties involved.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol, cast

import numpy as np

from sim.crypto import aead, agreement, prg, shamir, signatures
from sim.crypto.randomness import RandomSource
from sim.protocol.wire import Blank, Data, Opaque, Vector

SEED_BYTES = 32
KEY_BYTES = agreement.KEY_BYTES
SHARE_BYTES = shamir.share_size(32)
"""A share of a 32-byte secret (an X25519 private key or a mask seed)."""
PLAINTEXT_BYTES = 8 + 8 + 2 * SHARE_BYTES
"""``sender (u64) | receiver (u64) | share of s_sk | share of b`` (| shares of noise seeds, under XNoise)."""
CIPHERTEXT_BYTES = PLAINTEXT_BYTES + aead.OVERHEAD


def plaintext_bytes(shares: int) -> int:
    """Bytes of a share plaintext holding ``shares`` shares (2 + the removable noise components)."""
    return 16 + shares * SHARE_BYTES


def ciphertext_bytes(shares: int) -> int:
    return plaintext_bytes(shares) + aead.OVERHEAD


_DOMAIN = b"dropsim/secagg/v1/"


def _pair(round: int, a: int, b: int) -> bytes:
    return struct.pack("<IQQ", round, a, b)


def _pair_key_info(purpose: bytes, round: int, a: int, b: int) -> bytes:
    """HKDF info of a key both parties of the pair derive: purpose, round, the pair in ascending order."""
    return _DOMAIN + purpose + _pair(round, min(a, b), max(a, b))


def survivors_bytes(session: bytes, round: int, clients: Sequence[int]) -> bytes:
    """What a client signs in the consistency check: the session, the round and the sorted set U3."""
    packed = struct.pack(f"<II{len(clients)}Q", round, len(clients), *sorted(clients))
    return _DOMAIN + b"survivors" + session + packed


def upload_bytes(session: bytes, round: int, client: int) -> bytes:
    """What a client signs with its masked input under distributed DP in the malicious variant (Dordis 3.3):
    that it uploaded in this round, so the server cannot count a client that dropped as a survivor (and so
    understate dropout to remove more noise)."""
    return _DOMAIN + b"upload" + session + struct.pack("<IQ", round, client)


def keys_bytes(session: bytes, round: int, client: int, c_pk: Data, s_pk: Data) -> bytes:
    """What a client signs when advertising its keys (Figure 5, stage 0): bound to the session (variant,
    round, clients, graph), the round and the sender. Empty for sized (timing) keys, never really signed."""
    if not (isinstance(c_pk, bytes) and isinstance(s_pk, bytes)):
        return b""
    return _DOMAIN + b"keys" + session + struct.pack("<IQ", round, client) + c_pk + s_pk


class OpenedShares:
    """The shares a client holds of another client's secrets, from one decrypted ciphertext: of its mask
    key, its self-mask seed and (XNoise) its noise seeds g_1, g_2, ..."""

    def __init__(self, s_share: Data, b_share: Data, noise: tuple[Data, ...] = ()) -> None:
        self.s_share = s_share
        self.b_share = b_share
        self.noise = noise


@dataclass(frozen=True)
class Recovered:
    """A secret reconstructed from its holders' shares, and the holders whose shares contradicted it (set
    aside). ``secret`` is None when the shares contradict each other and the liars cannot be outvoted."""

    secret: Data | None
    liars: tuple[int, ...] = ()


class Suite(Protocol):
    full: bool
    """Whether the cryptography is real (keys, signatures, ciphertexts, masks)."""
    vectors: bool
    """Whether vectors and noise seeds are real (the machines encode, add noise, sum and decode)."""

    def keypair(self, rng: RandomSource) -> tuple[Data, Data]: ...
    def seed(self, rng: RandomSource) -> Data: ...
    def sign(self, signing_key: Data, message: bytes) -> Data: ...
    def verify(self, public: Data, message: bytes, signature: Data) -> bool: ...
    def share(self, secret: Data, threshold: int, holders: Sequence[int], rng: RandomSource) -> list[Data]: ...
    def reconstruct(self, holders: Sequence[int], shares: Sequence[Data]) -> Data: ...
    def recover(
        self,
        holders: Sequence[int],
        shares: Sequence[Data],
        threshold: int,
        check: Callable[[Data], bool] | None = None,
        suspects: Collection[int] = (),
    ) -> Recovered: ...
    def public_of(self, private: Data) -> Data: ...
    def valid_key(self, public: Data) -> bool: ...
    def valid_shares(self, shares: Sequence[Data]) -> bool: ...
    def seal(
        self,
        c_sk: Data,
        peer_c_pk: Data,
        round: int,
        sender: int,
        receiver: int,
        shares: Sequence[Data],
        rng: RandomSource,
    ) -> Data: ...
    def open(
        self, c_sk: Data, peer_c_pk: Data, round: int, sender: int, receiver: int, ct: Data, count: int
    ) -> OpenedShares: ...
    def share_many(
        self, secrets: Sequence[Data], threshold: int, holders: Sequence[int], rng: RandomSource
    ) -> list[list[Data]]: ...
    def pair_mask(
        self, s_sk: Data, peer_s_pk: Data, round: int, a: int, b: int, length: int, bits: int, scratch: bool = False
    ) -> Vector: ...
    def self_mask(self, seed: Data, length: int, bits: int, scratch: bool = False) -> Vector: ...


class RealSuite:
    """The operations performed with :mod:`sim.crypto`."""

    full = True
    vectors = True

    def keypair(self, rng: RandomSource) -> tuple[Data, Data]:
        return agreement.generate(rng)

    def seed(self, rng: RandomSource) -> Data:
        return rng.bytes(SEED_BYTES)

    def sign(self, signing_key: Data, message: bytes) -> Data:
        assert isinstance(signing_key, bytes)
        return signatures.sign(signing_key, message)

    def verify(self, public: Data, message: bytes, signature: Data) -> bool:
        assert isinstance(public, bytes)
        return isinstance(signature, bytes) and signatures.verify(public, message, signature)

    def share(self, secret: Data, threshold: int, holders: Sequence[int], rng: RandomSource) -> list[Data]:
        assert isinstance(secret, bytes)
        return list(shamir.share_bytes(secret, threshold, [h + 1 for h in holders], rng))

    def reconstruct(self, holders: Sequence[int], shares: Sequence[Data]) -> Data:
        assert all(isinstance(s, bytes) for s in shares)
        return shamir.reconstruct_bytes([h + 1 for h in holders], shares, 32)  # type: ignore[arg-type]

    def recover(
        self,
        holders: Sequence[int],
        shares: Sequence[Data],
        threshold: int,
        check: Callable[[Data], bool] | None = None,
        suspects: Collection[int] = (),
    ) -> Recovered:
        """The 32-byte secret from the shares of ``holders`` (ascending), despite wrong ones.

        As :meth:`reconstruct` does, from the first ``threshold`` shares; then ``check`` (a test of the
        secret itself, e.g. a key against its public key), or else the parity checks of the rest
        (:func:`sim.crypto.shamir.consistent`), confirm it. Only if they fail does :func:`shamir.decode`
        look for the secret that the most shares agree on, trying ``suspects`` left out first.
        """
        if all(isinstance(s, bytes) and len(s) == SHARE_BYTES for s in shares):
            sized = list(range(len(shares)))
        else:
            sized = [i for i, s in enumerate(shares) if isinstance(s, bytes) and len(s) == SHARE_BYTES]
        joined = b"".join(shares[i] for i in sized)  # type: ignore[misc]
        rows = np.frombuffer(joined, dtype="<u4").reshape(len(sized), SHARE_BYTES // 4).astype(np.int64)
        in_field = rows.max(axis=1, initial=0) < shamir.PRIME
        if len(sized) < len(shares) or not in_field.all():  # refused where they enter (valid_shares), and here
            keep = [i for i, ok in zip(sized, in_field, strict=True) if ok]
            found = self.recover([holders[i] for i in keep], [shares[i] for i in keep], threshold, check, suspects)
            dropped = {holders[i] for i in range(len(shares)) if i not in keep}
            return Recovered(found.secret, tuple(sorted({*found.liars, *dropped})))
        if len(shares) < threshold:
            return Recovered(None)
        xs = tuple(h + 1 for h in holders)
        t = threshold
        try:
            secret = shamir.elements_to_bytes(shamir.reconstruct(xs[:t], rows[:t]), SEED_BYTES)
        except ValueError:  # not a byte string: some share is wrong
            pass
        else:
            if check(secret) if check is not None else shamir.consistent(xs, rows, t):
                return Recovered(secret)

        def accept(elements: np.ndarray) -> bool:
            assert check is not None
            try:
                return check(shamir.elements_to_bytes(elements, SEED_BYTES))
            except ValueError:
                return False

        first = [i for i, h in enumerate(holders) if h in suspects]
        elements, wrong = shamir.decode(xs, rows, t, accept if check is not None else None, first)
        if elements is None:
            return Recovered(None)
        try:
            secret = shamir.elements_to_bytes(elements, SEED_BYTES)
        except ValueError:  # the shares agree on something that is no byte string: the dealer's doing
            return Recovered(None, tuple(holders[i] for i in wrong))
        return Recovered(secret, tuple(holders[i] for i in wrong))

    def public_of(self, private: Data) -> Data:
        assert isinstance(private, bytes)
        return agreement.public_of(private)

    def valid_key(self, public: Data) -> bool:
        """Whether ``public`` is a 32-byte X25519 key of large order (:func:`sim.crypto.agreement.low_order`)."""
        return isinstance(public, bytes) and len(public) == KEY_BYTES and not agreement.low_order(public)

    def valid_shares(self, shares: Sequence[Data]) -> bool:
        """Whether every share is :data:`SHARE_BYTES` bytes of field elements (uint32 below 2^31 - 1)."""
        if not all(isinstance(s, bytes) and len(s) == SHARE_BYTES for s in shares):
            return False
        joined = b"".join(shares)  # type: ignore[arg-type]
        return not joined or int(np.frombuffer(joined, dtype="<u4").max()) < shamir.PRIME

    def seal(
        self,
        c_sk: Data,
        peer_c_pk: Data,
        round: int,
        sender: int,
        receiver: int,
        shares: Sequence[Data],
        rng: RandomSource,
    ) -> Data:
        """Encrypt ``sender``'s shares for ``receiver`` (s_sk's, b's, then the noise seeds')."""
        assert isinstance(c_sk, bytes) and isinstance(peer_c_pk, bytes)
        assert all(isinstance(s, bytes) and len(s) == SHARE_BYTES for s in shares)
        key = agreement.agree(
            c_sk, peer_c_pk, _DOMAIN + b"enc" + _pair(round, min(sender, receiver), max(sender, receiver)), keep=True
        )
        plaintext = struct.pack("<QQ", sender, receiver) + b"".join(shares)  # type: ignore[arg-type]
        return aead.encrypt(key, plaintext, _pair(round, sender, receiver), rng)

    def open(
        self, c_sk: Data, peer_c_pk: Data, round: int, sender: int, receiver: int, ct: Data, count: int
    ) -> OpenedShares:
        """Decrypt the ``count`` shares ``sender`` sealed for ``receiver``; raises ``aead.DecryptionError``."""
        assert isinstance(c_sk, bytes) and isinstance(peer_c_pk, bytes) and isinstance(ct, bytes)
        key = agreement.agree(
            c_sk, peer_c_pk, _DOMAIN + b"enc" + _pair(round, min(sender, receiver), max(sender, receiver)), keep=True
        )
        plaintext = aead.decrypt(key, ct, _pair(round, sender, receiver))
        if len(plaintext) != plaintext_bytes(count):
            raise aead.DecryptionError(f"plaintext of {len(plaintext)} bytes, expected {plaintext_bytes(count)}")
        u, v = struct.unpack_from("<QQ", plaintext)
        if (u, v) != (sender, receiver):
            raise aead.DecryptionError(f"plaintext names sender {u} and receiver {v}, not {sender} and {receiver}")
        parts = tuple(plaintext[16 + i * SHARE_BYTES : 16 + (i + 1) * SHARE_BYTES] for i in range(count))
        return OpenedShares(parts[0], parts[1], parts[2:])

    def share_many(
        self, secrets: Sequence[Data], threshold: int, holders: Sequence[int], rng: RandomSource
    ) -> list[list[Data]]:
        """Shares of several 32-byte secrets at once (one polynomial per field element, as
        :meth:`share`): ``result[i][j]`` is holder i's share of secret j."""
        assert all(isinstance(s, bytes) for s in secrets)
        elements = np.concatenate([shamir.bytes_to_elements(s) for s in secrets])  # type: ignore[arg-type]
        table = shamir.share(elements, threshold, [h + 1 for h in holders], rng)
        width = shamir.elements_for(32)
        return [
            [row[j * width : (j + 1) * width].astype("<u4").tobytes() for j in range(len(secrets))] for row in table
        ]

    def pair_mask(
        self, s_sk: Data, peer_s_pk: Data, round: int, a: int, b: int, length: int, bits: int, scratch: bool = False
    ) -> Vector:
        """The pair mask PRG(s_ab); with ``scratch``, in this thread's kept buffer (:func:`sim.crypto.prg.expand`),
        valid until the next scratch mask: add it at once."""
        assert isinstance(s_sk, bytes) and isinstance(peer_s_pk, bytes)
        seed = agreement.agree(s_sk, peer_s_pk, _pair_key_info(b"mask", round, a, b), keep=True)
        return prg.expand(seed, length, bits, scratch)

    def self_mask(self, seed: Data, length: int, bits: int, scratch: bool = False) -> Vector:
        """The self mask PRG(b); ``scratch`` as for :meth:`pair_mask`."""
        assert isinstance(seed, bytes)
        return prg.expand(seed, length, bits, scratch)


_KEY, _SEED, _SHARE, _SECRET = Opaque(KEY_BYTES), Opaque(SEED_BYTES), Opaque(SHARE_BYTES), Opaque(32)
_SIGNATURE = Opaque(signatures.SIGNATURE_BYTES)


@lru_cache(maxsize=64)
def _sealed(shares: int) -> Opaque:
    return Opaque(ciphertext_bytes(shares))


@lru_cache(maxsize=64)
def _opened(count: int) -> OpenedShares:
    return OpenedShares(_SHARE, _SHARE, (_SHARE,) * (count - 2))


class SizedSuite:
    """The same operations by size only (``timing`` fidelity): nothing is computed. Its values are
    immutable and carry only their length, so one object of each length serves every call (a round of
    1,000 clients would otherwise make some 50,000 of them)."""

    full = False
    vectors = False

    def keypair(self, rng: RandomSource) -> tuple[Data, Data]:
        return _KEY, _KEY

    def seed(self, rng: RandomSource) -> Data:
        return _SEED

    def sign(self, signing_key: Data, message: bytes) -> Data:
        return _SIGNATURE

    def verify(self, public: Data, message: bytes, signature: Data) -> bool:
        return True

    def share(self, secret: Data, threshold: int, holders: Sequence[int], rng: RandomSource) -> list[Data]:
        return [_SHARE] * len(holders)

    def reconstruct(self, holders: Sequence[int], shares: Sequence[Data]) -> Data:
        return _SECRET

    def recover(
        self,
        holders: Sequence[int],
        shares: Sequence[Data],
        threshold: int,
        check: Callable[[Data], bool] | None = None,
        suspects: Collection[int] = (),
    ) -> Recovered:
        return Recovered(_SECRET if len(shares) >= threshold else None)

    def public_of(self, private: Data) -> Data:
        return _KEY

    def valid_key(self, public: Data) -> bool:
        return len(public) == KEY_BYTES

    def valid_shares(self, shares: Sequence[Data]) -> bool:
        return all(len(s) == SHARE_BYTES for s in shares)

    def seal(
        self,
        c_sk: Data,
        peer_c_pk: Data,
        round: int,
        sender: int,
        receiver: int,
        shares: Sequence[Data],
        rng: RandomSource,
    ) -> Data:
        return _sealed(len(shares))

    def open(
        self, c_sk: Data, peer_c_pk: Data, round: int, sender: int, receiver: int, ct: Data, count: int
    ) -> OpenedShares:
        return _opened(count)

    def share_many(
        self, secrets: Sequence[Data], threshold: int, holders: Sequence[int], rng: RandomSource
    ) -> list[list[Data]]:
        return [[_SHARE] * len(secrets) for _ in holders]

    def pair_mask(
        self, s_sk: Data, peer_s_pk: Data, round: int, a: int, b: int, length: int, bits: int, scratch: bool = False
    ) -> Vector:
        return Blank(length, np.uint32)

    def self_mask(self, seed: Data, length: int, bits: int, scratch: bool = False) -> Vector:
        return Blank(length, np.uint32)


@dataclass(frozen=True, eq=False)
class Carried(Opaque):
    """A sized stand-in that carries what the real value would let its holder recover (``learning``
    fidelity): a share carries the secret it is a share of, a ciphertext the shares it seals. Its length is
    the real value's, so messages holding it are sized as the real ones; it has no bytes to encode."""

    inside: object = field(repr=False)
    """The secret (of a share) or the tuple of shares (of a ciphertext)."""


class LearningSuite(SizedSuite):
    """The operations for the ``learning`` fidelity: the protocol's messages, sizes and work as
    :class:`SizedSuite` gives them, with real noise seeds and no cryptography.

    Each client's key stream (a :class:`~sim.crypto.randomness.RandomSource`) is consumed exactly as
    :class:`RealSuite` consumes it: 32 bytes per key pair (:func:`sim.crypto.agreement.generate`), 32 per
    seed, the Shamir coefficients of every share by the same rejection sampling
    (:func:`sim.crypto.shamir.random_elements`, same counts), a nonce per ciphertext
    (:func:`sim.crypto.aead.encrypt`). So every seed drawn from it (the noise seeds, the self-mask seed,
    rebasing's fresh seed) is the byte string ``full`` draws, and the noise is the same. A share is a
    :class:`Carried` of :data:`SHARE_BYTES` holding its secret, a ciphertext one of its ciphertext's
    length holding its shares: recovering a secret from at least ``threshold`` shares returns it (a
    survivor's noise seeds in XNoise's noise removal). Masks are never made (:meth:`pair_mask` and
    :meth:`self_mask` give blanks, as :class:`SizedSuite`'s, whose signatures and checks it keeps: the
    machines add masks only when ``full``, and the clients are honest.
    """

    full = False
    vectors = True

    def keypair(self, rng: RandomSource) -> tuple[Data, Data]:
        rng.bytes(KEY_BYTES)  # agreement.generate's draw
        return _KEY, _KEY

    def seed(self, rng: RandomSource) -> Data:
        return rng.bytes(SEED_BYTES)

    @staticmethod
    def _draw(secrets: int, threshold: int, rng: RandomSource) -> None:
        """The random coefficients :func:`sim.crypto.shamir.share` draws for ``secrets`` 32-byte secrets."""
        shamir.random_elements((threshold - 1) * secrets * shamir.elements_for(SEED_BYTES), rng)

    def share(self, secret: Data, threshold: int, holders: Sequence[int], rng: RandomSource) -> list[Data]:
        self._draw(1, threshold, rng)
        return [Carried(SHARE_BYTES, secret)] * len(holders)

    def reconstruct(self, holders: Sequence[int], shares: Sequence[Data]) -> Data:
        share = shares[0]
        assert isinstance(share, Carried)
        return cast(Data, share.inside)

    def recover(
        self,
        holders: Sequence[int],
        shares: Sequence[Data],
        threshold: int,
        check: Callable[[Data], bool] | None = None,
        suspects: Collection[int] = (),
    ) -> Recovered:
        """The carried secret from at least ``threshold`` shares (None below it), as :class:`RealSuite`
        recovers it from honest shares."""
        if len(shares) < threshold:
            return Recovered(None)
        return Recovered(self.reconstruct(holders, shares))

    def seal(
        self,
        c_sk: Data,
        peer_c_pk: Data,
        round: int,
        sender: int,
        receiver: int,
        shares: Sequence[Data],
        rng: RandomSource,
    ) -> Data:
        rng.bytes(aead.NONCE_BYTES)  # aead.encrypt's draw
        return Carried(ciphertext_bytes(len(shares)), tuple(shares))

    def open(
        self, c_sk: Data, peer_c_pk: Data, round: int, sender: int, receiver: int, ct: Data, count: int
    ) -> OpenedShares:
        assert isinstance(ct, Carried)
        parts = cast(tuple[Data, ...], ct.inside)
        assert len(parts) == count
        return OpenedShares(parts[0], parts[1], parts[2:])

    def share_many(
        self, secrets: Sequence[Data], threshold: int, holders: Sequence[int], rng: RandomSource
    ) -> list[list[Data]]:
        """As :meth:`RealSuite.share_many`: one draw of coefficients for every secret's elements."""
        self._draw(len(secrets), threshold, rng)
        row: list[Data] = [Carried(SHARE_BYTES, s) for s in secrets]
        return [row for _ in holders]


SUITES: dict[str, Callable[[], Suite]] = {"full": RealSuite, "learning": LearningSuite, "timing": SizedSuite}
"""The suite of each fidelity (``sim.scenario.types.FIDELITIES``)."""
