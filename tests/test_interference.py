"""Pipeline interference (Dordis eq. 3's beta_2 m): the fit, a real loopback measurement, the profile key."""

from __future__ import annotations

import json
import math
import threading

import pytest

from sim.costs.model import DEFAULT_PROFILE, CostModel, CostModelError
from sim.profiling.interference import (
    FEATURES,
    FULL,
    QUICK,
    PipelineSettings,
    fit_interference,
    measure_pipeline,
    time_points,
)


def test_fit_recovers_known_coefficients_exactly():
    # seconds per chunk = a d/m + b m + c, generated on the full grid with made-up a, b, c
    a, b, c = 1.6e-8, 4e-6, 3e-5
    grid = FULL.grid
    fit = fit_interference(grid, [a * d / m + b * m + c for d, m in grid])
    assert fit["coef"] == pytest.approx({"const": c, "chunk_elements": a, "chunks": b}, rel=1e-9)
    assert fit["interference_s"] == pytest.approx(b, rel=1e-9)
    assert fit["r2"] == pytest.approx(1.0)


def test_fit_reports_a_dropped_term_as_zero():
    # no interference and a negative pull on b: NNLS drops 'chunks' and still names it, as 0.0
    grid = QUICK.grid
    fit = fit_interference(grid, [2e-8 * d / m + 1e-5 - 1e-7 * m for d, m in grid])
    assert set(fit["coef"]) == set(FEATURES) and fit["interference_s"] == 0.0
    assert all(v >= 0 for v in fit["coef"].values())
    with pytest.raises(ValueError, match="one seconds value per"):
        fit_interference(grid, [1.0])


def test_settings_name_the_bad_point():
    with pytest.raises(ValueError, match="d=10, m=4: m must be >= 1 and divide d"):
        PipelineSettings(dims=(10, 20), chunks=(1, 4), repeats=1, budget_s=1.0, min_repeats=1)
    with pytest.raises(ValueError, match="two distinct dims"):
        PipelineSettings(dims=(16,), chunks=(1, 2), repeats=1, budget_s=1.0, min_repeats=1)


def test_in_process_timing_joins_its_threads():
    before = {t.name for t in threading.enumerate()}
    settings = PipelineSettings(dims=(1 << 10, 1 << 11), chunks=(1, 2), repeats=2, budget_s=1.0, min_repeats=1)
    points = time_points(settings)
    assert [(p.elements, p.chunks) for p in points] == settings.grid
    assert all(p.seconds > 0 and p.baseline_seconds > 0 and p.repeats >= 1 for p in points)
    assert {t.name for t in threading.enumerate()} <= before


def test_quick_measurement_has_finite_non_negative_coefficients():
    pipeline = measure_pipeline(quick=True)
    assert set(pipeline) >= {"interference_s", "coef", "r2", "points", "baseline", "method"}
    assert pipeline["isolated"] is True and pipeline["bits"] == 20
    for fit in (pipeline, pipeline["baseline"]):
        assert set(fit["coef"]) == set(FEATURES)
        assert all(math.isfinite(v) and v >= 0 for v in fit["coef"].values())
        assert fit["interference_s"] == fit["coef"]["chunks"] and math.isfinite(fit["r2"])
    assert [(p["elements"], p["chunks"]) for p in pipeline["points"]] == QUICK.grid
    assert all(p["seconds"] > 0 and p["baseline_seconds"] > 0 for p in pipeline["points"])
    model = CostModel.from_dict({"format": 1, "operations": {}, "pipeline": pipeline}, "measured")
    assert model.interference_s == pipeline["interference_s"]


def test_cost_model_reads_interference_and_defaults_to_zero():
    assert CostModel.from_dict({"format": 1, "operations": {}}, "old").interference_s == 0.0
    doc = {"format": 1, "operations": {}, "pipeline": {"interference_s": 2.5e-6}}
    assert CostModel.from_dict(doc, "new").interference_s == 2.5e-6


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        ({"interference_s": "2e-6"}, r"'pipeline.interference_s' is '2e-6'; it must be a number of seconds >= 0"),
        ({"interference_s": -1e-6}, r"'pipeline.interference_s' is -1e-06; it must be a number of seconds >= 0"),
        ({"r2": 0.9}, r"'pipeline.interference_s' is None"),
        (0.5, r"'pipeline' is 0.5; it must be a mapping with 'interference_s'"),
    ],
)
def test_cost_model_rejects_a_malformed_pipeline_entry(tmp_path, pipeline, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": 1, "operations": {}, "pipeline": pipeline}))
    with pytest.raises(CostModelError, match=message):
        CostModel.load(path)


def test_shipped_profile_has_the_measured_pipeline():
    pipeline = json.loads(DEFAULT_PROFILE.read_text())["pipeline"]
    assert CostModel.load().interference_s == pipeline["interference_s"] >= 0
    assert [(p["elements"], p["chunks"]) for p in pipeline["points"]] == FULL.grid
    assert pipeline["isolated"] is True and set(pipeline["baseline"]["coef"]) == set(FEATURES)
