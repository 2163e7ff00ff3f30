"""What a deployed worker may spend of its policy's epsilon, and what it has spent (docs/security.md).

A worker's policy may cap the epsilon (at the scenario's ``privacy.delta``) of one round
(``max_epsilon_round``) and of the whole deployment (``max_epsilon_total``). Every figure is the worker's
own, computed from the scenario with this project's accountant (:class:`sim.round.privacy.PrivacyLedger`,
Hyades section 4), at the worst case a server can bring about:

- **dropouts.** A round reveals a sum once t clients answer, so it is accounted at every dropout count d from
  0 to n - t, and the largest RDP at each order is the round's (:class:`WorstCase`). At d the strategy leaves
  ``residual(d)``, of which the server knows the share of the c colluders among the m = n - d survivors:
  ``residual(d) (m - c) / m`` for strategies whose clients share the noise (c the larger of the policy's and
  the scenario's collusion), and what the strategy accounts otherwise (``local``: a client's own noise).
  Since RDP grows as the variance shrinks, only the smallest variance is computed for ``skellam`` and
  ``gaussian``; ``dgaussian``, whose curve also depends on m, is computed at each (variance, m).
- **sampling.** The subsampling that amplifies privacy is the server's to do. Unless the policy trusts it
  (``trust_sampling``), a round is accounted as if every client took part (q = 1), and only the rounds the
  worker played cost it anything: :class:`Spending` composes their curves and refuses a round that would pass
  the total. Trusting it, every round of the scenario is accounted at its sampling rate (never below the
  planned one, whatever a round start says): the rounds the worker played at their size, the others at the
  planned size, ``rounds`` of them in all, and each round number may start once.

A round is evaluated at up to :data:`MAX_EVALUATED_CLIENTS` clients: with an epsilon limit, a larger one is
refused (the evaluation is linear in n, and quadratic for XNoise's removals). The record is the worker
process's, one deployment's: a worker started again starts from nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from sim.dp.accounting import epsilon
from sim.dp.strategies import RoundNoise, strategy_named
from sim.protocol.machine import RoundSetupError
from sim.round.privacy import PrivacyLedger, nominal_sampling
from sim.scenario.types import Scenario

if TYPE_CHECKING:
    from sim.deploy.policy import WorkerPolicy

MAX_EVALUATED_CLIENTS = 1024
"""Most clients of a round whose worst case a worker with an epsilon limit evaluates."""


def without_client_noise(scenario: Scenario) -> str:
    """Why the clients of ``scenario`` add no DP noise (empty if they do): no strategy, or the server's noise,
    added after it has seen the sum (``central``), which no client can count on."""
    strategy = strategy_named(scenario.privacy.strategy)
    if not strategy.enabled:
        return "adds no noise"
    if strategy.central:
        return "has the server add the noise, after it sees the sum"
    return ""


class WorstCase:
    """A round's RDP curve at its worst case (module docstring), per (clients, sampling rate), cached."""

    def __init__(self, scenario: Scenario, ledger: PrivacyLedger, collusion: int) -> None:
        self.scenario, self.ledger = scenario, ledger
        self.collusion = collusion
        """c: the clients colluding with the server that the accounting assumes."""
        self._curves: dict[tuple[int, float], np.ndarray] = {}

    def variance(self, plan: RoundNoise, dropped: int) -> Fraction:
        """The variance a round is accounted at with ``dropped`` clients gone, against the server and its
        colluders (module docstring)."""
        m, c = plan.sampled - dropped, self.collusion
        if c and plan.spec.distributed and m > 0:
            return plan.residual(dropped) * max(m - c, 0) / m
        return plan.accounted(dropped)

    def curve(self, n: int, q: float) -> np.ndarray:
        """The worst-case RDP curve (nats, at the accountant's orders) of a round of ``n`` sampled at rate
        ``q``; raises :class:`RoundSetupError` for a round that cannot be planned."""
        key = (n, q)
        if key not in self._curves:
            self._curves[key] = self._worst(n, q)
        return self._curves[key]

    def _worst(self, n: int, q: float) -> np.ndarray:
        book = self.ledger
        plan = book.plan(n)
        scale = book.scale(n, plan.largest_residual, book.largest_component(plan))
        by_clients = self.scenario.privacy.mechanism == "dgaussian"
        cases = {
            (self.variance(plan, d), n - d if by_clients else 1) for d in range(0, max(0, n - book.threshold(n)) + 1)
        }
        if not by_clients:
            cases = {min(cases)}  # RDP grows as the variance shrinks
        orders = book.accountant.orders
        curves = [
            book.accountant.round_rdp(float(v), m, scale, q) if v > 0 else np.full(orders.shape, np.inf)
            for v, m in cases
        ]
        return np.max(curves, axis=0)

    def epsilon(self, rdp: np.ndarray) -> float:
        """Epsilon of an RDP curve at ``privacy.delta``."""
        return float(epsilon(rdp, self.ledger.accountant.orders, self.scenario.privacy.delta)[0])


