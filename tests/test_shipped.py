"""Every shipped scenario is valid and runs (reduced to two rounds); the code base lints and type-checks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.runner import run_scenario
from sim.scenario import load

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if p.name != "reproductions.yaml")
"""Every scenario file (the paper catalog is not one)."""
RUNNABLE = [p for p in SCENARIOS if p.parent.name != "paper"]
"""The ones run here; the paper scenarios run in their reduced forms in test_paper.py."""


def test_there_are_shipped_scenarios():
    assert ROOT / "scenarios" / "quickstart.yaml" in SCENARIOS


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_scenario_is_valid(path):
    assert load(path).points()


@pytest.mark.slow
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_scenario_runs_reduced(path, tmp_path):
    scenario = load(path, ["rounds=2"], output=str(tmp_path)).points()[0]
    summary = run_scenario(scenario, tmp_path, progress=False)
    assert summary.rounds == 2
    assert len(pd.read_csv(tmp_path / "rounds.csv")) == 2


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; install the test extra: pip install -e '.[test]'")
    return found


@pytest.mark.slow
def test_ruff_is_clean():
    done = subprocess.run(
        [_tool("ruff"), "check", *(d for d in ("sim", "tests", "benchmarks") if (ROOT / d).is_dir())],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_is_clean():
    done = subprocess.run([_tool("mypy"), "sim"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
