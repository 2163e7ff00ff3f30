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

Wrong shares. The n >= t shares of one secret are a codeword of a Reed-Solomon code of length n and
dimension t, so those beyond the t interpolated can check them: :func:`consistent` runs up to
:data:`CHECKS` parity checks of the dual code, which see any lie told by up to that many holders (at the
cost of CHECKS reconstructions). :func:`decode` then looks for the polynomial that agrees with more than the
others by trying bases of t shares, fewest left out first. With e lying holders among n it is the only one
that can be taken when n >= t + 2e (any other polynomial of degree < t agrees with at most t - 1 + e
shares), and with an ``accept`` test of the secret itself (a key against its public key) any base of t
honest shares gives it. The search is bounded (:data:`DECODE_BASES`): one liar is always found (t + 1
bases at most), several only if a base without them comes up in time; otherwise decode gives up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from itertools import combinations

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


CHECKS = 8
"""Parity checks :func:`consistent` runs: a lie by at most this many of a secret's holders always shows."""
DECODE_BASES = 256
"""Bases of t shares :func:`decode` tries at most (each costs about n reconstructions)."""


def _products_except(d: np.ndarray) -> np.ndarray:
    """``out[i, j] = prod_{l != j} d[i, l] mod p`` by prefix and suffix products (no inverse needed)."""
    rows, cols = d.shape
    prefix = np.ones((rows, cols), dtype=np.int64)
    suffix = np.ones((rows, cols), dtype=np.int64)
    for j in range(1, cols):
        prefix[:, j] = prefix[:, j - 1] * d[:, j - 1] % PRIME
        suffix[:, cols - 1 - j] = suffix[:, cols - j] * d[:, cols - j] % PRIME
    return prefix * suffix % PRIME


def _row_products(d: np.ndarray) -> np.ndarray:
    """``prod_l d[i, l] mod p`` for every row i."""
    out = np.ones(d.shape[0], dtype=np.int64)
    for j in range(d.shape[1]):
        out = out * d[:, j] % PRIME
    return out


def _inverses(values: np.ndarray) -> np.ndarray:
    """Inverses mod p (Fermat) of non-zero elements."""
    return np.asarray([pow(int(v), PRIME - 2, PRIME) for v in values], dtype=np.int64)


def _weights(x: np.ndarray) -> np.ndarray:
    """Barycentric weights ``1 / prod_{j != i} (x_i - x_j)`` of distinct points."""
    diff = (x[:, None] - x[None, :]) % PRIME
    np.fill_diagonal(diff, 1)
    return _inverses(_row_products(diff))


@lru_cache(maxsize=4096)
def parity_checks(xs: tuple[int, ...], threshold: int) -> np.ndarray:
    """Rows ``c_k`` (``k < min(n - t, CHECKS)``) with ``sum_i c_k[i] f(x_i) = 0`` for every polynomial f of
    degree < t (cached per set of parties).

    ``c_k[i] = x_i^k / prod_{j != i} (x_i - x_j)``: the sum is the coefficient of ``x^(n-1)`` of the
    polynomial of degree < n through ``(x_i, x_i^k f(x_i))``, which is ``x^k f`` itself, of degree at most
    ``k + t - 1 <= n - 2``. The K rows restricted to any K parties are a Vandermonde matrix times an
    invertible diagonal, so an error on at most K shares never passes all of them.
    """
    x = _check_xs(xs)
    n, k = x.size, max(0, min(x.size - threshold, CHECKS))
    if k == 0:
        return np.zeros((0, n), dtype=np.int64)
    rows = [_weights(x)]
    for _ in range(1, k):
        rows.append(rows[-1] * x % PRIME)
    return np.stack(rows)


