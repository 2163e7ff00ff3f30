"""What a trace says about availability: clients online over time, session lengths, the daily cycle.

``online_series`` counts the clients online on a time grid without looping over times: a client's
intervals are disjoint, so the clients online at t are the intervals begun by t minus those ended by t
(two binary searches in the sorted starts and ends). A repeating client's intervals are first unrolled over
the grid's span. :func:`sim.plots.plot_online` draws the series.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from sim.traces.model import Trace

__all__ = ["SessionStats", "dominant_period_h", "online_counts", "online_series", "session_stats"]


def span_s(trace: Trace) -> float:
    """End of what the trace describes (s): its last interval end, or a repeating client's period if later."""
    ends = float(trace.ends.max()) if trace.intervals else 0.0
    periods = trace.periods[~np.isnan(trace.periods)]
    return max(ends, float(periods.max())) if periods.size else ends


def online_counts(trace: Trace, times: np.ndarray) -> np.ndarray:
    """int64: how many clients are online at each of ``times`` (trace seconds; any order).

    Agrees with ``trace.online_mask(t).sum()`` at every t (start inclusive, end exclusive), up to floating
    point: a repeating client's intervals are shifted by whole periods (``start + k * period``) rather than
    t reduced (``t mod period``), which can round differently within an ulp of a boundary. Cost: sorting the
    intervals, a repeating one once per period it spans within ``times``."""
    times = np.asarray(times, dtype=np.float64)
    if times.size == 0:
        return np.zeros(0, dtype=np.int64)
    owner = trace.owner()
    period = trace.periods[owner]
    fixed = np.isnan(period)
    starts, ends = [trace.starts[fixed]], [trace.ends[fixed]]
    if not fixed.all():
        s, e, p = trace.starts[~fixed], trace.ends[~fixed], period[~fixed]
        lo, hi = float(times.min()), float(times.max())
        k_lo = np.floor((lo - e) / p) + 1  # copies s + k p .. e + k p that reach into [lo, hi]
        k_hi = np.floor((hi - s) / p)
        copies = np.maximum(k_hi - k_lo + 1, 0).astype(np.int64)
        which = np.repeat(np.arange(s.size), copies)
        k = k_lo[which] + (np.arange(which.size) - np.repeat(np.cumsum(copies) - copies, copies))
        starts.append(s[which] + k * p[which])
        ends.append(e[which] + k * p[which])
    begun = np.sort(np.concatenate(starts))
    ended = np.sort(np.concatenate(ends))
    return (np.searchsorted(begun, times, side="right") - np.searchsorted(ended, times, side="right")).astype(np.int64)


def online_series(
    trace: Trace,
    step_s: float,
    start_s: float = 0.0,
    end_s: float | None = None,
    population: int | None = None,
) -> pd.DataFrame:
    """Clients online every ``step_s`` seconds at ``start_s, start_s + step_s, ...`` before ``end_s``
    (default: the trace's span; excluded, as interval ends are).

    Columns: ``time_h`` (trace hours), ``online`` (clients), ``fraction`` (of ``population``, default the
    trace's client count)."""
    if not step_s > 0:
        raise ValueError(f"step_s must be > 0, not {step_s}")
    end = span_s(trace) if end_s is None else end_s
    count = max(int(np.ceil((end - start_s) / step_s - 1e-9)), 0)
    times = start_s + step_s * np.arange(count)
    online = online_counts(trace, times)
    total = trace.size if population is None else population
    return pd.DataFrame({"time_h": times / 3600.0, "online": online, "fraction": online / max(total, 1)})


@dataclass(frozen=True)
class SessionStats:
    """Online intervals ("sessions") of a trace; a repeating client's intervals count once."""

    clients: int
    intervals: int
    intervals_per_client: float
    """Mean intervals per client."""
    median_s: float
    """Median interval length (s)."""
    mean_s: float
    """Mean interval length (s)."""
    p10_s: float
    """10th percentile of interval length (s)."""
    p90_s: float
    """90th percentile of interval length (s)."""

    def row(self) -> dict[str, float | int]:
        return asdict(self)


def session_stats(trace: Trace) -> SessionStats:
    lengths = trace.ends - trace.starts
    q = np.quantile(lengths, [0.1, 0.5, 0.9]) if lengths.size else np.full(3, np.nan)
    return SessionStats(
        clients=trace.size,
        intervals=trace.intervals,
        intervals_per_client=trace.intervals / max(trace.size, 1),
        median_s=float(q[1]),
        mean_s=float(lengths.mean()) if lengths.size else float("nan"),
        p10_s=float(q[0]),
        p90_s=float(q[2]),
    )


def dominant_period_h(series: pd.DataFrame, column: str = "fraction") -> float:
    """The period (hours) of the strongest cycle in ``series[column]`` (evenly spaced ``time_h``).

    The peak of the periodogram of the linearly detrended series, zero-padded 64-fold so that the peak is
    located to a small fraction of the frequency spacing, among periods of at most half the series' length
    (at least two cycles seen). NaN for fewer than 8 points."""
    t = series["time_h"].to_numpy(dtype=np.float64)
    y = series[column].to_numpy(dtype=np.float64)
    if y.size < 8:
        return float("nan")
    step = float(t[1] - t[0])
    y = y - np.polyval(np.polyfit(t, y, 1), t)
    size = 64 * y.size
    power = np.abs(np.fft.rfft(y, size)) ** 2
    freq = np.fft.rfftfreq(size, step)
    allowed = freq >= 2.0 / (y.size * step)
    if not allowed.any() or not np.any(power[allowed] > 0):
        return float("nan")
    return float(1.0 / freq[allowed][np.argmax(power[allowed])])
