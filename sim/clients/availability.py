"""Which clients are online when: an availability trace replayed on the simulation's clock.

Virtual time t (seconds since the run began) maps to trace time ``offset + t * time_scale``: ``offset`` picks
where in the trace the run starts (``trace.offset_hours``), ``time_scale`` how many trace seconds pass per
virtual second (1: real time; larger compresses days of availability into fewer simulated rounds). Client c
of the population is trace client c; population clients absent from the trace are never online.

The server samples among the clients online when a round starts; a sampled client whose online interval
ends during the round goes offline at that moment, at whatever protocol stage it is in (see
:class:`sim.engine.virtual_round.Round`). Sessions still open where the trace ends were cut by the observation,
not ended by their devices: they are no offline events. When nobody is online the server waits for the next
client to come online; when nobody ever will again, the run stops.
"""

from __future__ import annotations

import math

import numpy as np

from sim.traces.model import Trace


class Availability:
    def __init__(self, trace: Trace, population: int, offset_s: float = 0.0, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, not {time_scale}")
        self.trace = trace
        self.population = population
        self.offset_s = offset_s
        self.time_scale = time_scale
        self._owner = trace.owner()
        self.horizon = float(trace.ends.max()) if trace.intervals else 0.0
        """Trace seconds where observation ends: a session still open there was cut by the trace, not ended
        by its device, so it is no offline event (a non-repeating client)."""

    def trace_time(self, t: float) -> float:
        """Trace seconds at virtual time ``t``."""
        return self.offset_s + t * self.time_scale

    def virtual_time(self, trace_t: float) -> float:
        """Virtual seconds at trace time ``trace_t`` (inverse of :meth:`trace_time`)."""
        return (trace_t - self.offset_s) / self.time_scale

    def online(self, t: float) -> np.ndarray:
        """Population clients online at virtual time ``t`` (sorted int64)."""
        ids = self.trace.online(self.trace_time(t))
        return ids[ids < self.population]

    def offline_at(self, client: int, t: float) -> float:
        """Virtual time at which ``client`` (online at ``t``) goes offline; inf if it never does, ``t`` if it
        is offline already."""
        try:
            index = self.trace.index_of(client)
        except KeyError:
            return t
        end = self.trace.offline_at(index, self.trace_time(t))
        if math.isinf(end) or (np.isnan(self.trace.periods[index]) and end >= self.horizon):
            return math.inf
        return self.virtual_time(end)

    def next_online(self, t: float) -> float:
        """The first virtual time after ``t`` at which some client comes online (inf if none ever does)."""
        tr = self.trace
        now = self.trace_time(t)
        keep = tr.clients[self._owner] < self.population
        starts, owner = tr.starts[keep], self._owner[keep]
        periods = tr.periods[owner]
        periodic = ~np.isnan(periods)
        safe = np.where(periodic, periods, 1.0)
        base = np.where(periodic, np.floor(now / safe) * safe, 0.0)
        at = starts + base
        at = np.where(periodic & (at <= now), at + safe, at)
        later = at[at > now]
        return self.virtual_time(float(later.min())) if later.size else math.inf
