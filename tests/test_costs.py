"""The cost model: linear evaluation, clear errors, and a profile the profiler really measures."""

from __future__ import annotations

import json

import pytest

from sim.costs.model import CostModel, CostModelError, LinearCost
from sim.learning.federated import SHAPES
from sim.learning.models import MODELS, train_op
from sim.profiling.fit import fit_nonnegative
from sim.profiling.profiler import run_profile
from sim.protocol.machine import Work


def test_linear_cost_is_the_dot_product_with_const_one():
    cost = LinearCost({"const": 0.5, "elements": 2e-9, "samples": 1e-3})
    assert cost.seconds({"elements": 1e6, "samples": 10}) == pytest.approx(0.5 + 2e-3 + 1e-2, rel=1e-15)
    assert cost.seconds({}) == 0.5


def test_missing_operation_names_it_and_the_profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": 1, "operations": {"a": {"coef": {"const": 1}}}}))
    model = CostModel.load(path)
    assert model.work_seconds([Work("a"), Work("a")]) == 2.0
    with pytest.raises(
        CostModelError, match=r"has no operation 'b'; run `dropsim profile` to measure it \(it has: a\)"
    ):
        model.seconds("b", {})


def test_work_seconds_adds_every_item_in_order_however_often_one_is_listed() -> None:
    """The same float sum as charging each item in turn, whether an item object is listed once or several
    times (a SecAgg+ client lists one set of work per neighbour), and for a server (its own costs)."""
    model = CostModel(
        {
            "x": LinearCost({"const": 0.1, "n": 1e-7}),
            "y": LinearCost({"n": 3.3e-9}),
            "y@server": LinearCost({"n": 7.1e-9, "const": 0.3}),
        },
        {},
        "test",
    )
    shared = (Work("x", {"n": 12345}), Work("y", {"n": 1e6 / 3}))
    for work in (
        [shared[0]],
        list(shared),
        [Work("y", {"n": 5}), *shared * 7, Work("x", {"n": 1})],
        [*shared * 40],
    ):
        for role in (None, "client", "server"):
            expected = 0.0
            for w in work:
                expected += model.seconds(w.op, w.size, role)
            assert model.work_seconds(work, role) == expected
            assert model.work_seconds(tuple(work), role) == expected
    assert model.work_seconds([]) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"format": 2}', "not a dropsim profile of format 1"),
        ('{"format": 1, "operations": {"a": {"coef": {"const": "x"}}}}', "operation 'a' needs 'coef'"),
    ],
)
def test_malformed_profiles_are_rejected(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(CostModelError, match=message):
        CostModel.load(path)
    with pytest.raises(CostModelError, match="cannot be read"):
        CostModel.load(tmp_path / "missing.json")


def test_default_profile_covers_every_shipped_model_and_data_shape():
    model = CostModel.load()
    for shape, classes in SHAPES.values():
        for name in MODELS:
            assert model.has(train_op(name, shape, classes))
    assert model.has("fedavg.accumulate") and model.has("fedavg.finalize")
    assert model.machine["cpus"] >= 1 and not model.machine["quick"]


def test_fit_is_exact_on_linear_data_and_drops_negative_terms():
    rows = [{"x": float(x), "z": float(x % 3)} for x in range(1, 8)]
    fit = fit_nonnegative(("const", "x"), rows, [0.25 + 0.5 * r["x"] for r in rows])
    assert fit["coef"] == pytest.approx({"const": 0.25, "x": 0.5}, rel=1e-9) and fit["r2"] == pytest.approx(1.0)
    fit = fit_nonnegative(("const", "x", "z"), rows, [1.0 + 0.5 * r["x"] - 0.2 * r["z"] for r in rows])
    assert "z" not in fit["coef"] and all(c >= 0 for c in fit["coef"].values())


@pytest.mark.slow
def test_quick_profile_measures_every_operation(tmp_path):
    doc = run_profile(tmp_path / "p.json", quick=True)
    model = CostModel.load(tmp_path / "p.json")
    assert set(model.operations) == set(CostModel.load().operations) == set(doc["operations"])
    assert model.seconds("train.cnn.1x8x8.10", {"samples": 100, "batches": 10}) > 0


def test_only_the_named_operations_are_measured_again(tmp_path, capsys):
    from sim.cli import main
    from sim.costs.model import DEFAULT_PROFILE
    from sim.results.manifest import host

    profile = tmp_path / "profile.json"
    doc = json.loads(DEFAULT_PROFILE.read_text())
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({**doc, "machine": {**doc["machine"], "processor": "another CPU", "cpus": 64}}))
    doc["machine"].update(host())  # as if measured here
    profile.write_text(json.dumps(doc))
    before = json.loads(profile.read_text())
    assert main(["profile", "--only", "vector.add", "prg.expand", "--quick", "--out", str(profile)]) == 0
    after = json.loads(profile.read_text())
    for op in ("vector.add", "prg.expand"):
        assert after["operations"][op]["quick"] is True and "measured_at" in after["operations"][op]
        assert after["operations"][op]["coef"] != before["operations"][op]["coef"]
    unchanged = {op: e for op, e in before["operations"].items() if op not in ("vector.add", "prg.expand")}
    assert {op: after["operations"][op] for op in unchanged} == unchanged
    assert after["machine"] == before["machine"]
    CostModel.load(profile)  # still a valid profile
    assert main(["profile", "--only", "noise.nonsense", "--out", str(profile)]) == 2
    assert "noise.nonsense" in capsys.readouterr().err
    assert main(["profile", "--only", "vector.add", "--out", str(tmp_path / "missing.json")]) == 2
    assert main(["profile", "--only", "vector.add", "--out", str(elsewhere)]) == 2
    assert "another machine" in capsys.readouterr().err
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["profile", "--only", "vector.add", "--out", str(tmp_path / "broken.json")]) == 2
    assert "broken.json:1" in capsys.readouterr().err
    assert main(["profile", "--only", "vector.add", "--pipeline", "scenarios/secagg.yaml"]) == 2
