"""How much noise each client adds, which part is removed under dropout, and what is left: one round.

Notation (Dordis section 3, Hyades section 5): sigma*^2 = ``target``, the central noise variance a round
must have (model units: the variance per coordinate of the noise in the SUM of clipped updates); n = |U|
sampled clients; T = ``tolerance`` (a count); |D| = ``dropped``, the sampled clients whose input is not in
the aggregate; m = n - |D| survivors; f = t / (t - T_C), the collusion inflation of Dordis 3.3 (t the
SecAgg threshold, T_C the tolerated colluders).

A client's noise is a list of components: component 0 is never removed, components 1.. may be removed by
the server (each expanded from its own seed). The strategies:

- ``orig``: chi(f sigma*^2 / n); nothing removed; residual m/n f sigma*^2.
- ``early``: ``orig``, and the server stops training before the budget would be passed.
- ``con``: chi(f sigma*^2 / floor(n (1 - x))) for a guessed dropout rate x.
- ``xnoise`` (XNoise-Prec, Dordis Definition 2): n_0 ~ chi(f sigma*^2 / n), n_k ~ chi(f sigma*^2 / ((n-k+1)(n-k)))
  for k = 1..T; with |D| <= T the components k > |D| of every survivor are removed and the residual is
  exactly f sigma*^2; with |D| > T nothing is removed and the residual is m / (n - T) f sigma*^2.
- ``xnoise-appr`` (Hyades Definition 4): tau = ceil(log2 T), eta = f sigma*^2 T / (2^tau n (n - T));
  components eta and eta 2^(k-2) for k = 2..tau+1 besides f sigma*^2 / n; a survivor removes components
  summing to floor(lambda / eta) eta, lambda = (T - |D|) f sigma*^2 / ((n - T) m); residual in
  [f sigma*^2, f sigma*^2 (1 + 1/(n - T))].
- ``rebasing`` (Baek et al. 2021): chi(f sigma*^2 / n) first; every survivor then sends -n_0 + chi(f sigma*^2 / m)
  (a model-sized vector); residual exactly f sigma*^2, unless a survivor drops during that step.
- ``committee`` (Aero-style worst case): chi(f sigma*^2 / (n - T)) sized for T dropouts, never removed.
- ``central``: the (trusted) server adds chi(sigma*^2) to the aggregate; clients add nothing.
- ``local``: every client adds chi(sigma*^2) itself (private against anyone who sees its input alone);
  residual m sigma*^2.
- ``none``: no noise.

The privacy a round really gives is accounted at :meth:`RoundNoise.accounted`: the residual, less the
share the T_C colluders know of it (their own noise, the residual being spread evenly over survivors).
Variances are exact :class:`fractions.Fraction` of the (float) target, so "the residual equals the target"
is an exact statement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

STRATEGIES = ("none", "orig", "early", "con", "xnoise", "xnoise-appr", "rebasing", "committee", "central", "local")
"""Every ``privacy.strategy``."""
REMOVING = ("xnoise", "xnoise-appr")
"""Strategies whose clients share noise seeds and whose server removes excess components."""
DISTRIBUTED = ("orig", "early", "con", "xnoise", "xnoise-appr", "rebasing", "committee")
"""Strategies where clients add the central noise together (collusion inflation applies)."""


def allowed(protocol: str) -> tuple[str, ...]:
    """Strategies a protocol supports: removal and rebasing need seeds shared under secure aggregation, and
    under ``plain`` the server sees each noisy update alone, so only central and local DP hold."""
    if protocol in ("secagg", "secagg+"):
        return STRATEGIES
    if protocol == "plain":
        return ("none", "central", "local")
    return ("none",)


@dataclass(frozen=True)
class RoundNoise:
    """The noise plan of one round for ``sampled`` clients."""

    strategy: str
    target: float
    """sigma*^2, model units."""
    sampled: int
    tolerance: int
    """T, dropped clients tolerated (a count)."""
    threshold: int = 0
    """t, the secure-aggregation threshold (for the collusion inflation; 0 when ``collusion`` is 0)."""
    collusion: int = 0
    """T_C."""
    guessed_dropout: float = 0.0
    """x of ``con``."""

    def __post_init__(self) -> None:
        n, t = self.sampled, self.tolerance
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; one of {', '.join(STRATEGIES)}")
        if n < 1 or not 0 <= t < n:
            raise ValueError(f"need 0 <= tolerance < sampled, got tolerance {t} of {n}")
        if self.collusion and not 0 <= self.collusion < self.threshold:
            raise ValueError(f"collusion {self.collusion} must be below the threshold {self.threshold}")

    @property
    def guessed_survivors(self) -> int:
        """``con``'s floor(n (1 - x)), at least 1 (a small round may have fewer clients than the guess
        leaves)."""
        return max(1, math.floor(self.sampled * (1 - self.guessed_dropout)))

    # -- components -------------------------------------------------------------------------------
    @cached_property
    def _sigma(self) -> Fraction:
        """The target, inflated by t / (t - T_C) for distributed strategies."""
        s = Fraction(self.target)
        if self.collusion and self.strategy in DISTRIBUTED:
            s *= Fraction(self.threshold, self.threshold - self.collusion)
        return s

    @cached_property
    def tau(self) -> int:
        """XNoise-Appr's tau = ceil(log2 T) (0 for T <= 1)."""
        return max(0, math.ceil(math.log2(self.tolerance))) if self.tolerance else 0

    @cached_property
    def eta(self) -> Fraction:
        """XNoise-Appr's smallest removable unit, eta = sigma^2 T / (2^tau n (n - T))."""
        n, t = self.sampled, self.tolerance
        return self._sigma * t / (2**self.tau * n * (n - t))

    @cached_property
    def components(self) -> tuple[Fraction, ...]:
        """Variance of each client component (model units); index 0 is never removed."""
        n, t, s = self.sampled, self.tolerance, self._sigma
        match self.strategy:
            case "none" | "central":
                return (Fraction(0),)
            case "orig" | "early" | "rebasing":
                return (s / n,)
            case "con":
                return (s / self.guessed_survivors,)
            case "committee":
                return (s / (n - t),)
            case "local":
                return (s,)
            case "xnoise":
                return (s / n, *(s / ((n - k + 1) * (n - k)) for k in range(1, t + 1)))
            case _:  # xnoise-appr
                if t == 0:
                    return (s / n,)
                return (s / n, self.eta, *(self.eta * 2 ** (k - 2) for k in range(2, self.tau + 2)))

    @property
    def removable(self) -> int:
        """Components that may be removed (each with its own seed, Shamir-shared)."""
        return len(self.components) - 1

    @property
    def server(self) -> Fraction:
        """Variance the server adds to the aggregate (``central``)."""
        return self._sigma if self.strategy == "central" else Fraction(0)

    def rebased(self, survivors: int) -> Fraction:
        """``rebasing``: the variance of the fresh noise each of ``survivors`` sends with -n_0."""
        return self._sigma / survivors

    # -- removal ----------------------------------------------------------------------------------
    def removed(self, dropped: int) -> tuple[int, ...]:
        """Indices of the components every survivor's noise loses when ``dropped`` clients dropped."""
        n, t = self.sampled, self.tolerance
        if not 0 <= dropped <= n:
            raise ValueError(f"{dropped} dropped of {n} sampled: a survivor set larger than the sample")
        if dropped > t or dropped >= n:
            return ()
        if self.strategy == "xnoise":
            return tuple(range(dropped + 1, t + 1))
        if self.strategy == "xnoise-appr" and t:
            lam = (t - dropped) * self._sigma / ((n - t) * (n - dropped))
            units = math.floor(lam / self.eta)  # 0 .. 2^tau
            if units == 2**self.tau:
                return tuple(range(1, self.removable + 1))
            return tuple(k for k in range(2, self.tau + 2) if units >> (k - 2) & 1)
        return ()

    def residual(self, dropped: int) -> Fraction:
        """Central variance left in the aggregate when ``dropped`` of the sampled clients dropped."""
        m = self.sampled - dropped
        if m <= 0:
            return Fraction(0)
        if self.strategy == "rebasing":
            return self.rebased(m) * m
        if self.strategy == "central":
            return self.server
        gone = set(self.removed(dropped))
        per_client = sum((v for k, v in enumerate(self.components) if k not in gone), Fraction(0))
        return m * per_client

    def accounted(self, dropped: int) -> Fraction:
        """The variance the round's privacy is accounted at: against the server, with the T_C colluders'
        own noise known to it (``local``: one client's own noise)."""
        if self.strategy == "local":
            return self._sigma
        m = self.sampled - dropped
        residual = self.residual(dropped)
        if m <= 0 or not self.collusion or self.strategy not in DISTRIBUTED:
            return residual
        return residual * max(m - self.collusion, 0) / m

    @cached_property
    def largest_residual(self) -> Fraction:
        """The most noise the decoded aggregate can hold (over every dropout count): the range it must fit."""
        return max(self.residual(d) for d in range(self.sampled))

    @cached_property
    def added(self) -> Fraction:
        """Variance each client adds before any removal (sum of its components)."""
        return sum(self.components, Fraction(0))
