"""The hot paths made fast keep their results bit for bit: mask expansion into kept buffers, masks added in
place, and the fixed-point encoding without temporaries, each against the plain implementation it replaced."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.crypto import prg
from sim.protocol.encoding import FixedPoint, add_mod, add_mod_into, sub_mod, sub_mod_into


def keystream_words(seed: bytes, length: int, bits: int) -> np.ndarray:
    """The expansion as first written: the AES-256-CTR keystream of 4 * length zero bytes, as little-endian
    words, reduced mod 2^bits."""
    stream = Cipher(algorithms.AES256(seed), modes.CTR(bytes(16))).encryptor().update(bytes(4 * length))
    return np.frombuffer(stream, dtype="<u4").astype(np.uint32) & np.uint32((1 << bits) - 1)


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=32, max_size=32), st.integers(0, 5000), st.integers(1, 32))
def test_expansion_is_the_keystream_however_it_is_written(seed, length, bits):
    expected = keystream_words(seed, length, bits)
    fresh = prg.expand(seed, length, bits)
    assert fresh.dtype == np.uint32 and np.array_equal(fresh, expected)
    kept = prg.expand(seed, length, bits, scratch=True)
    assert np.array_equal(kept, expected)
    prg.expand(bytes(32), length + 7, bits, scratch=True)  # the next scratch expansion overwrites the view...
    assert np.array_equal(fresh, expected)  # ...but not a fresh one


def test_masks_added_in_place_equal_masks_added_out_of_place():
    rng = np.random.default_rng(3)
    for bits in (1, 20, 31, 32):
        x = rng.integers(0, 2**bits, 10_000, dtype=np.uint64).astype(np.uint32)
        masks = [prg.expand(bytes([k]) * 32, 10_000, bits) for k in range(5)]
        signs = [1, -1, -1, 1, 1]
        old = x
        for sign, mask in zip(signs, masks, strict=True):
            old = add_mod(old, mask, bits) if sign > 0 else sub_mod(old, mask, bits)
        new = x.copy()
        for sign, k in zip(signs, range(5), strict=True):
            mask = prg.expand(bytes([k]) * 32, 10_000, bits, scratch=True)
            new = add_mod_into(new, mask, bits) if sign > 0 else sub_mod_into(new, mask, bits)
        assert np.array_equal(new, old)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3000), st.sampled_from([2, 8, 20, 32]), st.floats(1e-6, 1e3), st.integers(0, 2**32))
def test_the_encoding_without_temporaries_is_the_encoding(n, bits, spread, seed):
    fp = FixedPoint.for_clients(bits, 1.0, 4) if bits > 2 else FixedPoint(bits, 1.0, 0.25)
    if seed % 3 == 0:  # a scale beyond int32's range: the int64 path
        fp = FixedPoint(bits, 1.0, 2.0**40)
    x = (np.random.default_rng(seed).standard_normal(n) * spread).astype(np.float32)
    old_y = x.astype(np.float64) * (fp.clip_factor(x) * fp.scale)
    rng = np.random.default_rng(seed + 1)
    old = (np.floor(old_y + rng.random(old_y.shape[0])).astype(np.int64) & (fp.modulus - 1)).astype(np.uint32)
    assert np.array_equal(fp.encode(x, np.random.default_rng(seed + 1)), old)
