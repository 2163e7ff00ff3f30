"""Sweeps: worker processes, one combined table, resume, and failures that do not lose other runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from sim.results.read import read_run_table
from sim.scenario import ScenarioError, load
from sim.sweeps import run_sweep

SCENARIO = """
name: sw
seed: 1
rounds: 3
population: 16
sampling: {clients_per_round: 5}
data: {dataset: synthetic, samples_per_client: 8}
model: {name: mlp}
fidelity: timing
sweep: {dropout.rate: [0, 0.4], seed: [1, 2]}
"""


def grid(tmp_path: Path, text: str = SCENARIO, *overrides: str):
    path = tmp_path / "sw.yaml"
    path.write_text(text)
    return load(path, list(overrides), output=str(tmp_path / "out")), str(path)


def test_parallel_sweep_matches_serial_and_combines_rounds(tmp_path):
    g, src = grid(tmp_path)
    statuses = run_sweep(g, src, jobs=2, progress=False)
    assert [s.status for s in statuses] == ["complete"] * 4
    out = tmp_path / "out"
    combined = pd.read_csv(out / "rounds.csv")
    assert list(combined["run_id"].unique()) == [
        "dropout.rate=0_seed=1",
        "dropout.rate=0_seed=2",
        "dropout.rate=0.4_seed=1",
        "dropout.rate=0.4_seed=2",
    ]
    assert len(combined) == 12
    assert set(combined.groupby("dropout.rate")["dropped"].unique().map(tuple)) == {(0,), (2,)}
    # A one-process run of a point gives the very same tables as the worker did.
    serial = tmp_path / "serial"
    serial.mkdir()
    g2, src2 = grid(serial)
    run_sweep(g2, src2, jobs=1, progress=False)
    for rid in combined["run_id"].unique():
        a = (out / "runs" / rid / "rounds.csv").read_bytes()
        b = (serial / "out" / "runs" / rid / "rounds.csv").read_bytes()
        assert a == b
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["status"]) == ["complete"] * 4 and (runs["rounds"] == 3).all()
    assert json.loads((out / "sweep.json").read_text())["run_ids"] == list(runs["run_id"])


def test_resume_skips_finished_runs_and_reruns_changed_ones(tmp_path):
    g, src = grid(tmp_path)
    run_sweep(g, src, jobs=1, progress=False)
    out = tmp_path / "out"
    stamp = (out / "runs" / "dropout.rate=0_seed=1" / "manifest.json").stat().st_mtime_ns
    statuses = run_sweep(g, src, jobs=1, progress=False)
    assert [s.status for s in statuses] == ["skipped"] * 4
    assert (out / "runs" / "dropout.rate=0_seed=1" / "manifest.json").stat().st_mtime_ns == stamp
    assert len(pd.read_csv(out / "rounds.csv")) == 12
    # Changing the scenario invalidates the finished runs.
    g3, _ = grid(tmp_path, SCENARIO, "rounds=2")
    assert [s.status for s in run_sweep(g3, src, jobs=1, progress=False)] == ["complete"] * 4


def test_a_failing_run_is_reported_and_the_others_finish(tmp_path):
    # A population larger than digits' training set passes the scenario checks but fails when the
    # run partitions the data.
    text = SCENARIO.replace("sweep: {dropout.rate: [0, 0.4], seed: [1, 2]}", "sweep: {population: [16, 5000]}")
    text = text.replace("data: {dataset: synthetic, samples_per_client: 8}", "data: {dataset: digits}")
    g, src = grid(tmp_path, text)
    statuses = run_sweep(g, src, jobs=2, progress=False)
    assert [s.status for s in statuses] == ["complete", "failed"]
    assert "population 5000 exceeds the 1438 training samples of digits" in statuses[1].error
    out = tmp_path / "out"
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False)
    assert list(runs["status"]) == ["complete", "failed"]
    assert "Traceback" in (out / "runs" / "population=5000" / "error.txt").read_text()
    assert list(pd.read_csv(out / "rounds.csv")["run_id"].unique()) == ["population=16"]


INTERRUPTIBLE = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from sim.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""``dropsim`` with SIGINT as at a terminal (KeyboardInterrupt), even where the tests were started in the
background by a shell that ignores SIGINT for its background jobs (and so for their children)."""


def _long_sweep(tmp_path: Path, rounds: int) -> tuple[subprocess.Popen[str], Path]:
    """Start a two-run, two-worker sweep of ``rounds`` full-fidelity rounds; return it once both run."""
    text = SCENARIO.replace("rounds: 3", f"rounds: {rounds}").replace("fidelity: timing", "fidelity: full")
    text = text.replace("sweep: {dropout.rate: [0, 0.4], seed: [1, 2]}", "sweep: {seed: [1, 2]}")
    path = tmp_path / "long.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", INTERRUPTIBLE, "sweep", str(path), "--jobs", "2", "--quiet", "--output", str(out)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a failing test can stop the workers too
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("runs/*/rounds.csv"))) < 2:
        time.sleep(0.2)
    time.sleep(1)
    return proc, out


def _finish(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, which would run on
        proc.communicate()
        raise AssertionError(f"the sweep did not finish {what}") from None
    return err


@pytest.mark.slow
def test_interrupting_a_parallel_sweep_stops_its_workers_and_resume_finishes(tmp_path):
    proc, out = _long_sweep(tmp_path, rounds=3000)
    proc.send_signal(signal.SIGINT)  # to the main process only, as `timeout -s INT` or `kill -INT` would
    err = _finish(proc, 30, "within 30 s of SIGINT")
    assert proc.returncode == 130, err
    assert "interrupted; finished rounds are kept" in err
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["status"]) == {"interrupted"}
    for rid in runs["run_id"]:
        manifest = json.loads((out / "runs" / rid / "manifest.json").read_text())
        assert manifest["status"] == "interrupted"  # closed by its worker, or here if it had to be killed
        # A worker stopped between appending a round and committing it leaves one extra row; readers
        # keep the committed rounds only.
        written = len(pd.read_csv(out / "runs" / rid / "rounds.csv"))
        assert manifest["rounds_completed"] <= written <= manifest["rounds_completed"] + 1
        assert len(read_run_table(out / "runs" / rid)) == manifest["rounds_completed"]


def _workers(pid: int) -> list[int]:
    """Worker processes (spawned by multiprocessing) among the children of ``pid``."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                found.append(int(child))
    return found


@pytest.mark.slow
def test_a_killed_worker_costs_a_retry_not_the_sweep(tmp_path):
    proc, out = _long_sweep(tmp_path, rounds=400)
    workers = _workers(proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)  # as the out-of-memory killer would
    err = _finish(proc, 180, "after a worker was killed")
    assert proc.returncode == 0, err
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["status"]) == ["complete", "complete"] and (runs["rounds"] == 400).all()


def test_a_sweep_refuses_a_name_that_is_a_path_before_writing(tmp_path):
    g, src = grid(tmp_path, SCENARIO.replace("name: sw", "name: ../up"))
    with pytest.raises(ScenarioError, match=r"name: is '\.\./up', which holds '/'"):
        run_sweep(g, src, jobs=2, progress=False)
    assert not (tmp_path / "out").exists()
