"""A synthetic availability trace calibrated to FedScale's replay of the FLASH study (Yang et al., WWW'21).

Model (all times in seconds; the calibration targets and achieved numbers are in ``traces/README.md``):

* Client i has an activity propensity ``a_i ~ Gamma(k, 1/k)`` (mean 1; some devices are online far more
  often than others), a daily phase ``phi_i ~ Normal(0, phase_sd_s)`` (time-zone and routine jitter), and a
  time ``D_i ~ Exponential(leave_per_day / 86400 s)`` at which it leaves the study (offline from then on).
* Sessions start as a Poisson process with rate ``a_i * lam(t + phi_i)``, where ``lam`` is one 24-hour
  profile shared by everyone (per second, piecewise constant on a 1-minute grid); session lengths are
  lognormal (median ``session_median_s``, shape ``session_sigma``), capped at ``session_max_s``.
  Overlapping sessions of a client merge (the client is online while any session is running).
* For such a process the probability that a client still in the study is online at time t is
  ``E[1 - exp(-a_i m(t + phi_i))] = E_phi[1 - (1 + m(t + phi)/k)^-k]``, with ``m = lam * S`` (convolution
  with the session survival function S). ``lam`` is solved for (multiplicative, Richardson-Lucy-style
  iteration; it stays >= 0) so that this matches the target daily profile ``profile_online`` read off the
  reference figure (FedScale's 4-day replay: a sawtooth between ~16% and ~24.5%, peaking ~7 h into each
  day). With departures the expected online fraction of the population is ``exp(-leave * t) * g(t)``.

The process runs from ``-session_max_s`` (so sessions already in progress at 0 are present) to the end of
the trace; intervals are clipped to ``[0, days * 86400)`` and rounded to whole seconds. A client whose
sessions all fall outside that window gets one session drawn from the same process and length
distribution in ``[0, days * 86400)`` (so the trace has exactly ``clients`` clients, ids 0..clients-1; the
README gives how many that affects). Everything is vectorised: 1M clients x 4 days take seconds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from sim.traces.model import Trace

__all__ = ["DAY_S", "Calibration", "expected_online", "start_rate", "synthesize", "synthesize_counted"]

DAY_S = 86_400.0
"""Seconds per day."""

_PROFILE_HOURS = tuple(float(h) for h in range(25))
# Online fraction (of clients still in the study) at each hour of the day, read off the reference figure
# fedscale-available-clients-percent.png (days 2-4, scaled up by ~5% so that, with departures, day 1 peaks
# near its 24.7% and day 4 near 23%); hour 24 repeats hour 0.
_PROFILE_ONLINE = (
    0.160, 0.180, 0.198, 0.213, 0.226, 0.236, 0.242, 0.245, 0.243, 0.238, 0.232, 0.226, 0.221,
    0.216, 0.212, 0.209, 0.206, 0.204, 0.203, 0.202, 0.200, 0.195, 0.186, 0.174, 0.160,
)  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """Parameters of the synthetic model (see the module docstring); defaults are the shipped calibration."""

    profile_hours: tuple[float, ...] = _PROFILE_HOURS
    """Hours of the day (0..24) at which ``profile_online`` is given; linear in between."""
    profile_online: tuple[float, ...] = _PROFILE_ONLINE
    """Target fraction of the clients still in the study that are online, at those hours."""
    session_median_s: float = 3600.0
    """Median session length (s) before merging: one hour."""
    session_sigma: float = 1.0
    """Lognormal shape of session lengths: mean = median * exp(sigma^2 / 2) ~ 99 min before the cap."""
    session_max_s: float = 12 * 3600.0
    """Longest session (s); longer draws are cut to this."""
    phase_sd_s: float = 1800.0
    """Standard deviation of a client's daily phase (s)."""
    propensity_shape: float = 2.0
    """Gamma shape k of the per-client activity propensity (mean 1, coefficient of variation 1/sqrt(k))."""
    leave_per_day: float = 0.02
    """Rate at which clients leave the study (per day): exp(-0.02 * 4) = 92% remain after 4 days."""
    grid_s: float = 60.0
    """Resolution of the daily start-rate profile (s); must divide a day."""
    iterations: int = 300
    """Iterations of the start-rate solver."""

    def __post_init__(self) -> None:
        if len(self.profile_hours) != len(self.profile_online) or len(self.profile_hours) < 2:
            raise ValueError("profile_hours and profile_online must have the same length (>= 2)")
        if not all(0 < p < 1 for p in self.profile_online):
            raise ValueError("profile_online values must be fractions in (0, 1)")
        positive = (self.session_median_s, self.session_sigma, self.session_max_s, self.propensity_shape)
        if min(positive) <= 0 or self.phase_sd_s < 0 or self.leave_per_day < 0:
            raise ValueError("session lengths, sigma and propensity shape must be > 0; phase sd and leave rate >= 0")
        if DAY_S % self.grid_s != 0 or self.session_max_s >= DAY_S:
            raise ValueError("grid_s must divide a day, and session_max_s must be shorter than a day")


