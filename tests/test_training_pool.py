"""Training a round's clients in worker processes gives the updates training here gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.runner import Simulation
from sim.scenario import load

ROOT = Path(__file__).resolve().parents[1]


def _run(workers: int, rounds: int = 3) -> list[tuple[object, ...]]:
    sc = load(
        ROOT / "scenarios" / "secagg.yaml",
        [
            f"rounds={rounds}",
            "sampling.clients_per_round=6",
            "training.local_epochs=1",
            f"training.workers={workers}",
            "training.clients_at_once=1",  # bit for bit: each client alone (together, groups follow the workers)
        ],
    ).base()
    simulation = Simulation(sc)
    try:
        out = []
        for _ in range(rounds):
            result = simulation.step()
            record = result.record
            out.append((result.model_sha256, result.accuracy, record.t_end, record.outcome, record.survivors))
        assert simulation.learner is not None
        assert (simulation.learner._pool is not None) == (workers > 1)  # the workers did train
        return out
    finally:
        simulation.close()


@pytest.mark.slow
def test_two_training_workers_give_the_same_rounds_bit_for_bit() -> None:
    alone, pooled = _run(1), _run(2)
    assert pooled == alone
    assert len({digest for digest, *_ in alone}) == 3  # the model changed every round


def test_the_pool_is_not_started_with_one_worker() -> None:
    sc = load(ROOT / "scenarios" / "secagg.yaml", ["rounds=1", "sampling.clients_per_round=3"]).base()
    simulation = Simulation(sc)
    simulation.step()
    assert simulation.learner is not None and simulation.learner._pool is None
    simulation.close()


@pytest.mark.slow
def test_closing_stops_the_workers_with_training_still_running() -> None:
    sc = load(ROOT / "scenarios" / "secagg.yaml", ["training.workers=2", "training.local_epochs=20"]).base()
    simulation = Simulation(sc)
    learner = simulation.learner
    assert learner is not None
    learner.prefetch(1, list(range(40)))  # far more training than the test waits for
    pool = learner._pool
    assert pool is not None
    processes = list(pool._executor._processes.values())  # type: ignore[attr-defined]
    simulation.close()
    assert processes and not any(p.is_alive() for p in processes)
    assert learner._pool is None


_ORPHAN_SCRIPT = """
import sys, time
from sim.runner import Simulation
from sim.scenario import load
sc = load(sys.argv[1], ["training.workers=2", "training.local_epochs=20"]).base()
simulation = Simulation(sc)
simulation.learner.prefetch(1, list(range(40)))
print(" ".join(str(p.pid) for p in simulation.learner._pool._executor._processes.values()), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_workers_exit_when_their_parent_is_killed() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(ROOT / "scenarios" / "secagg.yaml")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert pids
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    for _ in range(100):  # at most 20 s
        if not any(alive(p) for p in pids):
            break
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
