"""Micro-benchmarks of the protocol operations the machines report as :class:`~sim.protocol.machine.Work`.

Each operation is timed through the same code the protocols run (:mod:`sim.crypto`,
:mod:`sim.protocol.suite`, :mod:`sim.protocol.encoding`, the wire codec) at a grid of sizes; the
profiler fits ``seconds = coef . features`` on the points. The features of each operation are exactly
the keys the machines put in its ``Work.size``:

- counts of constant-size operations (``count``): X25519 key generation, agreement (with HKDF), public
  key derivation, Ed25519 signing and verification; AES-GCM sealing and opening of share plaintexts in
  ``count`` and ``bytes`` (XNoise adds a share per noise seed);
- vector work in ``elements``: fixed-point and DSkellam encoding and decoding, PRG mask expansion,
  modular addition, noise expanded from seeds (Skellam, rounded Gaussian, discrete Gaussian);
- Shamir sharing in ``holders`` and ``products`` (coefficient evaluations: elements x holders x
  threshold) and reconstruction in ``shares`` and ``elements``;
- the SecAgg server's bookkeeping per list entry (key lists, ciphertexts, shares) in ``count``;
- frame encoding and decoding in ``bytes`` and ``packed`` (values bit-packed at widths other than 8, 16,
  32, which cost far more per byte).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from sim.crypto import aead, agreement, prg, signatures
from sim.crypto.randomness import SeededRandom
from sim.dp import noise
from sim.dp.dskellam import DSkellamEncoding
from sim.protocol import wire
from sim.protocol.encoding import FixedPoint, add_mod
from sim.protocol.messages import AdvertiseKeys, MaskedInput, ModelDownload, ShareKeys
from sim.protocol.params import AggregationParams
from sim.protocol.registry import round_machines
from sim.protocol.secagg.config import SECRET_ELEMENTS, share_threshold
from sim.protocol.secagg.spec import SECAGG
from sim.protocol.suite import RealSuite, plaintext_bytes
from sim.protocol.wire import ModVector


@dataclass(frozen=True)
class Point:
    """One timed size of an operation: its features and a call that performs it once."""

    features: dict[str, float]
    run: Callable[[], object]


@dataclass(frozen=True)
class Benchmark:
    op: str
    features: tuple[str, ...]
    points: Callable[[bool], Iterator[Point]]
    """``points(quick)``: the sizes to time."""


def _rng() -> SeededRandom:
    return SeededRandom(bytes(range(32)))


def _counts(quick: bool) -> tuple[int, ...]:
    return (1, 4, 8) if quick else (1, 10, 40, 100)


def _elements(quick: bool) -> tuple[int, ...]:
    return (1_000, 5_000, 20_000) if quick else (10_000, 100_000, 400_000, 1_000_000)


def repeat(fn: Callable[[], object], count: int) -> Callable[[], None]:
    """A call that performs ``fn`` ``count`` times (one timed point of a per-call operation)."""

    def run() -> None:
        for _ in range(count):
            fn()

    return run


def _keygen(quick: bool) -> Iterator[Point]:
    rng = _rng()
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: agreement.generate(rng), n))


def _agree(quick: bool) -> Iterator[Point]:
    sk, _ = agreement.generate(_rng())
    _, pk = agreement.generate(_rng())
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: agreement.agree(sk, pk, b"profile"), n))


def _public(quick: bool) -> Iterator[Point]:
    sk, _ = agreement.generate(_rng())
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: agreement.public_of(sk), n))


def _sign(quick: bool) -> Iterator[Point]:
    seed, _ = signatures.generate(_rng())
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: signatures.sign(seed, bytes(100)), n))


def _verify(quick: bool) -> Iterator[Point]:
    seed, public = signatures.generate(_rng())
    signature = signatures.sign(seed, bytes(100))
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: signatures.verify(public, bytes(100), signature), n))


def _plaintexts(quick: bool) -> Iterator[tuple[int, int]]:
    """(count, plaintext bytes) of share ciphertexts: a share pair, and pairs with noise-seed shares."""
    for shares in (2, 12) if quick else (2, 12, 52):
        for n in _counts(quick):
            yield n, plaintext_bytes(shares)


def _seal(quick: bool) -> Iterator[Point]:
    rng, key = _rng(), bytes(32)
    for n, size in _plaintexts(quick):

        def run(n: int = n, size: int = size) -> None:
            for _ in range(n):
                aead.encrypt(key, bytes(size), b"ad", rng)

        yield Point({"count": n, "bytes": n * size}, run)


def _open(quick: bool) -> Iterator[Point]:
    key = bytes(32)
    for n, size in _plaintexts(quick):
        ct = aead.encrypt(key, bytes(size), b"ad", _rng())
        yield Point({"count": n, "bytes": n * size}, repeat(partial(aead.decrypt, key, ct, b"ad"), n))


def _share(quick: bool) -> Iterator[Point]:
    suite, rng = RealSuite(), _rng()
    for holders in (4, 9, 16) if quick else (5, 20, 50, 100, 200):
        t = share_threshold(0.5, holders)
        order = list(range(holders))

        for seeds in (0, 10) if quick else (0, 10, 50):  # XNoise shares its noise seeds in one batch

            def run(order: list[int] = order, t: int = t, seeds: int = seeds) -> None:
                suite.share(bytes(32), t, order, rng)
                suite.share(bytes(32), t, order, rng)
                if seeds:
                    suite.share_many([bytes(32)] * seeds, t, order, rng)

            yield Point({"holders": holders, "products": (2 + seeds) * SECRET_ELEMENTS * holders * t}, run)


def _reconstruct(quick: bool) -> Iterator[Point]:
    suite = RealSuite()
    for holders in (4, 9, 16) if quick else (5, 20, 50, 100, 200):
        t = share_threshold(0.5, holders)
        parties = list(range(t))
        shares = suite.share(bytes(range(32)), t, parties, _rng())
        yield Point(
            {"shares": t, "elements": SECRET_ELEMENTS * t},
            partial(suite.reconstruct, parties, shares),
        )


def _vector(op: Callable[[int], Callable[[], object]]) -> Callable[[bool], Iterator[Point]]:
    def points(quick: bool) -> Iterator[Point]:
        for n in _elements(quick):
            yield Point({"elements": n}, op(n))

    return points


def _encode_op(n: int) -> Callable[[], object]:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    fp, rng = FixedPoint.for_clients(20, 1.0, 100), np.random.default_rng(1)
    return lambda: fp.encode(x, rng)


def _decode_op(n: int) -> Callable[[], object]:
    total = np.random.default_rng(0).integers(0, 1 << 20, n).astype(np.uint32)
    fp = FixedPoint.for_clients(20, 1.0, 100)
    return lambda: fp.decode_mean(total, 10)


def _padded_vector(op: Callable[[int], Callable[[], object]]) -> Callable[[bool], Iterator[Point]]:
    """Vector work on the padded length (a power of two): the DSkellam machines report padded elements."""

    def points(quick: bool) -> Iterator[Point]:
        for n in _elements(quick):
            padded = 1 << (n - 1).bit_length()
            yield Point({"elements": padded}, op(padded))

    return points


def _dskellam(n: int) -> DSkellamEncoding:
    return DSkellamEncoding(n, 20, 1.0, 1e4)


def _encode_dskellam_op(n: int) -> Callable[[], object]:
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    enc, rng = _dskellam(n), np.random.default_rng(1)
    return lambda: enc.wrap(enc.encode(x, bytes(32), rng))


def _decode_dskellam_op(n: int) -> Callable[[], object]:
    enc = _dskellam(n)
    total = np.random.default_rng(0).integers(0, 1 << 20, enc.padded).astype(np.uint32)
    return lambda: enc.decode_sum(total, bytes(32))


def _noise_op(mechanism: str) -> Callable[[int], Callable[[], object]]:
    """Noise of a typical per-component integer-domain variance (1e4: the rejection samplers' regime)."""

    def op(n: int) -> Callable[[], object]:
        return lambda: noise.sample(mechanism, bytes(32), 1e4, n)

    return op


def _prg_op(n: int) -> Callable[[], object]:
    return lambda: prg.expand(bytes(32), n, 20)


def _add_op(n: int) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 1 << 20, n).astype(np.uint32) for _ in range(2))
    return lambda: add_mod(a, b, 20)


