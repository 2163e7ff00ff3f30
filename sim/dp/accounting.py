"""Renyi-DP accounting of distributed DP under dropout: per-round curves, subsampling, composition, planning.

Theory of operation. A round releases the sum of the sampled clients' clipped updates plus central noise of
variance ``variance`` per coordinate. Every variance here is in MODEL units (the per-coordinate noise variance
of the SUM of clipped updates, the units of ``clip^2``); ``clip`` is the L2 clip norm c, ``dim`` the padded
dimension d, ``scale`` s the integer units per model unit of the DSkellam encoding. One round gives an RDP
curve eps(alpha) over the integer orders ``ORDERS`` (Mironov 2017):

- ``skellam``: Agarwal, Kairouz, Liu, NeurIPS'21 (the multi-dimensional Skellam bound) with the sensitivities
  inflated by conditional stochastic rounding (Kairouz, Liu, Steinke, ICML'21; arXiv:2102.06387);
- ``gaussian``: the continuous Gaussian, sensitivity ``clip``, handed to ``dp_accounting`` whole (its
  Poisson-subsampled Gaussian is exact at integer orders, Mironov, Talwar, Zhang 2019);
- ``dgaussian``: the sum of n discrete Gaussians, Kairouz, Liu, Steinke, ICML'21, Proposition 14 / Eq. 17.

Clients are Poisson-sampled at rate q; a client that dropped before sampling has rate 0 <= q, and Hyades
Theorem 1 shows the general subsampled bound (Zhu & Wang, ICML'19, Theorem 5) increases in the rate, so
every round is accounted at q (``subsampled_rdp``). Rounds compose by adding curves, each round with the
noise it really had (:class:`Accountant`); curves become (epsilon, delta) by the conversion of Canonne,
Kamath, Steinke 2020 (Proposition 12) / Balle et al. 2020 (``epsilon``), identical to
``dp_accounting.rdp.compute_epsilon``. ``plan_variance`` inverts that for a whole training run, and
``choose_scale`` picks the DSkellam scale that fits k standard deviations of the aggregate in 2^bits.

Provenance of the formulas (docs/privacy.md, "Accounting", writes them out; checked, not only copied):
- The Skellam bound is implemented as docs/privacy.md writes it, with ``mu`` = central variance. It agrees with the
  authors' own accounting code (google-research/federated, ``distributed_dp/accounting_utils.py``,
  ``_skellam_rdp``, whose Skellam noise Sk(lambda, lambda) has lambda = variance / 2). The paper's own
  statement was not reachable from here; instead the tests check the bound numerically against the exact
  Renyi divergence of two shifted one-dimensional Skellam distributions (it is an upper bound, and tight as
  the variance grows; reading ``mu`` as the Poisson parameter instead would be twice too loose).
- The rounding inflation of D2 and D1 is docs/privacy.md's, identical to ``rounded_l2_norm_bound`` and
  ``rounded_l1_norm_bound`` of the same file.
- The discrete-Gaussian bound is the three-term minimum of that file's ``compute_rdp_dgaussian`` (which
  cites Proposition 14 / Eq. 17 of arXiv:2102.06387) with tau of the paper's Theorem 1; the tests check it
  against the exact divergence of a sum of discrete Gaussians. Below a per-client integer-domain standard
  deviation of 1/2 the bound is not used (the exact divergence exceeds it for tiny sigma): the round costs inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from dp_accounting import dp_event  # type: ignore[import-untyped]
from dp_accounting.rdp import RdpAccountant  # type: ignore[import-untyped]

ORDERS: tuple[int, ...] = (*range(2, 129), 256)
"""RDP orders alpha accounted (integers: the subsampled bound needs integer orders)."""
DEFAULT_BETA = math.exp(-0.5)
"""Bias beta of conditional stochastic rounding (DSkellam / DDGauss default)."""
HEADROOM_STDDEVS = 3.0
"""k, the standard deviations of one aggregate coordinate that must fit in the modulus (papers' default)."""
MECHANISMS = ("skellam", "gaussian", "dgaussian")
"""Mechanisms the accountant knows."""
SCALED = ("skellam", "dgaussian")
"""Mechanisms on the integer grid: they need the scale s (rounding inflates their sensitivity)."""
DDG_MIN_STDDEV = 0.5
"""Smallest per-client integer-domain stddev for which the discrete-Gaussian bound is used (below: inf)."""
PLAN_RTOL = 1e-10
"""Relative width of the final bisection bracket of :func:`plan_variance` (on the variance)."""
PLAN_MARGIN = 1e-9
"""Relative slack :func:`plan_variance` leaves under the target epsilon, so that composing the rounds one by
one (a different float summation order) cannot land above it."""

RdpFunction = Callable[[np.ndarray], np.ndarray]
"""A per-round RDP curve: float array of orders -> RDP (nats) at each."""


# ----------------------------------------------------------------------------------------- validation


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def _check_variance(variance: float) -> float:
    variance = float(variance)
    if not variance >= 0:  # also rejects NaN
        raise ValueError(f"variance must be >= 0 (model units; inf = no privacy loss), got {variance!r}")
    return variance


def _check_dim(dim: int) -> int:
    if int(dim) != dim or dim < 1:
        raise ValueError(f"dim must be a positive integer (the padded dimension), got {dim!r}")
    return int(dim)


def _check_beta(beta: float) -> float:
    beta = float(beta)
    if not 0 <= beta < 1:
        raise ValueError(f"beta (conditional rounding bias) must be in [0, 1), got {beta!r}")
    return beta


def _check_rate(q: float) -> float:
    q = float(q)
    if not 0 <= q <= 1:
        raise ValueError(f"sampling rate q must be in [0, 1], got {q!r}")
    return q


def _check_clients(clients: int) -> int:
    if int(clients) != clients or clients < 1:
        raise ValueError(f"clients must be a positive integer, got {clients!r}")
    return int(clients)


def _check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")
    return mechanism


def _integer_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    alphas = np.asarray(orders, dtype=float)
    if alphas.ndim != 1 or alphas.size == 0:
        raise ValueError(f"orders must be a non-empty 1-D sequence, got shape {alphas.shape}")
    if not (np.all(alphas >= 2) and np.all(alphas == np.floor(alphas)) and np.all(np.isfinite(alphas))):
        raise ValueError(f"orders must be finite integers >= 2 (the subsampled bound needs them), got {orders!r}")
    return alphas.astype(np.int64)


def _float_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    alphas = np.asarray(orders, dtype=float)
    if alphas.ndim != 1 or alphas.size == 0 or not np.all(alphas > 1):
        raise ValueError(f"orders must be a non-empty 1-D sequence of numbers > 1, got {orders!r}")
    return alphas


def _logsumexp(x: np.ndarray) -> float:
    top = float(np.max(x))
    if math.isinf(top):
        return top
    return top + math.log(float(np.sum(np.exp(x - top))))


def _log1p_exp(x: float) -> float:
    """log(1 + e^x) without overflow (and without losing precision when e^x is tiny)."""
    if x > 0:
        return x + math.log1p(math.exp(-x))
    return math.log1p(math.exp(x))


# ------------------------------------------------------------------------------------- per-round curves


def rounding_sensitivity(clip: float, scale: float, dim: int, beta: float = DEFAULT_BETA) -> tuple[float, float]:
    """(D2, D1): L2 and L1 sensitivity, in model units, of one client's update after scaling and rounding.

    With S = c s (the clip in integer units) conditional stochastic rounding with bias beta keeps the rounded
    vector's L2 norm within (Kairouz, Liu, Steinke ICML'21, arXiv:2102.06387, conditional randomized rounding,
    as in their code's ``rounded_l2_norm_bound``; docs/privacy.md)
    ``D2 s = min(S + sqrt(d), sqrt(S^2 + d/4 + sqrt(2 ln(1/beta)) (S + sqrt(d)/2)))``; beta = 0 (plain
    stochastic rounding) keeps only the first bound. An integer vector has L1 <= min(sqrt(d) L2, L2^2), so
    ``D1 = D2 s min(sqrt(d), D2 s) / s``. Both come back divided by s (model units).
    """
    clip = _positive("clip", clip)
    scale = _positive("scale", scale)
    dim = _check_dim(dim)
    beta = _check_beta(beta)
    big_s = clip * scale
    root_d = math.sqrt(dim)
    l2_int = big_s + root_d
    if beta > 0:
        squared = big_s**2 + dim / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (big_s + root_d / 2.0)
        l2_int = min(l2_int, math.sqrt(squared))
    l1_int = l2_int * min(root_d, l2_int)
    return l2_int / scale, l1_int / scale


def skellam_rdp_bound(
    orders: Sequence[float] | np.ndarray, variance: float, scale: float, l2: float, l1: float
) -> np.ndarray:
    """Unsampled Skellam RDP (nats) at ``orders`` for given sensitivities ``l2``, ``l1`` (model units).

    Agarwal, Kairouz, Liu NeurIPS'21 (multi-dimensional Skellam mechanism), written in model units as in
    docs/privacy.md, with mu = ``variance`` (central, model units) and s = ``scale``::

        eps(a) = a l2^2 / (2 mu) + min(((2a - 1) s l2^2 + 6 l1) / (4 s^3 mu^2), 3 l1 / (2 s mu)).

    This is the bound in the integer domain (noise Sk(lambda, lambda), variance 2 lambda = mu s^2;
    sensitivities s l2, s l1) divided through by s; its leading term is the Gaussian's of variance mu.
    ``variance`` 0 gives inf, inf gives 0.
    """
    alphas = _float_orders(orders)
    variance = _check_variance(variance)
    s = _positive("scale", scale)
    if not (l2 >= 0 and l1 >= 0):
        raise ValueError(f"sensitivities must be >= 0, got l2={l2!r}, l1={l1!r}")
    if variance == 0:
        return np.full(alphas.shape, np.inf)
    if math.isinf(variance):
        return np.zeros(alphas.shape)
    mu = variance
    gauss = alphas * l2**2 / (2.0 * mu)
    small_noise = ((2.0 * alphas - 1.0) * s * l2**2 + 6.0 * l1) / (4.0 * s**3 * mu**2)
    large_shift = 3.0 * l1 / (2.0 * s * mu)
    return gauss + np.minimum(small_noise, large_shift)


def skellam_rdp(
    orders: Sequence[float] | np.ndarray,
    variance: float,
    scale: float,
    clip: float,
    dim: int,
    beta: float = DEFAULT_BETA,
) -> np.ndarray:
    """Unsampled RDP (nats) at ``orders`` of DSkellam whose central noise has ``variance`` (model units).

    :func:`skellam_rdp_bound` at the rounding-inflated sensitivities (D2, D1) = :func:`rounding_sensitivity`
    of ``clip``, ``scale``, ``dim``, ``beta``: docs/privacy.md's
    ``eps(a) = a D2^2/(2 mu) + min(((2a-1) s D2^2 + 6 D1) / (4 s^3 mu^2), 3 D1/(2 s mu))``, mu = variance.
    """
    d2, d1 = rounding_sensitivity(clip, scale, dim, beta)
    return skellam_rdp_bound(orders, variance, scale, d2, d1)


def gaussian_rdp(orders: Sequence[float] | np.ndarray, variance: float, sensitivity: float) -> np.ndarray:
    """Unsampled RDP (nats) of the Gaussian mechanism: ``a sensitivity^2 / (2 variance)`` (Mironov 2017, Prop. 7).

    ``variance`` and ``sensitivity^2`` in the same units (model units here); variance 0 gives inf, inf gives 0.
    """
    alphas = _float_orders(orders)
    variance = _check_variance(variance)
    sensitivity = float(sensitivity)
    if not sensitivity >= 0:
        raise ValueError(f"sensitivity must be >= 0, got {sensitivity!r}")
    if sensitivity == 0 or math.isinf(variance):
        return np.zeros(alphas.shape)
    if variance == 0:
        return np.full(alphas.shape, np.inf)
    return alphas * sensitivity**2 / (2.0 * variance)


def ddg_tau(local_stddev: float, clients: int) -> float:
    """tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)) of Kairouz, Liu, Steinke ICML'21, Theorem 1.

    ``local_stddev`` sigma is the per-client discrete-Gaussian parameter in INTEGER units; n = ``clients``.
    tau measures how far a sum of n discrete Gaussians is from one discrete Gaussian (0 for n = 1).
    """
    clients = _check_clients(clients)
    k = np.arange(1, clients, dtype=float)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * local_stddev**2 * k / (k + 1.0))))


