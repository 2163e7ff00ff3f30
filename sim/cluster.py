"""Sweep points on a Dask distributed cluster: ``dropsim sweep FILE --scheduler tcp://HOST:PORT``.

Each point runs on a worker as it would locally, into a temporary folder there, and its run folder's files
come back to this process, which writes them into ``OUTPUT/runs/<run_id>/`` and keeps ``runs.csv`` and the
combined ``rounds.csv`` as a local sweep does (so the tables are identical, and a later sweep, local or not,
resumes it).

Only plain data crosses the cluster: the scenario as the JSON of its document with the point's swept
values (the worker parses and checks it exactly as :meth:`sim.scenario.grid.Grid.points` does), and back
a status, an error text and the files' bytes, whose names are checked before anything is written. Dask
itself pickles the function reference (``sim.cluster.run_remote``) and its own messages: use a cluster you
trust, over ``tls://`` when it spans machines. Paths in the scenario (``data.path``, ``trace.file``) are
opened on the workers: give paths that resolve there (the same checkout, or shared storage).
"""

from __future__ import annotations

import json
import re
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.results.writer import MANIFEST, make_folder, write_atomic
from sim.scenario.grid import Grid
from sim.scenario.parser import parse
from sim.scenario.source import parse_text
from sim.scenario.types import Scenario

CONNECT_TIMEOUT_S = 20.0
"""How long to wait for the scheduler before giving up (seconds)."""
_FILE_NAME = re.compile(r"^[A-Za-z0-9_=+-][A-Za-z0-9._=+-]*$")
"""A run id or file name a worker may send back: the characters of run ids (``dropout.rate=0.2_seed=1``), no
separator and no leading dot, so it names an entry of the run folder and nothing else."""


class ClusterError(InputError):
    """The scheduler cannot be reached, or ``distributed`` is not installed."""


def payload(grid: Grid, source: str, point: Scenario) -> dict[str, Any]:
    """What a worker needs to run ``point``: plain, JSON-able data."""
    return {
        "source": source,
        "document": json.dumps(grid.document.data),
        "swept": dict(point.swept),
        "run_id": point.run_id,
    }


def rebuild(sent: dict[str, Any]) -> Scenario:
    """The point's scenario from :func:`payload`: the document with the swept values set, parsed and checked."""
    doc = parse_text(str(sent["document"]), f"{sent['source']} (sent to a worker)")
    for key, value in dict(sent["swept"]).items():
        doc.set(tuple(str(key).split(".")), value, f"{sent['source']} (sweep {sent['run_id']})")
    return replace(parse(doc), swept=dict(sent["swept"]), run_id=str(sent["run_id"]))


def run_remote(sent: dict[str, Any]) -> dict[str, Any]:
    """Worker side: run the point into a temporary folder; its status, error and files (name -> bytes)."""
    # deferred: sim.sweep_point loads the runner and torch; storing results needs neither
    from sim.sweep_point import run_point

    scenario = rebuild(sent)
    with tempfile.TemporaryDirectory(prefix="dropsim-") as tmp:
        directory = Path(tmp) / "run"
        status = run_point(scenario, str(directory))
        files = (
            {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()} if directory.is_dir() else {}
        )
    return {"run_id": scenario.run_id, "status": status.status, "error": status.error, "files": files}


def store(result: dict[str, Any], runs: Path) -> Path:
    """Write a worker's files into ``runs/<run_id>/`` (each atomically, the manifest last, so that a store cut
    short never pairs a complete manifest with earlier tables); names are checked first. The manifest's
    digests of the tables, computed on the worker, are checked when the run is read back here."""
    run_id = str(result["run_id"])
    files = result.get("files", {})
    bad = [name for name in [run_id, *files] if not _FILE_NAME.match(str(name))]
    if bad:
        raise ClusterError(f"a worker sent back files with unusable names: {bad!r}")
    for name, data in files.items():
        if not isinstance(data, bytes):
            raise ClusterError(f"a worker sent {name!r} of run {run_id} as {type(data).__name__}, not bytes")
    directory = runs / run_id
    make_folder(directory)
    for name in sorted(files, key=lambda name: name == MANIFEST):  # the manifest, the commit record, last
        write_atomic(directory / name, files[name])
    return directory


def connect(address: str) -> Any:
    """A ``distributed.Client`` on the scheduler at ``address``; a clear error if that is impossible."""
    try:
        # deferred: distributed is optional (the cluster extra)
        from distributed import Client
    except ImportError:
        raise ClusterError(
            f"--scheduler {address}: needs the 'distributed' package: pip install -e '.[cluster]'"
        ) from None
    try:
        return Client(address, timeout=CONNECT_TIMEOUT_S)  # as_completed finds it as the default client
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"--scheduler {address}: cannot reach the Dask scheduler: {exc}") from None


def run_on_cluster(
    grid: Grid, source: str, todo: list[Scenario], out: Path, address: str, finish: Callable[[Any], None]
) -> None:
    """Run ``todo`` on the cluster at ``address``, calling ``finish`` with each point's status as it ends.

    A point whose worker raises, or dies more often than Dask retries it, is ``failed`` with the error; the
    others go on. On Ctrl-C the submitted points are cancelled.
    """
    # deferred: distributed is optional (the cluster extra)
    from distributed import as_completed

    # deferred: the runner loads torch; storing results needs none
    from sim.runner import summarize

    # deferred: sim.sweep_point loads the runner and torch; storing results needs neither
    from sim.sweep_point import RunStatus

    client = connect(address)
    tag = uuid.uuid4().hex[:8]  # this sweep's task keys, unique on a shared scheduler
    futures = {}
    try:
        for point in todo:
            key = f"dropsim-{tag}-{point.run_id}"
            futures[client.submit(run_remote, payload(grid, source, point), key=key, pure=False)] = point
        for future in as_completed(list(futures)):
            point = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # the worker raised (or died) outside the run's own error handling
                finish(RunStatus(point.run_id, "failed", f"{type(exc).__name__}: {exc}"))
                continue
            directory = store(result, out / "runs")
            complete = result["status"] == "complete"
            finish(
                RunStatus(point.run_id, result["status"], result["error"], summarize(directory) if complete else None)
            )
    except KeyboardInterrupt:
        client.cancel(list(futures))
        raise
    finally:
        client.close()
