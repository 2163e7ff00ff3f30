"""The asyncio loop seen as the clock and event source of :class:`sim.round.gates.StageGate`.

The pipeline's stage gates order a resource's (stage, chunk) tasks by Hyades appendix F; they need only
``now`` and ``event()`` with ``succeed()``, so the deployment's client workers use the very same gates
with events that are awaitable futures and the monotonic clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import Any


class LoopEvent:
    """An awaitable that fires once (:meth:`succeed`)."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def succeed(self, value: Any = None) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.future.__await__()


class LoopClock:
    """``now`` (monotonic seconds) and ``event()`` for gates driven by the running asyncio loop."""

    @property
    def now(self) -> float:
        return time.monotonic()

    def event(self) -> LoopEvent:
        return LoopEvent()
