"""The hot paths made fast keep their results bit for bit: mask expansion into kept buffers, masks added in
place, the fixed-point encoding in cache-sized blocks, and agreement with a kept private key, each against
the plain implementation it replaced."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.crypto import agreement, prg
from sim.crypto.randomness import SeededRandom
from sim.protocol import encoding
from sim.protocol.encoding import FixedPoint, add_mod, add_mod_into, sub_mod, sub_mod_into
from sim.protocol.params import AggregationParams
from sim.protocol.registry import round_machines
from sim.protocol.suite import RealSuite


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


def whole_vector_encoding(fp: FixedPoint, x: np.ndarray, seed: int) -> np.ndarray:
    """The encoding as first written: whole-vector passes, one call for the uniforms, through int64."""
    y = x.astype(np.float64) * (fp.clip_factor(x) * fp.scale)
    rng = np.random.default_rng(seed)
    return (np.floor(y + rng.random(y.shape[0])).astype(np.int64) & (fp.modulus - 1)).astype(np.uint32)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 3000),
    st.sampled_from([2, 8, 20, 32]),
    st.floats(1e-6, 1e3),
    st.integers(0, 2**32),
    st.sampled_from([1, 7, 64, encoding.BLOCK]),
)
def test_the_encoding_in_blocks_is_the_encoding(n, bits, spread, seed, block):
    fp = FixedPoint.for_clients(bits, 1.0, 4) if bits > 2 else FixedPoint(bits, 1.0, 0.25)
    if seed % 3 == 0:  # a scale beyond int32's range: the int64 path
        fp = FixedPoint(bits, 1.0, 2.0**40)
    x = (np.random.default_rng(seed).standard_normal(n) * spread).astype(np.float32)
    kept, encoding.BLOCK = encoding.BLOCK, block  # blocks of any size, the last one partial or not
    try:
        assert np.array_equal(fp.encode(x, np.random.default_rng(seed + 1)), whole_vector_encoding(fp, x, seed + 1))
    finally:
        encoding.BLOCK = kept


def test_the_encoding_of_many_blocks_is_the_encoding():
    """A million values at the shipped block size: 30 whole blocks and a partial one, clipped or not."""
    fp = FixedPoint.for_clients(20, 1.0, 16)
    for spread in (1e-4, 1e-2):  # norms of about 0.1 (not clipped) and 10 (clipped)
        x = (np.random.default_rng(5).standard_normal(1_000_000) * spread).astype(np.float32)
        assert np.array_equal(fp.encode(x, np.random.default_rng(6)), whole_vector_encoding(fp, x, 6))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=80), st.binary(min_size=1, max_size=40))
def test_agreement_with_a_kept_key_is_the_agreement(privates, info):
    """Keys used in any order, more of them than the cache holds, agree as keys parsed afresh do."""
    peer = agreement.generate(SeededRandom(bytes(32)))[1]
    for private in [*privates, *reversed(privates)]:
        assert agreement.agree(private, peer, info, keep=True) == agreement.agree(private, peer, info)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 32), st.integers(0, 2000), st.lists(st.booleans(), min_size=1, max_size=6), st.integers(0, 2**32))
def test_masks_added_as_words_and_reduced_once_are_the_masks_mod_2_to_the_bits(bits, n, signs, seed):
    """What the SecAgg machines do (``encoding.WORD``): whole keystream words added, the sum reduced once."""
    x = np.random.default_rng(seed).integers(0, 1 << bits, n, dtype=np.uint64).astype(np.uint32)
    reduced, words = x.copy(), x.copy()
    for k, plus in enumerate(signs):
        seed_k = bytes([k]) * 32
        mask = prg.expand(seed_k, n, bits)
        reduced = add_mod(reduced, mask, bits) if plus else sub_mod(reduced, mask, bits)
        word = prg.expand(seed_k, n, encoding.WORD, scratch=True)
        words = add_mod_into(words, word, encoding.WORD) if plus else sub_mod_into(words, word, encoding.WORD)
    assert np.array_equal(encoding.reduce_into(words, bits), reduced)


def test_the_survivor_view_is_made_once_per_list_object_and_equals_a_fresh_one():
    """Clients of one broadcast share the SecAgg config's view of the survivor list; a copy of the list
    (a decoded frame) gets a view of its own with the same contents, and lists beyond those kept are each
    judged on their own."""
    sampled = tuple(range(40, 0, -2))
    server, _ = round_machines(AggregationParams("secagg+", 20, 1.0, 0.5), 1, sampled, 8, RealSuite(), graph_seed=1)
    cfg = server.config
    u3 = tuple(reversed(sampled[:15]))
    view = cfg.survivor_view(u3)
    assert cfg.survivor_view(u3) is view  # the same object: computed once
    copy = tuple(list(u3))
    assert copy is not u3 and cfg.survivor_view(copy) is not view and cfg.survivor_view(copy) == view
    assert view.members == frozenset(u3) and view.ordered == tuple(sorted(u3)) and view.within_sampled
    for k in range(20):  # more lists than are kept, each judged on its own
        other = (*u3[:-1], 41 + 2 * k)  # odd ids were not sampled
        assert not cfg.survivor_view(other).within_sampled
    assert cfg.survivor_view(u3).within_sampled
