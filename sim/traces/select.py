"""Pick a subset of a trace's clients: the most available or the most volatile, renumbered from 0.

Dordis (section 2.3, Figure 1) replays "100 volatile users" extracted from a 136k-device study. ``select``
does that for any trace: it ranks clients by their online fraction over the trace's span (``online``) or by
their number of sessions (``sessions``), keeps the top ``n`` (ties: the lower id first), and renumbers them
0..n-1 in the order of their original ids, so the result replays as a population of ``n``. Periods and
device capacities go with their clients.
"""

from __future__ import annotations

import numpy as np

from sim.traces.model import Trace
from sim.traces.stats import span_s

RANKINGS = ("online", "sessions")
"""How :func:`select_clients` ranks clients: online fraction of the span, or number of sessions."""


def online_seconds(trace: Trace) -> np.ndarray:
    """float64 (n,): seconds each client is online within ``[0, span_s(trace))`` (one pass of the trace)."""
    span = span_s(trace)
    lengths = np.clip(trace.ends, None, span) - np.clip(trace.starts, None, span)
    return np.bincount(trace.owner(), weights=lengths, minlength=trace.size)


def select_clients(trace: Trace, n: int, by: str = "online") -> Trace:
    """The ``n`` clients of ``trace`` ranked first by ``by`` (:data:`RANKINGS`), renumbered 0..n-1."""
    if by not in RANKINGS:
        raise ValueError(f"by is {by!r}; allowed: {', '.join(RANKINGS)}")
    if not 1 <= n <= trace.size:
        raise ValueError(f"cannot select {n} clients from a trace of {trace.size}")
    score = online_seconds(trace) if by == "online" else np.diff(trace.offsets).astype(np.float64)
    order = np.lexsort((trace.clients, -score))  # highest score first, then the lower id
    keep = np.sort(order[:n])  # original id order
    counts = np.diff(trace.offsets)[keep]
    rows = np.concatenate([np.arange(trace.offsets[i], trace.offsets[i + 1]) for i in keep])
    pick = None if trace.compute_ms_per_sample is None else trace.compute_ms_per_sample[keep]
    bandwidth = None if trace.bandwidth_kbps is None else trace.bandwidth_kbps[keep]
    return Trace(
        clients=np.arange(n, dtype=np.int64),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        starts=trace.starts[rows],
        ends=trace.ends[rows],
        periods=trace.periods[keep],
        compute_ms_per_sample=pick,
        bandwidth_kbps=bandwidth,
        source=f"{trace.source} (the {n} clients with the most {'time online' if by == 'online' else 'sessions'})",
    )