def _entries(quick: bool) -> Iterator[Point]:
    """The SecAgg server's per-entry bookkeeping: key lists, then checking and routing ciphertexts."""
    for n in (8, 16, 32) if quick else (10, 50, 100, 200):
        sampled = tuple(range(n))
        # distinct keys, none of low order (the server refuses repeated and low-order keys)
        keys = [((2 * c + 2).to_bytes(32, "little"), (2 * c + 3).to_bytes(32, "little")) for c in sampled]
        adverts = [AdvertiseKeys(1, c, *keys[c], b"") for c in sampled]
        shares = [ShareKeys(1, c, tuple((v, bytes(132)) for v in sampled if v != c)) for c in sampled]

        def run(sampled: tuple[int, ...] = sampled, adverts: list[Any] = adverts, shares: list[Any] = shares) -> None:
            server, _ = round_machines(AggregationParams(SECAGG.name), 1, sampled, 10, RealSuite(), graph_seed=0)
            for m in adverts:
                server.receive(m.client, m)
            server.close_step()
            for m in shares:
                server.receive(m.client, m)
            server.close_step()

        yield Point({"count": n * n + 2 * n * (n - 1)}, run)


def _frames(quick: bool) -> Iterator[wire.Message]:
    rng = np.random.default_rng(0)
    for n in _elements(quick):
        yield ModelDownload(1, rng.standard_normal(n).astype(np.float32))
        yield MaskedInput(1, 2, ModVector(20, rng.integers(0, 1 << 20, n).astype(np.uint32)))


