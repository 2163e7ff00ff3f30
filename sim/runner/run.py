"""Running one scenario: simulate round by round, write the tables as rounds finish, summarise.

The manifest is written before the first round (status ``running``) and closed with ``complete`` (with
the SHA-256 of every table), ``interrupted`` (Ctrl-C, or SIGTERM where the command turns it into one) or
``failed`` (with the error); the tables always hold every finished round. A folder that already holds this
scenario's complete run is found finished, not run again, once its tables are checked against those
digests (:mod:`sim.results.integrity`); a scenario's name must be one folder name
(:mod:`sim.results.folders`).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from sim.protocol.registry import spec_of
from sim.results.folders import check_name
from sim.results.integrity import check_run
from sim.results.manifest import host, versions
from sim.results.read import SWEEP, read_manifest, read_run_table
from sim.results.tables import round_rows, step_columns
from sim.results.writer import MANIFEST, ResultsError, RunWriter
from sim.runner.experiment import Experiment, Simulation
from sim.scenario.plugins import plugin_records
from sim.scenario.types import Scenario, scenario_digest


@dataclass
class RunSummary:
    """A few numbers about a finished run, for the summary table."""

    run_id: str
    rounds: int
    final_accuracy: float
    best_accuracy: float
    mean_round_time: float
    virtual_seconds: float
    mean_dropped: float
    aborted: int
    wall_seconds: float
    epsilon: float = math.inf
    """Privacy spent by the end (inf without distributed DP)."""
    stopped: str = ""
    """Why training stopped before its last round (``early``), or empty."""

    def row(self) -> dict[str, Any]:
        privacy = {} if math.isinf(self.epsilon) else {"epsilon": self.epsilon}
        return {
            "run": self.run_id,
            "rounds": self.rounds,
            "final acc": self.final_accuracy,
            "best acc": self.best_accuracy,
            "round time (s)": self.mean_round_time,
            "virtual time (s)": self.virtual_seconds,
            "dropped/round": self.mean_dropped,
            "aborted": self.aborted,
            **privacy,
            "wall (s)": self.wall_seconds,
        }


def prepare_output(directory: Path, scenario: Scenario, force: bool = False, driver: str = "simulate") -> bool:
    """Whether ``scenario`` should run into ``directory``; False when it already holds this scenario's
    complete run by the same ``driver`` (``simulate`` or ``deploy``) with the same plug-in code (a run whose
    plug-ins' modules changed runs again) and its tables as the run wrote them (one that changed since is
    refused, naming it, unless ``force``). A folder holding anything else is refused unless ``force``; a sweep
    folder always; a scenario whose name is no folder name always."""
    check_name(scenario)
    if (directory / SWEEP).exists():
        raise ResultsError(f"{directory}: is a sweep folder; give the run another --output")
    if directory.is_file():
        raise ResultsError(f"{directory}: is a file, not a folder; choose another output folder")
    if (directory / MANIFEST).is_file():
        try:
            manifest = read_manifest(directory)
        except ResultsError:
            manifest = {}
        same = manifest.get("scenario_sha256") == scenario_digest(scenario)
        same = same and manifest.get("driver", "simulate") == driver
        same_code = manifest.get("plugins", []) == plugin_records(scenario)  # its plug-ins' modules unchanged
        if same and same_code and manifest.get("status") == "complete" and not force:
            check_run(directory, manifest)  # an older dropsim's manifest has no digests: found finished, unverified
            return False
        if not same and not force:
            raise ResultsError(
                f"{directory}: holds the results of another scenario ({manifest.get('run_id', '?')}); "
                "use --force to overwrite them, or --output for another folder"
            )
        return True
    if directory.is_dir() and any(directory.iterdir()) and not force:
        raise ResultsError(f"{directory}: is not empty and holds no dropsim run; use --force or another --output")
    return True


def _close(sim: Experiment | None) -> None:
    if sim is not None:
        sim.close()


def summarize(directory: Path) -> RunSummary:
    """The summary of a finished run, from its tables."""
    manifest = read_manifest(directory)
    rounds = read_run_table(directory, "rounds")
    accuracy = rounds["accuracy"].dropna() if "accuracy" in rounds else pd.Series(dtype=float)
    n = len(rounds)
    return RunSummary(
        run_id=str(manifest.get("run_id", directory.name)),
        rounds=n,
        final_accuracy=float(accuracy.iloc[-1]) if len(accuracy) else math.nan,
        best_accuracy=float(accuracy.max()) if len(accuracy) else math.nan,
        mean_round_time=float(rounds["round_time"].mean()) if n else math.nan,
        virtual_seconds=float(rounds["t_end"].iloc[-1]) if n else 0.0,
        mean_dropped=float(rounds["dropped"].mean()) if n else math.nan,
        aborted=int((rounds["outcome"] != "ok").sum()) if n else 0,
        wall_seconds=float(manifest.get("wall_seconds", math.nan)),
        epsilon=float(rounds["epsilon"].iloc[-1]) if n and "epsilon" in rounds else math.inf,
        stopped=str(manifest.get("stopped", "")),
    )


def run_scenario(
    scenario: Scenario,
    directory: Path,
    progress: bool = True,
    engine: Callable[[Scenario], Experiment] = Simulation,
    driver: str = "simulate",
) -> RunSummary:
    """Run ``scenario`` and write its results to ``directory``: simulated, or through another ``engine``
    (an :class:`Experiment` with another driver, such as the socket deployment, ``driver="deploy"``), which
    the manifest records."""
    check_name(scenario)
    started = time.perf_counter()
    manifest: dict[str, Any] = {
        "driver": driver,
        "run_id": scenario.run_id or scenario.name,
        "scenario_name": scenario.name,
        "seed": scenario.seed,
        "swept": scenario.swept,
        "scenario": scenario.resolved,
        "scenario_sha256": scenario_digest(scenario),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "host": host(),
    }
    plugins = plugin_records(scenario)
    if plugins:  # each plug-in's import path, its distribution's version and its module's digest
        manifest["plugins"] = plugins
    writer = RunWriter(
        directory,
        manifest,
        extra_columns=list(scenario.swept),
        round_columns=step_columns(spec_of(scenario.aggregation).steps_for(scenario.aggregation)),
    )
    accuracies: list[float] = []
    times: list[float] = []
    dropped: list[int] = []
    epsilon = math.inf
    aborted = 0
    t_end = 0.0
    sim: Experiment | None = None
    try:
        sim = engine(scenario)
        writer.manifest.update(
            driver=sim.driver.name,  # what really played the rounds
            model_parameters=sim.dim,
            cost_profile={
                "source": sim.costs.source,
                "implementation": sim.costs.implementation,
                "machine": sim.costs.machine,
            },
            training_cost=(  # measured, or estimated from another shape (sim.costs.estimate)
                sim.world.training_estimate.manifest()
                if sim.world.training_estimate is not None
                else {"op": sim.world.train_op, "estimated": False}
            ),
            **sim.manifest_entries(),
        )
        if sim.world.learner is not None:  # the device, torch's and CUDA's versions, clients trained together
            writer.manifest.update(training=sim.world.learner.manifest())
        if sim.chunks is not None:
            plan = sim.chunk_plan
            writer.manifest.update(
                pipeline={
                    "chunks": sim.chunks,
                    "chosen_by": "auto" if plan is not None else "scenario",
                    "predicted_s": {str(m): t for m, t in plan.predicted.items()} if plan is not None else {},
                }
            )
        bar = tqdm(
            range(scenario.rounds),
            desc=scenario.run_id or scenario.name,
            unit="round",
            disable=not progress,
            leave=False,
        )
        for _ in bar:
            result = sim.step()
            writer.append(round_rows(manifest["run_id"], result, scenario.swept))
            rec = result.record
            times.append(rec.t_end - rec.t_start)
            dropped.append(rec.sampled - rec.survivors)
            t_end = rec.t_end
            aborted += rec.outcome != "ok"
            if result.privacy is not None:
                epsilon = result.privacy.epsilon
            if not math.isnan(result.accuracy):
                accuracies.append(result.accuracy)
                bar.set_postfix(acc=f"{result.accuracy:.3f}")
            if sim.stopped:
                writer.manifest.update(stopped=f"after round {rec.round}: {sim.stopped}")
                break
        writer.manifest.update(sim.manifest_entries())  # what its driver learnt playing (a deployment's workers)
        if sim.world.learner is not None:  # groups halved when the device ran out of memory
            writer.manifest.update(training=sim.world.learner.manifest())
    except KeyboardInterrupt:
        writer.close("interrupted", wall_seconds=time.perf_counter() - started)
        raise
    except Exception as exc:
        writer.close(
            "failed",
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            wall_seconds=time.perf_counter() - started,
        )
        raise
    finally:
        _close(sim)  # on every exit, SystemExit included
    wall = time.perf_counter() - started
    writer.close("complete", wall_seconds=wall, virtual_seconds=t_end)
    return RunSummary(
        run_id=manifest["run_id"],
        rounds=len(times),
        final_accuracy=accuracies[-1] if accuracies else math.nan,
        best_accuracy=max(accuracies) if accuracies else math.nan,
        mean_round_time=sum(times) / len(times) if times else math.nan,
        virtual_seconds=t_end,
        mean_dropped=sum(dropped) / len(dropped) if dropped else math.nan,
        aborted=aborted,
        wall_seconds=wall,
        epsilon=epsilon,
        stopped=str(writer.manifest.get("stopped", "")),
    )
