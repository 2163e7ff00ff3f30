"""Token buckets: the link rates of the simulator, imposed on real sockets.

A :class:`TokenBucket` of ``rate_bps`` bits per second models one link of that rate, as the simulator's
fluid links do: a transfer of ``n`` bytes occupies it for ``8 n / rate_bps`` seconds, and senders sharing
the link (the server's) take turns on it. A taker of ``n`` bytes reserves the link from when it is free
(or now) for ``n`` bytes' time and waits until the reservation ends: a piece is written once it has
"crossed" the link (sender side), or released once it has "arrived" (receiver side, which throttles the
sender through TCP back-pressure). Reservations are made in call order (FIFO) and without awaiting, so
concurrent takers interleave piece by piece.

A lone message of ``n`` bytes takes ``8 n / rate_bps``, as in the simulator. The event loop wakes a
sleeping taker a little late; up to ``slack_s`` (1 ms) of that lateness is credited to the next
reservation, so a stream of pieces keeps the exact rate (the price: a link idle for longer lets its first
``slack_s`` worth of bytes through at once). ``burst_bytes`` > 0 gives an idle link more credit than that.
Bytes move in pieces (at most 64 KiB in :mod:`sim.deploy.framing`), so the rate holds over times longer
than a piece takes, not within one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

BITS_PER_BYTE = 8

UNSHAPED_BPS = 1e15
"""The rate of a link that is not shaped here: a worker's before it knows its round's client (only the
configuration crosses it), and every link of a kernel testbed (tc shapes them)."""


def seconds_for(nbytes: int, rate_bps: float) -> float:
    """Seconds a link of ``rate_bps`` bits per second takes to carry ``nbytes`` bytes."""
    return nbytes * BITS_PER_BYTE / rate_bps


class TokenBucket:
    """A link of ``rate_bps`` bits per second, reserved by its takers in FIFO order. It belongs to one event
    loop; ``clock`` and ``sleep`` are injectable so that tests can run it in fake time."""

    rate_bps: float
    """Rate in bits per second (Mbps * 1e6, as the simulator's links)."""
    burst_bytes: int
    """Bytes an idle link lets pass without waiting, beyond ``slack_s``'s worth."""
    slack_s: float
    """Lateness of a taker's wake-up credited to the next reservation (seconds)."""

    def __init__(
        self,
        rate_bps: float,
        burst_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        slack_s: float = 0.001,
    ) -> None:
        if not (math.isfinite(rate_bps) and rate_bps > 0):
            raise ValueError(f"rate_bps must be a positive finite number of bits per second, not {rate_bps}")
        if burst_bytes < 0:
            raise ValueError(f"burst_bytes must be at least 0 bytes, not {burst_bytes}")
        self.rate_bps = rate_bps
        self.burst_bytes = burst_bytes
        self.slack_s = slack_s
        self._bytes_per_second = rate_bps / BITS_PER_BYTE
        self._clock = clock
        self._sleep = sleep
        self._free_at = clock() - self._credit()
        """When the link has carried every byte reserved so far (clock seconds)."""

    def _credit(self) -> float:
        """Seconds of the link an idle period or a late wake-up may make up for."""
        return max(self.burst_bytes / self._bytes_per_second, self.slack_s)

    def retune(self, rate_bps: float) -> None:
        """Carry the bytes reserved from now on at ``rate_bps`` (a worker's link is its client's of the round)."""
        if not (math.isfinite(rate_bps) and rate_bps > 0):
            raise ValueError(f"rate_bps must be a positive finite number of bits per second, not {rate_bps}")
        self.rate_bps = rate_bps
        self._bytes_per_second = rate_bps / BITS_PER_BYTE

    @property
    def busy_until(self) -> float:
        """Clock time at which the link has carried everything reserved so far."""
        return self._free_at

    def reserve(self, n: int) -> float:
        """Reserve the link for ``n`` bytes after what is reserved already; returns the seconds from now
        until they are through (0 when an idle link's burst covers them)."""
        if n < 0:
            raise ValueError(f"cannot take a negative number of bytes ({n})")
        now = self._clock()
        self._free_at = max(now - self._credit(), self._free_at) + n / self._bytes_per_second
        return max(0.0, self._free_at - now)

    async def take(self, n: int) -> None:
        """Wait until ``n`` bytes, queued behind every earlier taker's, have crossed the link."""
        wait = self.reserve(n)
        if wait > 0:
            await self._sleep(wait)
