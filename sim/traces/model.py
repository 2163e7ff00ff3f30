"""An availability trace in memory: each client's online intervals, in seconds, as flat arrays.

Layout (compressed sparse rows, so a million clients cost a few arrays, not a million objects):
``clients`` holds the sorted client ids; client ``clients[i]``'s intervals are ``starts[offsets[i]:offsets[i+1]]``
and ``ends[...]``, sorted, non-overlapping, ``0 <= start < end``. A client is online at trace time t when
``start <= t' < end`` for one of its intervals, where t' = t, or ``t mod periods[i]`` for a client whose trace
repeats (FedScale's ``finish_time``; NaN = does not repeat; after its last interval a non-repeating client
stays offline). Optional per-client device capacity: ``compute_ms_per_sample`` and ``bandwidth_kbps`` (NaN
where unknown).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class Trace:
    clients: np.ndarray
    """int64, sorted, unique client ids (n,)."""
    offsets: np.ndarray
    """int64 (n + 1,): client i's intervals are [offsets[i], offsets[i+1])."""
    starts: np.ndarray
    """float64 (m,): interval starts, seconds."""
    ends: np.ndarray
    """float64 (m,): interval ends, seconds (exclusive)."""
    periods: np.ndarray
    """float64 (n,): the client's trace repeats with this period (seconds); NaN: it does not."""
    compute_ms_per_sample: np.ndarray | None = None
    """float64 (n,) or None: device compute time per training sample (ms); NaN unknown."""
    bandwidth_kbps: np.ndarray | None = None
    """float64 (n,) or None: device bandwidth (kbit/s); NaN unknown."""
    source: str = "<memory>"

    @property
    def size(self) -> int:
        """Number of clients."""
        return int(self.clients.size)

    @property
    def intervals(self) -> int:
        return int(self.starts.size)

    def owner(self) -> np.ndarray:
        """int64 (m,): the index (into ``clients``) of each interval's client (computed once)."""
        return self._owner

    @cached_property
    def _owner(self) -> np.ndarray:
        return np.repeat(np.arange(self.size, dtype=np.int64), np.diff(self.offsets))

    @cached_property
    def _interval_periods(self) -> np.ndarray | None:
        """float64 (m,): each interval's client period, or None when no client repeats."""
        if bool(np.isnan(self.periods).all()):
            return None
        return self.periods[self._owner]

    def online_mask(self, t: float) -> np.ndarray:
        """bool (n,): which clients are online at trace time t. O(m), vectorised."""
        owner = self._owner
        periods = self._interval_periods
        local: float | np.ndarray = t
        if periods is not None:
            local = np.where(np.isnan(periods), t, np.mod(t, np.where(np.isnan(periods), 1.0, periods)))
        hit = (self.starts <= local) & (local < self.ends)
        mask = np.zeros(self.size, dtype=bool)
        mask[owner[hit]] = True
        return mask

    def online(self, t: float) -> np.ndarray:
        """Client ids online at trace time t (sorted)."""
        return self.clients[self.online_mask(t)]

    def offline_at(self, index: int, t: float) -> float:
        """Trace time at which client ``clients[index]``, online at t, goes offline (inf if never); t itself
        if it is offline at t."""
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        period = float(self.periods[index])
        base = 0.0
        local = t
        if not np.isnan(period):
            local = float(np.mod(t, period))  # exactly as online_mask reduces it
            base = t - local
        k = int(np.searchsorted(self.starts[lo:hi], local, side="right")) - 1
        if k < 0 or not local < self.ends[lo + k]:
            return t
        end = base + float(self.ends[lo + k])
        if not np.isnan(period) and self.ends[lo + k] >= period and self.starts[lo] <= 0.0:
            # the session runs on into the next period, whose first interval starts at 0: one session
            end = base + period + float(self.ends[lo]) if hi - lo > 1 or self.ends[lo] < period else np.inf
        return end

    def index_of(self, client: int) -> int:
        """Position of ``client`` in ``clients``; KeyError if it is not in the trace."""
        i = int(np.searchsorted(self.clients, client))
        if i >= self.size or int(self.clients[i]) != client:
            raise KeyError(client)
        return i
