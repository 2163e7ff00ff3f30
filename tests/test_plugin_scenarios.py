"""Plug-ins in scenarios (docs/plugins.md): tests/plugin_package holds a model factory, a data loader, a dropout
model and a strategy, used from YAML, from Python, by their entry point names, in a two-worker sweep, by
training workers and by a Dask cluster's workers; and every kind of bad plug-in is refused, naming what and
where, before a run starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.errors import InputError
from sim.learning.federated import load_federated
from sim.scenario.errors import ScenarioError

PACKAGE = Path(__file__).resolve().parent / "plugin_package"
ROOT = Path(__file__).resolve().parent.parent
TABLES = ("rounds.csv", "clients.csv", "stages.csv")
P = "dropsim_example_plugins"
SCENARIO = {
    "name": "plug",
    "seed": 3,
    "rounds": 2,
    "population": 12,
    "sampling": {"clients_per_round": 8},
    "dropout": {"model": f"{P}:Battery", "args": {"low_fraction": 0.5}},
    "data": {"loader": f"{P}:blobs", "args": {"samples": 20}},
    "model": {"factory": f"{P}:small_cnn", "args": {"width": 4}, "train_seconds_per_sample": 0.001},
    "privacy": {"strategy": f"{P}:Doubled", "epsilon": 6},
    "aggregation": {"protocol": "secagg+"},
    "training": {"local_epochs": 1, "batch_size": 10},
}
BY_NAME = {
    "dropout": {"mode": "example-battery", "args": {"low_fraction": 0.5}},
    "data": {"dataset": "example-blobs", "args": {"samples": 20}},
    "model": {"name": "example-cnn", "args": {"width": 4}, "train_seconds_per_sample": 0.001},
    "privacy": {"strategy": "example-doubled", "epsilon": 6},
}


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The plug-in package importable here, and in child processes (PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(PACKAGE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PACKAGE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return PACKAGE


def tables(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in TABLES}


def dropsim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim", *args], capture_output=True, text=True, timeout=600, cwd=cwd, check=False
    )


def test_yaml_through_dropsim_run_and_sim_run_gives_identical_tables(on_path, tmp_path):
    file = tmp_path / "plug.yaml"
    file.write_text(yaml.safe_dump(SCENARIO))
    done = dropsim("run", str(file), "--output", str(tmp_path / "cli"))
    assert done.returncode == 0, done.stderr
    result = sim.run(file, output=tmp_path / "api", progress=False)
    assert tables(tmp_path / "cli") == tables(tmp_path / "api")
    rounds = result.rounds
    assert list(rounds["round"]) == [1, 2] and rounds["epsilon"].iloc[-1] > 0
    assert set(result.clients["client"]) <= set(range(12))
    records = {r["kind"]: r for r in result.manifest["plugins"]}
    assert records["model"] == {
        "kind": "model",
        "name": f"{P}:small_cnn",
        "path": f"{P}:small_cnn",
        "distribution": "dropsim-example-plugins",
        "version": "0.1",
        "module_sha256": hashlib.sha256((PACKAGE / P / "__init__.py").read_bytes()).hexdigest(),
    }
    assert {r["path"] for r in records.values()} == {f"{P}:small_cnn", f"{P}:blobs", f"{P}:Battery", f"{P}:Doubled"}


def test_entry_point_names_are_the_same_plugins_as_their_import_paths(on_path, tmp_path):
    by_path = sim.run(SCENARIO, output=tmp_path / "path", progress=False)
    by_name = sim.run({**SCENARIO, **BY_NAME}, output=tmp_path / "name", progress=False)
    assert tables(tmp_path / "path") == tables(tmp_path / "name")
    named = {r["kind"]: (r["name"], r["path"], r["version"]) for r in by_name.manifest["plugins"]}
    assert named == {
        "model": ("example-cnn", f"{P}:small_cnn", "0.1"),
        "dataset": ("example-blobs", f"{P}:blobs", "0.1"),
        "dropout": ("example-battery", f"{P}:Battery", "0.1"),
        "strategy": ("example-doubled", f"{P}:Doubled", "0.1"),
    }
    assert by_path.manifest["scenario"]["model"]["factory"] == f"{P}:small_cnn"
    assert by_name.manifest["scenario"]["model"]["name"] == "example-cnn"


def test_the_plugins_do_what_they_say(on_path):
    scenario = sim.load_scenario(SCENARIO).points()[0]
    data = load_federated(scenario.data, scenario.population, scenario.seed)
    assert (data.input_shape, data.num_classes) == ((1, 8, 8), 4)
    assert [data.num_samples(c) for c in range(12)] == [20] * 12
    from sim.learning.models import update_dimension

    # conv 1->4 (3x3, bias) and dense 4*4*4 -> 4 (bias)
    assert update_dimension(scenario.model, (1, 8, 8), 4) == (9 * 4 + 4) + (64 * 4 + 4)
    from sim.dp.strategies import RoundNoise

    plan = RoundNoise(f"{P}:Doubled", 1.0, 10, 0)
    assert plan.residual(3) == 7 * plan.components[0] and plan.components[0] * 10 == 2
    from sim.clients.dropout import DropoutModel

    model = DropoutModel(scenario.dropout, 12, 3)
    assert sorted(set(np.round(model.probability, 2))) == [0.05, 0.8]


def test_a_train_set_is_cut_by_the_partition(on_path):
    mapping = {**SCENARIO, "data": {"loader": f"{P}:pooled", "partition": {"dirichlet": 0.3}}}
    scenario = sim.load_scenario(mapping).points()[0]
    data = load_federated(scenario.data, 12, 3)
    sizes = [data.num_samples(c) for c in range(12)]
    assert sum(sizes) == 400 and min(sizes) >= 1 and max(sizes) > 2 * min(sizes)
    assert data.test_data()[0].shape == (100, 1, 8, 8)


def test_a_train_set_of_rows_trains_a_model_for_rows(on_path, tmp_path):
    mapping = {
        **SCENARIO,
        "data": {"loader": f"{P}:pooled", "args": {"flat": True}, "partition": {"dirichlet": 0.3}},
        "model": {"factory": f"{P}:mlp", "train_seconds_per_sample": 0.001},
    }
    result = sim.run(mapping, output=tmp_path / "rows", progress=False)
    assert len(result.rounds) == 2 and result.rounds["accuracy"].notna().all()
    from sim.learning.models import update_dimension

    scenario = sim.load_scenario(mapping).base()
    assert update_dimension(scenario.model, (64,), 4) == 64 * 16 + 16 + 16 * 4 + 4


def test_a_two_worker_sweep_and_training_workers_carry_the_plugins(on_path, tmp_path):
    file = tmp_path / "plug.yaml"
    file.write_text(yaml.safe_dump({**SCENARIO, "training": {**SCENARIO["training"], "workers": 2}}))
    out = tmp_path / "sweep"
    done = dropsim("sweep", str(file), "--jobs", "2", "--output", str(out), "--set", "sweep={seed: [3, 4]}")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "sweep.json").read_text())["run_ids"] == ["seed=3", "seed=4"]
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["status"]) == ["complete", "complete"]
    alone = sim.run(SCENARIO, output=tmp_path / "alone", progress=False)  # one process, seed 3
    swept = pd.read_csv(out / "rounds.csv")
    mine = swept[swept["seed"] == 3].reset_index(drop=True)
    assert mine["accuracy"].tolist() == alone.rounds["accuracy"].tolist()
    assert mine["model_sha256"].tolist() == alone.rounds["model_sha256"].tolist()


def test_a_dask_cluster_runs_plugins_and_a_worker_that_cannot_import_one_names_it(on_path, tmp_path):
    distributed = pytest.importorskip("distributed")
    file = tmp_path / "plug.yaml"
    file.write_text(yaml.safe_dump({**SCENARIO, "sweep": {"seed": [3, 4]}}))
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster:
        result = sim.sweep(file, output=tmp_path / "dask", scheduler=cluster.scheduler_address, progress=False)
    assert [s.status for s in result.statuses] == ["complete", "complete"]
    # a worker without the package: the point's error names the import path and why
    code = (
        "import json, sys; from sim.cluster import run_remote\n"
        f"sent = {{'source': 'plug.yaml', 'document': {json.dumps(json.dumps(SCENARIO))}, 'swept': {{}}, "
        "'run_id': 'x'}\n"
        "try:\n    run_remote(sent)\nexcept Exception as exc:\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert f"cannot import '{P}:small_cnn': no module named '{P}'" in done.stdout, done.stdout + done.stderr
    assert "plug.yaml (sent to a worker)" in done.stdout and "model.factory" in done.stdout


def test_profile_model_adds_the_factory_model_s_training_to_a_profile(on_path, tmp_path):
    mapping = {**SCENARIO, "model": {"factory": f"{P}:small_cnn", "args": {"width": 4}}}
    with pytest.raises(ScenarioError, match=r"model\.factory: has no training time: .* does not measure train\."):
        sim.run(mapping, output=tmp_path / "no", progress=False)
    assert not (tmp_path / "no").exists()
    file = tmp_path / "plug.yaml"
    file.write_text(yaml.safe_dump({**mapping, "sweep": {"seed": [3, 4], "model.args.width": [2, 4]}}))
    profile = tmp_path / "mine.json"
    done = dropsim("profile", "--model", str(file), "--out", str(profile), "--quick")
    assert done.returncode == 0, done.stderr
    doc = json.loads(profile.read_text())
    ops = [op for op in doc["operations"] if op.startswith("train.small_cnn-")]  # one per width, not per seed
    assert len(ops) == 2 and all(op.endswith(".1x8x8.4") for op in ops)
    assert sorted(doc["operations"][op]["model"]["args"]["width"] for op in ops) == [2, 4]
    assert "train.cnn.1x8x8.10" in doc["operations"]  # the rest of the scenario's profile, copied
    result = sim.run({**mapping, "costs": {"profile": str(profile)}}, output=tmp_path / "yes", progress=False)
    assert result.rounds["round_time"].gt(0).all()


BAD = [
    ({"model": {"factory": "nosuch.models:build"}}, "model.factory", "cannot import 'nosuch.models:build': no module"),
    ({"model": {"factory": f"{P}:not_a_model"}}, "model.factory", "returned a str, not a torch.nn.Module"),
    (
        {"model": {"factory": f"{P}:too_many_outputs"}},
        "model.factory",
        r"gives outputs of shape \(2, 5\) for inputs of shape \(2, 1, 8, 8\); one logit per class, shape \(2, 4\)",
    ),
    ({"model": {"factory": f"{P}:small_cnn", "args": {"depth": 3}}}, "model.factory", "cannot take args"),
    ({"data": {"loader": f"{P}:too_few_clients"}}, "data.loader", "returned 11 clients; population is 12"),
    ({"data": {"loader": f"{P}:ragged"}}, "data.loader", r"clients\[2\] has inputs of shape \(1, 4, 8\), test"),
    ({"data": {"loader": f"{P}:bad_labels"}}, "data.loader", r"clients\[1\] labels are not whole numbers"),
    (
        {"data": {"loader": f"{P}:blobs", "partition": {"dirichlet": 1.0}}},
        "data.loader",
        "data.partition dirichlet has nothing to cut",
    ),
    (
        {"model": {"name": "cnn"}, "data": {"loader": f"{P}:tabular"}},
        "model.name",
        r"model cnn takes images \(C, H, W\), not inputs of shape \(16,\)",
    ),
    (
        {"data": {"loader": f"{P}:tabular"}},
        "model.factory",
        "small_cnn raised ValueError: not enough values to unpack",
    ),
    (
        {"model": {"factory": f"{P}:with_batch_norm"}, "training": {"workers": 2}},
        "training.workers",
        f"is 2, which needs a model whose state is its parameters; {P}:with_batch_norm has buffers",
    ),
    ({"dropout": {"model": f"{P}:Outsider"}}, "dropout.model", "drops returned .* a subset of the sampled clients"),
    ({"dropout": {"model": f"{P}:Battery", "args": {"level": 1}}}, "dropout.model", "cannot take args"),
    (
        {"dropout": {"model": "fractions:Fraction"}},
        "dropout.model",
        "fractions:Fraction gave a Fraction, not a dropout",
    ),
    (
        {"privacy": {"strategy": f"{P}:Inexact"}},
        "privacy.strategy",
        r"breaks the strategy interface: components returned 0\.1 .* an exact variance",
    ),
    ({"privacy": {"strategy": f"{P}:Battery"}}, "privacy.strategy", "is class Battery, not a strategy"),
    (
        {"privacy": {"strategy": "not-installed"}},
        "privacy.strategy",
        "is 'not-installed'; allowed: none .* local; or a plug-in: an import path module:Name or an installed "
        "dropsim.strategies entry point's name",
    ),
]


@pytest.mark.parametrize(("change", "key", "message"), BAD, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(BAD)])
def test_a_bad_plugin_is_refused_before_the_run_starts_naming_key_and_why(on_path, tmp_path, change, key, message):
    file = tmp_path / "plug.yaml"
    file.write_text(yaml.safe_dump({**SCENARIO, **change}))
    with pytest.raises(InputError) as caught:
        sim.run(file, output=tmp_path / "out", progress=False)
    text = str(caught.value)
    assert f"{file}:" in text and f"{key}: " in text, text
    if message is not None:
        import re

        assert re.search(message, text), text
    assert not (tmp_path / "out").exists()


@st.composite
def loader_results(draw: st.DrawFn) -> tuple[dict[str, object], int]:
    """A loader's mapping, well-formed or not: client counts, shapes, label values and dtypes drawn."""
    population = draw(st.integers(1, 4))
    clients = []
    for _ in range(draw(st.one_of(st.just(population), st.integers(0, 5)))):  # mostly the right count
        n = draw(st.integers(0, 3))
        shape = draw(st.sampled_from([(1, 2, 2)] * 8 + [(1, 2, 3), (4,)]))
        labels = draw(st.lists(st.sampled_from([0, 1, 2] * 8 + [-1, 0.5, np.nan]), min_size=n, max_size=n))
        dtype = draw(st.sampled_from([np.int64, np.int64, np.float64, np.int8]))
        with np.errstate(invalid="ignore"):
            y = np.asarray(labels, dtype=np.float64).astype(dtype)
        clients.append((np.zeros((n, *shape)), y))
    mapping: dict[str, object] = {"clients": clients, "test": (np.zeros((2, 1, 2, 2)), np.array([0, 1]))}
    if draw(st.booleans()):
        mapping["classes"] = draw(st.sampled_from([1, 2, 3, 0, "2", True]))
    return mapping, population


