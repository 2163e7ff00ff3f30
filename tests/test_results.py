"""Result tables: columns as documented, written round by round, and nothing finished lost on a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sim.results.read import read_run_table
from sim.results.tables import CLIENT_COLUMNS, ROUND_COLUMNS, STAGE_COLUMNS
from sim.results.writer import cell, csv_bytes
from sim.runner import Simulation, run_scenario
from sim.scenario import load

SCENARIO = """
name: r
seed: 2
rounds: 5
population: 12
sampling: {clients_per_round: 4}
dropout: {rate: 0.25}
data: {dataset: synthetic, samples_per_client: 10}
model: {name: mlp}
fidelity: timing
sweep: {dropout.rate: [0.25], seed: [2]}
"""


def point(tmp_path: Path):
    path = tmp_path / "r.yaml"
    path.write_text(SCENARIO)
    return load(path, output=str(tmp_path / "out")).points()[0]


def test_tables_have_the_documented_columns_and_swept_values(tmp_path):
    scenario = point(tmp_path)
    out = tmp_path / "out"
    run_scenario(scenario, out, progress=False)
    rounds = pd.read_csv(out / "rounds.csv")
    assert tuple(rounds.columns) == (*ROUND_COLUMNS, "time_upload", "dropout.rate", "seed")
    assert tuple(pd.read_csv(out / "clients.csv").columns) == (*CLIENT_COLUMNS, "dropout.rate", "seed")
    assert tuple(pd.read_csv(out / "stages.csv").columns) == (*STAGE_COLUMNS, "dropout.rate", "seed")
    assert list(rounds["round"]) == [1, 2, 3, 4, 5]
    assert (rounds["dropout.rate"] == 0.25).all() and (rounds["run_id"] == "dropout.rate=0.25_seed=2").all()
    assert (rounds["t_start"].iloc[1:].to_numpy() == rounds["t_end"].iloc[:-1].to_numpy()).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["rounds_completed"] == 5
    assert manifest["scenario"]["dropout"]["rate"] == 0.25 and manifest["seed"] == 2
    assert manifest["swept"] == {"dropout.rate": 0.25, "seed": 2}
    assert {"numpy", "torch", "simpy", "dropsim"} <= set(manifest["versions"])
    assert manifest["host"]["cpus"] >= 1 and manifest["model_parameters"] > 0


def test_an_interrupted_run_keeps_its_finished_rounds(tmp_path, monkeypatch):
    scenario = point(tmp_path)
    out = tmp_path / "out"
    real_step = Simulation.step

    def step(self):
        if self.round == 3:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(Simulation, "step", step)
    with pytest.raises(KeyboardInterrupt):
        run_scenario(scenario, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["rounds_completed"] == 3
    assert list(pd.read_csv(out / "rounds.csv")["round"]) == [1, 2, 3]
    assert sorted(pd.read_csv(out / "clients.csv")["round"].unique()) == [1, 2, 3]


def test_a_failing_run_records_its_error(tmp_path, monkeypatch):
    scenario = point(tmp_path)
    out = tmp_path / "out"

    def boom(self):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Simulation, "step", boom)
    with pytest.raises(RuntimeError):
        run_scenario(scenario, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["error"] == "RuntimeError: disk on fire"
    assert "Traceback" in manifest["traceback"]


def test_rows_beyond_the_committed_round_are_ignored(tmp_path):
    scenario = point(tmp_path)
    out = tmp_path / "out"
    run_scenario(scenario, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["rounds_completed"] = 4  # as if killed after writing round 5's rows, before committing it
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert list(read_run_table(out, "rounds")["round"]) == [1, 2, 3, 4]
    assert read_run_table(out, "clients")["round"].max() == 4


def test_cells_are_exact_and_missing_values_empty():
    assert cell(0.1 + 0.2) == "0.30000000000000004"
    assert cell(float("nan")) == "" and cell(None) == ""
    data = csv_bytes([{"a": 1 / 3, "b": "x,y"}], ["a", "b"], header=True)
    assert data == b'a,b\n0.3333333333333333,"x,y"\n'
    assert float(pd.read_csv(__import__("io").BytesIO(data))["a"][0]) == 1 / 3
