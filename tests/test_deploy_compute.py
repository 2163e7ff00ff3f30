"""A deployed party's processor: one operation at a time, its CPU seconds counted, its slow-down slept."""

from __future__ import annotations

import asyncio
import time

from sim.deploy.compute import ComputeThread


def _spin(seconds: float) -> float:
    """Burn about ``seconds`` of this thread's CPU; returns the CPU seconds used."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return time.thread_time() - start


def test_a_slow_party_holds_its_processor_for_its_slowdown_times_the_cpu() -> None:
    async def main() -> tuple[ComputeThread, list[float]]:
        cpu = ComputeThread("slow", slowdown=3.0)
        used = await asyncio.gather(*(cpu.run(lambda: _spin(0.002)) for _ in range(3)))
        cpu.shutdown()
        return cpu, list(used)

    cpu, used = asyncio.run(main())
    assert cpu.cpu_s >= sum(used) > 0
    # each operation is followed by a sleep of twice its CPU seconds, still holding the processor
    assert cpu.busy_s >= 3 * cpu.cpu_s * 0.999
    # each call's instants: asked, held, began in the thread, returned, back on the loop
    first, second, third = (call.times for call in cpu.calls)
    for call in cpu.calls:
        requested, acquired, began, returned, resumed = call.times
        assert requested <= acquired <= began <= returned <= resumed
        assert returned - began >= call.cpu_s * 0.999  # wall time of the computation: at least its CPU
        assert resumed - returned >= 2 * call.cpu_s * 0.999  # then the slow-down's sleep
    # all three asked at once; each later one held the processor once the one before let go of it
    assert first[0] <= second[0] <= third[0] < first[4] <= second[1] and second[4] <= third[1]


def test_operations_run_one_at_a_time_and_errors_come_back() -> None:
    async def main() -> list[str]:
        cpu = ComputeThread("one")
        order: list[str] = []

        def op(name: str) -> str:
            order.append(f"{name} in")
            _spin(0.001)
            order.append(f"{name} out")
            return name

        def fail() -> None:
            raise ValueError("refused")

        results = await asyncio.gather(
            cpu.run(lambda: op("a")), cpu.run(lambda: op("b")), cpu.run(fail), return_exceptions=True
        )
        cpu.shutdown()
        assert results[:2] == ["a", "b"] and isinstance(results[2], ValueError)
        return order

    assert asyncio.run(main()) == ["a in", "a out", "b in", "b out"]
