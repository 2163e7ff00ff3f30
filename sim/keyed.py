"""Per-client values computed from a client's id, so that no array of the population's size is ever held.

Two keyed functions of 64-bit ids, both vectorised over numpy arrays of ids and both seeded from a run's
streams (:mod:`sim.seeds`), so a client's value depends only on the scenario seed, the population's size
and its own id:

* :class:`KeyedPermutation`: a bijection of ``0..size-1``. A balanced Feistel network of :data:`ROUNDS`
  rounds permutes the ``2h``-bit words (``2^(2h)`` the smallest even power of two >= ``size``, so at most
  ``4 size``); an image outside ``0..size-1`` is permuted again until it falls inside ("cycle walking"),
  which keeps the map a bijection of ``0..size-1`` (the walk from an id inside stays on that id's cycle and
  stops at the next id inside). Fewer than 4 steps per id are expected.
* :func:`keyed_uniform`: uniform floats in [0, 1) with 53 random bits each.

The round function and the uniforms are the SplitMix64 finaliser of the id mixed with a 64-bit key: a
well-mixed hash, not a cipher (profiles and dropout probabilities are simulation parameters, not secrets).
"""

from __future__ import annotations

import numpy as np

from sim.seeds import Stream, generator

ROUNDS = 6
"""Feistel rounds of :class:`KeyedPermutation` (more than the 4 a pseudo-random permutation needs)."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of ``x + key`` (a uint64 array; the arithmetic wraps mod 2^64)."""
    z = x + key
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def stream_keys(seed: int, stream: Stream, *context: int, count: int = 1) -> np.ndarray:
    """``count`` 64-bit keys from the ``stream`` of scenario ``seed`` for ``context``."""
    return generator(seed, stream, *context).integers(0, 2**64, size=count, dtype=np.uint64)


def _ids(ids: np.ndarray | int, size: int) -> np.ndarray:
    """``ids`` as a uint64 array, checked to lie in ``0..size-1``."""
    a = np.asarray(ids)
    if a.size == 0:
        return a.astype(np.uint64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"client ids must be integers, not {a.dtype}")
    if a.size and (int(a.min()) < 0 or int(a.max()) >= size):
        raise IndexError(f"client id out of range: the population has clients 0..{size - 1}")
    return a.astype(np.uint64)


class KeyedPermutation:
    """A keyed bijection of ``0..size-1``, evaluated per id (see the module docstring)."""

    def __init__(self, size: int, keys: np.ndarray) -> None:
        if size < 1:
            raise ValueError(f"a permutation of {size} elements")
        if keys.shape != (ROUNDS,):
            raise ValueError(f"a Feistel permutation takes {ROUNDS} round keys, not {keys.shape}")
        self.size = size
        self.half = max(1, ((size - 1).bit_length() + 1) // 2)
        """h: bits of each half of the permuted words."""
        self._mask = np.uint64((1 << self.half) - 1)
        self._keys = [np.uint64(k) for k in keys]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        h, mask = np.uint64(self.half), self._mask
        left, right = x >> h, x & mask
        for key in self._keys:
            left, right = right, left ^ (mix64(right, key) & mask)
        return (left << h) | right

    def __call__(self, ids: np.ndarray | int) -> np.ndarray:
        """The images of ``ids`` (ints in ``0..size-1``), as int64, in ``ids``' shape."""
        x = _ids(ids, self.size)
        shape = x.shape
        y = self._encrypt(x.ravel())
        n = np.uint64(self.size)
        outside = np.flatnonzero(y >= n)
        while outside.size:
            y[outside] = self._encrypt(y[outside])
            outside = outside[y[outside] >= n]
        return y.astype(np.int64).reshape(shape)


def keyed_uniform(ids: np.ndarray | int, size: int, key: np.uint64) -> np.ndarray:
    """Uniform floats in [0, 1) (53 bits each) for ``ids`` (ints in ``0..size-1``) under ``key``."""
    x = _ids(ids, size)
    u = (mix64(x.ravel(), key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # arrays: no overflow warnings
    return u.reshape(x.shape)