@settings(max_examples=200, deadline=None)
@given(loader_results())
def test_a_loader_s_data_is_used_as_given_or_refused_with_a_loader_error(drawn):
    from sim.learning.plugin_data import LoaderError, check
    from sim.scenario.types import LOADER, Data, Partition

    mapping, population = drawn
    config = Data(LOADER, Partition("iid"), None, 0.2, 50, 1, loader="x:y")
    try:
        data = check(mapping, config, population, 0, "here")
    except LoaderError as exc:
        assert str(exc).startswith("here: ")
        return
    classes = data.num_classes
    assert [data.num_samples(c) for c in range(population)] == [len(c[1]) for c in mapping["clients"]]
    for c in range(population):
        x, y = data.client_data(c)
        assert x.dtype == np.float32 and y.dtype == np.int64 and len(y) >= 1
        assert x.shape[1:] == data.input_shape == (1, 2, 2) and ((y >= 0) & (y < classes)).all()


def test_a_deployment_worker_refuses_a_scenario_naming_code_unless_allowed(on_path):
    from sim.deploy.policy import SAFE_POLICY
    from sim.deploy.worker import PolicyRefusedError, config_message, read_config

    scenario = sim.load_scenario(SCENARIO).base()
    config = config_message(scenario, b"\0" * 16)
    with pytest.raises(
        PolicyRefusedError,
        match=r"names plug-ins \(.*model.factory: 'dropsim_example_plugins:small_cnn';.*"
        "--allow-plugins",
    ):
        read_config(config, SAFE_POLICY)
    assert read_config(config, replace(SAFE_POLICY, plugins=True)) == scenario
    plain = sim.load_scenario({k: v for k, v in SCENARIO.items() if k in ("name", "rounds", "population")}).base()
    assert read_config(config_message(plain, b"\0" * 16), SAFE_POLICY) == plain


