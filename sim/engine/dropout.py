"""Which sampled clients drop out of a round, and where.

Three models (``dropout.mode``):

- ``fixed``: exactly ``floor(rate * n + 1/2)`` of the n sampled clients (rounded half up), chosen
  uniformly; Dordis section 6.1 ("clients randomly drop with a configurable rate in each round").
- ``bernoulli``: each sampled client independently with probability ``rate``.
- ``per_client``: client i has its own probability p_i, drawn once per run: ``high`` with probability
  ``high_fraction``, otherwise uniform in ``low`` (DReS-FL section 6: 0.99 with probability 1/2, else
  U[0, 0.1]); each round each sampled client drops with its p_i.

A dropping client leaves at ``dropout.stage``. Each round draws from its own ``DROPOUT`` stream.
"""

from __future__ import annotations

import math

import numpy as np

from sim.scenario.schema import Dropout
from sim.seeds import Stream, generator


class DropoutModel:
    """Decides each round's dropouts for a population of ``population`` clients."""

    def __init__(self, config: Dropout, population: int, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.probability: np.ndarray | None = None
        if config.mode == "per_client":
            rng = generator(seed, Stream.DROPOUT, 0)
            high = rng.random(population) < config.high_fraction
            low = rng.uniform(config.low[0], config.low[1], size=population)
            self.probability = np.where(high, config.high, low)

    def plan(self, round: int, sampled: np.ndarray) -> dict[int, str]:
        """``{client: stage}`` for the sampled clients that drop in ``round`` (1-based)."""
        rng = generator(self.seed, Stream.DROPOUT, 1, round)
        n = int(sampled.shape[0])
        cfg = self.config
        if cfg.mode == "fixed":
            k = min(n, math.floor(cfg.rate * n + 0.5))
            dropped = sampled[np.sort(rng.choice(n, size=k, replace=False))] if k else sampled[:0]
        elif cfg.mode == "bernoulli":
            dropped = sampled[rng.random(n) < cfg.rate]
        else:
            assert self.probability is not None
            dropped = sampled[rng.random(n) < self.probability[sampled]]
        return {int(c): cfg.stage for c in dropped}
