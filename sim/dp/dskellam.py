"""The DSkellam encoding (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS 2021): the distributed-DP sibling of :class:`sim.protocol.encoding.FixedPoint`.

Client side (:meth:`DSkellamEncoding.encode`), for an update x of ``dim`` floats (model units):

1. clip to L2 norm c: ``x * min(1, c / ||x||_2)``;
2. zero-pad to ``d' = 2^k >= dim``;
3. rotate: ``z = H D x / sqrt(d')``, D the diagonal of random signs expanded from the round's shared
   ``rotation_seed`` (:func:`rotation_signs`), H the d' x d' Walsh-Hadamard matrix (Sylvester order); the
   rotation is orthonormal and spreads the update evenly over the coordinates, so few wrap or clip;
4. scale by s (integer units per model unit);
5. conditional stochastic rounding (Kairouz, Liu, Steinke, "The Distributed Discrete Gaussian Mechanism",
   ICML 2021, conditional randomized rounding; reused by Agarwal et al.):
   ``q = floor(y + u)``, u ~ U[0, 1)^d', redrawn while ``||q||^2`` exceeds :attr:`norm_bound`
   ``= (s c)^2 + d'/4 + sqrt(2 ln(1/beta)) (s c + sqrt(d')/2)``; one draw exceeds it with probability at most
   beta, so retries are few, the L2 sensitivity in integer units is at most ``sqrt(norm_bound)`` (the
   accounting's D2), and the bias is at most ``sqrt(beta) / (2 (1 - beta))`` integer units in L2 norm
   (Cauchy-Schwarz: ``||E[(q - y) 1_reject]|| <= sqrt(Var) sqrt(P(reject)) <= sqrt(beta)/2``).

The caller then adds integer noise (:mod:`sim.dp.noise`; Skellam of variance ``(sigma_local s)^2`` in this
scaled domain) and wraps mod 2^b (:meth:`DSkellamEncoding.wrap`); secure aggregation sums mod 2^b
(:func:`sim.protocol.encoding.add_mod`). Server side (:meth:`DSkellamEncoding.decode_sum`): centre the sum
into ``(-2^(b-1), 2^(b-1)]``, divide by s, rotate back (``D H / sqrt(d')`` is the exact inverse), unpad: the
sum of the clipped updates plus the total noise / s, up to rounding. Choosing s and b so that the sum does
not wrap (k standard deviations of headroom) is the planner's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.dp.noise import SIGNS_DOMAIN, Keystream
from sim.errors import EncodingError
from sim.numerics import l2_norm, sum_of_squares

MAX_BITS = 32
MAX_ROUNDING_TRIES = 1000
"""Draws of the stochastic rounding before giving up (each is rejected with probability at most beta)."""


def next_power_of_two(n: int) -> int:
    """The least power of two ``>= n`` (n >= 1)."""
    return 1 << (n - 1).bit_length()


def hadamard(x: np.ndarray) -> np.ndarray:
    """The normalised Walsh-Hadamard transform ``H x / sqrt(n)`` along the last axis (a new float64 array).

    H is the Sylvester-order Hadamard matrix (``H_2n = [[H_n, H_n], [H_n, -H_n]]``), n a power of two. The
    fast transform: log2(n) butterfly passes, each a reshape to (..., n / 2h, 2, h) and one in-place
    ``(a, b) <- (a + b, a - b)``, O(n log n) in all. ``H / sqrt(n)`` is symmetric and orthogonal, so the
    transform is its own inverse and preserves the L2 norm."""
    y = np.array(x, dtype=np.float64)
    n = y.shape[-1] if y.ndim else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"the Hadamard transform needs a length that is a power of two, not {n}")
    h = 1
    while h < n:
        pairs = y.reshape((*y.shape[:-1], n // (2 * h), 2, h))
        a = pairs[..., 0, :]
        b = pairs[..., 1, :]
        diff = a - b
        a += b
        b[...] = diff
        h *= 2
    y *= 1.0 / math.sqrt(n)
    return y


def rotation_signs(seed: bytes, padded: int) -> np.ndarray:
    """The diagonal of D: ``padded`` signs +1/-1 (float64) from a 32-byte seed.

    Sign i is -1 exactly when bit ``i mod 8`` (least significant first) of byte ``i // 8`` of the seed's
    AES-256-CTR keystream with initial counter block ``b"dp-signs" || 0^8`` is set."""
    if padded < 0:
        raise ValueError(f"padded must be a non-negative integer, not {padded}")
    bits = np.unpackbits(Keystream(seed, SIGNS_DOMAIN).read((padded + 7) // 8), bitorder="little")[:padded]
    return 1.0 - 2.0 * bits.astype(np.float64)


def rotate(x: np.ndarray, seed: bytes) -> np.ndarray:
    """``H D x / sqrt(d')`` for x of power-of-two length d' (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return hadamard(x * rotation_signs(seed, x.shape[-1]))


def unrotate(z: np.ndarray, seed: bytes) -> np.ndarray:
    """``D H z / sqrt(d')``, the inverse of :func:`rotate` (float64)."""
    z = np.asarray(z, dtype=np.float64)
    x = hadamard(z)
    x *= rotation_signs(seed, z.shape[-1])
    return x


@dataclass(frozen=True)
class DSkellamEncoding:
    """DSkellam's encoding of ``dim``-float updates into Z_(2^bits) and its decoding (see the module docstring)."""

    dim: int
    """Model dimension d: floats per update."""
    bits: int
    """b: encoded values live in Z_(2^b), 1 <= b <= 32."""
    clip: float
    """L2 clip norm c, model units."""
    scale: float
    """s, integer units per model unit."""
    beta: float = math.exp(-0.5)
    """Conditional-rounding parameter in [0, 1): the bound is exceeded by one draw with probability <= beta
    (Agarwal et al.'s default e^-0.5); 0 means plain unbiased stochastic rounding (an infinite bound)."""

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be a positive integer, not {self.dim!r}")
        if not isinstance(self.bits, int) or not 1 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must be an integer in 1..{MAX_BITS}, not {self.bits!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite L2 norm, not {self.clip!r}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive finite number of integer units per unit, not {self.scale!r}")
        if not self.scale * self.clip < 2.0**52:
            raise ValueError(f"scale * clip must stay below 2^52 (exact in float64), not {self.scale * self.clip}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), not {self.beta!r}")

    @property
    def padded(self) -> int:
        """d' = the least power of two >= dim."""
        return next_power_of_two(self.dim)

    @property
    def modulus(self) -> int:
        """2^bits."""
        return 1 << self.bits

    @property
    def norm_bound(self) -> float:
        """The conditional-rounding bound on ``||q||^2``, integer units squared:
        ``(s c)^2 + d'/4 + sqrt(2 ln(1/beta)) (s c + sqrt(d')/2)`` (Kairouz, Liu, Steinke 2021, with the scaled
        clip norm s c in place of ||y||, which it bounds); infinite for beta = 0."""
        if self.beta == 0.0:
            return math.inf
        sc = self.scale * self.clip
        d = self.padded
        return sc * sc + d / 4 + math.sqrt(2.0 * math.log(1.0 / self.beta)) * (sc + math.sqrt(d) / 2)

    def clipped(self, x: np.ndarray) -> np.ndarray:
        """``x * min(1, c / ||x||_2)`` (float64): the update the encoding represents."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.dim,):
            raise ValueError(f"the update must have shape ({self.dim},), not {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("the update has non-finite values (NaN or infinity); it cannot be clipped")
        norm = l2_norm(x)  # without BLAS: the same bits whatever the host's cores (sim.numerics)
        return x if norm <= self.clip else x * (self.clip / norm)

    def encode(self, x: np.ndarray, rotation_seed: bytes, rng: np.random.Generator) -> np.ndarray:
        """Clip, pad, rotate, scale and round ``x`` conditionally: int64 of length d', integer units, *not*
        wrapped, so noise can be added before :meth:`wrap`. ``rng`` gives the rounding's uniforms."""
        padded = np.zeros(self.padded)
        padded[: self.dim] = self.clipped(x)
        y = rotate(padded, rotation_seed)
        y *= self.scale
        bound = self.norm_bound
        for _ in range(MAX_ROUNDING_TRIES):
            q = np.floor(y + rng.random(y.size))
            if sum_of_squares(q) <= bound:
                return q.astype(np.int64)
        raise EncodingError(
            f"conditional rounding exceeded the squared-norm bound {bound:.6g} in {MAX_ROUNDING_TRIES} tries "
            f"(beta = {self.beta}); use a smaller beta"
        )

    def wrap(self, values: np.ndarray) -> np.ndarray:
        """Integer values (int64, e.g. an encoding plus noise) mod 2^bits, as uint32."""
        values = np.asarray(values)
        if values.dtype.kind not in "iu":
            raise ValueError(f"wrap takes integers, not {values.dtype}")
        return (values.astype(np.int64) & (self.modulus - 1)).astype(np.uint32)

    def decode_sum(self, total: np.ndarray, rotation_seed: bytes, weights: np.ndarray | None = None) -> np.ndarray:
        """The sum of the clipped updates (float64 of length dim, model units) from the sum mod 2^bits of their
        wrapped encodings (plus noise, which arrives divided by s and rotated back). ``weights`` (one per
        encoded value) scale the rotated sum before it is rotated back: a pipelined round whose chunks had
        different survivors takes each chunk's mean with 1 / its survivor count."""
        total = np.asarray(total)
        if total.shape != (self.padded,) or total.dtype.kind not in "iu":
            raise ValueError(f"the sum must be {self.padded} integers, not {total.shape} of {total.dtype}")
        centred = total.astype(np.int64)
        if centred.size and (centred.min() < 0 or centred.max() >= self.modulus):
            raise ValueError(f"the sum must lie in Z_(2^{self.bits}): values in [0, {self.modulus})")
        centred[centred > self.modulus // 2] -= self.modulus  # into (-2^(b-1), 2^(b-1)]
        values = centred / self.scale
        if weights is not None:
            values = values * weights
        return unrotate(values, rotation_seed)[: self.dim]
