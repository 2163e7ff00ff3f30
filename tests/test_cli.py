"""The ``dropsim`` command as a user meets it: exit codes, messages on stderr, files written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.cli import main

SCENARIO = """
name: cli
seed: 4
rounds: 3
population: 20
sampling: {clients_per_round: 5}
dropout: {rate: 0.2}
data: {dataset: digits}
model: {name: mlp}
training: {local_epochs: 2, batch_size: 10}
sweep: {dropout.rate: [0, 0.4]}
"""


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "cli.yaml"
    path.write_text(SCENARIO)
    return path


def test_check_accepts_a_valid_file(scenario_file, capsys):
    assert main(["check", str(scenario_file)]) == 0
    out = capsys.readouterr().out
    assert (
        "ok: cli, 3 rounds, population 20, aggregation fedavg" in out
        and "sweep of 2 runs over dropout.rate; all valid" in out
    )


def test_check_rejects_a_bad_file_naming_key_value_and_line(scenario_file, capsys):
    scenario_file.write_text(SCENARIO.replace("dropout: {rate: 0.2}", "dropout: {rate: 0.2, stag: x}"))
    assert main(["check", str(scenario_file)]) == 2
    err = capsys.readouterr().err
    assert f"dropsim: {scenario_file}:7: dropout.stag: is not a known key; did you mean 'dropout.stage'?" in err


def test_check_reports_a_bad_set(scenario_file, capsys):
    assert main(["check", str(scenario_file), "--set", "rounds=0"]) == 2
    assert "--set rounds=0: rounds: is 0, out of range; allowed: a whole number >= 1" in capsys.readouterr().err


def test_run_writes_results_where_asked_and_prints_a_summary(scenario_file, tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["run", str(scenario_file), "--output", str(out), "--set", "rounds=2", "--quiet"])
    assert code == 0
    captured = capsys.readouterr()
    assert "defines a sweep of 2 runs; this runs the scenario as written" in captured.err
    assert "final acc" in captured.out and "cli" in captured.out
    rounds = pd.read_csv(out / "rounds.csv")
    assert list(rounds["round"]) == [1, 2] and (rounds["dropped"] == 1).all()
    assert json.loads((out / "manifest.json").read_text())["scenario"]["output"] == str(out)


def test_run_reports_data_problems_as_bad_input_before_writing(scenario_file, tmp_path, capsys):
    code = main(["run", str(scenario_file), "--output", str(tmp_path / "r"), "--set", "population=4000", "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--set population=4000: population: is 4000, more than the 1438 training samples of digits" in err
    assert not (tmp_path / "r").exists()


def test_check_looks_at_the_machine_too(scenario_file, tmp_path, capsys):
    args = ["check", str(scenario_file), "--set", "data={dataset: femnist, path: /nonexistent}"]
    assert main([*args, "--set", f"costs.profile={tmp_path / 'p.json'}"]) == 2
    err = capsys.readouterr().err
    assert "data.path: is '/nonexistent': there is no such folder" in err
    assert f"costs.profile: cost profile {tmp_path / 'p.json'}: cannot be read" in err
    assert main(["check", str(scenario_file), "--set", "sweep={population: [50, 5000]}"]) == 2
    assert "population: is 5000, more than the 1438 training samples" in capsys.readouterr().err
    (tmp_path / "p.json").write_text('{"format": 1, "operations": {"train.mlp.1x8x8.10": {"coef": {}}}}')
    assert main(["check", str(scenario_file), "--set", f"costs.profile={tmp_path / 'p.json'}"]) == 2
    assert "does not measure wire.encode, wire.decode, fedavg.accumulate" in capsys.readouterr().err


def test_run_keeps_a_finished_run_and_refuses_to_overwrite_another(scenario_file, tmp_path, capsys):
    out = tmp_path / "res"
    base = ["run", str(scenario_file), "--output", str(out), "--quiet"]
    assert main([*base, "--set", "rounds=1"]) == 0
    stamp = (out / "rounds.csv").stat().st_mtime_ns
    capsys.readouterr()
    assert main([*base, "--set", "rounds=1"]) == 0  # the same scenario again: nothing to do, the summary is shown
    captured = capsys.readouterr()
    assert "already holds this scenario's complete run (--force runs it again)" in captured.err
    assert "cli" in captured.out and (out / "rounds.csv").stat().st_mtime_ns == stamp
    assert main([*base, "--set", "rounds=2"]) == 2
    assert "holds the results of another scenario (cli); use --force to overwrite them" in capsys.readouterr().err
    assert main([*base, "--set", "rounds=2", "--force"]) == 0
    assert len(pd.read_csv(out / "rounds.csv")) == 2
    (tmp_path / "afile").write_text("x")
    assert main(["run", str(scenario_file), "--output", str(tmp_path / "afile"), "--quiet"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["run", str(scenario_file), "--output", "/proc/nope/x", "--quiet"]) == 2
    assert "cannot create the results folder" in capsys.readouterr().err


def test_sweep_then_plot(scenario_file, tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", str(scenario_file), "--output", str(out), "--jobs", "2", "--quiet"]) == 0
    assert "results:" in capsys.readouterr().out
    assert len(pd.read_csv(out / "rounds.csv")) == 6
    figs = tmp_path / "figs"
    assert main(["plot", str(out), "--out", str(figs), "--by", "dropout.rate"]) == 0
    names = sorted(p.name for p in figs.iterdir())
    assert names == sorted(
        f"{n}.{e}" for n in ("accuracy_vs_round", "accuracy_vs_time", "round_time") for e in ("png", "pdf")
    )
    assert (figs / "accuracy_vs_round.pdf").read_bytes().startswith(b"%PDF")
    assert (figs / "round_time.png").read_bytes().startswith(b"\x89PNG")
    assert main(["plot", str(out / "runs" / "dropout.rate=0"), str(out), "--out", str(tmp_path / "f2")]) == 0


def test_plot_rejects_a_folder_without_results(tmp_path, capsys):
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert "neither a run folder" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "f"), "--by", "x"]) == 2
    assert main(["plot", str(tmp_path / "nowhere"), "--out", str(tmp_path / "f")]) == 2
    assert f"{tmp_path / 'nowhere'}: does not exist" in capsys.readouterr().err


def test_profile_refuses_a_missing_folder_before_measuring(tmp_path, capsys):
    assert main(["profile", "--quick", "--out", str(tmp_path / "no" / "p.json")]) == 2
    assert "does not exist; create it first" in capsys.readouterr().err


def test_the_console_script_is_installed(scenario_file):
    done = subprocess.run(
        [Path(sys.executable).with_name("dropsim"), "check", str(scenario_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "ok: cli" in done.stdout


NOT_FOLDER_NAMES = ["../../x", "../x", "/tmp/dropsim-elsewhere", "a/b", "a\\b", "..", ".", "x\ty", "x\0y"]


@pytest.mark.parametrize("name", NOT_FOLDER_NAMES)
def test_a_name_that_is_no_folder_name_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys, name):
    """``name`` gives the default output folder results/<name>: a path there would put the results anywhere
    (``../../x`` beside the working directory), so it is refused, naming the key and the value."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # results/../../x is tmp_path/x
    path = work / "named.yaml"
    path.write_text(SCENARIO.replace("name: cli", f"name: {json.dumps(name)}").replace("rounds: 3", "rounds: 1"))
    for command in ("check", "run", "sweep"):
        assert main([command, str(path), "--quiet"] if command != "check" else [command, str(path)]) == 2, command
        err = capsys.readouterr().err
        assert f"dropsim: {path}:2: name: is {name!r}, which " in err, err
        assert "a name is one folder name" in err and "other than '.' and '..'" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [Path("work"), Path("work/named.yaml")]


def test_an_explicit_output_folder_stays_the_users_choice(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "spaced.yaml"
    path.write_text(SCENARIO.replace("name: cli", "name: my run (2)").replace("rounds: 3", "rounds: 1"))
    assert main(["run", str(path), "--quiet"]) == 0  # any other text is a folder name, kept as written
    assert (tmp_path / "results" / "my run (2)" / "rounds.csv").is_file()
    assert main(["run", str(path), "--quiet", "--output", str(tmp_path / "elsewhere" / "deep")]) == 0
    assert (tmp_path / "elsewhere" / "deep" / "rounds.csv").is_file()


def test_every_shipped_scenario_keeps_its_name_and_output_folder():
    """The name rule refuses no shipped scenario, and their output folders are the ones they always had."""
    from sim.results.folders import check_name
    from sim.scenario import load

    root = Path(__file__).resolve().parent.parent / "scenarios"
    shipped = sorted(p for p in root.rglob("*.yaml") if p.name != "reproductions.yaml")
    assert len(shipped) >= 25
    for file in shipped:
        written = yaml.safe_load(file.read_text())
        base = load(file).base()
        check_name(base)
        assert base.name == written.get("name", file.stem)
        assert base.output == written.get("output", f"results/{base.name}"), file