def ddgauss_rdp_bound(
    orders: Sequence[float] | np.ndarray,
    variance: float,
    scale: float,
    l2: float,
    l1: float,
    dim: int,
    clients: int,
) -> np.ndarray:
    """Unsampled RDP (nats) of a sum of ``clients`` discrete Gaussians, total ``variance`` (model units).

    Kairouz, Liu, Steinke ICML'21 (arXiv:2102.06387), Proposition 14 / Eq. 17, as its authors' code evaluates
    it (google-research/federated ``distributed_dp/accounting_utils.py``, ``compute_rdp_dgaussian``): n
    clients each add N_Z(0, sigma^2), sigma^2 = variance s^2 / n in integer units; tau = :func:`ddg_tau`;
    e2 = l2 / sqrt(variance) and e1 = l1 / sqrt(variance) are the sensitivities (model units) in stddevs::

        eps(a) = min(a e2^2 / 2 + tau d,  a (e2^2 + 2 e1 tau + tau^2 d) / 2,  a (e2 + tau sqrt(d))^2 / 2).

    The last term is a eps^2 / 2 for the paper's Theorem 1 (1/2 eps^2-concentrated DP with
    eps = e2 + tau sqrt(d)). A per-client sigma below ``DDG_MIN_STDDEV`` gives inf (the bound is not used
    there); ``variance`` 0 gives inf, inf gives 0.
    """
    alphas = _float_orders(orders)
    variance = _check_variance(variance)
    scale = _positive("scale", scale)
    dim = _check_dim(dim)
    clients = _check_clients(clients)
    if not (l2 >= 0 and l1 >= 0):
        raise ValueError(f"sensitivities must be >= 0, got l2={l2!r}, l1={l1!r}")
    if variance == 0:
        return np.full(alphas.shape, np.inf)
    if math.isinf(variance):
        return np.zeros(alphas.shape)
    local_stddev = math.sqrt(variance / clients) * scale
    if local_stddev < DDG_MIN_STDDEV:
        return np.full(alphas.shape, np.inf)
    tau = ddg_tau(local_stddev, clients)
    stddev = math.sqrt(variance)
    e2, e1 = l2 / stddev, l1 / stddev
    term_1 = alphas / 2.0 * e2**2 + tau * dim
    term_2 = alphas / 2.0 * (e2**2 + 2.0 * e1 * tau + tau**2 * dim)
    term_3 = alphas / 2.0 * (e2 + math.sqrt(dim) * tau) ** 2
    return np.minimum(np.minimum(term_1, term_2), term_3)


