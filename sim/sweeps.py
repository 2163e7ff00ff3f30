"""Running a sweep: every grid point of a scenario, in worker processes, resumable.

Layout: ``OUTPUT/sweep.json`` (the file, the grid and the run ids in order), ``OUTPUT/runs/<run_id>/``
(one run folder each), ``OUTPUT/runs.csv`` (status of every run: ``complete``, ``skipped`` when an
earlier sweep finished it with the same resolved scenario, ``failed`` with the error, ``interrupted`` by
Ctrl-C or SIGTERM) and ``OUTPUT/rounds.csv`` (the rounds of every finished run, in sweep order). Both tables
are rewritten atomically each time a run ends, so a killed sweep keeps every finished run, and running the
sweep again skips them, once their tables are checked against the digests their manifests record: a
finished run whose table changed since stops the sweep before anything runs, naming the file
(:mod:`sim.results.integrity`); ``force`` runs every point again. A failing run is reported and does not
stop the others. Workers are spawned processes (:mod:`sim.runner.workers`); when the sweep is interrupted
they are interrupted too, so that each run closes its manifest as ``interrupted``, and reaped (a worker
that does not answer in time is killed, and its run's manifest closed here). With a ``scheduler`` address
the points run on a Dask distributed cluster instead (:mod:`sim.cluster`), and the tables are written here
the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from sim.cluster import run_on_cluster
from sim.results.folders import check_name
from sim.results.integrity import ChangedTableError, check_run
from sim.results.read import SWEEP, read_manifest, read_run_table
from sim.results.writer import (
    MANIFEST,
    ResultsError,
    csv_bytes,
    make_folder,
    mark_interrupted,
    write_atomic,
    write_json,
)
from sim.runner import scenario_digest, summarize
from sim.runner.interrupts import deferred
from sim.runner.workers import Died, Done, Interrupted, Outcome, Raised, Workers
from sim.scenario.grid import Grid
from sim.scenario.plugins import plugin_records
from sim.scenario.types import Scenario
from sim.sweep_point import RunStatus, run_point

RUN_COLUMNS = ("run_id", "status", "error", "rounds", "final_accuracy", "mean_round_time", "wall_seconds")


def is_finished(directory: Path, scenario: Scenario) -> bool:
    """Whether ``directory`` holds a complete run of exactly this resolved scenario; raises
    :class:`~sim.results.integrity.ChangedTableError` when it does but one of its tables changed since (a
    manifest without digests, from an older dropsim, counts as finished, unverified)."""
    try:
        manifest = read_manifest(directory)
    except ResultsError:
        return False
    same_code = manifest.get("plugins", []) == plugin_records(scenario)  # its plug-ins' modules unchanged
    finished = (
        manifest.get("status") == "complete"
        and manifest.get("scenario_sha256") == scenario_digest(scenario)
        and same_code
    )
    if finished:
        check_run(directory, manifest)
    return finished


def run_sweep(
    grid: Grid,
    source: str,
    jobs: int = 1,
    progress: bool = True,
    on_status: Callable[[RunStatus], None] | None = None,
    scheduler: str | None = None,
    force: bool = False,
) -> list[RunStatus]:
    """Run every point of ``grid`` (from scenario file ``source``) into its ``output`` folder: in this process
    (``jobs`` 1), in ``jobs`` worker processes, or on the Dask cluster whose scheduler is at ``scheduler``
    (:mod:`sim.cluster`; ``jobs`` is then the cluster's business). Points already finished there are kept
    (``skipped``), unless ``force``; one whose tables changed since stops the sweep before anything runs."""
    points = grid.points()
    check_name(points[0])  # the name is fixed per file: every point has the base's
    out = Path(points[0].output)
    if (out / MANIFEST).is_file() and not (out / SWEEP).exists():
        raise ResultsError(f"{out}: holds a single run's results; give the sweep another --output")
    statuses: dict[str, RunStatus] = {}
    todo: list[Scenario] = []
    changed: list[str] = []
    for point in points:
        directory = out / "runs" / point.run_id
        try:
            finished = not force and is_finished(directory, point)
        except ChangedTableError as exc:
            changed.append(str(exc))
            continue
        if finished:
            statuses[point.run_id] = RunStatus(point.run_id, "skipped", summary=summarize(directory))
        else:
            todo.append(point)
    if changed:
        head = f"{len(changed)} finished runs' tables changed since they completed:\n  " if len(changed) > 1 else ""
        raise ChangedTableError(head + "\n  ".join(changed))
    make_folder(out)
    write_json(
        out / SWEEP,
        {"scenario_file": source, "sweep": grid.sweep, "run_ids": [p.run_id for p in points]},
    )
    order = [p.run_id for p in points]
    _write_tables(out, order, statuses)
    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc="sweep", unit="run", disable=not progress)

    def finish(status: RunStatus) -> None:
        statuses[status.run_id] = status
        _write_tables(out, order, statuses)
        bar.update(1)
        if on_status is not None:
            on_status(status)

    try:
        if scheduler is not None and todo:
            run_on_cluster(grid, source, todo, out, scheduler, finish)
        elif jobs <= 1:
            for point in todo:
                finish(run_point(point, str(out / "runs" / point.run_id)))
        elif todo:
            _run_parallel(todo, out, jobs, finish)
    except KeyboardInterrupt:
        with deferred():  # a second Ctrl-C must not leave runs.csv half told
            for run_id in order:
                statuses.setdefault(run_id, RunStatus(run_id, "interrupted"))
            _write_tables(out, order, statuses)
            bar.close()
        raise
    bar.close()
    return [statuses[r] for r in order]


MAX_ATTEMPTS = 2
"""Times a run is started in a worker before a dying worker process counts as the run's failure."""
STOP_GRACE_S = 10.0
"""How long an interrupted sweep waits for its running points to close their manifests before it kills their
workers and closes the manifests itself (seconds)."""


def _run_job(job: tuple[Scenario, str]) -> RunStatus:
    """A worker's job: one point into its folder."""
    return run_point(*job)


def _run_parallel(todo: list[Scenario], out: Path, jobs: int, finish: Callable[[RunStatus], None]) -> None:
    """Run the points in at most ``jobs`` worker processes at a time.

    A worker process that dies (killed, out of memory) costs only its own run, which is started again in a
    fresh worker; a run whose worker dies a second time is marked failed. When the sweep is interrupted (or
    anything else stops it), the running points are interrupted and every worker is reaped before the
    exception goes on; a point whose worker had to be killed has its manifest closed as ``interrupted`` here.
    """
    queue = list(todo)
    attempts: dict[str, int] = {}
    workers: Workers[tuple[Scenario, str]] = Workers(_run_job, jobs)
    try:
        while queue or workers.busy:
            while queue and workers.free:
                point = queue.pop(0)
                attempts[point.run_id] = attempts.get(point.run_id, 0) + 1
                workers.start(point.run_id, (point, str(out / "runs" / point.run_id)))
            for _, (point, directory), outcome in workers.wait():
                if _settle(point, Path(directory), outcome, attempts[point.run_id], finish):
                    queue.insert(0, point)
    except BaseException:
        with deferred():  # stopping: a second signal must not leave a worker behind
            for _, (_point, directory), outcome in workers.stop(STOP_GRACE_S):
                if isinstance(outcome, Done):  # it finished (or failed) before it saw the signal
                    finish(outcome.result)
                else:
                    mark_interrupted(Path(directory))
        raise
    workers.close()


def _settle(
    point: Scenario, directory: Path, outcome: Outcome, attempt: int, finish: Callable[[RunStatus], None]
) -> bool:
    """Record how a worker's run of ``point`` ended; True when it should run again (its worker died)."""
    if isinstance(outcome, Done):
        finish(outcome.result)
    elif isinstance(outcome, Raised):
        finish(RunStatus(point.run_id, "failed", outcome.error))
    elif isinstance(outcome, Interrupted):  # its worker alone was signalled: the run is closed, the sweep goes on
        finish(RunStatus(point.run_id, "interrupted"))
    else:
        assert isinstance(outcome, Died)
        try:
            finished = is_finished(directory, point)  # it ended just before its worker died
        except ResultsError:
            finished = False
        if finished:
            finish(RunStatus(point.run_id, "complete", summary=summarize(directory)))
        elif attempt >= MAX_ATTEMPTS:
            finish(RunStatus(point.run_id, "failed", f"its worker process died {MAX_ATTEMPTS} times"))
        else:
            return True
    return False


def _swept_keys(out: Path) -> list[str]:
    return list(json.loads((out / SWEEP).read_text(encoding="utf-8")).get("sweep", {}))


def _write_tables(out: Path, order: list[str], statuses: dict[str, RunStatus]) -> None:
    rows: list[dict[str, Any]] = []
    frames = []
    for run_id in order:
        status = statuses.get(run_id)
        if status is None:
            rows.append({"run_id": run_id, "status": "pending"})
            continue
        row: dict[str, Any] = {"run_id": run_id, "status": status.status, "error": status.error}
        directory = out / "runs" / run_id
        if status.status in ("complete", "skipped"):
            try:
                manifest = read_manifest(directory)
                rounds = read_run_table(directory, "rounds")
            except ResultsError as exc:
                row.update(status="failed", error=str(exc))
            else:
                frames.append(rounds)
                acc = rounds["accuracy"].dropna() if "accuracy" in rounds else pd.Series(dtype=float)
                row.update(
                    rounds=len(rounds),
                    final_accuracy=float(acc.iloc[-1]) if len(acc) else None,
                    mean_round_time=float(rounds["round_time"].mean()) if len(rounds) else None,
                    wall_seconds=manifest.get("wall_seconds"),
                )
        rows.append(row)
    write_atomic(out / "runs.csv", csv_bytes(rows, RUN_COLUMNS, header=True))
    if frames:
        combined = pd.concat(frames, ignore_index=True)
        # Runs of different protocols have different step columns: keep the fixed columns first, then every
        # step column, then the swept keys, as each run's own table does.
        swept = [c for c in combined.columns if c in _swept_keys(out)]
        first = [c for c in combined.columns if c not in swept]
        combined = combined[first + swept]
        write_atomic(out / "rounds.csv", combined.to_csv(index=False, float_format=None).encode())
