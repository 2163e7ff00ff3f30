"""A run's privacy: the planned noise, each round's DP parameters, and the budget really spent.

Planning (Hyades eq. 3): the target central variance sigma*^2 (model units) is the smallest whose
``rounds`` rounds, each accounted at sigma*^2 and Poisson-subsampled at the sampling rate q, stay within
(``privacy.epsilon``, ``privacy.delta``) (:func:`sim.dp.accounting.plan_variance`). Every round then gets a
noise plan for its sampled clients (:class:`sim.dp.strategies.RoundNoise`) and a DSkellam scale that fits
``headroom`` standard deviations of one aggregate coordinate in 2^bits, for the most noise the decoded sum
can hold and for updates that all point the same way (norms adding up to n c: the worst case).

Accounting: a round whose aggregate was revealed is composed at the variance it really had after dropout
and removal (:meth:`RoundNoise.accounted`); an aborted round revealed nothing and costs nothing. Rounds are
accounted at the sampling rate q; a fixed-size sample of k of N clients is accounted as Poisson sampling
at q = k / N (the usual approximation).

``early`` (Hyades section 8): when the survivors of a round are known and before anything is unmasked,
the server refuses to go on if accounting the round would pass the budget, and the run stops.
"""

from __future__ import annotations

import math
from fractions import Fraction

from sim.dp.accounting import Accountant, choose_scale, epsilon, plan_variance
from sim.dp.dskellam import DSkellamEncoding
from sim.dp.noise import MAX_VARIANCE
from sim.dp.strategies import RoundNoise
from sim.protocol.machine import RoundSetupError
from sim.protocol.params import AggregationParams
from sim.protocol.private import Admission, PrivateRound
from sim.protocol.registry import reconstruction_threshold
from sim.round.records import RoundPrivacy
from sim.scenario.types import Privacy, Scenario
from sim.seeds import Stream, seed_bytes


def padded(dim: int) -> int:
    """d' = the next power of two >= dim (the Hadamard rotation's length)."""
    return 1 << max(0, (dim - 1).bit_length())


def nominal_sampling(scenario: Scenario) -> tuple[float, int]:
    """(q, n): the sampling rate rounds are planned at and the clients a round is planned for.
    ``clients_per_round: k`` gives k / population and k; ``rate: q`` gives q and round(q population)."""
    k, rate = scenario.sampling.clients_per_round, scenario.sampling.rate
    q = k / scenario.population if k is not None else float(rate or 0.0)
    return q, k if k is not None else max(1, round(q * scenario.population))