def test_strategy_flags_set_as_class_attributes_are_honoured_and_removal_needs_removes():
    from fractions import Fraction

    from sim.dp.strategies import RoundNoise, Strategy, check_strategy, plugin_strategy
    from sim.plugins import PluginError

    class Drops(Strategy):
        removes = True

        def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
            return (plan.sigma / plan.sampled, plan.sigma / plan.sampled)

        def removed(self, plan: RoundNoise, dropped: int) -> tuple[int, ...]:
            return (1,) if dropped == 0 else ()

    module = type(sys)("flag_plugins")
    module.Drops = Drops  # type: ignore[attr-defined]
    sys.modules["flag_plugins"] = module
    try:
        built = plugin_strategy("flag_plugins:Drops", "here")
        assert built.removes and RoundNoise("flag_plugins:Drops", 1.0, 10, 5).residual(0) == 1
    finally:
        del sys.modules["flag_plugins"]
    with pytest.raises(PluginError, match=r"removed\(0\) returned \(1,\) .* but removes is False"):
        check_strategy(Drops("plain", removes=False), "here")


def test_a_dropout_plugin_without_a_rate_may_drop_so_silent_needs_a_timeout(on_path):
    with pytest.raises(ScenarioError, match=r"dropout\.silent: is true: .* set timeouts\.masked_input"):
        sim.load_scenario({**SCENARIO, "dropout": {"model": f"{P}:Battery", "silent": True}}).base()


