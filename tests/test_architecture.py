"""The package's architecture: the import contracts of ``.importlinter`` hold, none of them is vacuous, the
layer picture of docs/architecture.md is the contract's, and the light entry points stay light.

The contracts (checked by import-linter, docs/architecture.md "Layers"): every child of ``sim`` in a layer,
each importing only the layers below it; the two drivers never import each other; no import cycle among
sim's direct children; the round layer, the protocols, the cryptography and the scenario types import no
simpy, asyncio, socket or torch, and the first three no clock; cryptography only through ``sim.crypto`` and
``sim.dp``; the scenario types no cryptography or dp_accounting. Each contract is shown to bite: an import
it forbids is planted in a copy of the package, and import-linter must then report that contract broken.
The light entry points (reading results, ``dropsim plot``, ``dropsim trace stats``, the scenario types)
must not import the simulator's heavy dependencies, each checked in a fresh interpreter so that this
process's own imports do not count. An import inside a function of ``sim/`` says why it is deferred, and
their number is pinned.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
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


def _contracts() -> dict[str, configparser.SectionProxy]:
    """The contracts of ``.importlinter`` by id."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    prefix = "importlinter:contract:"
    return {name.removeprefix(prefix): config[name] for name in config.sections() if name.startswith(prefix)}


def _values(option: str) -> list[str]:
    """A contract option's values, one a line (or one a comma)."""
    return [v.strip() for v in re.split(r"[\n,]", option) if v.strip()]


def _layers() -> list[tuple[str, ...]]:
    """The layers contract's layers, top first, each a tuple of ``sim.X`` names (independent siblings)."""
    contract = _contracts()["layers"]
    (container,) = _values(contract["containers"])
    layers = []
    for line in _values(contract["layers"]):
        assert ":" not in line, f"layer {line!r}: siblings are independent here (a | b); see docs/architecture.md"
        layers.append(tuple(f"{container}.{name.strip()}" for name in line.split("|")))
    return layers


PLANTS = [
    # (contract, file of the copy that gets the import, module imported): one forbidden edge each
    ("layers", "sim/round/__init__.py", "sim.engine"),  # the round layer above a driver
    ("layers", "sim/seeds.py", "sim.api"),  # a loose module of the bottom layer up to the API
    ("layers", "sim/learning/__init__.py", "sim.costs"),  # independent siblings
    ("layers", "sim/traces/__init__.py", "sim.learning"),
    ("layers", "sim/traces/stats.py", "sim.plots"),
    ("layers", "sim/preflight.py", "sim.runner"),
    ("layers", "sim/api.py", "sim.cli"),
    ("layers", "sim/newcomer.py", None),  # a new child of sim in no layer (the contract is exhaustive)
    ("drivers", "sim/engine/__init__.py", "sim.deploy"),
    ("drivers", "sim/deploy/__init__.py", "sim.engine"),
    ("acyclic", "sim/crypto/__init__.py", "sim.protocol"),
    ("sans-io", "sim/protocol/machine.py", "torch"),
    ("sans-io", "sim/round/__init__.py", "simpy"),
    ("sans-io", "sim/scenario/types.py", "asyncio"),
    ("sans-io", "sim/crypto/__init__.py", "socket"),
    ("clock", "sim/protocol/__init__.py", "time"),
    ("clock", "sim/round/__init__.py", "datetime"),
    ("cryptography", "sim/round/__init__.py", "cryptography"),
    ("cryptography", "sim/protocol/__init__.py", "cryptography"),
    ("scenario-types", "sim/scenario/types.py", "cryptography"),
    ("scenario-types", "sim/scenario/types.py", "sim.crypto.aead"),  # through another module
    ("scenario-types", "sim/scenario/types.py", "dp_accounting"),
]