def _encode_frames(quick: bool) -> Iterator[Point]:
    for m in _frames(quick):
        yield Point({"bytes": m.wire_size(), "packed": m.packed_elements()}, m.encode)


def _decode_frames(quick: bool) -> Iterator[Point]:
    for m in _frames(quick):
        data = m.encode()
        yield Point({"bytes": m.wire_size(), "packed": m.packed_elements()}, partial(wire.decode, data))


BENCHMARKS = (
    Benchmark("x25519.keygen", ("const", "count"), _keygen),
    Benchmark("x25519.agree", ("const", "count"), _agree),
    Benchmark("x25519.public", ("const", "count"), _public),
    Benchmark("ed25519.sign", ("const", "count"), _sign),
    Benchmark("ed25519.verify", ("const", "count"), _verify),
    Benchmark("aead.seal", ("const", "count", "bytes"), _seal),
    Benchmark("aead.open", ("const", "count", "bytes"), _open),
    Benchmark("shamir.share", ("const", "holders", "products"), _share),
    Benchmark("shamir.reconstruct", ("const", "shares", "elements"), _reconstruct),
    Benchmark("encode.fixed_point", ("const", "elements"), _vector(_encode_op)),
    Benchmark("decode.fixed_point", ("const", "elements"), _vector(_decode_op)),
    Benchmark("encode.dskellam", ("const", "elements"), _padded_vector(_encode_dskellam_op)),
    Benchmark("decode.dskellam", ("const", "elements"), _padded_vector(_decode_dskellam_op)),
    Benchmark("noise.skellam", ("const", "elements"), _vector(_noise_op("skellam"))),
    Benchmark("noise.gaussian", ("const", "elements"), _vector(_noise_op("gaussian"))),
    Benchmark("noise.dgaussian", ("const", "elements"), _vector(_noise_op("dgaussian"))),
    Benchmark("prg.expand", ("const", "elements"), _vector(_prg_op)),
    Benchmark("vector.add", ("const", "elements"), _vector(_add_op)),
    Benchmark("secagg.entries", ("const", "count"), _entries),
    Benchmark("wire.encode", ("const", "bytes", "packed"), _encode_frames),
    Benchmark("wire.decode", ("const", "bytes", "packed"), _decode_frames),
)
"""Every operation the protocol machines and the engine charge, besides training and FedAvg."""
