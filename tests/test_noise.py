"""Noise from seeds: the keystream, determinism, pinned values, moments and exact distributions."""

from __future__ import annotations

import hashlib
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from sim.crypto import prg
from sim.dp import noise

SEED = bytes(range(32))
N = 200_000


def _seed(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def _raw_keystream(seed: bytes, nonce: bytes, n: int) -> bytes:
    return Cipher(algorithms.AES256(seed), modes.CTR(nonce)).encryptor().update(bytes(n))


def _raw_uniforms(seed: bytes, n: int) -> np.ndarray:
    words = np.frombuffer(_raw_keystream(seed, b"dp-noise" + bytes(8), 8 * n), dtype="<u8")
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53


# --- the keystream --------------------------------------------------------------------------------------------


def test_keystream_is_aes_ctr_with_the_noise_nonce_in_any_chunking():
    stream = noise.Keystream(SEED, noise.NOISE_DOMAIN)
    got = b"".join(stream.read(n).tobytes() for n in (0, 5, 16, (1 << 20) + 3, 1000))
    assert got == _raw_keystream(SEED, b"dp-noise" + bytes(8), len(got))


def test_noise_keystream_is_separated_from_the_mask_keystream():
    mask_words = prg.expand(SEED, 64, 32)
    noise_words = noise.Keystream(SEED, noise.NOISE_DOMAIN).read(256).view("<u4")
    assert not np.array_equal(mask_words, noise_words)
    assert noise.NOISE_DOMAIN != noise.SIGNS_DOMAIN


def test_uniforms_are_the_documented_values_on_0_1_with_1_for_the_largest_word():
    u = noise.Keystream(SEED, noise.NOISE_DOMAIN).uniforms(10_000)
    np.testing.assert_array_equal(u, _raw_uniforms(SEED, 10_000))
    words = np.array([0, 2**11, 2**63 - 2**11, 2**63, 2**63 + 2**11, 2**64 - 2**11 - 1, 2**64 - 1], dtype=np.uint64)
    below, above = 2.0**-53, 2.0**-52  # the grid below and above 1/2
    expected = [0.5 * below, 1.5 * below, 0.5 - 0.5 * below, 0.5, 0.5 + above, 1.0 - above, 1.0]
    assert noise._uniforms(words).tolist() == expected


@pytest.mark.parametrize("mechanism", noise.MECHANISMS)
@pytest.mark.parametrize("variance", [3.0, 1e4])
def test_a_uniform_of_exactly_1_is_accepted_by_every_sampler(monkeypatch, mechanism, variance):
    # the largest keystream word gives 1.0: every sampler must take it without a warning or an absurd value
    def ones(self, buf, n):
        buf[:n] = 0xFF
        return buf[:n]

    monkeypatch.setattr(noise.Keystream, "read_into", ones)
    monkeypatch.setattr(noise, "MAX_PASSES", 3)  # PTRS and the discrete Gaussian reject a 1 every time
    with np.errstate(all="raise"):
        try:
            x = noise.sample(mechanism, SEED, variance, 10)
        except RuntimeError as error:  # rejection samplers: every candidate rejected, which they report
            assert "rejected after 3 passes" in str(error)
        else:
            assert x.dtype == np.int64 and (np.abs(x) <= 10 * math.sqrt(variance) + 10).all()


def test_keystream_into_a_short_buffer_is_refused():
    stream = noise.Keystream(SEED, noise.NOISE_DOMAIN)
    with pytest.raises(ValueError, match="too small for 100"):
        stream.read_into(np.empty(100, dtype=np.uint8), 100)
    got = stream.read_into(np.empty(115, dtype=np.uint8), 100)
    assert got.tobytes() == _raw_keystream(SEED, b"dp-noise" + bytes(8), 100)


# --- determinism and pinned values ----------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", noise.MECHANISMS)
@pytest.mark.parametrize("variance", [0.5, 3.0, 50.0, 1e4])
def test_same_seed_same_noise_other_seed_other_noise(mechanism, variance):
    a = noise.sample(mechanism, SEED, variance, 5000)
    np.testing.assert_array_equal(a, noise.sample(mechanism, SEED, variance, 5000))
    b = noise.sample(mechanism, _seed(1), variance, 5000)
    assert not np.array_equal(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 6 / math.sqrt(5000)


def test_first_values_are_pinned():
    # regression values recorded from this implementation (seed bytes(range(32))); a change here changes every
    # recorded XNoise run, so it must be deliberate
    assert noise.sample("skellam", SEED, 3, 8).tolist() == [2, 4, 0, -1, -1, -1, -2, 0]
    assert noise.sample("skellam", SEED, 1e4, 8).tolist() == [-104, -64, -2, 33, 4, -20, -53, -22]
    assert noise.sample("gaussian", SEED, 10, 8).tolist() == [7, 3, 4, -1, 3, -1, -2, 0]
    assert noise.sample("dgaussian", SEED, 10, 8).tolist() == [-1, -2, -2, -2, 2, -2, 0, 2]


PINNED_DIGESTS = {
    ("skellam", 3.0): "cf54bcdca35bf59fd7d99e5372d844bf",
    ("skellam", 1e4): "b36b832ea16c87aaf2f13fef24089122",
    ("skellam", 3e7): "7542896fcef392819c9edb3e49ebb6e4",
    ("gaussian", 1e4): "019fec9d346051751e6f3e810f98d053",
    ("dgaussian", 1e4): "ecdc226aee1d0787d34f97f4259395b7",
}
"""SHA-256 (first 128 bits) of 150,001 draws from SEED, recorded from this implementation: several blocks and
rejection passes, so a rewrite of the block loop that changed any value or the keystream order shows here."""


@pytest.mark.parametrize(("mechanism", "variance"), list(PINNED_DIGESTS))
def test_many_values_are_pinned(mechanism, variance):
    x = noise.sample(mechanism, SEED, variance, 150_001)
    assert hashlib.sha256(x.astype("<i8").tobytes()).hexdigest()[:32] == PINNED_DIGESTS[mechanism, variance]


def test_threads_sampling_at_once_get_the_values_of_one_thread():
    # the samplers' scratch buffers are per thread (Dask workers run tasks in threads)
    cases = [(mechanism, _seed(i), variance) for i, (mechanism, variance) in enumerate(PINNED_DIGESTS)] * 2
    alone = [noise.sample(m, seed, v, 70_001) for m, seed, v in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda case: noise.sample(case[0], case[1], case[2], 70_001), cases))
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gaussian_is_box_muller_of_the_keystream_rounded():
    u = _raw_uniforms(SEED, 1000)
    radius = np.sqrt(-2.0 * 7.0 * np.log(u[0::2]))
    z = np.empty(1000)
    z[0::2] = radius * np.cos(2.0 * math.pi * u[1::2])
    z[1::2] = radius * np.sin(2.0 * math.pi * u[1::2])
    np.testing.assert_array_equal(noise.gaussian(SEED, 7.0, 999), np.rint(z[:999]).astype(np.int64))


def test_small_mean_skellam_is_the_exact_inverse_of_the_keystream_uniforms():
    # 2 x 70_000 Poisson draws cross a block boundary and go through both the guide table and the search
    mean, size = 1.5, 70_000
    u = _raw_uniforms(SEED, 2 * size)
    tail = stats.poisson.sf(np.arange(0, 60), mean)  # P(X > j) = P(X >= j + 1)
    draws = (tail[None, :] > u[:, None]).sum(axis=1)
    np.testing.assert_array_equal(noise.skellam(SEED, 2 * mean, size), draws[:size] - draws[size:])


# --- the Poisson pmf ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mean", [0.3, 4.0, 25.0, 5000.0])
def test_log_poisson_pmf_matches_scipy(mean):
    k = np.unique(np.clip(np.round(mean + np.linspace(-10, 10, 81) * math.sqrt(mean)), 0, None))
    k = np.concatenate([k, np.arange(0, 40.0)])
    np.testing.assert_allclose(noise.log_poisson_pmf(k, mean), stats.poisson.logpmf(k, mean), rtol=1e-11, atol=1e-11)


def test_log_poisson_pmf_is_stable_for_large_means():
    # at the mode of Poisson(1e12) the pmf is 1/sqrt(2 pi 1e12) (1 + O(1/mean)): the naive formula loses ~1e-3 here
    assert noise.log_poisson_pmf(np.array([1e12]), 1e12)[0] == pytest.approx(-0.5 * math.log(2 * math.pi * 1e12))


# --- moments --------------------------------------------------------------------------------------------------


def _moments_of_pmf(support: np.ndarray, pmf: np.ndarray) -> tuple[float, float]:
    pmf = pmf / pmf.sum()
    var = float(np.sum(pmf * support**2))
    return var, float(np.sum(pmf * support**4))


def _exact_variance_and_fourth_moment(mechanism: str, variance: float) -> tuple[float, float]:
    if mechanism == "skellam":  # cumulants k2 = k4 = variance
        return variance, 3 * variance**2 + variance
    sigma = math.sqrt(variance)
    support = np.arange(-math.ceil(14 * sigma) - 2, math.ceil(14 * sigma) + 3, dtype=np.float64)
    if mechanism == "gaussian":
        pmf = stats.norm.cdf((support + 0.5) / sigma) - stats.norm.cdf((support - 0.5) / sigma)
    else:
        pmf = np.exp(-(support**2) / (2 * variance))
    return _moments_of_pmf(support, pmf)


MOMENT_CASES = [("skellam", v) for v in (0.5, 3.0, 50.0, 1e4, 1e7)] + [
    (m, v) for m in ("gaussian", "dgaussian") for v in (0.5, 10.0, 1e4)
]


@pytest.mark.parametrize(("mechanism", "variance"), MOMENT_CASES)
def test_mean_and_variance_within_six_standard_errors(mechanism, variance):
    x = noise.sample(mechanism, _seed(7), variance, N).astype(np.float64)
    var, fourth = _exact_variance_and_fourth_moment(mechanism, variance)
    assert abs(x.mean()) <= 6 * math.sqrt(var / N)
    assert abs(np.mean(x**2) - var) <= 6 * math.sqrt((fourth - var**2) / N)


def test_discrete_gaussian_variance_is_close_to_sigma_squared_from_sigma_one():
    var, _ = _exact_variance_and_fourth_moment("dgaussian", 1.0)
    assert var < 1.0
    assert 1.0 - var < 1e-6


# --- exact distributions --------------------------------------------------------------------------------------


def _chi_square_p_value(x: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Pearson's test over the cells with expected count >= 20, the rest pooled into one cell."""
    expected = pmf / pmf.sum() * x.size
    keep = expected >= 20
    counts = np.array([np.count_nonzero(x == k) for k in support[keep]])
    observed = np.append(counts, x.size - counts.sum())
    wanted = np.append(expected[keep], x.size - expected[keep].sum())
    return float(stats.chisquare(observed, wanted).pvalue)


@pytest.mark.parametrize("variance", [0.5, 3.0, 50.0, 400.0])
def test_skellam_matches_the_exact_pmf(variance):
    # 0.5 and 3 use inversion, 50 and 400 use PTRS (Poisson means 25 and 200)
    x = noise.skellam(_seed(11), variance, N)
    support = np.arange(-60 - 10 * math.isqrt(int(variance)), 61 + 10 * math.isqrt(int(variance)))
    pmf = stats.skellam.pmf(support, variance / 2, variance / 2)
    assert _chi_square_p_value(x, support, pmf) > 1e-6


@pytest.mark.parametrize("variance", [0.5, 10.0])
def test_discrete_gaussian_matches_the_exact_pmf(variance):
    x = noise.discrete_gaussian(_seed(12), variance, N)
    support = np.arange(-40, 41)
    assert _chi_square_p_value(x, support, np.exp(-(support**2) / (2 * variance))) > 1e-6


def test_rounded_gaussian_matches_the_exact_pmf():
    x = noise.gaussian(_seed(13), 2.0, N)
    support = np.arange(-40, 41)
    sigma = math.sqrt(2.0)
    pmf = stats.norm.cdf((support + 0.5) / sigma) - stats.norm.cdf((support - 0.5) / sigma)
    assert _chi_square_p_value(x, support, pmf) > 1e-6


def test_ptrs_takes_several_passes_and_fills_every_draw():
    # at Poisson mean 10 (variance 20) about a fifth of the candidates are rejected in the first pass
    x = noise.skellam(_seed(14), 20.0, 100_000)
    assert x.dtype == np.int64
    assert abs(x.mean()) <= 6 * math.sqrt(20.0 / x.size)


# --- interface ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", noise.MECHANISMS)
def test_zero_variance_and_zero_size(mechanism):
    np.testing.assert_array_equal(noise.sample(mechanism, SEED, 0.0, 7), np.zeros(7, dtype=np.int64))
    assert noise.sample(mechanism, SEED, 5.0, 0).shape == (0,)


def test_unknown_mechanism_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"'laplace'.*skellam, gaussian, dgaussian"):
        noise.sample("laplace", SEED, 1.0, 3)


@pytest.mark.parametrize(
    ("seed", "variance", "size", "message"),
    [
        (bytes(31), 1.0, 3, "32 bytes"),
        (SEED, -1.0, 3, "variance"),
        (SEED, math.nan, 3, "variance"),
        (SEED, math.inf, 3, "variance"),
        (SEED, 2.0**51, 3, "variance"),
        (SEED, 1.0, -1, "size"),
    ],
)
@pytest.mark.parametrize("mechanism", noise.MECHANISMS)
def test_bad_arguments_are_refused(mechanism, seed, variance, size, message):
    with pytest.raises(ValueError, match=message):
        noise.sample(mechanism, seed, variance, size)


@settings(max_examples=60, deadline=None)
@given(
    mechanism=st.sampled_from(noise.MECHANISMS),
    variance=st.sampled_from([0.0, 0.01, 0.5, 9.99, 10.0, 50.0, 1e4, 1e9]),
    size=st.integers(0, 1000),
    seed=st.binary(min_size=32, max_size=32),
)
def test_any_size_gives_that_many_int64_draws(mechanism, variance, size, seed):
    x = noise.sample(mechanism, seed, variance, size)
    assert x.shape == (size,)
    assert x.dtype == np.int64
    np.testing.assert_array_equal(x, noise.sample(mechanism, seed, variance, size))


# --- several components on every core ----------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    mechanism=st.sampled_from(noise.MECHANISMS),
    variances=st.lists(st.sampled_from([0.5, 3.0, 40.0, 1e6]), min_size=0, max_size=9),
    size=st.integers(1, 3000),
)
def test_total_is_exactly_the_sum_of_the_components(mechanism: str, variances: list[float], size: int) -> None:
    draws = [(_seed(100 + i), v) for i, v in enumerate(variances)]
    expected = np.zeros(size, dtype=np.int64)
    for seed, variance in draws:
        expected += noise.sample(mechanism, seed, variance, size)
    np.testing.assert_array_equal(noise.total(mechanism, draws, size), expected)