def ddgauss_rdp(
    orders: Sequence[float] | np.ndarray,
    variance: float,
    scale: float,
    clip: float,
    dim: int,
    clients: int,
    beta: float = DEFAULT_BETA,
) -> np.ndarray:
    """Unsampled RDP (nats) of the distributed discrete Gaussian: ``clients`` clients, total ``variance``.

    :func:`ddgauss_rdp_bound` (Kairouz, Liu, Steinke ICML'21, Proposition 14 with tau of Theorem 1) at the
    rounding-inflated sensitivities (D2, D1) = :func:`rounding_sensitivity` of ``clip``, ``scale``, ``dim``,
    ``beta``; ``variance`` in model units, the per-client integer-domain variance is variance s^2 / clients.
    """
    d2, d1 = rounding_sensitivity(clip, scale, dim, beta)
    return ddgauss_rdp_bound(orders, variance, scale, d2, d1, dim, clients)


def gaussian_subsampled_rdp(orders: Sequence[float] | np.ndarray, noise_multiplier: float, q: float) -> np.ndarray:
    """RDP (nats) of the Poisson-subsampled Gaussian with noise multiplier z = stddev / sensitivity, rate q.

    Delegates to ``dp_accounting.rdp.RdpAccountant`` composing ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
    once (exact for integer orders: Mironov, Talwar, Zhang 2019). z = 0 gives inf (unless q = 0), z = inf 0.
    """
    alphas = _float_orders(orders)
    q = _check_rate(q)
    z = float(noise_multiplier)
    if not z >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {z!r}")
    if math.isinf(z) or q == 0:
        return np.zeros(alphas.shape)
    accountant = RdpAccountant(np.asarray(orders))
    accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    return np.asarray(accountant.rdp, dtype=float)


