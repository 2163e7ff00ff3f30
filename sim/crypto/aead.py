"""AES-256-GCM authenticated encryption (NIST SP 800-38D) for SecAgg's share ciphertexts.

A ciphertext is ``nonce (12 bytes) | GCM ciphertext and 16-byte tag``; the nonce comes from the caller's
randomness, since both parties of a pair hold the same agreed key. ``associated`` data (round and the
two parties) is authenticated but not sent. Decryption failure raises :class:`DecryptionError`.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sim.crypto.randomness import RandomSource

NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
"""Bytes a ciphertext adds to its plaintext."""


class DecryptionError(ValueError):
    """A ciphertext that does not authenticate under the key and associated data."""


def encrypt(key: bytes, plaintext: bytes, associated: bytes, rng: RandomSource) -> bytes:
    nonce = rng.bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    if len(ciphertext) < OVERHEAD:
        raise DecryptionError(f"ciphertext of {len(ciphertext)} bytes is shorter than nonce and tag")
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated)
    except InvalidTag:
        raise DecryptionError("ciphertext does not authenticate") from None
