"""A finished run's tables as its run wrote them: the manifest's SHA-256 of each, checked wherever a finished
run is shown again (``dropsim run`` and ``sweep`` finding it, ``sim.run``, ``dropsim plot``), and manifests from
before the digests still read, unverified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import sim
from sim.cli import main
from sim.errors import InputError

SCENARIO = """
name: integ
seed: 5
rounds: 2
population: 12
sampling: {clients_per_round: 4}
dropout: {rate: 0.25}
data: {dataset: synthetic, samples_per_client: 8}
model: {name: mlp}
fidelity: timing
sweep: {seed: [5, 6]}
"""
TABLES = ("rounds.csv", "clients.csv", "stages.csv")


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "integ.yaml"
    path.write_text(SCENARIO)
    return path


def _run(scenario_file: Path, out: Path, *extra: str) -> int:
    return main(["run", str(scenario_file), "--output", str(out), "--quiet", *extra])


def _edit(path: Path) -> None:
    """Change one cell of a table's last row, as a hand edit would (the file stays valid CSV)."""
    lines = path.read_text().splitlines(keepends=True)
    cells = lines[-1].split(",")
    cells[1] = str(int(cells[1]) + 100)  # the round (or client) number: an integer in every table
    lines[-1] = ",".join(cells)
    path.write_text("".join(lines))


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def test_a_complete_run_records_the_sha256_of_each_table(scenario_file, tmp_path):
    out = tmp_path / "res"
    assert _run(scenario_file, out) == 0
    digests = _manifest(out)["tables_sha256"]
    assert digests == {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in TABLES}


@pytest.mark.parametrize("table", TABLES)
def test_dropsim_run_names_a_table_edited_since_and_force_runs_it_again(scenario_file, tmp_path, capsys, table):
    out = tmp_path / "res"
    assert _run(scenario_file, out) == 0
    written = {name: (out / name).read_bytes() for name in TABLES}
    _edit(out / table)
    capsys.readouterr()
    assert _run(scenario_file, out) == 2
    captured = capsys.readouterr()
    assert f"dropsim: {out / table}: changed since its run completed" in captured.err
    assert "--force runs it again" in captured.err
    assert "final acc" not in captured.out  # the edited table is not shown as the run's result
    assert _run(scenario_file, out, "--force") == 0
    assert {name: (out / name).read_bytes() for name in TABLES} == written  # the same run, the same bytes


def test_a_missing_table_is_named_too(scenario_file, tmp_path, capsys):
    out = tmp_path / "res"
    assert _run(scenario_file, out) == 0
    (out / "stages.csv").unlink()
    capsys.readouterr()
    assert _run(scenario_file, out) == 2
    err = capsys.readouterr().err
    assert f"{out / 'stages.csv'}: cannot be read" in err and "--force runs it again" in err


def test_sim_run_raises_naming_the_edited_table_and_force_runs_it_again(scenario_file, tmp_path):
    out = tmp_path / "res"
    first = sim.run(scenario_file, output=out, progress=False)
    expected = first.rounds
    _edit(out / "rounds.csv")
    with pytest.raises(InputError, match=r"rounds\.csv: changed since its run completed.*--force runs it again"):
        sim.run(scenario_file, output=out, progress=False)
    again = sim.run(scenario_file, output=out, progress=False, force=True)
    assert again.ran and again.verified and again.rounds.equals(expected)


def test_a_sweep_stops_before_running_anything_when_a_finished_point_changed(scenario_file, tmp_path, capsys):
    out = tmp_path / "sw"
    base = ["sweep", str(scenario_file), "--output", str(out), "--quiet"]
    assert main(base) == 0
    edited = out / "runs" / "seed=6" / "clients.csv"
    written = edited.read_bytes()
    _edit(edited)
    stamp = (out / "runs.csv").stat().st_mtime_ns
    capsys.readouterr()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert f"dropsim: {edited}: changed since its run completed" in err and "--force runs it again" in err
    assert (out / "runs.csv").stat().st_mtime_ns == stamp  # nothing ran, nothing was rewritten
    assert main([*base, "--force"]) == 0
    assert edited.read_bytes() == written
    assert "complete,complete" in ",".join(line.split(",")[1] for line in (out / "runs.csv").read_text().splitlines())


