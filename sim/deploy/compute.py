"""A party's compute thread in the deployment: one operation at a time, its slow-down emulated by sleeping.

Work runs in the party's own thread, its :class:`ComputeThread` (the asyncio loop keeps moving bytes
meanwhile, as a device's network stack does while it computes). An emulated slower device (Zipf slow-down
``f >= 1``, Dordis 6.1) takes ``f`` times as long: after each operation its compute thread sleeps ``(f - 1)``
times the CPU seconds the operation used, still holding the party's processor. The simulator's testbed
model (``testbed: {cores: K}``) charges the same: the operation's work on the host's shared cores, then the
idle tail. Waiting operations are served in priority order (:data:`SIDE` first, as
:class:`sim.engine.processor.Processor`), first come first served within a priority.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from threadpoolctl import threadpool_limits

from sim.dp.noise import limit_threads
from sim.protocol.machine import Work
from sim.round.gates import SIDE, STAGED

T = TypeVar("T")

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval in deployment processes (Python's default is 5 ms). A party's
event loop and its compute thread share the GIL; with the default, every hand-over between them could wait
up to 5 ms for the other to let go, an artefact of the testbed rather than a cost of the protocol."""


def interleave_threads() -> None:
    """Let this process's event loop and compute threads take turns every :data:`SWITCH_INTERVAL_S`."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


ONE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""Environment of a deployment's worker processes: numerical libraries start with one thread."""


class _OneThread:
    """The limits :func:`one_thread_math` set, with the way back."""

    def __init__(self) -> None:
        self.pools = threadpool_limits(limits=1)
        self.noise = limit_threads(1)

    def restore_original_limits(self) -> None:
        self.pools.restore_original_limits()
        limit_threads(self.noise)


def one_thread_math() -> _OneThread:
    """Limit this process's BLAS and OpenMP pools (numpy's OpenBLAS, torch's OpenMP) and the noise samplers'
    threads (:func:`sim.dp.noise.limit_threads`) to one thread, until the returned limits are restored
    (``restore_original_limits()``).

    A party's computation is one thread, as the testbed model charges it and as :func:`_timed` measures its
    CPU time (work handed to other threads would not be counted). A second BLAS thread would not
    be a second core: with every core busy with other parties, OpenBLAS's helper thread waits for a time
    slice while the caller spins for it. Measured on the 2-core host: a client's first SecAgg step (a
    fixed-point encoding of 10^5 values, whose clipping norm then went through BLAS, and two key pairs)
    took 1.6 ms of its thread's CPU alone and 5.1 ms beside one busy process; with one BLAS thread, 1.1
    and 1.5 ms. The norm is now summed without BLAS (:mod:`sim.numerics`); training and anything else
    that uses these pools stays on one thread by this limit."""
    return _OneThread()


__all__ = ["CALL_TIMES", "ONE_THREAD_ENV", "SIDE", "STAGED", "Call", "ComputeThread", "one_thread_math"]


def _timed(fn: Callable[[], T], slowdown: float) -> tuple[T | None, BaseException | None, float, tuple[float, float]]:
    """Run ``fn`` in this (compute) thread, then sleep ``slowdown - 1`` times its CPU seconds in it; the
    result, the exception, the CPU seconds, and when (monotonic seconds) ``fn`` began and returned.

    The thread sleeps, not the event loop: ``asyncio.sleep`` waits in ``epoll_wait``, whose timeout is in
    whole milliseconds and rounded up, so every slow-down of a sub-millisecond operation would have taken
    a millisecond or more (docs/performance.md, "Measured facts the code relies on"); ``time.sleep``
    takes nanoseconds."""
    began = time.monotonic()
    start = time.thread_time()
    try:
        result, error = fn(), None
    except BaseException as exc:
        result, error = None, exc
    cpu = time.thread_time() - start
    returned = time.monotonic()
    if slowdown > 1:
        time.sleep((slowdown - 1) * cpu)
    return result, error, cpu, (began, returned)


NO_TIMES = (math.nan,) * 5


@dataclass(frozen=True)
class Call:
    """One computation a party ran: the CPU seconds it took in its thread, and the operations the simulator
    charges for it (empty where none is named), for ``dropsim calibrate`` (:mod:`sim.profiling.calibrate`).

    ``times`` are five instants of the party's monotonic clock (seconds), :data:`CALL_TIMES`: when the
    event loop asked for the processor, when it held it, when the compute thread began the computation,
    when the computation returned, and when the event loop had the result back (after the slow-down's
    sleep on a process testbed; on a kernel testbed the slow-down is in the quota and nothing sleeps).
    Their differences split a computation's wall time into the wait for the processor, the hand-over to
    the thread, the computation (its CPU seconds, and whatever kept it from a CPU: another thread, a spent
    CFS quota) and the hand-back; docs/time-model.md, "Where a deployed computation's time goes"."""

    cpu_s: float
    work: tuple[Work, ...]
    times: tuple[float, ...] = NO_TIMES


CALL_TIMES = ("requested_s", "acquired_s", "began_s", "returned_s", "resumed_s")
"""The instants of :attr:`Call.times`, in order (the columns of ``operations.csv`` that hold them)."""


class ComputeThread:
    """One lane of compute for one party (``slowdown`` >= 1): a thread of its own that runs one operation at a
    time, held from the request until the result is back. ``busy_s`` counts the seconds it was held,
    ``cpu_s`` the CPU seconds its operations took in its thread (without the slow-down's sleep), ``calls``
    each computation (:class:`Call`)."""

    def __init__(self, name: str, slowdown: float = 1.0) -> None:
        self.name = name
        self.slowdown = slowdown
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.busy_s = 0.0
        self.cpu_s = 0.0
        self.calls: list[Call] = []
        self._held = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def run(
        self, fn: Callable[[], T], priority: int = STAGED, work: Callable[[T], Iterable[Work]] | None = None
    ) -> T:
        """Run ``fn`` in this thread once it is free; re-raise what it raises. ``work`` names the
        operations the simulator charges for it, from its result (kept in :attr:`calls`)."""
        requested = time.monotonic()
        await self._acquire(priority)
        start = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
            result, error, cpu, (began, returned) = await loop.run_in_executor(self.executor, _timed, fn, self.slowdown)
            resumed = time.monotonic()
            self.cpu_s += cpu
            done = tuple(work(result)) if work is not None and error is None else ()  # type: ignore[arg-type]
            self.calls.append(Call(cpu, done, (requested, start, began, returned, resumed)))
        finally:
            self.busy_s += time.monotonic() - start
            self._release()
        if error is not None:
            raise error
        return result  # type: ignore[return-value]

    async def _acquire(self, priority: int) -> None:
        if not self._held and not self._waiting:
            self._held = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # it was handed the processor as it was cancelled
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self._held = False

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