@pytest.mark.parametrize(
    ("args", "where"),
    [
        ({"levels": {1, 2}}, r"dropout\.args\.levels: is \{1, 2\}: arguments are plain data"),
        ({"m": {1: 2}}, r"args\.m\.1"),
    ],
)
def test_args_must_be_plain_data(on_path, args, where):
    with pytest.raises(ScenarioError, match=where):
        sim.load_scenario({**SCENARIO, "dropout": {"model": f"{P}:Battery", "args": args}}).base()


def test_an_empty_test_set_is_refused(on_path, tmp_path):
    (tmp_path / "empty_test_plugin.py").write_text(
        "import numpy as np\n"
        "def load(population):\n"
        "    x = np.zeros((3, 1, 8, 8))\n"
        "    return {'clients': [(x, np.array([0, 1, 0]))] * population, 'test': (x[:0], np.array([], int))}\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ScenarioError, match="data.loader: .* returned an empty test set"):
            sim.run({**SCENARIO, "data": {"loader": "empty_test_plugin:load"}}, output=tmp_path / "o", progress=False)
    finally:
        sys.path.remove(str(tmp_path))


def test_a_training_worker_that_cannot_import_the_model_names_it(on_path, tmp_path):
    """A module that exists only in this process (as one defined in a notebook): the workers cannot import it."""
    from sim.plugins import _RESOLVED

    module = type(sys)("ghost_plugin")
    module.build = lambda input_shape, num_classes: __import__("torch").nn.Sequential(  # type: ignore[attr-defined]
        __import__("torch").nn.Flatten(), __import__("torch").nn.Linear(64, num_classes)
    )
    sys.modules["ghost_plugin"] = module
    mapping = {**SCENARIO, "model": {"factory": "ghost_plugin:build", "train_seconds_per_sample": 0.001}}
    mapping["training"] = {**SCENARIO["training"], "workers": 2}
    try:
        with pytest.raises(InputError, match=r"training worker .* cannot import 'ghost_plugin:build': no module named"):
            sim.run(mapping, output=tmp_path / "o", progress=False)
    finally:
        del sys.modules["ghost_plugin"]
        _RESOLVED.pop(("model", "ghost_plugin:build"), None)


def test_a_run_whose_plugin_module_changed_runs_again(tmp_path):
    (tmp_path / "edited_plugin.py").write_text((PACKAGE / P / "__init__.py").read_text())
    mapping = {
        **SCENARIO,
        "model": {"factory": "edited_plugin:small_cnn", "args": {"width": 4}, "train_seconds_per_sample": 0.001},
    }
    code = (
        "import sim, sys, json\n"
        f"r = sim.run(json.loads(sys.argv[1]), output={str(tmp_path / 'out')!r}, progress=False)\n"
        "print('ran' if r.ran else 'kept')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(PACKAGE), str(ROOT)])}

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(mapping)], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "ran"
    assert run() == "kept"
    with (tmp_path / "edited_plugin.py").open("a") as f:
        f.write("\n# edited\n")
    assert run() == "ran"
