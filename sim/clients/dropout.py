"""Which sampled clients drop out of a round, and where.

The ``dropout.mode`` decides who: each mode is one object of :data:`sim.scenario.dropout_modes.MODES`
(``fixed``, ``bernoulli``, ``per_client``; see that module, re-exported here) or a plug-in, which draws the
run's state once and each round's dropouts. A dropping client leaves at ``dropout.stage``. Each round draws from its own
``DROPOUT`` stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.scenario.dropout_modes import MODES, DropoutMode, dropout_mode, register_dropout_mode
from sim.scenario.types import Dropout
from sim.seeds import Stream, generator

__all__ = ["MODES", "DropoutMode", "DropoutModel", "dropout_mode", "register_dropout_mode"]


class DropoutModel:
    """Decides each round's dropouts for a population of ``population`` clients."""

    def __init__(self, config: Dropout, population: int, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.mode = dropout_mode(config)
        self.probability: Any = self.mode.prepare(config, population, seed)
        """The mode's per-run state: ``per_client``'s drop probability of each client (None for the others)."""

    def plan(self, round: int, sampled: np.ndarray) -> dict[int, str]:
        """``{client: stage}`` for the sampled clients that drop in ``round`` (1-based)."""
        rng = generator(self.seed, Stream.DROPOUT, 1, round)
        dropped = self.mode.drops(self.config, self.probability, rng, sampled)
        return {int(c): self.config.stage for c in dropped}