def test_plot_refuses_an_edited_table_rather_than_draw_it(scenario_file, tmp_path, capsys):
    out = tmp_path / "res"
    assert _run(scenario_file, out) == 0
    _edit(out / "rounds.csv")
    assert main(["plot", str(out), "--out", str(tmp_path / "figs")]) == 2
    assert f"{out / 'rounds.csv'}: changed since its run completed" in capsys.readouterr().err


def test_a_manifest_from_before_the_digests_is_found_finished_and_said_unverified(scenario_file, tmp_path, capsys):
    """Manifests written by earlier versions hold no digests: their runs are still finished (rather than run
    again, which for a reproduction takes hours), shown with a note that nothing vouches for their tables."""
    out = tmp_path / "res"
    assert _run(scenario_file, out) == 0
    manifest = _manifest(out)
    del manifest["tables_sha256"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    stamp = (out / "rounds.csv").stat().st_mtime_ns
    capsys.readouterr()
    assert _run(scenario_file, out) == 0
    captured = capsys.readouterr()
    assert "already holds this scenario's complete run" in captured.err
    assert f"note: {out}: its manifest, from an earlier dropsim, holds no digests of its tables" in captured.err
    assert "final acc" in captured.out and (out / "rounds.csv").stat().st_mtime_ns == stamp
    result = sim.run(scenario_file, output=out, progress=False)
    assert not result.ran and not result.verified and len(result.rounds) == 2
    assert _run(scenario_file, out, "--force") == 0  # run again, it records them
    assert set(_manifest(out)["tables_sha256"]) == set(TABLES)


def test_a_sweep_notes_finished_points_without_digests(scenario_file, tmp_path, capsys):
    out = tmp_path / "sw"
    base = ["sweep", str(scenario_file), "--output", str(out), "--quiet"]
    assert main(base) == 0
    for point in ("seed=5", "seed=6"):
        manifest = _manifest(out / "runs" / point)
        del manifest["tables_sha256"]
        (out / "runs" / point / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "note: 2 finished runs found" in err and "holds no digests of its tables" in err


def test_digests_cover_every_table_in_the_folder_and_a_run_not_finished_has_none(tmp_path):
    """A driver may write tables of its own beside the three (a deployment's operations.csv): the digests
    cover them as well; an interrupted run is no result and records none."""
    from sim.results.integrity import ChangedTableError, check_run
    from sim.results.writer import RunWriter

    done = tmp_path / "done"
    writer = RunWriter(done, {"run_id": "x"})
    (done / "operations.csv").write_text("round,party\n1,server\n")
    writer.close("complete")
    manifest = _manifest(done)
    assert set(manifest["tables_sha256"]) == {"operations.csv", *TABLES}
    assert check_run(done, manifest)
    (done / "operations.csv").write_text("round,party\n1,client\n")
    with pytest.raises(ChangedTableError, match="operations.csv: changed since its run completed"):
        check_run(done, manifest)
    stopped = tmp_path / "stopped"
    RunWriter(stopped, {"run_id": "y"}).close("interrupted")
    assert "tables_sha256" not in _manifest(stopped)


def test_a_cluster_point_is_stored_with_its_manifest_last(tmp_path, monkeypatch):
    """The manifest is the commit record: a store cut short leaves it as it was, never complete beside tables
    of an earlier attempt."""
    import sim.cluster

    order: list[str] = []
    real = sim.cluster.write_atomic
    monkeypatch.setattr(sim.cluster, "write_atomic", lambda path, data: (order.append(path.name), real(path, data)))
    files = {name: b"x\n" for name in ("clients.csv", "manifest.json", "rounds.csv", "stages.csv")}
    sim.cluster.store({"run_id": "seed=1", "files": files}, tmp_path)
    assert order[-1] == "manifest.json" and sorted(order) == sorted(files)
