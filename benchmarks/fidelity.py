"""Wall time of ``fidelity: learning`` against ``full`` on the shipped scenarios, and whether their tables agree.

Each shipped scenario (``scenarios/*.yaml``; a sweep's base scenario) that trains a real model is run by
``dropsim run``'s simulator twice, in ``full`` fidelity (real training, noise and every cryptographic
step of secure aggregation) and in ``learning`` (the same training and noise, the survivors' exact modular
sum, no cryptography), each into its own folder, ``--repeats`` times alternately; the fastest of each is
kept (on a shared machine, other tenants only ever add time). ``full_s`` and ``learning_s`` are the wall
seconds of the whole run (building the world, every round, writing the tables), ``ratio`` the first over
the second. ``tables_identical`` says whether every file the two runs wrote, bar the manifest (which
records the fidelity and the wall clock), is the same byte for byte. Scenarios in ``timing`` fidelity are
left out: they train nothing, so there is no learning to compare. ``--rounds`` shortens every scenario
(default 3 of its rounds) so that the whole table takes minutes. An untimed round of the first scenario in
each fidelity comes first: a process's first run loads torch's and the data's machinery.

    python benchmarks/fidelity.py                        # every applicable scenario, 3 rounds each
    python benchmarks/fidelity.py --scenarios secagg privacy --rounds 5 --csv fidelity.csv
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from sim.runner import run_scenario
from sim.scenario import load
from sim.scenario.types import Scenario

ROOT = Path(__file__).resolve().parents[1]
FIDELITIES = ("full", "learning")
SHOWN = ["scenario", "rounds", "full_s", "learning_s", "ratio", "tables_identical"]


def applicable(path: Path) -> bool:
    """Whether the scenario at ``path`` trains a real model (its fidelity is not ``timing``)."""
    return load(path).base().fidelity != "timing"


def _scenario(path: Path, fidelity: str, rounds: int, output: Path, overrides: Sequence[str]) -> Scenario:
    return load(path, [*overrides, f"fidelity={fidelity}", f"rounds={rounds}"], output=str(output)).base()


def _tables(folder: Path) -> dict[str, bytes]:
    """Every file a run wrote but its manifest, by name."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "manifest.json"}


def point(path: Path, rounds: int = 3, repeats: int = 1, overrides: Sequence[str] = ()) -> dict[str, object]:
    """One row: the scenario at ``path`` run ``repeats`` times in each fidelity, alternately."""
    walls: dict[str, list[float]] = {f: [] for f in FIDELITIES}
    tables: dict[str, list[dict[str, bytes]]] = {f: [] for f in FIDELITIES}
    with tempfile.TemporaryDirectory(prefix="dropsim-fidelity-") as folder:
        for i in range(repeats):
            for fidelity in FIDELITIES:
                out = Path(folder) / f"{fidelity}-{i}"
                scenario = _scenario(path, fidelity, rounds, out, overrides)
                start = time.perf_counter()
                run_scenario(scenario, out, progress=False)
                walls[fidelity].append(time.perf_counter() - start)
                tables[fidelity].append(_tables(out))
    first = tables["full"][0]
    full_s, learning_s = min(walls["full"]), min(walls["learning"])
    return {
        "scenario": path.stem,
        "rounds": rounds,
        "full_s": full_s,
        "learning_s": learning_s,
        "ratio": full_s / learning_s,
        "tables_identical": all(t == first for f in FIDELITIES for t in tables[f]),
    }


def run(paths: Sequence[Path], rounds: int, repeats: int = 1, overrides: Sequence[str] = ()) -> pd.DataFrame:
    """One row per scenario, after an untimed round of the first in each fidelity (the first run of a
    process loads torch's and the data's machinery, which neither fidelity should be charged)."""
    if paths:
        point(paths[0], 1, 1, overrides)
    return pd.DataFrame([point(p, rounds, repeats, overrides) for p in paths], columns=SHOWN)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios", nargs="+", help="names of shipped scenarios (default: every one not in timing fidelity)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each scenario")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each fidelity, alternated; the fastest kept")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="an override for every run")
    parser.add_argument("--csv", type=Path, default=Path("fidelity.csv"))
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")
    shipped = sorted((ROOT / "scenarios").glob("*.yaml"))
    if args.scenarios:
        known = {p.stem: p for p in shipped}
        unknown = [s for s in args.scenarios if s not in known]
        if unknown:
            parser.error(f"--scenarios {unknown} are not shipped; the shipped: {', '.join(known)}")
        paths = [known[s] for s in args.scenarios]
    else:
        paths = [p for p in shipped if applicable(p)]
    table = run(paths, args.rounds, args.repeats, args.overrides)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0 if table["tables_identical"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
