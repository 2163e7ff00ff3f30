"""Tests for sim.dp.accounting: per-round RDP curves, subsampling, conversion, the accountant and planning.

Golden numbers say where they come from: computed by hand from the formula (arithmetic in the comment), the
exact Renyi divergence summed numerically from the probability mass functions, or dp-accounting's own values.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant, compute_epsilon
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ive, logsumexp

from sim.dp import accounting as acc

ORDERS = acc.ORDERS
BETA = math.exp(-0.5)  # sqrt(2 ln(1/beta)) = 1 exactly: keeps the hand arithmetic simple


def _skellam_curve(variance: float, scale: float = 100.0, clip: float = 1.0, dim: int = 64) -> acc.RdpFunction:
    return lambda a: acc.skellam_rdp(a, variance, scale, clip, dim)


def _exact_skellam_divergence(lam: float, shift: int, alpha: float) -> float:
    """D_alpha(Sk(lam, lam) + shift || Sk(lam, lam)), summed over the support (pmf = e^-2lam I_|k|(2 lam))."""
    width = int(30 * math.sqrt(2 * lam)) + 40 + shift
    x = np.arange(-width, width + 1)
    log_p = np.log(ive(np.abs(x - shift), 2 * lam))
    log_q = np.log(ive(np.abs(x), 2 * lam))
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    return float(logsumexp(alpha * log_p[keep] + (1 - alpha) * log_q[keep]) / (alpha - 1))


def _exact_ddg_divergence(clients: int, sigma2: float, shift: int, alpha: float) -> float:
    """D_alpha(Z + shift || Z), Z the sum of ``clients`` iid N_Z(0, sigma2), by convolving the pmfs."""
    width = int(40 * math.sqrt(sigma2)) + 40
    x = np.arange(-width, width + 1)
    log_w = -(x**2) / (2 * sigma2)
    pmf = np.exp(log_w - logsumexp(log_w))
    total = pmf
    for _ in range(clients - 1):
        total = np.convolve(total, pmf)
    inner = slice(shift + 5, len(total) - 5)  # away from the truncated ends
    with np.errstate(divide="ignore"):
        log_q = np.log(total)[inner]
        log_p = np.log(np.roll(total, shift))[inner]
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    return float(logsumexp(alpha * log_p[keep] + (1 - alpha) * log_q[keep]) / (alpha - 1))


# ----------------------------------------------------------------------------------- rounding_sensitivity


def test_rounding_sensitivity_pinned_values() -> None:
    # clip 1, scale 100, d = 4: S = 100, sqrt(d) = 2, sqrt(2 ln(1/beta)) = 1.
    # First bound S + sqrt(d) = 102; second sqrt(100^2 + 4/4 + 1 * (100 + 2/2)) = sqrt(10102) = 100.5087...
    # D2 = sqrt(10102) / 100; D1 = D2 s min(sqrt(d), D2 s) / s = sqrt(10102) * 2 / 100.
    d2, d1 = acc.rounding_sensitivity(1.0, 100.0, 4, BETA)
    assert d2 == pytest.approx(math.sqrt(10102) / 100, rel=1e-15)
    assert d1 == pytest.approx(2 * math.sqrt(10102) / 100, rel=1e-15)
    # beta = 0 (plain stochastic rounding): only S + sqrt(d) = 102; D1 = 102 * min(2, 102) / 100.
    assert acc.rounding_sensitivity(1.0, 100.0, 4, 0.0) == pytest.approx((1.02, 2.04), rel=1e-15)
    # clip 0.01, scale 100, d = 64: S = 1, sqrt(d) = 8; first bound 9; second sqrt(1 + 16 + 1 * (1 + 4)) = sqrt(22)
    # = 4.69 < 9. D1 takes the L2^2 branch: sqrt(22) * min(8, sqrt(22)) = 22 integer units -> 0.22.
    d2, d1 = acc.rounding_sensitivity(0.01, 100.0, 64, BETA)
    assert d2 == pytest.approx(math.sqrt(22) / 100, rel=1e-15)
    assert d1 == pytest.approx(0.22, rel=1e-14)


@settings(max_examples=100, deadline=None)
@given(
    clip=st.floats(1e-3, 1e3),
    scale=st.floats(1e-2, 1e6),
    log_dim=st.integers(0, 24),
    beta=st.sampled_from([0.0, BETA, 0.1, 0.9]),
)
def test_rounding_never_shrinks_sensitivity(clip: float, scale: float, log_dim: int, beta: float) -> None:
    d2, d1 = acc.rounding_sensitivity(clip, scale, 2**log_dim, beta)
    assert d2 >= clip
    assert d1 <= d2 * math.sqrt(2**log_dim) * (1 + 1e-12)  # L1 <= sqrt(d) L2
    assert d1 <= d2**2 * scale * (1 + 1e-12)  # L1 <= L2^2 in integer units


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip": 0.0}, "clip"),
        ({"scale": -1.0}, "scale"),
        ({"dim": 0}, "dim"),
        ({"beta": 1.0}, "beta"),
    ],
)
def test_rounding_sensitivity_rejects_bad_inputs(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"clip": 1.0, "scale": 10.0, "dim": 4, "beta": BETA} | kwargs
    with pytest.raises(ValueError, match=match):
        acc.rounding_sensitivity(args["clip"], args["scale"], int(args["dim"]), args["beta"])


# ------------------------------------------------------------------------------------------ Skellam


def test_skellam_rdp_pinned_values() -> None:
    # clip 1, scale 100, d 4: D2^2 = 10102 / 10^4 = 1.0102, D1 = 0.02 sqrt(10102) = 2.0101741...
    d1 = 0.02 * math.sqrt(10102)
    # mu = 1, a = 2: a D2^2 / (2 mu) = 1.0102;
    # min(((2a-1) s D2^2 + 6 D1) / (4 s^3 mu^2), 3 D1 / (2 s mu)) = min((303.06 + 12.0610...) / 4e6, 0.030152...)
    #   = 315.1210... / 4e6 = 7.8780...e-5.  Total 1.0102787802...
    expected_2 = 1.0102 + (303.06 + 6 * d1) / 4e6
    # a = 10: 10 * 1.0102 / 2 = 5.051; (19 * 100 * 1.0102 + 6 D1) / 4e6 = (1919.38 + 12.061...) / 4e6.
    expected_10 = 5.051 + (1919.38 + 6 * d1) / 4e6
    got = acc.skellam_rdp([2, 10], 1.0, 100.0, 1.0, 4, BETA)
    assert got == pytest.approx([expected_2, expected_10], rel=1e-14)
    # mu = 0.001 (integer-domain variance 10): the large-shift branch 3 D1 / (2 s mu) = 3 D1 / 0.2 wins over
    # (3 * 100 * 1.0102 + 6 D1) / (4e6 * 1e-6) = 78.78...;  a D2^2 / (2 mu) = 2 * 1.0102 / 0.002 = 1010.2.
    got = acc.skellam_rdp([2], 0.001, 100.0, 1.0, 4, BETA)
    assert got == pytest.approx([1010.2 + 15 * d1], rel=1e-13)


def test_skellam_rdp_edge_variances() -> None:
    assert np.all(np.isinf(acc.skellam_rdp(ORDERS, 0.0, 10.0, 1.0, 4)))
    assert np.all(acc.skellam_rdp(ORDERS, math.inf, 10.0, 1.0, 4) == 0)


def test_skellam_approaches_gaussian_as_scale_grows() -> None:
    variance, clip, dim = 2.0, 1.0, 2**10
    ratios = []
    for scale in (1e2, 1e3, 1e4, 1e6):
        d2, _ = acc.rounding_sensitivity(clip, scale, dim)
        skellam = acc.skellam_rdp(ORDERS, variance, scale, clip, dim)
        gaussian = acc.gaussian_rdp(ORDERS, variance, d2)
        assert np.all(skellam >= gaussian)
        ratios.append(float(np.max(skellam / gaussian)))
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] == pytest.approx(1.0, abs=1e-8)
    # ...and the inflated sensitivity tends to the clip: the limit is the Gaussian mechanism with sensitivity c.
    big = acc.skellam_rdp(ORDERS, variance, 1e8, clip, dim)
    assert big == pytest.approx(acc.gaussian_rdp(ORDERS, variance, clip), rel=1e-6)


@pytest.mark.parametrize("lam", [0.5, 2.0, 20.0, 500.0])
@pytest.mark.parametrize("shift", [1, 3])
def test_skellam_bound_dominates_exact_divergence(lam: float, shift: int) -> None:
    # Noise Sk(lam, lam) has variance 2 lam: the bound's mu is that variance (scale 1: integer = model units).
    # (Reading mu as the Poisson parameter lam would make the leading term twice the Gaussian's.)
    alphas = [2, 5, 20, 64]
    bound = acc.skellam_rdp_bound(alphas, 2 * lam, 1.0, float(shift), float(shift))
    exact = np.array([_exact_skellam_divergence(lam, shift, a) for a in alphas])
    assert np.all(exact <= bound * (1 + 1e-9))
    if lam >= 500:  # tight in the Gaussian regime at low orders
        assert exact[0] == pytest.approx(bound[0], rel=0.02)


# ---------------------------------------------------------------------------------- discrete Gaussian


def test_ddg_tau_pinned() -> None:
    # n = 2, sigma = 1: tau = 10 exp(-2 pi^2 * 1 * 1/2) = 10 exp(-pi^2) = 5.1723...e-4.
    assert acc.ddg_tau(1.0, 2) == pytest.approx(10 * math.exp(-(math.pi**2)), rel=1e-14)
    # n = 3 adds k = 2: 10 (exp(-pi^2) + exp(-2 pi^2 * 2/3)).
    assert acc.ddg_tau(1.0, 3) == pytest.approx(10 * (math.exp(-(math.pi**2)) + math.exp(-4 * math.pi**2 / 3)))
    assert acc.ddg_tau(0.7, 1) == 0.0


@pytest.mark.parametrize("clients", [2, 3, 5])
@pytest.mark.parametrize("sigma2", [0.25, 0.5, 1.0])
def test_ddg_bound_dominates_exact_divergence(clients: int, sigma2: float) -> None:
    shift = 2
    alphas = [2, 5, 20]
    bound = acc.ddgauss_rdp_bound(alphas, clients * sigma2, 1.0, float(shift), float(shift), 1, clients)
    exact = np.array([_exact_ddg_divergence(clients, sigma2, shift, a) for a in alphas])
    assert np.all(exact <= bound * (1 + 1e-9))


def test_ddg_single_client_is_the_discrete_gaussian_bound() -> None:
    # n = 1: tau = 0 and all three terms equal a D2^2 / (2 variance) (Canonne, Kamath, Steinke 2020).
    d2, _ = acc.rounding_sensitivity(1.0, 50.0, 256)
    got = acc.ddgauss_rdp(ORDERS, 0.8, 50.0, 1.0, 256, 1)
    assert got == pytest.approx(acc.gaussian_rdp(ORDERS, 0.8, d2), rel=1e-14)


def test_ddg_guard_and_edges() -> None:
    # per-client integer stddev sqrt(0.01 / 4) * 5 = 0.25 < 1/2: bound not used, inf.
    assert np.all(np.isinf(acc.ddgauss_rdp(ORDERS, 0.01, 5.0, 1.0, 16, 4)))
    assert np.all(np.isinf(acc.ddgauss_rdp(ORDERS, 0.0, 5.0, 1.0, 16, 4)))
    assert np.all(acc.ddgauss_rdp(ORDERS, math.inf, 5.0, 1.0, 16, 4) == 0)


# ---------------------------------------------------------------------------------------- subsampling


def test_subsampled_q1_is_unsampled_and_q0_is_zero() -> None:
    curve = _skellam_curve(0.5)
    assert np.array_equal(acc.subsampled_rdp(curve, ORDERS, 1.0), curve(np.asarray(ORDERS, dtype=float)))
    assert np.array_equal(acc.subsampled_rdp(curve, ORDERS, 0.0), np.zeros(len(ORDERS)))


def test_subsampled_order_two_pinned() -> None:
    # a = 2 keeps only l <= 2: log{(1-q)(1+q) + q^2 e^eps(2)} / 1. Gaussian variance 1, sensitivity 1: eps(2) = 1;
    # q = 0.1: log(0.99 + 0.01 e) = log(1.0171828...) = 0.0170368...
    got = acc.subsampled_rdp(lambda a: acc.gaussian_rdp(a, 1.0, 1.0), [2], 0.1)
    assert got[0] == pytest.approx(math.log(0.99 + 0.01 * math.e), rel=1e-14)


def _decimal_subsampled(eps: np.ndarray, alpha: int, q: float) -> float:
    """The general subsampled bound evaluated term by term in 60-digit decimal arithmetic (eps[l - 2] = eps(l))."""
    with localcontext() as ctx:
        ctx.prec = 60
        qd, one = Decimal(q), Decimal(1)
        total = (one - qd) ** (alpha - 1) * (alpha * qd - qd + one)
        total += math.comb(alpha, 2) * qd**2 * (one - qd) ** (alpha - 2) * Decimal(float(eps[0])).exp()
        for ell in range(3, alpha + 1):
            growth = (Decimal(float(eps[ell - 2])) * (ell - 1)).exp()
            total += 3 * math.comb(alpha, ell) * (one - qd) ** (alpha - ell) * qd**ell * growth
        return float(min(total.ln() / (alpha - 1), Decimal(float(eps[alpha - 2]))))


@pytest.mark.parametrize("variance", [0.05, 1.0, 1e4])
@pytest.mark.parametrize("q", [1e-5, 0.01, 0.7])
def test_subsampled_matches_high_precision_evaluation(variance: float, q: float) -> None:
    # Reference: the formula summed as written, in 60-digit decimals (no log-space rearrangement).
    curve = _skellam_curve(variance)
    eps = curve(np.arange(2.0, 129.0))
    alphas = [2, 3, 7, 32, 128]
    expected = [_decimal_subsampled(eps, a, q) for a in alphas]
    assert acc.subsampled_rdp(curve, alphas, q) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    q1=st.floats(1e-4, 1.0),
    q2=st.floats(1e-4, 1.0),
    variance=st.floats(1e-3, 1e3),
    mechanism=st.sampled_from(["skellam", "dgaussian"]),
)
def test_subsampled_increases_in_q_and_is_capped(q1: float, q2: float, variance: float, mechanism: str) -> None:
    # Hyades Theorem 1: the bound increases in the rate (so rate-0 dropouts are covered by accounting at q).
    low, high = sorted((q1, q2))
    if mechanism == "skellam":
        curve = _skellam_curve(variance)
    else:

        def curve(a: np.ndarray) -> np.ndarray:
            return acc.ddgauss_rdp(a, variance, 100.0, 1.0, 64, 10)

    at_low = acc.subsampled_rdp(curve, ORDERS, low)
    at_high = acc.subsampled_rdp(curve, ORDERS, high)
    assert np.all(at_low <= at_high * (1 + 1e-12) + 1e-300)
    assert np.all(at_high <= curve(np.asarray(ORDERS, dtype=float)))


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5])
def test_subsampled_gaussian_against_dp_accounting(z: float, q: float) -> None:
    # dp-accounting's Poisson-subsampled Gaussian is exact at integer orders (Mironov, Talwar, Zhang 2019); the
    # general bound is the same binomial sum with a factor 3 on the l >= 3 terms, so it is never below it,
    # equal at order 2, and (measured on this grid) at most ~3.1x as large in epsilon after 100 rounds.
    ours = acc.subsampled_rdp(lambda a: acc.gaussian_rdp(a, z * z, 1.0), ORDERS, q)
    theirs = acc.gaussian_subsampled_rdp(ORDERS, z, q)
    assert np.all(ours >= theirs * (1 - 1e-12))
    assert ours[0] == pytest.approx(theirs[0], rel=1e-12)
    eps_ours = acc.epsilon(100 * ours, ORDERS, 1e-5)[0]
    eps_theirs = acc.epsilon(100 * theirs, ORDERS, 1e-5)[0]
    assert eps_theirs * (1 - 1e-12) <= eps_ours <= 3.5 * eps_theirs


def test_subsampled_high_orders_do_not_overflow() -> None:
    out = acc.subsampled_rdp(lambda a: acc.gaussian_rdp(a, 0.05, 1.0), ORDERS, 0.5)
    assert np.all(np.isfinite(out))
    assert out[-1] > 0


def test_subsampled_rejects_fractional_orders() -> None:
    with pytest.raises(ValueError, match="integers"):
        acc.subsampled_rdp(_skellam_curve(1.0), [1.5, 2.0], 0.1)


# ----------------------------------------------------------------------------------------- conversion


@settings(max_examples=100, deadline=None)
@given(
    rdp=st.lists(st.floats(0.0, 200.0), min_size=len(ORDERS), max_size=len(ORDERS)),
    delta=st.floats(1e-12, 0.5),
)
def test_epsilon_matches_dp_accounting(rdp: list[float], delta: float) -> None:
    ours, _ = acc.epsilon(rdp, ORDERS, delta)
    theirs, _ = compute_epsilon(ORDERS, rdp, delta)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_epsilon_special_cases_match_dp_accounting() -> None:
    orders = [1.005, 1.5, 2.0, 8.0, 64.0]
    for rdp, delta in [
        ([0.0] * 5, 0.0),
        ([0.0, 0.0, 1.0, 0.0, 0.0], 0.0),
        ([1e-9] * 5, 0.1),  # KL branch: epsilon 0
        ([-1e-3, 1.0, 2.0, 3.0, 4.0], 1e-5),  # negative RDP: epsilon 0
        ([math.inf] * 5, 1e-5),
        ([5.0, 0.3, 0.2, 0.5, 3.0], 1e-6),
    ]:
        ours = acc.epsilon(rdp, orders, delta)
        theirs = compute_epsilon(orders, rdp, delta)
        assert ours[0] == pytest.approx(theirs[0], rel=1e-12, abs=1e-15)
        assert ours[1] == theirs[1]


def test_epsilon_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="same"):
        acc.epsilon([1.0, 2.0], [2.0], 1e-5)


# ------------------------------------------------------------------------------------------ accountant


@pytest.mark.parametrize("q", [1.0, 0.3, 0.01])
def test_gaussian_accountant_equals_dp_accounting(q: float) -> None:
    clip, delta, rounds = 0.7, 1e-5, 12
    variances = [2.25 * clip**2] * 4 + [0.9 * clip**2] * 3 + [2.25 * clip**2] * 5  # dropout: rounds with less noise
    ours = acc.Accountant("gaussian", delta, clip, 1024, q)
    theirs = RdpAccountant(ORDERS)
    for variance in variances:
        ours.add_round(variance)
        z = math.sqrt(variance) / clip
        theirs.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    assert ours.epsilon() == pytest.approx(theirs.get_epsilon(delta), rel=1e-9)
    assert ours.rdp == pytest.approx(theirs.rdp, rel=1e-12)
    assert ours.rounds == rounds


def test_gaussian_accountant_count_equals_self_composed_event() -> None:
    ours = acc.Accountant("gaussian", 1e-6, 1.0, 16, 0.05)
    ours.add_round(1.44, count=300)
    theirs = RdpAccountant(ORDERS)
    theirs.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.2)), count=300)
    assert ours.epsilon() == pytest.approx(theirs.get_epsilon(1e-6), rel=1e-9)


@pytest.mark.parametrize("mechanism", ["skellam", "dgaussian"])
def test_scaled_accountant_composes_subsampled_curves(mechanism: str) -> None:
    account = acc.Accountant(mechanism, 1e-5, 1.0, 64, 0.02, scale=100.0)
    account.add_round(0.8, clients=10)
    account.add_round(1.6, clients=10)
    if mechanism == "skellam":
        curves = [acc.subsampled_rdp(_skellam_curve(v), ORDERS, 0.02) for v in (0.8, 1.6)]
    else:
        curves = [
            acc.subsampled_rdp(lambda a, v=v: acc.ddgauss_rdp(a, v, 100.0, 1.0, 64, 10), ORDERS, 0.02)
            for v in (0.8, 1.6)
        ]
    assert account.rdp == pytest.approx(curves[0] + curves[1], rel=1e-14)
    assert account.epsilon() == pytest.approx(acc.epsilon(curves[0] + curves[1], ORDERS, 1e-5)[0], rel=1e-14)


@pytest.mark.parametrize("mechanism", acc.MECHANISMS)
def test_accountant_thousand_rounds_three_variances(mechanism: str) -> None:
    # Speed sanity (no timed assertion): curves are cached, one per distinct variance.
    account = acc.Accountant(mechanism, 1e-5, 1.0, 2**16, 0.01, scale=None if mechanism == "gaussian" else 200.0)
    levels = (1.0, 1.5, 3.0)
    for i in range(1000):
        account.add_round(levels[i % 3], clients=50)
    assert account.rounds == 1000
    once = acc.Accountant(mechanism, 1e-5, 1.0, 2**16, 0.01, scale=None if mechanism == "gaussian" else 200.0)
    for i, level in enumerate(levels):
        once.add_round(level, clients=50, count=334 if i == 0 else 333)
    assert account.epsilon() == pytest.approx(once.epsilon(), rel=1e-12)


@pytest.mark.parametrize("mechanism", acc.MECHANISMS)
def test_accountant_noise_free_and_infinite_noise_rounds(mechanism: str) -> None:
    scale = None if mechanism == "gaussian" else 100.0
    account = acc.Accountant(mechanism, 1e-5, 1.0, 16, 0.1, scale=scale)
    account.add_round(math.inf)
    assert account.epsilon() == 0.0
    account.add_round(0.0)
    assert account.epsilon() == math.inf


def test_accountant_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="unknown mechanism"):
        acc.Accountant("laplace", 1e-5, 1.0, 16, 0.1)
    with pytest.raises(ValueError, match="scale"):
        acc.Accountant("skellam", 1e-5, 1.0, 16, 0.1)
    with pytest.raises(ValueError, match="delta"):
        acc.Accountant("gaussian", 0.0, 1.0, 16, 0.1)
    with pytest.raises(ValueError, match="sampling rate"):
        acc.Accountant("gaussian", 1e-5, 1.0, 16, 1.5)
    with pytest.raises(ValueError, match="variance"):
        acc.Accountant("gaussian", 1e-5, 1.0, 16, 0.1).add_round(-1.0)


def test_rounds_within_budget_stops_before_the_round_that_passes() -> None:
    variances = [2.0] * 200  # 200 rounds at variance 2 spend about 3.75 (computed by the accountant)
    kept = acc.rounds_within_budget("skellam", 3.0, 1e-5, variances, 0.05, 1.0, 64, scale=100.0)
    assert 0 < kept < 200
    before = acc.Accountant("skellam", 1e-5, 1.0, 64, 0.05, scale=100.0)
    before.add_round(2.0, count=kept)
    assert before.epsilon() <= 3.0
    before.add_round(2.0)
    assert before.epsilon() > 3.0
    assert acc.rounds_within_budget("skellam", 1e9, 1e-5, variances, 0.05, 1.0, 64, scale=100.0) == 200


# ------------------------------------------------------------------------------------------- planning


def _spent(mechanism: str, variance: float, rounds: int, q: float, scale: float | None, clients: int) -> float:
    account = acc.Accountant(mechanism, 1e-5, 1.0, 2**10, q, scale=scale)
    for _ in range(rounds):
        account.add_round(variance, clients=clients)
    return account.epsilon()


@pytest.mark.parametrize("mechanism", acc.MECHANISMS)
def test_planned_variance_spends_the_budget(mechanism: str) -> None:
    def scale_for(variance: float) -> float:
        return acc.choose_scale(20, acc.HEADROOM_STDDEVS, 1.0, 2**10, 50, variance)

    target, rounds, q = 4.0, 200, 0.02
    planned = acc.plan_variance(mechanism, target, 1e-5, rounds, q, 1.0, 2**10, scale_for=scale_for, clients=50)
    scale = None if mechanism == "gaussian" else scale_for(planned)
    spent = _spent(mechanism, planned, rounds, q, scale, 50)
    assert target * (1 - 1e-4) <= spent <= target
    # A little less noise would pass the budget.
    lower = planned * (1 - 1e-6)
    assert _spent(mechanism, lower, rounds, q, None if scale is None else scale_for(lower), 50) > spent


def test_planned_variance_grows_with_rounds_and_with_smaller_epsilon() -> None:
    def plan(epsilon: float, rounds: int) -> float:
        return acc.plan_variance("skellam", epsilon, 1e-5, rounds, 0.02, 1.0, 2**10, scale_for=lambda v: 500.0)

    assert plan(2.0, 100) > plan(4.0, 100) > plan(8.0, 100)
    assert plan(4.0, 400) > plan(4.0, 100) > plan(4.0, 25)


def test_plan_variance_trivial_and_invalid_cases() -> None:
    assert acc.plan_variance("gaussian", 1.0, 1e-5, 0, 0.1, 1.0, 16) == 0.0
    assert acc.plan_variance("gaussian", 1.0, 1e-5, 10, 0.0, 1.0, 16) == 0.0
    with pytest.raises(ValueError, match="scale_for"):
        acc.plan_variance("skellam", 1.0, 1e-5, 10, 0.1, 1.0, 16)
    with pytest.raises(ValueError, match="epsilon"):
        acc.plan_variance("gaussian", 0.0, 1e-5, 10, 0.1, 1.0, 16)


def test_plan_variance_reports_an_unreachable_target() -> None:
    # 8 bits for a 2^16-dimensional update: as the noise grows the scale shrinks and the rounding sensitivity
    # grows with it, so epsilon has a floor above the target.
    def scale_for(variance: float) -> float:
        return acc.choose_scale(8, 3.0, 1.0, 2**16, 10, variance)

    with pytest.raises(ValueError, match="raise aggregation.bits"):
        acc.plan_variance("skellam", 0.5, 1e-5, 100, 0.1, 1.0, 2**16, scale_for=scale_for, clients=10)


# ---------------------------------------------------------------------------------------- choose_scale


@pytest.mark.parametrize(
    ("bits", "clients", "dim", "noise_variance"),
    [(20, 100, 2**16, 50.0), (16, 16, 2**20, 3.0), (12, 1, 4, 0.0), (32, 1000, 2**10, 1e4)],
)
def test_choose_scale_fills_the_range_exactly(bits: int, clients: int, dim: int, noise_variance: float) -> None:
    k, clip = 3.0, 0.5
    s = acc.choose_scale(bits, k, clip, dim, clients, noise_variance)
    spread = k * math.sqrt(clients * (clip**2 * s**2 / dim + 0.25) + noise_variance * s**2)
    assert spread == pytest.approx(2.0 ** (bits - 1), rel=1e-9)


@pytest.mark.parametrize(("bits", "clients"), [(1, 1), (4, 100), (6, 4096)])
def test_choose_scale_rejects_too_few_bits(bits: int, clients: int) -> None:
    with pytest.raises(ValueError, match="too few"):
        acc.choose_scale(bits, 3.0, 1.0, 1024, clients, 1.0)