def consistent(xs: Sequence[int], shares: np.ndarray, threshold: int) -> bool:
    """Whether the shares (shape ``(len(xs), m)``) pass the :func:`parity_checks` of degree < ``threshold``."""
    checks = parity_checks(xs if isinstance(xs, tuple) else tuple(int(v) for v in xs), threshold)
    if checks.size == 0:
        return True
    y = np.asarray(shares, dtype=np.int64)
    if y.shape[0] >= 1 << 16:
        return not (((checks[:, :, None] * y[None, :, :]) % PRIME).sum(axis=1) % PRIME).any()
    # Two integer products over the 16-bit halves of y: each term stays below 2^47, each sum below 2^63.
    low = checks @ (y & 0xFFFF) % PRIME
    high = checks @ (y >> 16) % PRIME
    return not ((high * 65536 + low) % PRIME).any()


def evaluate(xs: Sequence[int], shares: np.ndarray, at: Sequence[int]) -> np.ndarray:
    """Values at the points ``at`` of the polynomials of degree < len(xs) through the shares of ``xs``:
    shape ``(len(at), m)``, by Lagrange's basis ``L_j(a) = prod_{l != j} (a - x_l) / (x_j - x_l)``."""
    x, a = _check_xs(xs), np.asarray(at, dtype=np.int64)
    basis = _products_except((a[:, None] - x[None, :]) % PRIME) * _weights(x) % PRIME
    y = np.asarray(shares, dtype=np.int64)
    return ((basis[:, :, None] * y[None, :, :]) % PRIME).sum(axis=1) % PRIME


def _bases(order: list[int], threshold: int, most_left_out: int, first: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Bases of ``threshold`` rows: without ``first`` (suspects already known), then leaving out k = 0, 1, ..
    of the first t + k rows (the base is the first t of the rest; leaving out later rows changes nothing)."""
    if first:
        rest = [i for i in order if i not in first]
        if len(rest) >= threshold:
            yield tuple(rest[:threshold])
    for k in range(min(most_left_out, len(order) - threshold) + 1):
        for skip in combinations(range(threshold + k), k):
            yield tuple(order[i] for i in range(threshold + k) if i not in skip)


def decode(
    xs: Sequence[int],
    shares: np.ndarray,
    threshold: int,
    accept: Callable[[np.ndarray], bool] | None = None,
    first: Sequence[int] = (),
) -> tuple[np.ndarray | None, tuple[int, ...]]:
    """``(secret, rows that disagree with it)`` despite wrong shares, or ``(None, ())`` if it cannot be told.

    Without ``accept`` a base's polynomial is taken when it agrees with at least t more shares than it
    disagrees with: the unique decoding radius, so for n >= t + 2e with e liars the honest polynomial is
    found and no other can be. With ``accept`` (a check of the secret itself), the first base whose secret
    passes it is taken, which needs only t honest shares. ``first`` lists rows suspected already (tried left
    out first); at most :data:`DECODE_BASES` bases are tried.
    """
    x = _check_xs(xs)
    y = np.asarray(shares, dtype=np.int64)
    n, t = x.size, threshold
    if y.ndim != 2 or y.shape[0] != n:
        raise ValueError(f"need one row of shares per party: {n} parties, shares of shape {y.shape}")
    in_field = np.all((y >= 0) & (y < PRIME), axis=1)
    order = [int(i) for i in np.flatnonzero(in_field)]
    most_left_out = len(order) - t if accept is not None else (n - t) // 2
    tried: set[tuple[int, ...]] = set()
    for base in _bases(order, t, most_left_out, tuple(first)):
        if base in tried:
            continue
        if len(tried) == DECODE_BASES:
            break
        tried.add(base)
        xb, yb = [int(x[i]) for i in base], y[list(base)]
        agree = (evaluate(xb, yb, xs) == y).all(axis=1)
        secret = reconstruct(xb, yb)
        disagree = n - int(agree.sum())
        taken = accept(secret) if accept is not None else n - 2 * disagree >= t
        if taken:
            return secret, tuple(int(i) for i in np.flatnonzero(~agree))
    return None, ()


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
