"""X25519 key agreement (RFC 7748) composed with HKDF-SHA256 (RFC 5869).

``agree(sk, pk, info)`` is SecAgg's KA.agree "composed with a secure hash function" (Bonawitz et al.
2017, section 4; Dordis Figure 5): the raw X25519 shared secret goes through HKDF-SHA256 with no salt and
the caller's ``info`` (which binds the purpose, the round and the pair), giving 32 bytes. Both parties of
a pair obtain the same key: ``agree(sk_u, pk_v, i) == agree(sk_v, pk_u, i)``.
"""

from __future__ import annotations

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


def hkdf(secret: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 with no salt (RFC 5869)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def agree(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """32-byte key shared with the holder of ``peer_public``; raises ValueError on a bad peer key."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return hkdf(shared, info)
