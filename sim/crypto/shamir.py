"""Shamir t-out-of-n secret sharing over GF(p), p = 2^31 - 1, vectorised over many secrets.

A secret of m field elements is shared by m independent random polynomials of degree t - 1 whose
constant terms are the secret; party x (a non-zero field element, dropsim uses population index + 1)
gets their values at x, computed for all parties and all secrets at once by Horner's rule on int64
arrays (every product of two elements < 2^31 fits in 63 bits). Any t shares give the secret back by
Lagrange interpolation at zero, ``s = sum_j lambda_j y_j`` with ``lambda_j = prod_{k != j} x_k / (x_k - x_j)``;
the coefficients are cached per set of x-coordinates, since the server reconstructs many secrets from
the same survivors. Fewer than t shares reveal nothing about the secret (Shamir 1979).

Byte strings (keys, seeds) are split into 3-byte little-endian chunks, each below p, so a 32-byte key is
11 field elements and its share 44 bytes on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from sim.crypto.randomness import RandomSource

PRIME = (1 << 31) - 1
ELEMENT_BYTES = 4
"""Bytes of one field element on the wire (uint32 little-endian)."""
_CHUNK = 3


def elements_for(nbytes: int) -> int:
    """Field elements that hold ``nbytes`` bytes."""
    return -(-nbytes // _CHUNK)


def bytes_to_elements(data: bytes) -> np.ndarray:
    """Split ``data`` into field elements (3-byte little-endian chunks, the last zero-padded)."""
    padded = data + bytes(-len(data) % _CHUNK)
    raw = np.frombuffer(padded, dtype=np.uint8).reshape(-1, _CHUNK).astype(np.int64)
    return raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)


def elements_to_bytes(elements: np.ndarray, nbytes: int) -> bytes:
    """Inverse of :func:`bytes_to_elements`; raises ValueError if an element does not fit 3 bytes."""
    e = np.asarray(elements, dtype=np.int64)
    if e.size and (e.min() < 0 or e.max() >= 1 << 24):
        raise ValueError("reconstructed value is not a byte string (wrong or tampered shares?)")
    out = np.stack([e & 0xFF, (e >> 8) & 0xFF, (e >> 16) & 0xFF], axis=1).astype(np.uint8).tobytes()
    return out[:nbytes]


def random_elements(count: int, rng: RandomSource) -> np.ndarray:
    """``count`` uniform elements of GF(p) by rejection from 31-bit words."""
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        need = count - out.size
        words = np.frombuffer(rng.bytes(4 * (need + 8)), dtype="<u4").astype(np.int64) & PRIME
        out = np.concatenate([out, words[words < PRIME][:need]])
    return out


def _check_xs(xs: Sequence[int]) -> np.ndarray:
    x = np.asarray(xs, dtype=np.int64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("need at least one party")
    if (x <= 0).any() or (x >= PRIME).any():
        raise ValueError("party x-coordinates must be in 1..p-1")
    if np.unique(x).size != x.size:
        raise ValueError("party x-coordinates must be distinct")
    return x


def share(secrets: np.ndarray, threshold: int, xs: Sequence[int], rng: RandomSource) -> np.ndarray:
    """Shares of every secret element for every party: array of shape ``(len(xs), len(secrets))``."""
    s = np.asarray(secrets, dtype=np.int64)
    x = _check_xs(xs)
    if not 1 <= threshold <= x.size:
        raise ValueError(f"threshold must be in 1..{x.size} (the number of parties), not {threshold}")
    if s.size and (s.min() < 0 or s.max() >= PRIME):
        raise ValueError("secrets must be field elements in 0..p-1")
    coefficients = random_elements((threshold - 1) * s.size, rng).reshape(threshold - 1, s.size)
    acc = np.zeros((x.size, s.size), dtype=np.int64)
    xcol = x[:, None]
    for k in range(threshold - 2, -1, -1):  # Horner: highest degree first, constant term (secret) last
        acc = (acc * xcol + coefficients[k]) % PRIME
    return (acc * xcol + s) % PRIME if threshold > 1 else np.broadcast_to(s, (x.size, s.size)).copy()


@lru_cache(maxsize=4096)
def lagrange_at_zero(xs: tuple[int, ...]) -> np.ndarray:
    """Lagrange coefficients for interpolation at 0 from the parties ``xs`` (cached)."""
    _check_xs(xs)
    lambdas = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for k, xk in enumerate(xs):
            if k != j:
                num = num * xk % PRIME
                den = den * (xk - xj) % PRIME
        lambdas.append(num * pow(den, PRIME - 2, PRIME) % PRIME)
    return np.asarray(lambdas, dtype=np.int64)


def reconstruct(xs: Sequence[int], shares: np.ndarray) -> np.ndarray:
    """The secret elements from the shares of parties ``xs`` (shape ``(len(xs), m)``), by interpolation."""
    y = np.asarray(shares, dtype=np.int64)
    if y.ndim != 2 or y.shape[0] != len(xs):
        raise ValueError(f"need one row of shares per party: {len(xs)} parties, shares of shape {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= PRIME):
        raise ValueError("shares must be field elements in 0..p-1")
    lam = lagrange_at_zero(tuple(int(v) for v in xs))
    return ((lam[:, None] * y) % PRIME).sum(axis=0) % PRIME


def share_bytes(secret: bytes, threshold: int, xs: Sequence[int], rng: RandomSource) -> list[bytes]:
    """Shares of a byte string, one ``bytes`` per party (4 bytes per field element)."""
    table = share(bytes_to_elements(secret), threshold, xs, rng)
    return [row.astype("<u4").tobytes() for row in table]


def reconstruct_bytes(xs: Sequence[int], shares: Sequence[bytes], nbytes: int) -> bytes:
    """The byte string of length ``nbytes`` from parties' shares made by :func:`share_bytes`."""
    m = elements_for(nbytes)
    rows = []
    for s in shares:
        if len(s) != m * ELEMENT_BYTES:
            raise ValueError(f"a share of a {nbytes}-byte secret has {m * ELEMENT_BYTES} bytes, not {len(s)}")
        rows.append(np.frombuffer(s, dtype="<u4").astype(np.int64))
    return elements_to_bytes(reconstruct(xs, np.asarray(rows)), nbytes)


def share_size(nbytes: int) -> int:
    """Bytes of one party's share of an ``nbytes`` secret."""
    return elements_for(nbytes) * ELEMENT_BYTES
