"""Randomness for the protocols: a seeded AES-256-CTR byte stream, or the operating system's.

The simulator must be reproducible, so each party's key material comes from a :class:`SeededRandom`
whose 32-byte seed is derived from the scenario seed (the ``KEYS`` stream); the stream is the AES-256-CTR
keystream of that seed (a standard CTR_DRBG construction without reseeding). The real-socket mode can use
:class:`SystemRandom` (``os.urandom``) instead; both offer the same :meth:`bytes`.
"""

from __future__ import annotations

import os
from typing import Protocol

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_ZERO_NONCE = bytes(16)


class RandomSource(Protocol):
    def bytes(self, n: int) -> bytes:
        """``n`` uniformly random bytes."""
        ...


class SeededRandom:
    """Deterministic bytes: the AES-256-CTR keystream of a 32-byte seed, consumed in order."""

    def __init__(self, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError(f"seed must be 32 bytes, not {len(seed)}")
        self._encryptor = Cipher(algorithms.AES256(seed), modes.CTR(_ZERO_NONCE)).encryptor()

    def bytes(self, n: int) -> bytes:
        return self._encryptor.update(bytes(n))


class SystemRandom:
    """The operating system's randomness (for real deployments)."""

    def bytes(self, n: int) -> bytes:
        return os.urandom(n)
