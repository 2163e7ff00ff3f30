"""The Python API (sim.api, re-exported from sim): the same tables and errors as the dropsim command."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim.cli.main import main
from sim.scenario import ScenarioError

SMALL = {
    "name": "api",
    "seed": 3,
    "rounds": 2,
    "population": 10,
    "sampling": {"clients_per_round": 5},
    "data": {"dataset": "digits"},
    "model": {"name": "mlp"},
    "aggregation": {"protocol": "secagg", "bits": 20},
    "dropout": {"rate": 0.2, "stage": "before_upload"},
    "fidelity": "full",
}


def test_the_api_is_reexported_from_sim_and_not_shadowed_by_its_modules():
    import sim.sweeps

    assert sim.run is sim.api.run and sim.sweep is sim.api.sweep and callable(sim.sweep)
    assert sim.load_scenario is sim.api.load_scenario and sim.privacy_table is sim.api.privacy_table
    with pytest.raises(AttributeError):
        _ = sim.no_such_thing


def test_sim_run_and_dropsim_run_write_identical_tables(tmp_path):
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    result = sim.run(SMALL, output=tmp_path / "from-python", progress=False)
    assert main(["run", str(path), "--output", str(tmp_path / "from-cli"), "--quiet"]) == 0
    for table in ("rounds", "clients", "stages"):
        python = (tmp_path / "from-python" / f"{table}.csv").read_bytes()
        assert python == (tmp_path / "from-cli" / f"{table}.csv").read_bytes(), table
        pd.testing.assert_frame_equal(getattr(result, table), pd.read_csv(tmp_path / "from-python" / f"{table}.csv"))
    assert result.path == tmp_path / "from-python" and result.ran
    assert result.manifest["scenario"]["name"] == "api" and len(result.rounds) == 2
    assert result.summary.rounds == 2


def test_a_finished_run_is_read_again_unless_forced(tmp_path):
    first = sim.run(SMALL, output=tmp_path / "run", progress=False)
    again = sim.run(SMALL, output=tmp_path / "run", progress=False)
    assert not again.ran
    pd.testing.assert_frame_equal(first.rounds, again.rounds)
    assert sim.run(SMALL, output=tmp_path / "run", progress=False, force=True).ran


def test_a_scenario_from_a_file_a_mapping_a_grid_or_a_scenario(tmp_path):
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    grid = sim.load_scenario(path, overrides=["rounds=1"], output=str(tmp_path / "a"))
    scenario = grid.base()
    assert (scenario.rounds, scenario.output) == (1, str(tmp_path / "a"))
    assert sim.load_scenario(SMALL, ["rounds=1"]).base().rounds == 1
    tables = [sim.run(s, output=tmp_path / f"r{k}", progress=False).rounds for k, s in enumerate((grid, scenario))]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    with pytest.raises(TypeError, match="overrides"):
        sim.run(scenario, overrides=["rounds=2"])


def test_errors_are_the_commands_naming_where_what_and_what_is_allowed(tmp_path):
    with pytest.raises(ScenarioError) as caught:
        sim.load_scenario({**SMALL, "dropout": {"rate": 1.5}}).base()
    text = str(caught.value)
    assert "<mapping>" in text and "dropout.rate" in text and "1.5" in text
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nrounds: -1\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml:2.*rounds"):
        sim.run(path, progress=False)
    with pytest.raises(ScenarioError, match="--set"):
        sim.load_scenario(SMALL, ["dropout.rate=2"]).base()


def test_a_sweep_hands_back_every_points_tables(tmp_path):
    swept = {**SMALL, "rounds": 1, "sweep": {"dropout.rate": [0.0, 0.2]}}
    result = sim.sweep(swept, output=tmp_path / "sweep", jobs=2, progress=False)
    assert [s.status for s in result.statuses] == ["complete", "complete"] and not result.failed
    assert sorted(result.runs) == sorted(result.rounds["run_id"].unique())
    assert len(result.rounds) == 2 and set(result.clients["run_id"]) == set(result.runs)
    combined = pd.read_csv(tmp_path / "sweep" / "rounds.csv")
    assert list(combined["run_id"]) == list(result.rounds["run_id"])
    again = sim.sweep(swept, output=tmp_path / "sweep", progress=False)  # finished points are kept
    assert [s.status for s in again.statuses] == ["skipped", "skipped"]
    with pytest.raises(ValueError, match="jobs"):
        sim.sweep(swept, jobs=0)


def test_the_privacy_table_is_the_commands(tmp_path, capsys):
    path = Path(__file__).resolve().parents[1] / "scenarios" / "privacy.yaml"
    table = sim.privacy_table(path, dropouts=[0.0, 0.2])
    out = tmp_path / "privacy.csv"
    assert main(["privacy", str(path), "--dropout", "0", "0.2", "--csv", str(out)]) == 0
    pd.testing.assert_frame_equal(table, pd.read_csv(out), check_dtype=False)
    with pytest.raises(ValueError, match="strategies \\['magic'\\] are unknown"):
        sim.privacy_table(path, strategies=["magic"])
    with pytest.raises(ValueError, match="outside"):
        sim.privacy_table(path, dropouts=[1.0])


def test_a_name_that_is_a_path_is_refused_by_run_and_sweep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = {**SMALL, "name": "../outside", "rounds": 1}
    for call in (sim.run, sim.sweep):
        with pytest.raises(
            ScenarioError, match=r"<mapping>.*name: is '\.\./outside', which holds '/'.*one folder name"
        ):
            call(bad, progress=False)
    assert sorted(tmp_path.iterdir()) == []  # results/../outside would be tmp_path/outside
