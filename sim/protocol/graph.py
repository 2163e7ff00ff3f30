"""SecAgg+ communication graphs: each client masks and shares only with its neighbours.

Bell et al. (CCS 2020) replace SecAgg's complete graph by a random k-regular graph with k = O(log n).
dropsim builds the Harary graph on a ring: the sampled clients are placed in a random order drawn from a
public per-round seed, and each is joined to the k/2 nearest on either side (k even), which is k-regular
and connected. ``neighbours: auto`` takes k = 2 * ceil(log2 n), dropsim's choice of the O(log n)
constant; when k >= n - 1 the graph is complete and SecAgg+ is SecAgg. Everyone can rebuild the graph
from the seed, so a client can check that the server shows it exactly its neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def auto_degree(n: int) -> int:
    """``2 * ceil(log2 n)``, at most n - 1."""
    if n <= 1:
        return 0
    return min(n - 1, 2 * math.ceil(math.log2(n)))


def complete(clients: Sequence[int]) -> dict[int, tuple[int, ...]]:
    everyone = tuple(sorted(clients))
    return {c: tuple(v for v in everyone if v != c) for c in everyone}


def harary(clients: Sequence[int], degree: int, seed: int) -> dict[int, tuple[int, ...]]:
    """Neighbours (sorted) of each client in the ring graph of even ``degree`` over a seeded order."""
    n = len(clients)
    if degree >= n - 1:
        return complete(clients)
    if degree < 2 or degree % 2:
        raise ValueError(f"the ring graph needs an even degree >= 2, not {degree}")
    order = [int(c) for c in np.random.default_rng(seed).permutation(sorted(clients))]
    half = degree // 2
    neighbours: dict[int, tuple[int, ...]] = {}
    for i, c in enumerate(order):
        ring = {order[(i + d) % n] for d in range(-half, half + 1) if d}
        neighbours[c] = tuple(sorted(ring))
    return neighbours
