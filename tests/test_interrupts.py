"""Stopping ``dropsim run`` and ``dropsim sweep`` from outside, as a new user and a batch scheduler do.

Ctrl-C (SIGINT) and SIGTERM (what a scheduler sends at a time limit) end the command alike: a message, the
finished rounds kept, every interrupted run's manifest and ``runs.csv`` saying ``interrupted``, exit 130 or
143, no warning about leaked semaphores, and no process of the command left behind, a zombie included. The
test process makes itself a child subreaper while the command runs, so that an orphan the command leaves
comes to it and stays a zombie, as under an init that never reaps (this host's); it reaps them afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

SCENARIO = """
name: stop
seed: 1
rounds: 3000
population: 16
sampling: {clients_per_round: 5}
data: {dataset: synthetic, samples_per_client: 8}
model: {name: mlp}
fidelity: full
sweep: {seed: [1, 2]}
"""
AS_AT_A_TERMINAL = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from sim.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""``dropsim`` with SIGINT as at a terminal, even where the tests were started in the background by a shell that
ignores SIGINT for its background jobs (and so for their children)."""
PR_SET_CHILD_SUBREAPER = 36
STARTED_S = 120.0
"""How long the command may take to finish its first round of every run (spawned workers load torch)."""
ENDED_S = 60.0
"""How long it may take to stop once signalled."""


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This process adopts the orphans of its descendants while the test runs (and does not reap them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _processes() -> dict[int, tuple[str, str, int, int]]:
    """Every process: pid -> (name, state, parent, process group)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        state, parent, group = text[text.rindex(")") + 2 :].split()[:3]
        found[int(stat.parent.name)] = (name, state, int(parent), int(group))
    return found


def _left_by(command: int, seen: set[int]) -> list[str]:
    """The processes of ``command``'s group, or among ``seen``, still in the process table (zombies too)."""
    return [
        f"{pid} ({name}) {state}, parent {parent}"
        for pid, (name, state, parent, group) in sorted(_processes().items())
        if pid != command and (group == command or pid in seen)
    ]


def _clean_up(command: int) -> None:
    """Kill and reap what a failing test left of ``command`` (only its own process group)."""
    for pid, (_, _, parent, group) in _processes().items():
        if group == command and pid != command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if parent == os.getpid():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _start(tmp_path: Path, command: str, sig: int) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / "stop.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    entry = ["-c", AS_AT_A_TERMINAL] if sig == signal.SIGINT else ["-m", "sim"]
    jobs = ["--jobs", "2"] if command == "sweep" else []
    process = subprocess.Popen(
        [sys.executable, *entry, command, str(path), "--quiet", "--output", str(out), *jobs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: what it starts, and what a failing test kills
    )
    manifests = (
        [out / "runs" / f"seed={s}" / "manifest.json" for s in (1, 2)]
        if command == "sweep"
        else [out / "manifest.json"]
    )
    deadline = time.monotonic() + STARTED_S
    for _ in range(int(STARTED_S / 0.1)):  # until every run has finished a round
        if time.monotonic() > deadline or process.poll() is not None:
            break
        try:
            if all(json.loads(m.read_text())["rounds_completed"] >= 1 for m in manifests):
                return process, out
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    _clean_up(process.pid)
    process.kill()
    _, err = process.communicate()
    raise AssertionError(f"no round was finished within {STARTED_S} s: {err}")


def _stop(process: subprocess.Popen[str], sig: int, group: bool) -> tuple[str, set[int]]:
    """Signal the command (or its whole process group, as a terminal's Ctrl-C does); its stderr once it ended,
    and the processes it had started."""
    started = {pid for pid, (_, _, parent, grp) in _processes().items() if parent == process.pid or grp == process.pid}
    started.discard(process.pid)
    if group:
        os.killpg(process.pid, sig)
    else:
        process.send_signal(sig)
    try:
        _, err = process.communicate(timeout=ENDED_S)
    except subprocess.TimeoutExpired:
        _clean_up(process.pid)
        process.kill()
        process.communicate()
        raise AssertionError(f"the command did not end within {ENDED_S} s of the signal") from None
    return err, started


def _assert_nothing_left(process: subprocess.Popen[str], started: set[int]) -> None:
    time.sleep(0.5)  # an orphan's exit reaches its new parent
    left = _left_by(process.pid, started)
    _clean_up(process.pid)
    assert left == [], f"left behind: {left}"


def _assert_no_warning(err: str) -> None:
    assert "leaked semaphore" not in err and "resource_tracker" not in err, err
    assert "Traceback" not in err, err


EXPECTED = {
    signal.SIGINT: (130, "dropsim: interrupted; finished rounds are kept"),
    signal.SIGTERM: (143, "dropsim: terminated (SIGTERM); finished rounds are kept"),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "group"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, True)],
    ids=["sigterm", "sigint", "ctrl-c-to-the-group", "sigterm-to-the-group"],
)
def test_a_parallel_sweep_stops_alike_on_sigint_and_sigterm(tmp_path, subreaper, sig, group):
    process, out = _start(tmp_path, "sweep", sig)
    err, started = _stop(process, sig, group)
    code, message = EXPECTED[sig]
    assert process.returncode == code, err
    assert message in err
    _assert_no_warning(err)
    assert len(started) >= 2  # its two workers, at least
    _assert_nothing_left(process, started)
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["status"]) == ["interrupted", "interrupted"]
    for run_id in runs["run_id"]:
        manifest = json.loads((out / "runs" / run_id / "manifest.json").read_text())
        assert manifest["status"] == "interrupted" and manifest["rounds_completed"] >= 1
        rounds = pd.read_csv(out / "runs" / run_id / "rounds.csv")
        assert manifest["rounds_completed"] <= len(rounds) <= manifest["rounds_completed"] + 1


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_dropsim_run_stops_alike_on_sigint_and_sigterm(tmp_path, subreaper, sig):
    process, out = _start(tmp_path, "run", sig)
    err, started = _stop(process, sig, group=False)
    code, message = EXPECTED[sig]
    assert process.returncode == code, err
    assert message in err
    _assert_no_warning(err)
    _assert_nothing_left(process, started)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["rounds_completed"] >= 1
    assert "tables_sha256" not in manifest  # an interrupted run is no result


@pytest.mark.slow
def test_workers_answer_each_job_and_are_reaped_when_stopped():
    """The pool alone: a job's result, a worker killed mid-job (the other goes on), and stopping interrupts the
    running job and leaves no process, a zombie included; a job whose worker is still starting up is killed
    (nothing of it has begun)."""
    from sim.runner.workers import Died, Done, Interrupted, Workers

    pool: Workers[float] = Workers(time.sleep, 2)
    pool.start("quick", 0.0)
    assert pool.wait(timeout=STARTED_S) == [("quick", 0.0, Done(None))]
    pool.start("killed", 600.0)
    pool.start("long", 600.0)
    started = set(pool.pids.values())
    assert len(started) == 2
    os.kill(pool.pids["killed"], signal.SIGKILL)  # as the out-of-memory killer would
    assert pool.wait(timeout=STARTED_S) == [("killed", 600.0, Died(-signal.SIGKILL))]
    for _ in range(int(STARTED_S / 0.1)):  # until its worker has started up and begun it
        if pool.begun() == ["long"]:
            break
        time.sleep(0.1)
    assert pool.stop(grace=STARTED_S) == [("long", 600.0, Interrupted())]
    assert pool.pids == {} and [pid for pid in started if pid in _processes()] == []
    pool.start("starting", 600.0)
    assert pool.stop(grace=STARTED_S) == [("starting", 600.0, Died(-signal.SIGKILL))]
