"""The DSkellam encoding: the Hadamard rotation, clipping, conditional rounding, wrapping and decoding of sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.dp import noise
from sim.dp.dskellam import (
    DSkellamEncoding,
    hadamard,
    next_power_of_two,
    rotate,
    rotation_signs,
    unrotate,
)
from sim.protocol.encoding import EncodingError, add_mod

ROTATION = bytes(range(100, 132))


class CountingRng:
    """A numpy Generator's ``random`` that counts the rounding draws."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def random(self, n: int) -> np.ndarray:
        self.calls += 1
        return self.rng.random(n)


class ConstantRng:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self, n: int) -> np.ndarray:
        return np.full(n, self.value)


# --- the Walsh-Hadamard transform and the rotation -----------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 256])
def test_hadamard_is_the_sylvester_matrix_over_sqrt_n(n):
    x = np.random.default_rng(n).normal(size=n)
    np.testing.assert_allclose(hadamard(x), scipy.linalg.hadamard(n) @ x / math.sqrt(n), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 1024, 1 << 16])
def test_hadamard_is_its_own_inverse_and_keeps_the_norm(n):
    x = np.random.default_rng(n).normal(size=n) * 100
    y = hadamard(x)
    np.testing.assert_allclose(hadamard(y), x, rtol=0, atol=1e-9)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    np.testing.assert_array_equal(x, np.random.default_rng(n).normal(size=n) * 100)  # input untouched