def _threads_sampling(monkeypatch) -> set[str]:  # type: ignore[no-untyped-def]
    """The names of the threads that call ``noise.sample`` from now on (filled as they do)."""
    import threading

    seen: set[str] = set()
    sample = noise.sample

    def recorded(*args: object) -> np.ndarray:
        seen.add(threading.current_thread().name)
        return sample(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(noise, "sample", recorded)
    return seen


def test_total_runs_its_components_on_threads_and_is_the_same_on_one(monkeypatch) -> None:
    draws = [(_seed(i), 1e8) for i in range(7)]
    seen = _threads_sampling(monkeypatch)
    monkeypatch.setattr(noise, "threads", lambda: 2)
    many = noise.total("skellam", draws, 50_000)
    assert seen and all(name.startswith("dropsim-noise") for name in seen)
    seen.clear()
    monkeypatch.setattr(noise, "threads", lambda: 1)
    np.testing.assert_array_equal(noise.total("skellam", draws, 50_000), many)
    assert seen == {"MainThread"}


def test_a_deployments_one_thread_math_keeps_the_noise_on_the_callers_thread(monkeypatch) -> None:
    """A deployed party's CPU time is its compute thread's (sim.deploy.compute._timed): its noise must not
    run on other threads."""
    from sim.deploy.compute import one_thread_math

    monkeypatch.setattr(noise.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert noise.threads() == 2
    limits = one_thread_math()
    try:
        assert noise.threads() == 1
        seen = _threads_sampling(monkeypatch)
        noise.total("skellam", [(_seed(i), 10.0) for i in range(4)], 1000)
        assert seen == {"MainThread"}
    finally:
        limits.restore_original_limits()
    assert noise.threads() == 2
