"""Mask expansion: a 32-byte seed to a vector uniform over Z_(2^bits), from an AES-256-CTR keystream.

Element i is the i-th little-endian 4-byte word of the keystream (zero nonce; every seed is used for one
vector only) reduced mod 2^bits, for 1 <= bits <= 32: uniform, because 2^bits divides 2^32. This is the
PRG of Bonawitz et al.; unlike implementations that fold seeds into 32 bits or use Mersenne Twister, the
masks are a cryptographic keystream.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MAX_BITS = 32


def expand(seed: bytes, length: int, bits: int) -> np.ndarray:
    """``length`` elements of Z_(2^bits) as uint32 (values < 2^bits)."""
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in 1..{MAX_BITS}, not {bits}")
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, not {len(seed)}")
    stream = Cipher(algorithms.AES256(seed), modes.CTR(bytes(16))).encryptor().update(bytes(4 * length))
    words = np.frombuffer(stream, dtype="<u4").astype(np.uint32)
    return words & np.uint32((1 << bits) - 1)