def _pictured_layers() -> list[tuple[str, ...]]:
    """The layers of the picture under docs/architecture.md's "Layers", top first: each line that begins with
    ``sim.X`` (``| sim.Y`` ...) is a layer; the text after the names, and the lines that go on, describe it."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1]
    picture = section.split("```\n", 2)[1]
    names = re.compile(r"^\s*(sim\.\w+(?:\s*\|\s*sim\.\w+)*)")
    return [
        tuple(name.strip() for name in match.group(1).split("|"))
        for match in map(names.match, picture.splitlines())
        if match
    ]


def test_the_layer_picture_is_the_contract() -> None:
    assert _pictured_layers() == _layers(), "docs/architecture.md's picture and .importlinter's layers differ"


def test_every_contract_and_every_forbidden_package_has_a_planted_edge() -> None:
    contracts = _contracts()
    planted = {contract for contract, _, _ in PLANTS}
    assert planted == set(contracts), "each contract of .importlinter needs a planted edge in PLANTS"
    assert sum(contract == "layers" for contract, _, _ in PLANTS) >= 2
    for name, contract in contracts.items():
        if contract["type"] == "forbidden":
            imported = {module for c, _, module in PLANTS if c == name}
            missing = set(_values(contract["forbidden_modules"])) - imported
            assert not missing, f"contract {name}: plant an import of {sorted(missing)}"


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``sim/`` and ``.importlinter`` (no caches), for import-linter to analyse instead of the tree."""
    copy = tmp_path_factory.mktemp("architecture")
    shutil.copytree(ROOT / "sim", copy / "sim", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", copy / ".importlinter")
    return copy


def _lint(copy: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """import-linter on the copy (found first on the path, read without a cache), only ``contracts`` if any."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    selected = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [sys.executable, "-c", _LINT, "--no-cache", *selected],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def planted(package_copy: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The copy with one import line added to one file (or one new module), put back afterwards."""
    path = package_copy / request.param[0]
    before = path.read_text(encoding="utf-8") if path.exists() else None
    line = f"import {request.param[1]}  # planted by tests/test_architecture.py\n" if request.param[1] else ""
    path.write_text((before or '"""A module in no layer."""\n') + line, encoding="utf-8")
    try:
        yield package_copy
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before, encoding="utf-8")


def test_the_copy_keeps_every_contract(package_copy: Path) -> None:
    result = _lint(package_copy)
    assert result.returncode == 0, f"the unchanged copy breaks a contract:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize(
    ("contract", "planted"),
    [(contract, (path, module)) for contract, path, module in PLANTS],
    ids=[f"{contract}:{path.removeprefix('sim/')}->{module or 'new module'}" for contract, path, module in PLANTS],
    indirect=["planted"],
)
def test_a_planted_edge_breaks_its_contract(contract: str, planted: Path, request: pytest.FixtureRequest) -> None:
    result = _lint(planted, contract)
    assert result.returncode == 1, f"contract {contract} kept a planted edge:\n{result.stdout}\n{result.stderr}"
    assert "Contracts: 0 kept, 1 broken." in result.stdout, result.stdout
    # the plant broke it, not something else in the copy: the report names the planted module
    path = request.node.callspec.params["planted"][0]
    planted_module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    child = "." + planted_module.split(".")[1]  # how the acyclic contract names sim's children
    named = planted_module in result.stdout or f"{child} ->" in result.stdout
    assert named, f"{planted_module} not in the report:\n{result.stdout}"


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
        "import sim.cli.trace, sim.traces.stats, sim.traces.io",  # dropsim trace stats
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


DEFERRED = 109
"""Imports inside functions in ``sim/``: each defers a heavy package (torch, simpy, dp_accounting, matplotlib,
pandas, scipy, scikit-learn; the protocol stack's cryptography, or socket, where a module must stay light or
pure) or an optional one (an extra of setup.cfg), or breaks an import cycle, and says which."""


def _imports_in_functions() -> list[tuple[Path, int]]:
    """``(file, line)`` of each import statement inside a function, a method or a lambda in ``sim/`` (an
    ``if TYPE_CHECKING:`` block at a module's top is not one)."""
    found: list[tuple[Path, int]] = []

    def visit(node: ast.AST, path: Path, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.Import | ast.ImportFrom):
                found.append((path, child.lineno))
            visit(child, path, inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    for path in sorted((ROOT / "sim").rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), path, False)
    return found


def _says_why(lines: list[str], line: int) -> bool:
    """Whether the import at ``line`` (from 1) has a ``# deferred: <reason>`` comment on its line, or as the
    line above."""
    above = lines[line - 2].strip() if line > 1 else ""
    return bool(re.search(r"  # deferred: \S", lines[line - 1]) or re.match(r"# deferred: \S", above))


def test_imports_inside_functions_say_why_and_are_counted() -> None:
    """An import inside a function hides an edge of the import graph: it stays there only to defer a heavy or
    optional package or to break a cycle, with a ``# deferred: <reason>`` comment on its line or the line
    above; and their number is pinned, so that a new one is a conscious change (or goes to the module's top)."""
    found = _imports_in_functions()
    texts = {path: path.read_text(encoding="utf-8").splitlines() for path, _ in found}
    unexplained = [f"{path.relative_to(ROOT)}:{line}" for path, line in found if not _says_why(texts[path], line)]
    assert unexplained == [], f"imports inside functions without a '# deferred: <reason>' comment: {unexplained}"
    assert len(found) == DEFERRED, (
        f"{len(found)} imports inside functions in sim/, {DEFERRED} expected: move a new one to its module's top, "
        "or give it a reason and update DEFERRED"
    )
