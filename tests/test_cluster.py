"""Sweeps on a Dask distributed cluster (a local one on 127.0.0.1): the same tables as a local sweep, resumed
by either, failures reported per point, an unreachable scheduler named; what a worker sends back is checked."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sim.cli import main
from sim.cluster import ClusterError, payload, rebuild, store
from sim.runner import scenario_digest
from sim.scenario import load
from sim.sweeps import run_sweep

ROOT = Path(__file__).resolve().parent.parent
SWEEP = """
name: cluster
seed: 3
rounds: 2
population: 30
sampling: {clients_per_round: 6}
dropout: {rate: 0.2, stage: before_upload}
data: {dataset: digits}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 20}
aggregation: {protocol: secagg, bits: 20}
sweep: {dropout.rate: [0.0, 0.4], seed: [3, 4]}
"""
TABLES = ("rounds.csv", "clients.csv", "stages.csv")


@pytest.fixture(scope="module")
def scheduler():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


def write(tmp_path: Path, text: str = SWEEP) -> Path:
    file = tmp_path / "cluster.yaml"
    file.write_text(text)
    return file


def test_a_point_survives_the_trip_to_a_worker(tmp_path):
    file = write(tmp_path)
    grid = load(file)
    for point in grid.points():
        again = rebuild(payload(grid, str(file), point))
        assert again == point and again.run_id == point.run_id and again.swept == point.swept
        assert scenario_digest(again) == scenario_digest(point)


def test_files_sent_back_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(ClusterError, match="unusable names"):
        store({"run_id": "ok", "files": {"../escape.csv": b"x"}}, tmp_path)
    with pytest.raises(ClusterError, match="unusable names"):
        store({"run_id": "../up", "files": {}}, tmp_path)
    with pytest.raises(ClusterError, match="not bytes"):
        store({"run_id": "ok", "files": {"rounds.csv": "text"}}, tmp_path)
    assert not (tmp_path / "escape.csv").exists() and not (tmp_path / "ok").exists()  # nothing written
    directory = store({"run_id": "ok", "files": {"rounds.csv": b"round\n1\n"}}, tmp_path)
    assert (directory / "rounds.csv").read_bytes() == b"round\n1\n"


@pytest.mark.slow
def test_a_cluster_sweep_writes_the_same_tables_as_a_local_one(tmp_path, scheduler):
    file = write(tmp_path)
    local = run_sweep(load(file, [], str(tmp_path / "local")), str(file), progress=False)
    remote = run_sweep(load(file, [], str(tmp_path / "remote")), str(file), progress=False, scheduler=scheduler)
    assert [s.status for s in local] == [s.status for s in remote] == ["complete"] * 4
    assert (tmp_path / "local" / "rounds.csv").read_bytes() == (tmp_path / "remote" / "rounds.csv").read_bytes()
    for status in local:
        for table in TABLES:
            mine = (tmp_path / "local" / "runs" / status.run_id / table).read_bytes()
            assert mine == (tmp_path / "remote" / "runs" / status.run_id / table).read_bytes(), table
    # either kind of sweep finds the other's runs finished
    again = run_sweep(load(file, [], str(tmp_path / "remote")), str(file), progress=False)
    assert [s.status for s in again] == ["skipped"] * 4


@pytest.mark.slow
def test_a_failing_point_fails_alone_on_the_cluster(tmp_path, scheduler):
    text = SWEEP.replace(
        "sweep: {dropout.rate: [0.0, 0.4], seed: [3, 4]}",
        "sweep: {data: [{dataset: digits}, {dataset: cifar10, path: /nonexistent}]}",
    )
    file = write(tmp_path, text)
    statuses = run_sweep(load(file, [], str(tmp_path / "o")), str(file), progress=False, scheduler=scheduler)
    assert [s.status for s in statuses] == ["complete", "failed"]
    assert "/nonexistent" in statuses[1].error
    assert (tmp_path / "o" / "runs" / statuses[1].run_id / "error.txt").is_file()  # its details came back


def test_an_unreachable_scheduler_is_named(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr("sim.cluster.CONNECT_TIMEOUT_S", 2.0)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    file = write(tmp_path)
    code = main(
        ["sweep", str(file), "--scheduler", f"tcp://127.0.0.1:{port}", "--quiet", "--output", str(tmp_path / "o")]
    )
    assert code == 2
    assert f"--scheduler tcp://127.0.0.1:{port}: cannot reach the Dask scheduler" in capsys.readouterr().err
