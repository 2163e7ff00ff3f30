"""Token buckets: the link rates of the simulator, imposed on real sockets.

A :class:`TokenBucket` of ``rate_bps`` bits per second models one link of that rate, as the simulator's
links (and Dordis's testbed) do: a transfer of ``n`` bytes occupies it for ``8 n / rate_bps`` seconds,
and senders sharing the link (the server's) share its rate. Tokens are bytes; they accrue at
``rate_bps / 8`` per second up to ``burst_bytes``, and a taker waits until enough have accrued.

Deviation from the simulator's fluid links: up to ``burst_bytes`` pass at loopback speed after an idle
period, and bytes are released in pieces (of at most 64 KiB in :mod:`sim.deploy.framing`), so the rate
holds over times longer than a piece takes, not within one piece.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

BITS_PER_BYTE = 8


def seconds_for(nbytes: int, rate_bps: float) -> float:
    """Seconds a link of ``rate_bps`` bits per second takes to carry ``nbytes`` bytes."""
    return nbytes * BITS_PER_BYTE / rate_bps


class TokenBucket:
    """A link of ``rate_bps`` bits per second, which releases bytes to its takers in FIFO order.

    A request larger than the burst is allowed: it waits until the bucket is full, then takes the bucket
    into debt (negative tokens), which the next taker waits off, so the long-run rate is exactly
    ``rate_bps`` whatever the piece size. The bucket starts full. It belongs to one event loop (its lock
    does), and ``clock`` and ``sleep`` are injectable so that tests can run it in fake time.
    """

    rate_bps: float
    """Rate in bits per second (Mbps * 1e6, as the simulator's links)."""
    burst_bytes: int
    """Most bytes that pass without waiting after an idle period."""

    def __init__(
        self,
        rate_bps: float,
        burst_bytes: int = 65536,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not (math.isfinite(rate_bps) and rate_bps > 0):
            raise ValueError(f"rate_bps must be a positive finite number of bits per second, not {rate_bps}")
        if burst_bytes < 1:
            raise ValueError(f"burst_bytes must be at least 1 byte, not {burst_bytes}")
        self.rate_bps = rate_bps
        self.burst_bytes = burst_bytes
        self._bytes_per_second = rate_bps / BITS_PER_BYTE
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst_bytes)
        # The clock time up to which _tokens is accounted (in the future while a taker waits).
        self._stamp = clock()
        self._lock = asyncio.Lock()

    @property
    def tokens(self) -> float:
        """Bytes available now (negative while in debt)."""
        self._refill()
        return self._tokens

    def _refill(self) -> None:
        now = self._clock()
        if now > self._stamp:
            credit = (now - self._stamp) * self._bytes_per_second
            self._tokens = min(float(self.burst_bytes), self._tokens + credit)
            self._stamp = now

    async def take(self, n: int) -> None:
        """Wait until ``min(n, burst_bytes)`` bytes of tokens have accrued, then remove ``n``."""
        if n < 0:
            raise ValueError(f"cannot take a negative number of bytes ({n})")
        async with self._lock:
            self._refill()
            need = min(n, self.burst_bytes)
            if self._tokens < need:
                wait = (need - self._tokens) / self._bytes_per_second
                # Account the wait up to the instant the tokens suffice, not to when the sleep returns:
                # oversleeping then credits the next taker instead of slowing the link down.
                self._tokens = float(need)
                self._stamp += wait
                await self._sleep(wait)
            self._tokens -= n