# -------------------------------------------------------------------------------------- subsampling


def subsampled_rdp(rdp_fn: RdpFunction, orders: Sequence[float] | np.ndarray, q: float) -> np.ndarray:
    """RDP (nats) at integer ``orders`` of a mechanism with per-round curve ``rdp_fn`` under Poisson rate ``q``.

    Zhu & Wang ICML'19, general upper bound: their Theorem 5 as Hyades (appendix C) and the DDGauss authors'
    code cite it (some write Theorem 6; that code gives that number to its factor-free branch).
    Hyades Theorem 1 extends it to clients sampled at any rates in [0, q] (dropped before sampling)::

        eps_q(a) <= 1/(a-1) log{ (1-q)^(a-1) (a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^eps(2)
                                 + 3 sum_{l=3..a} C(a,l) (1-q)^(a-l) q^l e^((l-1) eps(l)) },

    capped at the unsampled eps(a). The bound needs eps at every integer 2..a, so ``rdp_fn`` (a function, not
    an array) is evaluated once on 2..max(orders) as a float array (negative values are raised to 0, which
    only loosens the bound). q = 1 returns ``rdp_fn(orders)``; q = 0 returns zeros.

    Numerics: the braces are 1 + sum_{l>=2} C(a,l) q^l (1-q)^(a-l) (c_l e^((l-1) eps(l)) - 1), c_2 = 1,
    c_l = 3 (the first term is P(Bin(a, q) <= 1) = 1 - P(Bin(a, q) >= 2)). Summing those positive excesses in
    log space (binomials from log-factorials) and taking log1p keeps full relative precision when the result
    is tiny (small q) and cannot overflow at order 256.
    """
    alphas = _integer_orders(orders)
    q = _check_rate(q)
    if q == 0:
        return np.zeros(alphas.shape)
    unsampled = np.asarray(rdp_fn(alphas.astype(float)), dtype=float)
    if q == 1:
        return unsampled
    top = int(alphas.max())
    ls = np.arange(2, top + 1)
    eps_l = np.maximum(np.asarray(rdp_fn(ls.astype(float)), dtype=float), 0.0)
    # log(c_l e^x - 1), x = (l-1) eps(l) >= 0: l = 2 -> log(expm1(x)); l >= 3 -> x + log(3 - e^-x).
    x = (ls - 1) * eps_l
    log_excess = x + np.log(3.0 - np.exp(-x))
    x2 = float(x[0])
    if x2 == 0:
        log_excess[0] = -math.inf
    else:
        log_excess[0] = math.log(math.expm1(x2)) if x2 <= 1 else x2 + math.log1p(-math.exp(-x2))
    log_fact = np.array([math.lgamma(n + 1.0) for n in range(top + 1)])
    log_q, log_1mq = math.log(q), math.log1p(-q)
    out = np.empty(alphas.shape)
    for i, a in enumerate(alphas.tolist()):
        ell = ls[: a - 1]
        log_binom = log_fact[a] - log_fact[ell] - log_fact[a - ell]
        terms = log_binom + ell * log_q + (a - ell) * log_1mq + log_excess[: a - 1]
        out[i] = _log1p_exp(_logsumexp(terms)) / (a - 1)
    return np.minimum(out, unsampled)


