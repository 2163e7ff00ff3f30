"""FEMNIST and CIFAR-10 from local files, end to end: tiny files in the real formats, a real run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main


def write_leaf(folder: Path, writers: int, per_writer: int, rng: np.random.Generator) -> None:
    """LEAF's FEMNIST layout: train/ and test/ JSON files of users with 784-pixel rows and labels."""
    for split, n in (("train", per_writer), ("test", 2)):
        users = [f"f{w:04d}_{w}" for w in range(writers)]
        data = {u: {"x": rng.random((n, 784)).round(3).tolist(), "y": rng.integers(0, 62, n).tolist()} for u in users}
        (folder / split).mkdir(parents=True)
        doc = {"users": users, "num_samples": [n] * writers, "user_data": data}
        (folder / split / f"all_data_0_{split}.json").write_text(json.dumps(doc))


def write_cifar_python(folder: Path, rows: int, rng: np.random.Generator) -> None:
    """CIFAR-10's python batches: pickled dicts with bytes keys, uint8 (rows, 3072) data and labels."""
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (rows, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, rows).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))


SCENARIO = """
name: files
seed: 1
rounds: 2
population: 3
sampling: {{clients_per_round: 3}}
data: {data}
model: {{name: {model}}}
training: {{local_epochs: 1, batch_size: 4}}
"""


@pytest.mark.slow
def test_femnist_natural_partition_run(tmp_path):
    write_leaf(tmp_path / "femnist", writers=6, per_writer=5, rng=np.random.default_rng(0))
    path = tmp_path / "s.yaml"
    data = f"{{dataset: femnist, path: {tmp_path / 'femnist'}, partition: natural, writers_per_client: 2}}"
    path.write_text(SCENARIO.format(data=data, model="cnn"))
    assert main(["run", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    clients = pd.read_csv(tmp_path / "out" / "clients.csv")
    assert sorted(clients["samples"].unique()) == [10]  # two writers of five samples each
    rounds = pd.read_csv(tmp_path / "out" / "rounds.csv")
    assert rounds["accuracy"].notna().all() and (rounds["survivors"] == 3).all()


@pytest.mark.slow
def test_cifar10_python_batches_run(tmp_path):
    write_cifar_python(tmp_path / "cifar" / "cifar-10-batches-py", rows=4, rng=np.random.default_rng(1))
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(data=f"{{dataset: cifar10, path: {tmp_path / 'cifar'}}}", model="mlp"))
    assert main(["run", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    rounds = pd.read_csv(tmp_path / "out" / "rounds.csv")
    assert len(rounds) == 2 and rounds["model_sha256"].str.len().eq(64).all()


def test_missing_data_folder_is_bad_input(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(data=f"{{dataset: femnist, path: {tmp_path / 'nowhere'}}}", model="cnn"))
    assert main(["run", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    assert str(tmp_path / "nowhere") in capsys.readouterr().err


def test_missing_cost_profile_is_bad_input(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(
        SCENARIO.format(data="{dataset: digits}", model="cnn") + f"costs: {{profile: {tmp_path / 'p.json'}}}\n"
    )
    assert main(["run", str(path), "--output", str(tmp_path / "out"), "--quiet"]) == 2
    assert f"cost profile {tmp_path / 'p.json'}: cannot be read" in capsys.readouterr().err
