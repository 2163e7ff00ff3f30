"""X25519 key agreement (RFC 7748) composed with HKDF-SHA256 (RFC 5869).

``agree(sk, pk, info)`` is SecAgg's KA.agree "composed with a secure hash function" (Bonawitz et al.
2017, section 4; Dordis Figure 5): the raw X25519 shared secret goes through HKDF-SHA256 with no salt and
the caller's ``info`` (which binds the purpose, the round and the pair), giving 32 bytes. Both parties of
a pair obtain the same key: ``agree(sk_u, pk_v, i) == agree(sk_v, pk_u, i)``.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from sim.crypto.randomness import RandomSource

KEY_BYTES = 32
"""Length of X25519 private and public keys, and of agreed keys."""


def generate(rng: RandomSource) -> tuple[bytes, bytes]:
    """A fresh key pair ``(private, public)``, 32 bytes each, from ``rng``."""
    sk = X25519PrivateKey.from_private_bytes(rng.bytes(KEY_BYTES))
    return private_bytes(sk), sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(sk: X25519PrivateKey) -> bytes:
    return sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_of(private: bytes) -> bytes:
    """The public key of a raw private key."""
    sk = X25519PrivateKey.from_private_bytes(private)
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


_P = 2**255 - 19
_SMALL_ORDER = (
    0,
    1,
    _P - 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
)
"""u-coordinates (mod p) of the points of order 1, 2, 4 and 8 on Curve25519 and its twist."""
_LOW_ORDER = frozenset(
    (u + wrap + top).to_bytes(KEY_BYTES, "little")
    for u in _SMALL_ORDER
    for wrap in (0, _P)
    for top in (0, 1 << 255)
    if u + wrap < 1 << 255
)
"""Every 32-byte encoding of them: X25519 ignores the top bit and reduces u mod p (RFC 7748, section 5)."""


def low_order(public: bytes) -> bool:
    """Whether X25519 with ``public`` gives the all-zero secret for every private key: a point of small order
    (RFC 7748, section 6.1). Every clamped private key is a multiple of 8, which sends exactly these to zero."""
    return bytes(public) in _LOW_ORDER


def hkdf(secret: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 with no salt (RFC 5869)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def agree(private: bytes, peer_public: bytes, info: bytes, keep: bool = False) -> bytes:
    """32-byte key shared with the holder of ``peer_public``; raises ValueError on a bad peer key.

    With ``keep``, the private key's parsed form stays in a small cache (:func:`_kept`) for the next
    agreement with the same key: parsing costs about as much as the exchange itself (a scalar multiplication
    for the public key), and a protocol key agrees with every neighbour in turn. Not for ephemeral keys,
    which should not outlive their one use."""
    sk = _kept(bytes(private)) if keep else X25519PrivateKey.from_private_bytes(private)
    return hkdf(sk.exchange(X25519PublicKey.from_public_bytes(peer_public)), info)


@lru_cache(maxsize=64)
def _kept(private: bytes) -> X25519PrivateKey:
    """The parsed private key, for the 64 keys used most recently (a round's client agrees with all its
    neighbours within one step, so a few entries cover a step; more cover interleaved clients)."""
    return X25519PrivateKey.from_private_bytes(private)