class Spending:
    """One deployment's epsilon as a worker sees it: the limits of its ``policy`` held against ``scenario``
    (``ledger``: its privacy plan, None without DP), and the rounds it was started in."""

    def __init__(self, policy: WorkerPolicy, scenario: Scenario, ledger: PrivacyLedger | None) -> None:
        self.policy, self.scenario = policy, scenario
        self.planned_rate, self.planned = nominal_sampling(scenario)
        collusion = max(policy.collusion or 0, scenario.privacy.collusion)
        noisy = ledger is not None and not without_client_noise(scenario)
        self.worst = WorstCase(scenario, ledger, collusion) if noisy and ledger is not None else None
        self.rounds: dict[int, np.ndarray | None] = {}
        """Each round this worker played, with its worst-case curve where a limit needs it."""

    @property
    def limited(self) -> bool:
        return not (math.isinf(self.policy.max_epsilon_round) and math.isinf(self.policy.max_epsilon_total))

    def rate(self, given: float | None) -> float:
        """The sampling rate rounds are accounted at: 1 unless the policy trusts the server's sampling, then
        the planned rate or the round's, whichever is larger."""
        if not self.policy.trust_sampling:
            return 1.0
        return max(self.planned_rate, given or 0.0)

    def _curve(self, n: int, q: float) -> tuple[np.ndarray | None, str]:
        """The worst-case curve of a round of ``n``, or why there is none."""
        if self.worst is None:
            return None, f"privacy.strategy {self.scenario.privacy.strategy} {without_client_noise(self.scenario)}"
        if n > MAX_EVALUATED_CLIENTS:
            return None, f"this worker evaluates rounds of at most {MAX_EVALUATED_CLIENTS} clients"
        try:
            return self.worst.curve(n, q), ""
        except (RoundSetupError, ValueError) as exc:
            return None, f"its noise cannot be planned: {exc}"

    def scenario_refusals(self) -> list[str]:
        """What the limits refuse of the scenario at its planned round size."""
        if not self.limited or self.worst is None:  # no client noise: the policy says so itself
            return []
        n, q, p = self.planned, self.rate(None), self.policy
        curve, why = self._curve(n, q)
        if curve is None:
            return [f"privacy: a planned round of {n} clients: {why} (policy: max_epsilon_round, max_epsilon_total)"]
        assert self.worst is not None
        refused, one = [], self.worst.epsilon(curve)
        sampling = f"at sampling rate {q:g}" if p.trust_sampling else "with every client taking part (q = 1)"
        if not one <= p.max_epsilon_round:
            refused.append(
                f"privacy: a planned round of {n} clients can cost epsilon {one:.4g} at its worst case, {sampling}; "
                f"this worker spends at most {p.max_epsilon_round:g} a round (policy: max_epsilon_round)"
            )
        if math.isinf(p.max_epsilon_total):
            return refused
        if p.trust_sampling:
            total = self.worst.epsilon(curve * self.scenario.rounds)
            if not total <= p.max_epsilon_total:
                refused.append(
                    f"privacy: {self.scenario.rounds} rounds of {n} clients can cost epsilon {total:.4g}, every round "
                    f"at its worst case {sampling} (the planned budget is {self.scenario.privacy.epsilon:g}): this "
                    f"worker spends at most {p.max_epsilon_total:g} (policy: max_epsilon_total)"
                )
        elif not one <= p.max_epsilon_total:
            refused.append(
                f"privacy: a single planned round of {n} clients can cost epsilon {one:.4g} at its worst case, "
                f"{sampling}: more than this worker spends in all, {p.max_epsilon_total:g} (policy: max_epsilon_total)"
            )
        return refused

    def round_problem(self, number: int) -> str:
        """What is wrong with a round start's number (empty: nothing): each of 1..rounds, once."""
        if not 1 <= number <= self.scenario.rounds:
            return f"round {number} is not one of the scenario's rounds 1..{self.scenario.rounds}"
        if number in self.rounds:
            return f"this worker played round {number} already"
        return ""

    def round_refusals(self, number: int, n: int, rate: float | None) -> list[str]:
        """What the limits refuse of round ``number`` of ``n`` sampled clients (``rate``: the round start's)."""
        if not self.limited:
            return []
        q, p = self.rate(rate), self.policy
        curve, why = self._curve(n, q)
        if curve is None:
            return [f"privacy: a round of {n} clients: {why} (policy: max_epsilon_round, max_epsilon_total)"]
        assert self.worst is not None
        refused, one = [], self.worst.epsilon(curve)
        if not one <= p.max_epsilon_round:
            refused.append(
                f"privacy: a round of {n} clients can cost epsilon {one:.4g} at its worst case; this worker spends "
                f"at most {p.max_epsilon_round:g} a round (policy: max_epsilon_round)"
            )
        if not math.isinf(p.max_epsilon_total):
            total = self.worst.epsilon(self._total_with(curve, q))
            if not total <= p.max_epsilon_total:
                refused.append(
                    f"privacy: this round would bring what this worker can have spent to epsilon {total:.4g}, "
                    f"more than its {p.max_epsilon_total:g} (policy: max_epsilon_total)"
                )
        return refused

    def _total_with(self, curve: np.ndarray, q: float) -> np.ndarray:
        """The composed curve of what has been spent, and a round of ``curve`` more."""
        played = [c for c in self.rounds.values() if c is not None]
        if not self.policy.trust_sampling:
            return sum(played, curve)
        planned, _ = self._curve(self.planned, q)
        others = max(0, self.scenario.rounds - len(self.rounds) - 1)
        rest = others * planned if planned is not None else np.zeros_like(curve)
        return sum(played, curve + rest)

    def record(self, number: int, n: int, rate: float | None) -> None:
        """Round ``number`` of ``n`` clients is played: its worst case joins what was spent."""
        curve = self._curve(n, self.rate(rate))[0] if self.limited else None
        self.rounds[number] = curve
