"""Mask expansion: a 32-byte seed to a vector uniform over Z_(2^bits), from an AES-256-CTR keystream.

Element i is the i-th little-endian 4-byte word of the keystream (zero nonce; every seed is used for one
vector only) reduced mod 2^bits, for 1 <= bits <= 32: uniform, because 2^bits divides 2^32. This is the
PRG of Bonawitz et al.; unlike implementations that fold seeds into 32 bits or use Mersenne Twister, the
masks are a cryptographic keystream.
"""

from __future__ import annotations

import threading

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MAX_BITS = 32


def expand(seed: bytes, length: int, bits: int, scratch: bool = False) -> np.ndarray:
    """``length`` elements of Z_(2^bits) as uint32 (values < 2^bits).

    The keystream is written straight into the result's memory (no intermediate bytes). With ``scratch``, into
    this thread's kept buffer: the result is a view that the next ``scratch`` expansion in this thread
    overwrites, for a mask added at once (:func:`sim.protocol.encoding.add_mod_into`) without allocating
    ``length`` words each time."""
    if not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in 1..{MAX_BITS}, not {bits}")
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, not {len(seed)}")
    words = _buffer(length) if scratch else np.empty(length + _SLACK, dtype=np.uint32)
    encryptor = Cipher(algorithms.AES256(seed), modes.CTR(bytes(16))).encryptor()
    encryptor.update_into(_zeros(4 * length), words.view(np.uint8).data)
    out = words[:length]
    if bits < MAX_BITS:
        np.bitwise_and(out, np.uint32((1 << bits) - 1), out=out)
    return out


_SLACK = 4
"""Words past the end that ``update_into`` asks room for (a block less one byte)."""

_local = threading.local()
_ZEROS = [b""]


def _zeros(n: int) -> memoryview:
    """``n`` zero bytes, the plaintext a keystream is made from (kept, grown as needed; read-only). Safe on
    any thread: a thread slices the buffer it read or made, whatever another thread keeps meanwhile."""
    zeros = _ZEROS[0]
    if len(zeros) < n:
        zeros = bytes(max(n, 2 * len(zeros)))
        if len(zeros) > len(_ZEROS[0]):
            _ZEROS[0] = zeros
    return memoryview(zeros)[:n]


def _buffer(length: int) -> np.ndarray:
    """This thread's scratch words, at least ``length`` + slack."""
    buf = getattr(_local, "words", None)
    if buf is None or buf.shape[0] < length + _SLACK:
        buf = _local.words = np.empty(length + _SLACK, dtype=np.uint32)
    return buf