def _survival(cal: Calibration, u: np.ndarray) -> np.ndarray:
    """P(session length > u) for the capped lognormal."""
    mu, s = math.log(cal.session_median_s), cal.session_sigma * math.sqrt(2.0)
    erfc = np.vectorize(math.erfc, otypes=[float])
    safe = np.maximum(u, 1e-300)
    return np.where(u < cal.session_max_s, 0.5 * erfc((np.log(safe) - mu) / s), 0.0)


def _daily_fraction(cal: Calibration, rate: np.ndarray, kernels: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Online probability of a client still in the study over one day (grid midpoints), given ``rate``;
    ``kernels`` are the Fourier transforms of the session survival function and the phase density."""
    survival, phase = kernels
    n = rate.size
    m = np.maximum(np.fft.irfft(np.fft.rfft(rate) * survival, n), 0.0)
    k = cal.propensity_shape
    online = 1.0 - (1.0 + m / k) ** (-k)
    return np.asarray(np.fft.irfft(np.fft.rfft(online) * phase, n))


def _kernels(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    n = int(DAY_S / cal.grid_s)
    u = (np.arange(n) + 0.5) * cal.grid_s
    survival = np.fft.rfft(_survival(cal, u) * cal.grid_s)
    distance = np.minimum(np.arange(n), n - np.arange(n)) * cal.grid_s
    kernel = np.exp(-0.5 * (distance / cal.phase_sd_s) ** 2) if cal.phase_sd_s > 0 else (distance == 0) * 1.0
    return survival, np.fft.rfft(kernel / kernel.sum())


def _target(cal: Calibration) -> np.ndarray:
    n = int(DAY_S / cal.grid_s)
    hours = (np.arange(n) + 0.5) * cal.grid_s / 3600.0
    return np.interp(hours, cal.profile_hours, cal.profile_online)


@functools.lru_cache(maxsize=8)
def _solve(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    target = _target(cal)
    mean_session = float(np.sum(_survival(cal, (np.arange(int(DAY_S / cal.grid_s)) + 0.5) * cal.grid_s)))
    rate = np.full(target.size, float(np.mean(target)) / (mean_session * cal.grid_s))
    kernels = _kernels(cal)
    for _ in range(cal.iterations):
        rate = np.maximum(rate * target / _daily_fraction(cal, rate, kernels), 1e-15)
    return rate, _daily_fraction(cal, rate, kernels)


def start_rate(cal: Calibration = Calibration()) -> np.ndarray:
    """Session start rate per second of a client with propensity 1, on the daily grid (``DAY_S / grid_s``
    values, for the minutes [0, 1), [1, 2), ... of the day in its own phase)."""
    return _solve(cal)[0].copy()


def expected_online(times_s: np.ndarray, cal: Calibration = Calibration()) -> np.ndarray:
    """The model's expected fraction of the population online at trace times ``times_s`` (seconds)."""
    rate, daily = _solve(cal)
    mids = (np.arange(rate.size) + 0.5) * cal.grid_s
    t = np.asarray(times_s, dtype=np.float64)
    within = np.interp(np.mod(t, DAY_S), mids, daily, period=DAY_S)
    return np.asarray(np.exp(-cal.leave_per_day * t / DAY_S) * within)


def _merge(owner: np.ndarray, starts: np.ndarray, ends: np.ndarray, span: int) -> tuple[np.ndarray, ...]:
    """Sort intervals by (owner, start) and merge each owner's overlapping or touching ones.

    Times are integers in [0, span); keys ``owner * span + t`` keep owners apart, so one running maximum
    over all keys is each owner's running maximum of its ends."""
    key = owner * span + starts
    order = np.argsort(key, kind="stable")
    owner, key = owner[order], key[order]
    end_key = np.maximum.accumulate(owner * span + ends[order])
    first = np.ones(key.size, dtype=bool)
    first[1:] = key[1:] > end_key[:-1]
    heads = np.flatnonzero(first)
    tails = np.append(heads[1:] - 1, key.size - 1)
    merged_owner = owner[heads]
    return merged_owner, key[heads] - merged_owner * span, end_key[tails] - merged_owner * span


def synthesize(clients: int, days: float, seed: int, cal: Calibration = Calibration()) -> Trace:
    """A synthetic trace of ``clients`` clients (ids 0..clients-1) over ``days`` days (times in whole
    seconds, non-repeating), from the model in the module docstring with calibration ``cal``."""
    return synthesize_counted(clients, days, seed, cal)[0]


def synthesize_counted(clients: int, days: float, seed: int, cal: Calibration = Calibration()) -> tuple[Trace, int]:
    """:func:`synthesize`, and how many clients were given their one session because the process gave none."""
    if clients < 1:
        raise ValueError(f"clients must be at least 1, not {clients}")
    if not days > 0 or not math.isfinite(days):
        raise ValueError(f"days must be a positive number, not {days}")
    horizon = round(days * DAY_S)
    rate, _ = _solve(cal)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7)]
    propensity_rng, phase_rng, leave_rng, count_rng, start_rng, length_rng, fill_rng = streams
    propensity = propensity_rng.gamma(cal.propensity_shape, 1.0 / cal.propensity_shape, clients)
    phase = phase_rng.normal(0.0, cal.phase_sd_s, clients)
    leave = (
        leave_rng.exponential(DAY_S / cal.leave_per_day, clients) if cal.leave_per_day > 0 else np.full(clients, np.inf)
    )

    # Cumulative start rate over the client's own (phase-shifted) clock, on a grid covering every client.
    warmup = cal.session_max_s
    lo_x = -warmup + min(0.0, float(phase.min())) - cal.grid_s
    hi_x = horizon + max(0.0, float(phase.max())) + cal.grid_s
    first_cell = math.floor(lo_x / cal.grid_s)
    cells = np.arange(first_cell, math.ceil(hi_x / cal.grid_s) + 1)
    x = cells * cal.grid_s
    per_cell = rate[np.mod(cells[:-1], rate.size)] * cal.grid_s
    cumulative = np.concatenate([[0.0], np.cumsum(per_cell)])

    def sample(owner: np.ndarray, lo: np.ndarray, hi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Start times (trace seconds) of sessions of ``owner`` drawn from the process on [lo, hi)."""
        c_lo = np.interp(lo + phase[owner], x, cumulative)
        c_hi = np.interp(hi + phase[owner], x, cumulative)
        u = c_lo + rng.random(owner.size) * (c_hi - c_lo)
        return np.interp(u, cumulative, x) - phase[owner]

    until = np.minimum(leave, float(horizon))
    everyone = np.arange(clients, dtype=np.int64)
    expected = propensity * (np.interp(until + phase, x, cumulative) - np.interp(-warmup + phase, x, cumulative))
    owner = np.repeat(everyone, count_rng.poisson(expected))
    start = sample(owner, np.full(owner.size, -warmup), until[owner], start_rng)
    length = np.minimum(length_rng.lognormal(math.log(cal.session_median_s), cal.session_sigma, owner.size), warmup)
    end = np.minimum(np.minimum(start + length, leave[owner]), horizon)
    start_s, end_s = np.rint(np.maximum(start, 0.0)).astype(np.int64), np.rint(end).astype(np.int64)
    keep = end_s > start_s
    owner, start_s, end_s = owner[keep], start_s[keep], end_s[keep]

    # Clients left without a session get one in [0, horizon), ignoring departure.
    empty = np.flatnonzero(np.bincount(owner, minlength=clients) == 0)
    if empty.size:
        fill_start = sample(empty, np.zeros(empty.size), np.full(empty.size, float(horizon)), fill_rng)
        fill_len = np.minimum(fill_rng.lognormal(math.log(cal.session_median_s), cal.session_sigma, empty.size), warmup)
        a = np.clip(np.rint(fill_start).astype(np.int64), 0, horizon - 1)
        b = np.clip(np.rint(fill_start + fill_len).astype(np.int64), a + 1, horizon)
        owner, start_s, end_s = (np.concatenate(p) for p in ((owner, empty), (start_s, a), (end_s, b)))

    owner, start_s, end_s = _merge(owner, start_s, end_s, horizon + 1)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=clients))]).astype(np.int64)
    return Trace(
        clients=everyone,
        offsets=offsets,
        starts=start_s.astype(np.float64),
        ends=end_s.astype(np.float64),
        periods=np.full(clients, np.nan),
        source=f"synthesize(clients={clients}, days={days:g}, seed={seed})",
    ), int(empty.size)
