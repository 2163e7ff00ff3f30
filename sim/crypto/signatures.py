"""Ed25519 signatures (RFC 8032) for SecAgg's malicious-server variant.

Each client holds a long-term signing key issued by a trusted party (Dordis Figure 5's PKI); the
verification keys of all clients are public. Keys are 32-byte seeds / public keys, signatures 64 bytes.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from sim.crypto.randomness import RandomSource

SIGNATURE_BYTES = 64


def generate(rng: RandomSource) -> tuple[bytes, bytes]:
    """``(signing seed, verification key)``, 32 bytes each."""
    seed = rng.bytes(32)
    return seed, public(seed)


def public(seed: bytes) -> bytes:
    """The verification key of a 32-byte signing seed."""
    return Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def valid_public(key: bytes) -> bool:
    """Whether ``key`` is accepted as an Ed25519 verification key (32 bytes; a value that is no point of the
    curve is accepted here and verifies no signature)."""
    try:
        Ed25519PublicKey.from_public_bytes(key)
    except ValueError:
        return False
    return True


def sign(seed: bytes, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(seed).sign(message)


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is valid for ``message`` under ``public`` (False for malformed inputs)."""
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
