"""Which available clients the server samples each round.

``clients_per_round: K`` samples K of the available clients uniformly without replacement (all of them
when fewer are available). ``rate: q`` is Poisson sampling: each available client independently with
probability q, drawn as a Binomial(n, q) count followed by a uniform subset of that size (the same
distribution, without n uniform draws per round for a large population). Each round draws from its own
``SAMPLING`` stream, so the sample of round r does not depend on earlier rounds' draws.

Without a trace every client is available: the population is then given by its size and never listed
(numpy draws k of n without replacement by Floyd's method, in memory of order k, when k is at most n / 50).
"""

from __future__ import annotations

import numpy as np

from sim.scenario.types import Sampling
from sim.seeds import Stream, generator


def sample_clients(available: np.ndarray | int, sampling: Sampling, seed: int, round: int) -> np.ndarray:
    """Sorted indices of the clients sampled in ``round`` among ``available``: sorted client indices, or a
    population's size for all of its clients (the same draws as ``np.arange(size)``)."""
    rng = generator(seed, Stream.SAMPLING, round)
    n = available if isinstance(available, int) else int(available.shape[0])
    if sampling.rate is not None:
        k = int(rng.binomial(n, sampling.rate))
    else:
        assert sampling.clients_per_round is not None
        k = min(sampling.clients_per_round, n)
    listed = None if isinstance(available, int) else available
    if k >= n:
        return np.arange(n, dtype=np.int64) if listed is None else np.sort(listed)
    chosen = rng.choice(n, size=k, replace=False)
    return np.sort(chosen if listed is None else listed[chosen])
