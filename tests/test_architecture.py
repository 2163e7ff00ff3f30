"""The package's architecture: the import contracts of ``.importlinter`` hold, and the light entry points stay light.

The contracts (checked by import-linter): the layers ``sim.cli`` > ``sim.runner`` > ``sim.engine | sim.deploy``
> ``sim.round`` > ``sim.protocol`` > ``sim.dp | sim.crypto``; the two drivers never import each other; no
import cycle among sim's direct children. The light entry points (reading results, ``dropsim plot``,
``dropsim trace stats``, the scenario types) must not import the simulator's heavy dependencies, each
checked in a fresh interpreter so that this process's own imports do not count.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("simpy", "torch", "dp_accounting")

_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _LINT, "--no-cache"],
        cwd=ROOT,  # it reads the contracts from ROOT/.importlinter
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"lint-imports failed:\n{result.stdout}\n{result.stderr}"


def _loaded(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` are in ``sys.modules`` after running ``statement`` in a fresh interpreter."""
    code = textwrap.dedent(
        f"""
        import sys
        {statement}
        print("loaded:" + ",".join(m for m in {modules!r} if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{statement!r} failed:\n{result.stderr}"
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("loaded:")]
    return [m for m in line.removeprefix("loaded:").split(",") if m]


@pytest.mark.parametrize(
    "statement",
    [
        "import sim.results",
        "import sim.results.read, sim.results.writer, sim.results.tables",
        "import sim.plots",  # dropsim plot
        "import sim.traces.cli, sim.traces.stats, sim.traces.io",  # dropsim trace stats
    ],
)
def test_light_entry_points_load_no_heavy_package(statement: str) -> None:
    assert _loaded(statement, HEAVY) == [], f"{statement!r} loads heavy packages"


def test_scenario_types_load_no_crypto_and_no_heavy_package() -> None:
    modules = ("cryptography", *HEAVY)
    assert _loaded("import sim.scenario.types", modules) == [], "sim.scenario.types loads heavy packages"


def test_the_plot_and_trace_stats_commands_load_no_heavy_package(tmp_path: Path) -> None:
    """``dropsim plot`` of a finished run and ``dropsim trace stats`` of a trace, run whole through the
    command line's ``main``, import none of the simulator's heavy packages."""
    from sim.runner import run_scenario
    from sim.scenario import load
    from sim.traces.io import write_trace
    from sim.traces.synth import synthesize

    scenario = tmp_path / "light.yaml"
    scenario.write_text(
        "name: light\nseed: 1\nrounds: 2\npopulation: 10\nsampling: {clients_per_round: 4}\n"
        "data: {dataset: synthetic, samples_per_client: 20}\nmodel: {params: 1000}\nfidelity: timing\n"
    )
    run = tmp_path / "run"
    run_scenario(load(scenario, [], output=str(run)).base(), run, progress=False)
    trace = tmp_path / "trace.csv"
    write_trace(synthesize(20, 1.0, seed=2), trace)
    for command in (["plot", str(run), "--out", str(tmp_path / "figs")], ["trace", "stats", str(trace)]):
        statement = f"from sim.cli import main; assert main({command!r}) == 0"
        assert _loaded(statement, HEAVY) == [], f"dropsim {' '.join(command[:2])} loads heavy packages"


def test_the_round_layer_loads_no_simpy_asyncio_or_torch() -> None:
    """The round layer is sans-IO: importing all of it loads no simpy, asyncio, torch or dp_accounting but
    through the privacy ledger (dp_accounting, for accounting)."""
    modules = ("simpy", "asyncio", "torch")
    layer = "import sim.round.records, sim.round.plan, sim.round.collector, sim.round.closing, sim.round.stages"
    assert (
        _loaded(f"{layer}, sim.round.gates, sim.round.departure, sim.round.driver", (*modules, "dp_accounting")) == []
    )
    assert _loaded("import sim.round.privacy", modules) == []
