"""The distributed-DP side of a round that the protocol machines share: encoding with noise, removal, decoding.

A :class:`PrivateRound` is public to every party of the round: the DSkellam encoding (its scale fitted to the
round), the shared rotation seed, the noise mechanism and the noise plan (:class:`sim.dp.strategies.RoundNoise`).
A client encodes its update (clip, rotate, scale, round: :mod:`sim.dp.dskellam`), adds every noise component
of its plan, each expanded from its own 32-byte seed (:mod:`sim.dp.noise`; the variance of component k in
the integer domain is ``components[k] * scale^2``), and wraps mod 2^bits. The server can regenerate any
component from its seed and subtract it, which is how XNoise removes excess noise exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.dp import noise
from sim.dp.dskellam import DSkellamEncoding
from sim.dp.strategies import RoundNoise
from sim.protocol.machine import Work

Admission = Callable[[int], "str | None"]
"""``admit(survivors)`` -> None to go on, or why the round must stop before its aggregate is revealed
(``early``: the privacy budget would be passed)."""


@dataclass(frozen=True)
class PrivateRound:
    encoding: DSkellamEncoding
    rotation_seed: bytes
    """Public per-round seed of the randomised Hadamard rotation."""
    mechanism: str
    """``skellam``, ``gaussian`` or ``dgaussian``."""
    plan: RoundNoise
    server_seed: bytes = bytes(32)
    """Seed of the noise the server adds (``central``): the server's own secret."""
    admit: Admission | None = None
    span: tuple[int, int] | None = None
    """The chunk ``[start, stop)`` of the encoded vector this instance aggregates; None for all of it."""

    @property
    def length(self) -> int:
        """Values per vector this instance aggregates (the padded dimension, or the chunk's length)."""
        if self.span is not None:
            return self.span[1] - self.span[0]
        return self.encoding.padded

    def chunk(self, start: int, stop: int) -> PrivateRound:
        """The view of one chunk's protocol instance (same encoding, plan and scale)."""
        if not 0 <= start < stop <= self.encoding.padded:
            raise ValueError(f"chunk [{start}, {stop}) outside the {self.encoding.padded} encoded values")
        return replace(self, span=(start, stop))

    @property
    def bits(self) -> int:
        return self.encoding.bits

    @property
    def removing(self) -> bool:
        """Whether clients share seeds of removable components and the server removes excess ones."""
        return self.plan.spec.removes and self.plan.removable > 0

    @property
    def rebasing(self) -> bool:
        return self.plan.spec.rebasing

    def variance(self, k: int) -> float:
        """Integer-domain variance of noise component ``k``."""
        return float(self.plan.components[k]) * self.encoding.scale**2

    def component(self, seed: bytes, k: int) -> np.ndarray:
        """Noise component ``k`` expanded from ``seed`` (int64, integer domain)."""
        return noise.sample(self.mechanism, seed, self.variance(k), self.length)

    def components(self, seeded: Sequence[tuple[bytes, int]]) -> np.ndarray:
        """The sum (int64) of components ``k`` expanded from ``seed`` for each ``(seed, k)`` of ``seeded``,
        on every core (:func:`sim.dp.noise.total`): exactly the sum of :meth:`component`'s."""
        return noise.total(self.mechanism, [(seed, self.variance(k)) for seed, k in seeded], self.length)

    def fresh(self, seed: bytes, variance: float) -> np.ndarray:
        """Noise of ``variance`` (model units) from ``seed`` (int64, integer domain)."""
        return noise.sample(self.mechanism, seed, variance * self.encoding.scale**2, self.length)

    def noise_work(self, components: int) -> Work:
        return Work(f"noise.{self.mechanism}", {"elements": self.length * components})

    def encode(self, update: np.ndarray, rng: np.random.Generator, seeds: Sequence[bytes]) -> np.ndarray:
        """The client's noisy encoding mod 2^bits (uint32): its update plus every component of its plan."""
        return self.add_noise(self.encoding.encode(update, self.rotation_seed, rng), seeds)

    def add_noise(self, values: np.ndarray, seeds: Sequence[bytes]) -> np.ndarray:
        """``values`` (int64, the encoded update or this chunk of it) plus every component of the plan,
        wrapped mod 2^bits (uint32)."""
        values = values.astype(np.int64, copy=True)
        values += self.components([(seed, k) for k, seed in enumerate(seeds) if self.plan.components[k]])
        return self.encoding.wrap(values)

    def encode_work(self) -> tuple[Work, ...]:
        return (Work("encode.dskellam", {"elements": self.length}), *self.add_noise_work())

    def add_noise_work(self) -> tuple[Work, ...]:
        components = sum(1 for v in self.plan.components if v)
        return (self.noise_work(components),)

    def wrap(self, values: np.ndarray) -> np.ndarray:
        return self.encoding.wrap(values)

    def decode_mean(self, total: np.ndarray, count: int | np.ndarray) -> np.ndarray:
        """Mean of ``count`` survivors' updates (noise included) from the sum of their encodings (float32);
        ``count`` may give each encoded value its own count (the chunks of a pipelined round)."""
        if self.plan.server:
            total = self.wrap(total.astype(np.int64) + self.fresh(self.server_seed, float(self.plan.server)))
        if isinstance(count, np.ndarray):
            return self.encoding.decode_sum(total, self.rotation_seed, 1.0 / count).astype(np.float32)
        return (self.encoding.decode_sum(total, self.rotation_seed) / count).astype(np.float32)

    def decode_work(self) -> tuple[Work, ...]:
        work = (Work("decode.dskellam", {"elements": self.length}),)
        return work + ((self.noise_work(1),) if self.plan.server else ())
