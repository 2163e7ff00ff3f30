"""Completion times of a pipeline of equal chunk tasks (Hyades appendix F, eqs. 18-19).

Stage s of chunk c begins when the chunk has finished stage s-1 (eq. 18: o) and its resource is free for
it (eq. 19: r), and lasts l_s:

    f(s, c) = max(o(s, c), r(s, c)) + l_s
    o(s, c) = 0 if s = 0, else f(s-1, c)
    r(s, c) = f(s, c-1)                      for c > 0
    r(0, 0) = 0
    r(s, 0) = f(q, m-1), q the latest stage before s on the same resource (0 if there is none)

so a resource runs one chunk's stage at a time, chunks in order within a stage, and a later stage on a
resource waits until every chunk has been through the earlier ones (Dordis Figure 6). The completion
time of the pipeline is f(a-1, m-1); the optimal chunk count minimises it (:func:`best_chunks`).
Stages are numbered from 0 here; Dordis Table 1 numbers them from 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.round import stages

DORDIS_RESOURCES = stages.resources(stages.SHARED)
"""Dominant resource of each stage of Dordis Table 1 (:mod:`sim.round.stages`): c-comp, comm, s-comp, comm,
c-comp."""
DUPLEX_RESOURCES = stages.resources(stages.DUPLEX)
"""The same with the upload and the dispatch on the two directions of a full-duplex link."""


def finish_times(latencies: Sequence[float], resources: Sequence[str], chunks: int) -> list[list[float]]:
    """``f[s][c]``: when stage ``s`` of chunk ``c`` finishes (same units as ``latencies``), starting at 0.

    ``latencies[s]`` is l_s, the time one chunk spends in stage s; ``resources[s]`` names its resource.
    """
    if len(latencies) != len(resources):
        raise ValueError(f"{len(latencies)} latencies for {len(resources)} stages")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, not {chunks}")
    stages = len(latencies)
    f = [[0.0] * chunks for _ in range(stages)]
    for s in range(stages):
        earlier = [q for q in range(s) if resources[q] == resources[s]]
        for c in range(chunks):
            o = f[s - 1][c] if s > 0 else 0.0
            # eq. 19: the previous chunk's turn at this stage, or for the first chunk every chunk's turn
            # at the latest earlier stage on this resource
            r = f[s][c - 1] if c > 0 else f[earlier[-1]][chunks - 1] if earlier else 0.0
            f[s][c] = max(o, r) + latencies[s]
    return f


def completion_time(latencies: Sequence[float], resources: Sequence[str], chunks: int) -> float:
    """f(a-1, m-1): when the last chunk leaves the last stage."""
    return finish_times(latencies, resources, chunks)[-1][-1]


def best_chunks(
    latency: Callable[[int], Sequence[float]], resources: Sequence[str], candidates: Sequence[int]
) -> tuple[int, dict[int, float]]:
    """The chunk count among ``candidates`` with the earliest completion, and every candidate's time.

    ``latency(m)`` gives the per-chunk latency of each stage when the update is cut into m chunks (Dordis
    eq. 3). Ties go to the smaller m (fewer messages, less state).
    """
    times = {m: completion_time(latency(m), resources, m) for m in candidates}
    best = min(times, key=lambda m: (times[m], m))
    return best, times