def test_hadamard_transforms_the_last_axis_of_a_batch():
    x = np.random.default_rng(0).normal(size=(3, 5, 32))
    np.testing.assert_allclose(hadamard(x)[1, 2], hadamard(x[1, 2]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("n", [0, 3, 12, 1000])
def test_hadamard_refuses_lengths_that_are_not_powers_of_two(n):
    with pytest.raises(ValueError, match="power of two"):
        hadamard(np.zeros(n))


def test_rotation_signs_are_the_keystream_bits_with_the_signs_nonce():
    keystream = Cipher(algorithms.AES256(ROTATION), modes.CTR(b"dp-signs" + bytes(8))).encryptor().update(bytes(3))
    bits = [(byte >> i) & 1 for byte in keystream for i in range(8)]
    signs = rotation_signs(ROTATION, 21)
    assert signs.tolist() == [1.0 - 2.0 * b for b in bits[:21]]
    assert rotation_signs(bytes(range(32)), 12).tolist() == [1, 1, -1, -1, 1, 1, -1, -1, -1, 1, 1, 1]  # pinned


def test_rotation_signs_are_balanced_and_seed_dependent():
    signs = rotation_signs(ROTATION, 1 << 14)
    assert set(np.unique(signs)) == {-1.0, 1.0}
    assert abs(signs.sum()) <= 6 * math.sqrt(signs.size)
    assert not np.array_equal(signs, rotation_signs(bytes(32), 1 << 14))
    np.testing.assert_array_equal(signs, rotation_signs(ROTATION, 1 << 14))


def test_rotation_round_trip_and_spreading():
    x = np.zeros(1024)
    x[7] = 1.0  # a spike spreads to +-1/32 everywhere
    z = rotate(x, ROTATION)
    np.testing.assert_allclose(np.abs(z), 1 / 32, rtol=1e-12)
    np.testing.assert_allclose(unrotate(z, ROTATION), x, rtol=0, atol=1e-15)


# --- parameters -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dim", "padded"), [(1, 1), (2, 2), (3, 4), (5, 8), (1000, 1024), (1024, 1024), (1025, 2048)])
def test_padded_dimension_is_the_next_power_of_two(dim, padded):
    assert DSkellamEncoding(dim, 20, 1.0, 10.0).padded == padded
    assert next_power_of_two(dim) == padded


def test_norm_bound_formula():
    # (s c)^2 + d'/4 + sqrt(2 ln(1/beta)) (s c + sqrt(d')/2) with s c = 100, d' = 64, beta = e^-0.5: 10000 + 16 + 104
    assert DSkellamEncoding(50, 20, 2.0, 50.0).norm_bound == pytest.approx(10_120.0, rel=1e-14)
    assert DSkellamEncoding(50, 20, 2.0, 50.0, beta=0.0).norm_bound == math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": 0}, "dim"),
        ({"bits": 0}, "bits"),
        ({"bits": 33}, "bits"),
        ({"clip": 0.0}, "clip"),
        ({"clip": math.nan}, "clip"),
        ({"scale": -1.0}, "scale"),
        ({"scale": math.inf}, "scale"),
        ({"scale": 2.0**60}, "2\\^52"),
        ({"beta": 1.0}, "beta"),
        ({"beta": -0.1}, "beta"),
    ],
)
def test_bad_parameters_are_refused(kwargs, message):
    params = {"dim": 10, "bits": 20, "clip": 1.0, "scale": 100.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        DSkellamEncoding(**params)


# --- encoding and decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [1, 3, 100, 1000, 1025])
def test_single_encoding_decodes_to_the_clipped_update_within_rounding(dim):
    enc = DSkellamEncoding(dim, 20, 1.0, 1000.0)
    x = np.random.default_rng(dim).normal(size=dim) * (0.5 / math.sqrt(dim))  # norm about 0.5: not clipped
    q = enc.encode(x, ROTATION, np.random.default_rng(1))
    assert q.dtype == np.int64
    assert q.shape == (enc.padded,)
    decoded = enc.decode_sum(enc.wrap(q), ROTATION)
    assert decoded.shape == (dim,)
    # each rotated coordinate rounds by less than 1, so the L2 error is below sqrt(d') / s
    assert np.linalg.norm(decoded - x) <= math.sqrt(enc.padded) / enc.scale


def test_clipping_bounds_the_norm():
    enc = DSkellamEncoding(300, 24, 2.0, 1000.0)
    x = np.random.default_rng(0).normal(size=300) * 50
    np.testing.assert_allclose(np.linalg.norm(enc.clipped(x)), 2.0, rtol=1e-12)
    np.testing.assert_allclose(enc.clipped(x), x * (2.0 / np.linalg.norm(x)), rtol=1e-12)
    small = x / np.linalg.norm(x)
    np.testing.assert_array_equal(enc.clipped(small), small)
    decoded = enc.decode_sum(enc.wrap(enc.encode(x, ROTATION, np.random.default_rng(1))), ROTATION)
    assert np.linalg.norm(decoded) <= 2.0 + math.sqrt(enc.padded) / enc.scale


def test_encode_refuses_wrong_shapes_and_non_finite_values():
    enc = DSkellamEncoding(4, 20, 1.0, 10.0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        enc.encode(np.zeros(5), ROTATION, np.random.default_rng(0))
    with pytest.raises(ValueError, match="non-finite"):
        enc.encode(np.array([0.0, np.nan, 0.0, 0.0]), ROTATION, np.random.default_rng(0))


def test_every_encoding_meets_the_conditional_rounding_bound_with_retries():
    # beta close to 1 leaves almost no slack above (s c)^2 + d'/4, so many first draws are rejected
    enc = DSkellamEncoding(40, 20, 1.0, 10.0, beta=0.999)
    rng = CountingRng(3)
    x = np.random.default_rng(4).normal(size=40)  # clipped to norm 1: ||y|| = s c exactly
    for _ in range(300):
        q = enc.encode(x, ROTATION, rng)
        assert float(np.dot(q, q)) <= enc.norm_bound
    assert rng.calls > 330


def test_default_beta_bound_holds_and_rarely_retries():
    enc = DSkellamEncoding(1000, 20, 1.0, 30.0)
    rng = CountingRng(5)
    x = np.random.default_rng(6).normal(size=1000)
    for _ in range(100):
        q = enc.encode(x, ROTATION, rng)
        assert float(np.dot(q, q)) <= enc.norm_bound
    assert rng.calls < 100 / (1 - enc.beta)


def test_conditional_rounding_gives_up_after_the_bounded_tries():
    # d = 1, s c = 10.01: rounding away from zero gives |q| = 11, and 121 exceeds the bound of about 100.45
    enc = DSkellamEncoding(1, 20, 10.01, 1.0, beta=1 - 1e-12)
    away = ConstantRng(0.999 if rotation_signs(ROTATION, 1)[0] > 0 else 0.0)
    with pytest.raises(EncodingError, match="1000 tries"):
        enc.encode(np.array([10.01]), ROTATION, away)


def test_wrap_takes_integers_mod_2_to_the_bits():
    enc = DSkellamEncoding(4, 8, 1.0, 10.0)
    wrapped = enc.wrap(np.array([-1, 0, 255, 256, -300], dtype=np.int64))
    assert wrapped.dtype == np.uint32
    assert wrapped.tolist() == [255, 0, 255, 0, 212]
    assert DSkellamEncoding(4, 32, 1.0, 10.0).wrap(np.array([-1])).tolist() == [2**32 - 1]
    with pytest.raises(ValueError, match="integers"):
        enc.wrap(np.array([0.5]))


def test_decode_centres_into_the_half_open_interval():
    enc = DSkellamEncoding(1, 8, 1.0, 1.0)
    sign = rotation_signs(ROTATION, 1)[0]
    assert enc.decode_sum(np.array([128], dtype=np.uint32), ROTATION).tolist() == [sign * 128]
    assert enc.decode_sum(np.array([129], dtype=np.uint32), ROTATION).tolist() == [sign * -127]
    with pytest.raises(ValueError, match=r"\[0, 256\)"):
        enc.decode_sum(np.array([256], dtype=np.uint32), ROTATION)
    with pytest.raises(ValueError, match="1 integers"):
        enc.decode_sum(np.array([1, 2], dtype=np.uint32), ROTATION)


def _sum_of_wrapped(enc: DSkellamEncoding, encodings: list[np.ndarray]) -> np.ndarray:
    total = np.zeros(enc.padded, dtype=np.uint32)
    for q in encodings:
        total = add_mod(total, enc.wrap(q), enc.bits)
    return total


def test_sum_of_wrapped_encodings_decodes_to_the_sum_of_clipped_updates():
    n, dim = 20, 300
    enc = DSkellamEncoding(dim, 16, 1.0, 300.0, beta=0.0)
    sizes = np.random.default_rng(7)
    updates = sizes.normal(size=(n, dim)) * sizes.uniform(0.02, 0.1, size=(n, 1))  # norms about 0.35 to 1.7
    assert 0 < sum(np.linalg.norm(x) > enc.clip for x in updates) < n  # some clipped, some not
    rng = np.random.default_rng(8)
    encodings = [enc.encode(x, ROTATION, rng) for x in updates]
    assert any(bool((q < 0).any()) for q in encodings)  # negative values wrap to the top of Z_(2^16)
    decoded = enc.decode_sum(_sum_of_wrapped(enc, encodings), ROTATION)
    expected = np.sum([enc.clipped(x) for x in updates], axis=0)
    error = np.linalg.norm(decoded - expected) * enc.scale
    # each client's rounding error is below sqrt(d') in L2 (always); with beta = 0 the n errors are independent,
    # zero-mean, of variance <= 1/4 per coordinate: E||sum||^2 <= n d'/4, and ||sum||^2 (512 terms) has a
    # relative standard deviation of about sqrt(2/512), so six of them leave a factor 1 + 6 sqrt(2/512)
    assert error <= n * math.sqrt(enc.padded)
    assert error**2 <= n * enc.padded / 4 * (1 + 6 * math.sqrt(2 / enc.padded))


def test_noisy_sum_decodes_to_the_sum_plus_noise_over_s():
    n, dim, sigma = 20, 300, 0.5
    enc = DSkellamEncoding(dim, 20, 1.0, 1000.0)
    variance = (sigma * enc.scale) ** 2  # in the scaled domain (docs/privacy.md, "The mechanism")
    updates = np.random.default_rng(9).normal(size=(n, dim)) * 0.1
    rng = np.random.default_rng(10)
    noisy = [
        enc.encode(x, ROTATION, rng) + noise.skellam(i.to_bytes(32, "big"), variance, enc.padded)
        for i, x in enumerate(updates)
    ]
    decoded = enc.decode_sum(_sum_of_wrapped(enc, noisy), ROTATION)
    expected = np.sum([enc.clipped(x) for x in updates], axis=0)
    # the total noise is d' iid sums of n Skellam draws (variance n v each); rotated back it has covariance
    # n v I (the rotation is orthonormal) and nearly Gaussian coordinates, so the mean square of the dim kept
    # coordinates of s (decoded - expected) is n v, with relative sd sqrt(2 / dim), plus rounding (<= n/4)
    mean_square = np.mean(((decoded - expected) * enc.scale) ** 2)
    total = n * variance
    assert abs(mean_square - total) <= 6 * math.sqrt(2 / dim) * total + n


def test_plain_stochastic_rounding_is_unbiased():
    enc = DSkellamEncoding(50, 20, 1.0, 10.0, beta=0.0)
    x = np.random.default_rng(11).normal(size=50) * 0.1
    rng = np.random.default_rng(12)
    count = 4000
    mean = np.mean([enc.decode_sum(enc.wrap(enc.encode(x, ROTATION, rng)), ROTATION) for _ in range(count)], axis=0)
    # each decoded coordinate's rounding error has variance <= 1/(4 s^2)
    assert np.max(np.abs(mean - x)) <= 6 * 0.5 / (enc.scale * math.sqrt(count))


def test_conditional_rounding_bias_is_within_its_bound():
    # bias <= sqrt(beta) / (2 (1 - beta)) integer units in L2 (Cauchy-Schwarz with P(reject) <= beta)
    enc = DSkellamEncoding(50, 20, 1.0, 10.0)
    x = np.random.default_rng(13).normal(size=50)  # clipped: ||y|| = s c, where rejections happen
    rng = CountingRng(14)
    count = 4000
    mean = np.mean(
        [enc.decode_sum(enc.wrap(enc.encode(x, ROTATION, rng)), ROTATION) for _ in range(count)],
        axis=0,
    )
    assert rng.calls > count  # some draws were rejected
    bias = np.linalg.norm(mean - enc.clipped(x)) * enc.scale
    noise_part = (math.sqrt(enc.padded) + 6) * 0.5 / math.sqrt(count)
    assert bias <= math.sqrt(enc.beta) / (2 * (1 - enc.beta)) + noise_part


@settings(max_examples=80, deadline=None)
@given(
    dim=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    magnitude=st.sampled_from([0.0, 1e-3, 1.0, 1e3]),
    clip=st.sampled_from([0.1, 1.0, 7.5]),
    bits=st.integers(12, 32),
    scale=st.sampled_from([1.0, 37.0, 1e3, 1e5]),
    beta=st.sampled_from([0.0, math.exp(-0.5), 0.9]),
)
def test_round_trip_properties(dim, seed, magnitude, clip, bits, scale, beta):
    scale = min(scale, 2.0 ** (bits - 3) / clip)  # room in Z_(2^bits) for one encoding
    enc = DSkellamEncoding(dim, bits, clip, scale, beta)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=dim) * magnitude
    q = enc.encode(x, ROTATION, rng)
    assert q.shape == (enc.padded,)
    assert q.dtype == np.int64
    assert float(np.dot(q, q)) <= enc.norm_bound
    wrapped = enc.wrap(q)
    assert wrapped.dtype == np.uint32
    assert int(wrapped.max()) < 2**bits
    decoded = enc.decode_sum(wrapped, ROTATION)
    assert decoded.shape == (dim,)
    np.testing.assert_allclose(decoded, unrotate(q / scale, ROTATION)[:dim], rtol=0, atol=1e-9 * (clip + 1))
    assert np.linalg.norm(decoded - enc.clipped(x)) <= math.sqrt(enc.padded) / scale + 1e-9 * (clip + 1)