class PrivacyLedger:
    """The privacy side of one run (``privacy.strategy`` other than ``none``)."""

    def __init__(
        self,
        privacy: Privacy,
        aggregation: AggregationParams,
        rounds: int,
        rate: float,
        clients: int,
        dim: int,
        seed: int,
    ) -> None:
        self.p = privacy
        self.aggregation = aggregation
        self.rate = rate
        """Sampling rate q every round is accounted at."""
        self.clients = clients
        """Nominal sampled clients per round (planning)."""
        self.dim = dim
        self.padded = padded(dim)
        self.seed = seed
        self.stopped = ""
        """Why training stopped early (``early``), or empty."""
        self._plans: dict[tuple[int, float], RoundNoise] = {}
        self.target = 0.0
        unit_plan = self.plan(clients, 1.0)
        unit, unit_component = unit_plan.largest_residual, self.largest_component(unit_plan)
        self.target = plan_variance(
            privacy.mechanism,
            privacy.epsilon,
            privacy.delta,
            rounds,
            rate,
            privacy.clip,
            self.padded,
            scale_for=lambda v: self.scale(clients, v * unit, v * unit_component),
            clients=clients,
        )
        """sigma*^2, model units."""
        self.accountant = Accountant(privacy.mechanism, privacy.delta, privacy.clip, self.padded, rate, scale=1.0)

    def threshold(self, n: int) -> int:
        """t, the secure-aggregation threshold of a round of ``n`` (per neighbourhood for SecAgg+)."""
        return reconstruction_threshold(self.aggregation, n)

    def plan(self, n: int, target: float | None = None) -> RoundNoise:
        """The noise plan of a round of ``n`` sampled clients (cached: rounds repeat their sizes)."""
        key = (n, self.target if target is None else target)
        if key not in self._plans:
            self._plans[key] = self._new_plan(n, key[1])
        return self._plans[key]

    def _new_plan(self, n: int, target: float) -> RoundNoise:
        p = self.p
        t = self.threshold(n) if p.collusion else 0
        if p.collusion and p.collusion >= t:
            raise RoundSetupError(
                f"privacy.collusion {p.collusion} is not below the threshold t = {t} of a round of {n} sampled "
                "clients: colluders could reconstruct secrets alone"
            )
        return RoundNoise(
            strategy=p.strategy,
            target=target,
            sampled=n,
            tolerance=min(math.floor(p.tolerance * n), n - 1),
            threshold=t,
            collusion=p.collusion,
            guessed_dropout=p.guessed_dropout,
        )

    def scale(self, n: int, largest: float | Fraction, component: float | Fraction = 0.0) -> float:
        """The round's scale: ``headroom`` stddevs of a coordinate of the sum of ``n`` aligned clipped updates
        (norm up to n c, so clip sqrt(n) in :func:`choose_scale`'s sqrt(n)-growth formula) plus noise of
        variance ``largest`` fit in 2^(bits-1); and no noise component (variance ``component``, model units)
        beyond what the samplers take (:data:`sim.dp.noise.MAX_VARIANCE` in integer units). A smaller scale
        always fits."""
        p = self.p
        s = choose_scale(self.aggregation.bits, p.headroom, p.clip * math.sqrt(n), self.padded, n, float(largest))
        if component:
            # a hair under the limit, so that component * s^2 cannot round above it
            s = min(s, math.sqrt(MAX_VARIANCE / float(component)) * (1 - 1e-9))
        return s

    @staticmethod
    def largest_component(plan: RoundNoise) -> Fraction:
        """The largest noise variance any single sample is drawn at (model units)."""
        rebased = plan.rebased(1) if plan.spec.rebasing else Fraction(0)
        return max((*plan.components, plan.server, rebased))

    def round(self, number: int, sampled: int, q: float | None = None) -> tuple[RoundNoise, PrivateRound]:
        """The noise plan and the public DP parameters of round ``number`` with ``sampled`` clients (``q``:
        this round's sampling rate, if not the planned one)."""
        plan = self.plan(sampled)
        scale = self.scale(sampled, plan.largest_residual, self.largest_component(plan))
        encoding = DSkellamEncoding(self.dim, self.aggregation.bits, self.p.clip, scale)
        private = PrivateRound(
            encoding=encoding,
            rotation_seed=seed_bytes(self.seed, Stream.ROTATION, number),
            mechanism=self.p.mechanism,
            plan=plan,
            server_seed=seed_bytes(self.seed, Stream.NOISE, number),
            admit=self._admission(plan, encoding.scale, q) if plan.spec.early else None,
        )
        return plan, private

    def _admission(self, plan: RoundNoise, scale: float, q: float | None) -> Admission:
        def admit(survivors: int) -> str | None:
            variance = float(plan.accounted(plan.sampled - survivors))
            curve = self.accountant.round_rdp(variance, survivors, scale, q)
            spent = epsilon(self.accountant.rdp + curve, self.accountant.orders, self.p.delta)[0]
            if spent > self.p.epsilon:
                self.stopped = (
                    f"privacy budget: this round would bring epsilon to {spent:.4g} > {self.p.epsilon:g} (early)"
                )
                return self.stopped
            return None

        return admit

    def account_empty(self) -> RoundPrivacy:
        """A round that sampled nobody: nothing revealed, nothing spent."""
        return RoundPrivacy(self.target, math.nan, math.nan, self.accountant.epsilon(), math.nan)

    def worst_exposure(
        self, plan: RoundNoise, scale: float, exposures: list[int], q: float | None = None
    ) -> int | None:
        """Of several sums revealed in one round (a pipelined round's chunks, each over its own survivors),
        the survivor count whose accounting costs the most epsilon: the chunks' releases are post-processing
        of that worst one (the others carried at least its noise over at most its sensitivity), so the round
        is accounted at it. Fewest survivors is not always the worst (XNoise-Appr's residual is not monotone
        in the dropouts). None when nothing was revealed."""
        if not exposures:
            return None

        def spent(survivors: int) -> float:
            variance = float(plan.accounted(plan.sampled - survivors))
            curve = self.accountant.round_rdp(variance, survivors, scale, q)
            return float(epsilon(self.accountant.rdp + curve, self.accountant.orders, self.p.delta)[0])

        return max(sorted(set(exposures)), key=spent)

    def account(self, plan: RoundNoise, scale: float, survivors: int | None, q: float | None = None) -> RoundPrivacy:
        """Compose a finished round (``survivors`` None: nothing was revealed; ``q`` its sampling rate if not
        the planned one) and report it."""
        realised = accounted = math.nan
        if survivors is not None:
            dropped = plan.sampled - survivors
            realised = float(plan.residual(dropped))
            accounted = float(plan.accounted(dropped))
            self.accountant.add_round(accounted, clients=survivors, scale=scale, q=q)
        return RoundPrivacy(self.target, realised, accounted, self.accountant.epsilon(), scale)
