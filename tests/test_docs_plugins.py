"""docs/plugins.md's worked example, run as a user would: its module and scenario written to a folder, its
commands run there (dropsim profile --model, run, a two-worker sweep), its Python too; and what the page says
of the results holds."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "plugins.md"


def examples() -> list[tuple[str, str]]:
    """``(kind, text)`` of each code block after an ``<!-- example: KIND -->`` marker, in page order."""
    found = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    assert found, "docs/plugins.md has no examples"
    return found


def dropsim_command() -> list[str]:
    script = Path(sys.executable).parent / "dropsim"  # the console script, as a user runs it
    return [str(script)] if script.is_file() else [sys.executable, "-m", "sim"]


@pytest.mark.slow
def test_the_worked_example_runs_as_the_page_says(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSAFEPATH", None)
    for kind, text in examples():
        if kind == "my_plugins.py":
            with (tmp_path / kind).open("a", encoding="utf-8") as f:
                f.write(text + "\n")
        elif kind == "my.yaml":
            (tmp_path / kind).write_text(text, encoding="utf-8")
        elif kind == "shell":
            for line in filter(None, text.splitlines()):
                words = shlex.split(line)
                assert words[0] == "dropsim", line
                done = subprocess.run(
                    [*dropsim_command(), *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        elif kind == "python":  # saved as a script and run, as a user would
            (tmp_path / "snippet.py").write_text(text, encoding="utf-8")
            done = subprocess.run(
                [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr
            assert "'path': 'my_plugins:tiny_cnn'" in done.stdout and done.stdout.count("status='complete'") == 2
        else:
            raise AssertionError(f"unknown example kind {kind}")

    rounds = pd.read_csv(tmp_path / "results" / "stripes" / "rounds.csv")
    assert len(rounds) == 10 and rounds["accuracy"].iloc[-1] > 0.9  # "about 99% accuracy in 10 rounds"
    runs = pd.read_csv(tmp_path / "results" / "cellular" / "runs.csv")
    assert list(runs["status"]) == ["complete", "complete"]
    assert (tmp_path / "results" / "cellular-py" / "runs.csv").is_file()
    sys.path.insert(0, str(tmp_path))
    try:
        import my_plugins  # the page's module

        model = my_plugins.tiny_cnn((1, 12, 12), 4, channels=8)
        count = sum(p.numel() for p in model.parameters())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_plugins", None)
    assert f"their count, {count:,} here" in PAGE.read_text(encoding="utf-8")
    (documented,) = set(re.findall(r"train\.tiny_cnn-[0-9a-f]{8}\.1x12x12\.4", PAGE.read_text(encoding="utf-8")))
    profile = json.loads((tmp_path / "my-profile.json").read_text(encoding="utf-8"))
    assert documented in profile["operations"]  # the operation the page names is the one measured
    # OneShot: the target with nobody dropped; (n - d) / (n - T) of it with d of 10 dropped, T = 5
    oneshot = pd.read_csv(tmp_path / "results" / "oneshot" / "rounds.csv")
    for _, row in oneshot.iterrows():
        ratio = row["realised_variance"] / row["target_variance"]
        assert ratio == pytest.approx(1.0 if row["dropped"] == 0 else (10 - row["dropped"]) / 5, rel=1e-12)
    assert set(oneshot["dropped"]) >= {0, 1, 2}
