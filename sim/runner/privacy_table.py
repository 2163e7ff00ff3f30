"""``dropsim privacy``: the epsilon each strategy ends at under a dropout rate, without training.

For each strategy and dropout rate x, every one of the scenario's rounds samples its nominal n clients, of
which round(x n) (half up, as ``dropout.mode: fixed``) drop before uploading; the round is planned, run
through the noise plan and accounted exactly as a simulated round is (:class:`sim.round.privacy.PrivacyLedger`),
including ``early``'s stop before the round that would pass the budget, and rounds that abort because
fewer clients than the secure-aggregation threshold upload (they reveal nothing and cost nothing).
Rows: ``strategy, dropout, epsilon, rounds_completed`` and, as siblings, the planned ``target_variance``
and the last round's ``accounted_variance``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from sim.dp.strategies import STRATEGIES
from sim.protocol.params import AggregationParams
from sim.protocol.registry import reconstruction_threshold, spec_of
from sim.round.privacy import PrivacyLedger, nominal_sampling
from sim.scenario.types import Scenario


def planned() -> tuple[str, ...]:
    """Strategies ``dropsim privacy`` compares by default: every registered one that adds noise."""
    return tuple(name for name, s in STRATEGIES.items() if s.enabled)


def minimum_survivors(aggregation: AggregationParams, n: int) -> int:
    """Fewest uploads a round of ``n`` goes on with: the secure protocols' threshold, one for ``plain``."""
    return reconstruction_threshold(aggregation, n) if spec_of(aggregation).secure else 1


def privacy_table(
    scenario: Scenario, dropouts: Sequence[float], dim: int, strategies: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """One row per strategy (default: :func:`planned`) and dropout rate (see the module docstring)."""
    sc = scenario
    q, n = nominal_sampling(sc)
    rows = []
    for strategy in strategies if strategies is not None else planned():
        privacy = dataclasses.replace(sc.privacy, strategy=strategy)
        aggregation = dataclasses.replace(sc.aggregation, strategy=strategy)
        for x in dropouts:
            ledger = PrivacyLedger(privacy, aggregation, sc.rounds, q, n, dim, sc.seed)
            survivors = n - math.floor(x * n + 0.5)
            completed, accounted = 0, math.nan
            # Fewer survivors than the threshold: every round aborts before unmasking; nothing is revealed.
            runs = survivors >= max(1, minimum_survivors(aggregation, n))
            for _ in range(sc.rounds if runs else 0):
                plan, private = ledger.round(completed + 1, n)
                if private.admit is not None and private.admit(survivors):
                    break
                report = ledger.account(plan, private.encoding.scale, survivors if survivors > 0 else None)
                accounted = report.accounted_variance
                completed += 1
            rows.append(
                {
                    "strategy": strategy,
                    "dropout": x,
                    "epsilon": ledger.accountant.epsilon(),
                    "rounds_completed": completed,
                    "target_variance": ledger.target,
                    "accounted_variance": accounted,
                }
            )
    return rows
