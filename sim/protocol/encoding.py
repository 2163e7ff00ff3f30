"""Fixed-point encoding of model updates into Z_(2^bits), shared by every encoded protocol.

Client side (``encode``): clip the update to L2 norm ``clip`` (``x * min(1, clip / ||x||_2)``), multiply
by the scale ``s``, round stochastically (``floor(y + u)``, u ~ U[0, 1): unbiased), and wrap mod 2^bits.
Server side (``decode_mean``): the sum of n encodings mod 2^bits, read as a centred integer in
``(-2^(bits-1), 2^(bits-1))``, divided by ``s * n``: the mean of the clipped updates up to rounding.

The scale leaves room for the sum of all ``clients`` sampled in the round: every clipped coordinate is at
most ``clip`` in magnitude and rounds to at most ``clip * s + 1``, so with

    s = (2^(bits-1) - 1 - clients) / (clients * clip)

the sum of up to ``clients`` encodings never wraps. ``plain``, ``secagg`` and ``secagg+`` use the same
encoding with the same randomness, so they aggregate to bit-identical sums; only masks differ, and those
cancel exactly mod 2^bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.errors import EncodingError
from sim.numerics import l2_norm

BLOCK = 1 << 15
"""Values per block of :meth:`FixedPoint.encode`'s passes: 256 KiB of float64, within a core's cache."""


@dataclass(frozen=True)
class FixedPoint:
    bits: int
    clip: float
    """L2 norm bound of an update, in model units."""
    scale: float
    """Integer units per model unit."""

    @classmethod
    def for_clients(cls, bits: int, clip: float, clients: int) -> FixedPoint:
        """The encoding whose sum over ``clients`` encodings cannot wrap around."""
        room = 2 ** (bits - 1) - 1 - clients
        if room <= 0 or clients < 1:
            raise EncodingError(
                f"{bits} bits leave no room to sum {clients} clients' updates; use more bits or fewer clients"
            )
        return cls(bits, clip, room / (clients * clip))

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    def clip_factor(self, x: np.ndarray) -> float:
        norm = l2_norm(x)  # without BLAS: the same bits whatever the host's cores (sim.numerics)
        return 1.0 if norm <= self.clip else self.clip / norm

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip, scale, round stochastically and wrap: uint32 values below 2^bits.

        After the norm (:func:`sim.numerics.l2_norm`: block by block, without BLAS), the rest runs over blocks
        of :data:`BLOCK` values that stay in the processor's cache: scale, add this block's uniforms (drawn in
        the order of one call for the whole vector), floor, convert. The same values as whole-vector passes, in
        less time (docs/performance.md, "Hot paths made fast")."""
        factor = self.clip_factor(x) * self.scale
        n = x.shape[0]
        out = np.empty(n, dtype=np.uint32)
        # |y| <= clip * scale + 1 < 2^31 where int32 holds every value: its two's complement bits mod 2^bits
        # are the int64's; otherwise (not an encoding of for_clients) through int64
        narrow = not self.clip * self.scale + 1 >= 2**31  # as written, so that NaN takes the int32 path as before
        values, uniforms = np.empty(min(BLOCK, n)), np.empty(min(BLOCK, n))
        wrap = np.uint32(self.modulus - 1)
        for start in range(0, n, BLOCK):
            block = values[: min(BLOCK, n - start)]
            block[:] = x[start : start + BLOCK]
            u = uniforms[: block.shape[0]]
            block *= factor
            rng.random(out=u)  # the next draws of the generator, as rng.random(len(x)) would give them
            block += u
            np.floor(block, out=block)
            if narrow:
                q = out[start : start + BLOCK]
                q.view(np.int32)[:] = block
                if self.bits < 32:
                    q &= wrap
            else:
                out[start : start + BLOCK] = block.astype(np.int64) & (self.modulus - 1)
        return out

    def decode_mean(self, total: np.ndarray, count: int | np.ndarray) -> np.ndarray:
        """Mean of ``count`` clipped updates from the sum of their encodings mod 2^bits (float32); ``count``
        may give each value its own count."""
        centred = total.astype(np.int64)
        centred[centred >= self.modulus // 2] -= self.modulus
        return (centred.astype(np.float64) / (self.scale * count)).astype(np.float32)


def add_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``(a + b) mod 2^bits`` for uint32 vectors of values below 2^bits (bits <= 32).

    uint32 arithmetic wraps mod 2^32, and 2^bits divides 2^32, so masking the wrapped sum is exact."""
    return (a + b) & np.uint32((1 << bits) - 1)


def sub_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``(a - b) mod 2^bits`` for uint32 vectors of values below 2^bits (bits <= 32)."""
    return (a - b) & np.uint32((1 << bits) - 1)


WORD = 32
"""The bits of a uint32 word. Masks added as whole words (``add_mod_into(acc, mask, WORD)``) and the sum
reduced once (:func:`reduce_into`) give the sum mod 2^bits of the masks mod 2^bits, because 2^bits divides
2^32: two passes over the vector fewer per mask."""


def reduce_into(acc: np.ndarray, bits: int) -> np.ndarray:
    """``acc = acc mod 2^bits`` in place (``acc`` uint32, owned by the caller); returns ``acc``."""
    if bits < WORD:
        np.bitwise_and(acc, np.uint32((1 << bits) - 1), out=acc)
    return acc


def add_mod_into(acc: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``acc = (acc + b) mod 2^bits`` in place (``acc`` uint32, owned by the caller); returns ``acc``."""
    np.add(acc, b, out=acc)
    if bits < 32:
        np.bitwise_and(acc, np.uint32((1 << bits) - 1), out=acc)
    return acc


def sub_mod_into(acc: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """``acc = (acc - b) mod 2^bits`` in place (``acc`` uint32, owned by the caller); returns ``acc``."""
    np.subtract(acc, b, out=acc)
    if bits < 32:
        np.bitwise_and(acc, np.uint32((1 << bits) - 1), out=acc)
    return acc