# -------------------------------------------------------------------------------------- conversion


def epsilon(
    rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """(epsilon, best order) of an RDP curve at ``delta``: min over orders of the conversion below.

    ``eps = r + log1p(-1/a) - log(delta a) / (a - 1)`` (Canonne, Kamath, Steinke 2020, Proposition 12;
    Balle et al. 2020), with the special cases of ``dp_accounting.rdp.compute_epsilon``, which this equals:
    a negative r or ``delta^2 + expm1(-r) > 0`` (KL bound) gives 0 at that order, an order <= 1.01 gives inf,
    delta = 0 gives (0, 0) for an all-zero curve and (inf, 0) otherwise. The result is clipped at 0.
    """
    r = np.asarray(rdp, dtype=float)
    a = np.asarray(orders, dtype=float)
    delta = float(delta)
    if not delta >= 0:
        raise ValueError(f"delta must be >= 0, got {delta!r}")
    if r.ndim != 1 or r.shape != a.shape or r.size == 0:
        raise ValueError(f"rdp and orders must be 1-D of the same non-zero length, got {r.shape} and {a.shape}")
    if delta == 0:
        return (0.0, 0.0) if bool(np.all(r == 0)) else (math.inf, 0.0)
    if np.any(a < 1):
        raise ValueError(f"Renyi orders must be >= 1, got {orders!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        converted = r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0)
        kl_small = delta**2 + np.expm1(-r) > 0
    eps = np.where(r < 0, 0.0, np.where(kl_small, 0.0, np.where(a > 1.01, converted, np.inf)))
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


# -------------------------------------------------------------------------------------- accountant


class Accountant:
    """Round-by-round RDP composition of one training run (what each round really cost), and its epsilon.

    ``mechanism`` is "skellam", "gaussian" or "dgaussian"; rounds sample clients at rate ``q`` (Poisson;
    dropouts before sampling covered by Hyades Theorem 1). Each :meth:`add_round` adds the subsampled curve of
    a round whose central noise had ``variance`` (model units). "gaussian" is the continuous Gaussian with
    sensitivity ``clip`` (no rounding) accounted by ``dp_accounting`` with z = sqrt(variance) / clip, so its
    epsilon equals ``RdpAccountant``'s for the same events; "skellam" and "dgaussian" need the encoding scale s
    (``scale``, or per round) and use :func:`skellam_rdp` / :func:`ddgauss_rdp` under :func:`subsampled_rdp`.
    Curves are cached per (variance, clients, scale): rounds usually repeat a few noise levels.
    """

    def __init__(
        self,
        mechanism: str,
        delta: float,
        clip: float,
        dim: int,
        q: float,
        scale: float | None = None,
        beta: float = DEFAULT_BETA,
        orders: Sequence[float] = ORDERS,
    ) -> None:
        self.mechanism = _check_mechanism(mechanism)
        """Noise mechanism ("skellam", "gaussian", "dgaussian")."""
        delta = float(delta)
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.delta = delta
        """Target delta of :meth:`epsilon`."""
        self.clip = _positive("clip", clip)
        """L2 clip norm c (model units)."""
        self.dim = _check_dim(dim)
        """Padded dimension d."""
        self.q = _check_rate(q)
        """Poisson sampling rate (upper bound of every client's rate)."""
        if mechanism in SCALED and scale is None:
            raise ValueError(f"mechanism {mechanism!r} needs the encoding scale s (integer units per model unit)")
        self.scale = None if scale is None else _positive("scale", scale)
        """Default scale s of add_round (integer units per model unit); None for "gaussian"."""
        self.beta = _check_beta(beta)
        """Conditional stochastic rounding bias."""
        self._orders = np.asarray(orders)
        if mechanism == "gaussian":
            _float_orders(self._orders)
        else:
            _integer_orders(self._orders)
        self._rdp = np.zeros(self._orders.shape, dtype=np.float64)
        self._cache: dict[tuple[float, int, float | None, float], np.ndarray] = {}
        self.rounds = 0
        """Rounds composed so far."""

    @property
    def orders(self) -> np.ndarray:
        """The RDP orders (a copy)."""
        return np.copy(self._orders)

    @property
    def rdp(self) -> np.ndarray:
        """Cumulative RDP (nats) at each order (a copy)."""
        return np.copy(self._rdp)

    def round_rdp(
        self, variance: float, clients: int = 1, scale: float | None = None, q: float | None = None
    ) -> np.ndarray:
        """Subsampled RDP curve (nats) of one round with central noise ``variance`` (model units); not composed.

        The array is cached and read-only.

        ``clients`` (n, the clients whose noise was summed) matters for "dgaussian" only; ``scale`` overrides
        the accountant's scale for this round ("skellam", "dgaussian"; ignored for "gaussian"); ``q`` the
        sampling rate (a round that sampled k of the clients then available has upper rate k / available:
        Hyades Theorem 1 covers every client at the upper rate).
        """
        variance = _check_variance(variance)
        clients = _check_clients(clients)
        rate = self.q if q is None else _check_rate(q)
        if self.mechanism == "gaussian":
            key: tuple[float, int, float | None, float] = (variance, 1, None, rate)
        else:
            s = self.scale if scale is None else _positive("scale", scale)
            key = (variance, clients if self.mechanism == "dgaussian" else 1, s, rate)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._compute(variance, key[1], key[2], rate)
            cached.setflags(write=False)
            self._cache[key] = cached
        return cached

    def _compute(self, variance: float, clients: int, scale: float | None, q: float) -> np.ndarray:
        if self.mechanism == "gaussian":
            return gaussian_subsampled_rdp(self._orders, math.sqrt(variance) / self.clip, q)
        assert scale is not None  # guaranteed by __init__ for SCALED mechanisms
        s = scale
        if self.mechanism == "skellam":

            def curve(alphas: np.ndarray) -> np.ndarray:
                return skellam_rdp(alphas, variance, s, self.clip, self.dim, self.beta)

        else:

            def curve(alphas: np.ndarray) -> np.ndarray:
                return ddgauss_rdp(alphas, variance, s, self.clip, self.dim, clients, self.beta)

        return subsampled_rdp(curve, self._orders, q)

    def add_round(
        self, variance: float, clients: int = 1, scale: float | None = None, count: int = 1, q: float | None = None
    ) -> None:
        """Compose ``count`` rounds whose central noise had ``variance`` (model units); see :meth:`round_rdp`.

        Variance 0 (no noise) makes the cumulative epsilon inf; variance inf costs nothing.
        """
        if int(count) != count or count < 0:
            raise ValueError(f"count must be a non-negative integer, got {count!r}")
        curve = self.round_rdp(variance, clients, scale, q)
        self._rdp += curve if count == 1 else count * curve
        self.rounds += int(count)

    def epsilon_and_order(self) -> tuple[float, float]:
        """(cumulative epsilon at ``delta``, the order attaining it); see :func:`epsilon`."""
        return epsilon(self._rdp, self._orders, self.delta)

    def epsilon(self) -> float:
        """Cumulative epsilon at ``delta`` of the rounds composed so far."""
        return epsilon(self._rdp, self._orders, self.delta)[0]


# -------------------------------------------------------------------------------------- planning


def plan_variance(
    mechanism: str,
    epsilon: float,
    delta: float,
    rounds: int,
    q: float,
    clip: float,
    dim: int,
    scale_for: Callable[[float], float] | None = None,
    clients: int = 1,
    beta: float = DEFAULT_BETA,
    orders: Sequence[float] = ORDERS,
) -> float:
    """Smallest central variance (model units) whose ``rounds`` rounds at rate ``q`` stay within (epsilon, delta).

    Hyades eq. (3): bisection on log variance of the epsilon the :class:`Accountant` computes for ``rounds``
    rounds at one variance (so planning and accounting agree), to a bracket of relative width ``PLAN_RTOL``;
    the returned variance is the bracket's upper end, whose epsilon is at most ``epsilon (1 - PLAN_MARGIN)``.
    "skellam" and "dgaussian" need ``scale_for(variance)`` -> s, the scale the encoding will use at that
    variance (e.g. from :func:`choose_scale`); ``clients`` is n for "dgaussian". Epsilon is assumed to fall as
    the variance grows (true at a fixed scale; a scale that shrinks with the variance inflates the rounding
    sensitivity and can put a floor under epsilon: then ValueError). ``rounds`` = 0, q = 0 or an infinite
    budget return 0.0.
    """
    mechanism = _check_mechanism(mechanism)
    target = float(epsilon)
    if not target > 0:
        raise ValueError(f"epsilon must be > 0, got {target!r}")
    if int(rounds) != rounds or rounds < 0:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")
    clip = _positive("clip", clip)
    if _check_rate(q) == 0 or rounds == 0 or math.isinf(target):
        return 0.0
    if mechanism in SCALED and scale_for is None:
        raise ValueError(f"mechanism {mechanism!r} needs scale_for(variance) -> scale to plan its variance")
    goal = target * (1.0 - PLAN_MARGIN)

    def spent(variance: float) -> float:
        scale = scale_for(variance) if (scale_for is not None and mechanism in SCALED) else None
        accountant = Accountant(mechanism, delta, clip, dim, q, scale=scale, beta=beta, orders=orders)
        accountant.add_round(variance, clients=clients, count=int(rounds))
        return accountant.epsilon()

    hi = clip**2
    steps = 0
    while spent(hi) > goal:
        hi *= 4.0
        steps += 1
        if steps > 200:
            raise ValueError(
                f"no central variance up to {hi:.3g} (model units) keeps {rounds} {mechanism} rounds within "
                f"epsilon {target} at delta {delta}; "
                + (
                    "with few bits the scale shrinks as the noise grows and rounding puts a floor under "
                    "epsilon: raise aggregation.bits, or raise epsilon"
                    if mechanism in SCALED
                    else "raise epsilon"
                )
            )
    lo = hi / 4.0
    while spent(lo) <= goal:
        hi, lo = lo, lo / 4.0
        if lo < clip**2 * 1e-300:
            return hi
    while hi / lo > 1.0 + PLAN_RTOL:
        mid = math.sqrt(lo * hi)
        if spent(mid) <= goal:
            hi = mid
        else:
            lo = mid
    return hi


def rounds_within_budget(
    mechanism: str,
    epsilon: float,
    delta: float,
    variances: Sequence[float],
    q: float,
    clip: float,
    dim: int,
    scale: float | None = None,
    clients: int = 1,
    beta: float = DEFAULT_BETA,
    orders: Sequence[float] = ORDERS,
) -> int:
    """Number of leading rounds of ``variances`` (model units, one per round) whose cumulative epsilon <= epsilon.

    The Early strategy's stopping rule: training stops before the round that would pass the budget. One
    ``scale`` and ``clients`` for all rounds (use an :class:`Accountant` directly for per-round values).
    """
    accountant = Accountant(mechanism, delta, clip, dim, q, scale=scale, beta=beta, orders=orders)
    for done, variance in enumerate(variances):
        accountant.add_round(variance, clients=clients)
        if accountant.epsilon() > epsilon:
            return done
    return len(variances)


def choose_scale(bits: int, k: float, clip: float, dim: int, clients: int, noise_variance: float) -> float:
    """The DSkellam scale s (integer units per model unit) fitting k stddevs of an aggregate coordinate in 2^bits.

    Solves ``k sqrt(n (c^2 s^2 / d + 1/4) + V s^2) = 2^(bits-1)`` for s, with n = ``clients``, c = ``clip``,
    d = ``dim`` and V = ``noise_variance``, the total noise variance (model units) in the sum before any
    removal: one coordinate of a rotated clipped update has variance about c^2 / d (flatness rho = 1), the
    rounding adds at most 1/4 per client, the noise V s^2 (integer units). The n c^2 s^2 / d term assumes
    the updates' norms add like sqrt(n) (the "sqrtn_norm_growth" variant of the DDGauss / DSkellam code; its
    default is the worst case n^2). Any smaller s also fits. Raises ValueError when 2^(bits-1) cannot hold
    even the rounding term k sqrt(n / 4).
    """
    if int(bits) != bits or bits < 1:
        raise ValueError(f"bits must be a positive integer, got {bits!r}")
    k = _positive("k", k)
    clip = _positive("clip", clip)
    dim = _check_dim(dim)
    clients = _check_clients(clients)
    noise_variance = float(noise_variance)
    if not (noise_variance >= 0 and math.isfinite(noise_variance)):
        raise ValueError(f"noise_variance must be finite and >= 0 (model units), got {noise_variance!r}")
    half_range = 2.0 ** (bits - 1)
    room = (half_range / k) ** 2 - clients / 4.0
    if not room > 0:
        raise ValueError(
            f"bits={bits} is too few for {clients} clients at k={k} standard deviations: the rounding alone "
            f"needs k sqrt(clients / 4) = {k * math.sqrt(clients / 4.0):.4g} >= 2^(bits-1) = {half_range:g}; "
            f"raise bits to at least {math.floor(math.log2(k * math.sqrt(clients / 4.0))) + 2}, or lower k"
        )
    return math.sqrt(room / (clients * clip**2 / dim + noise_variance))
