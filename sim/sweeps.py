"""Running a sweep: every grid point of a scenario, in worker processes, resumable.

Layout: ``OUTPUT/sweep.json`` (the file, the grid and the run ids in order), ``OUTPUT/runs/<run_id>/``
(one run folder each), ``OUTPUT/runs.csv`` (status of every run: ``complete``, ``skipped`` when an
earlier sweep finished it with the same resolved scenario, ``failed`` with the error, ``interrupted`` by
Ctrl-C) and ``OUTPUT/rounds.csv`` (the rounds of every finished run, in sweep order). Both tables are
rewritten atomically each time a run ends, so a killed sweep keeps every finished run, and running the
sweep again skips them, once their tables are checked against the digests their manifests record: a
finished run whose table changed since stops the sweep before anything runs, naming the file
(:mod:`sim.results.integrity`); ``force`` runs every point again. A failing run is reported and does not
stop the others. Workers are started with ``spawn`` (no forked torch state) and stopped at once on
Ctrl-C. With a ``scheduler`` address the points run on a Dask distributed cluster instead
(:mod:`sim.cluster`), and the tables are written here the same way.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from sim.results.folders import check_name
from sim.results.integrity import ChangedTableError, check_run
from sim.results.read import SWEEP, read_manifest, read_run_table
from sim.results.writer import MANIFEST, ResultsError, csv_bytes, make_folder, write_atomic, write_json
from sim.runner import scenario_digest, summarize
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
            from sim.cluster import run_on_cluster

            run_on_cluster(grid, source, todo, out, scheduler, finish)
        elif jobs <= 1:
            for point in todo:
                finish(run_point(point, str(out / "runs" / point.run_id)))
        elif todo:
            _run_parallel(todo, out, jobs, finish)
    except KeyboardInterrupt:
        for run_id in order:
            statuses.setdefault(run_id, RunStatus(run_id, "interrupted"))
        _write_tables(out, order, statuses)
        bar.close()
        raise
    bar.close()
    return [statuses[r] for r in order]


MAX_ATTEMPTS = 2
"""Times a run is started in a worker before a dying worker process counts as the run's failure."""


def _run_parallel(todo: list[Scenario], out: Path, jobs: int, finish: Callable[[RunStatus], None]) -> None:
    """Run the points in ``jobs`` spawned worker processes, at most ``jobs`` at a time.

    A worker process that dies (killed, out of memory) breaks the whole pool and every run in flight with
    it; those runs are started again in a fresh pool, and a run in flight at a second breakage is marked
    failed, so one bad run cannot fail the others. On Ctrl-C the workers are stopped at once.
    """
    queue = list(todo)
    attempts: dict[str, int] = {}
    context = multiprocessing.get_context("spawn")
    while queue:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context)
        running: dict[Future[RunStatus], Scenario] = {}
        broken: list[Scenario] = []
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    point = queue.pop(0)
                    attempts[point.run_id] = attempts.get(point.run_id, 0) + 1
                    running[pool.submit(run_point, point, str(out / "runs" / point.run_id))] = point
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    point = running.pop(future)
                    try:
                        finish(future.result())
                    except BrokenProcessPool:
                        broken.append(point)
                if broken:
                    broken += list(running.values())
                    break
        except KeyboardInterrupt:
            # Workers may not have seen the signal (it can be sent to this process alone): stop them, so
            # the interrupted runs keep the rounds they finished and a later sweep runs them again.
            _stop(pool)
            raise
        if broken:
            _stop(pool)
        else:
            pool.shutdown()
        for point in broken:
            directory = out / "runs" / point.run_id
            try:
                finished = is_finished(directory, point)  # it ended just before the pool broke
            except ResultsError:
                finished = False
            if finished:
                finish(RunStatus(point.run_id, "complete", summary=summarize(directory)))
            elif attempts[point.run_id] >= MAX_ATTEMPTS:
                finish(RunStatus(point.run_id, "failed", f"its worker process died {MAX_ATTEMPTS} times"))
            else:
                queue.insert(0, point)


def _stop(pool: ProcessPoolExecutor) -> None:
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


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
