"""The result tables: their columns, and the rows a round contributes to each.

Tidy tables (one row per observation) with fixed leading columns; the sweep's parameters follow as
extra columns named by their key path (``dropout.rate``). Times are virtual seconds, sizes bytes.

- ``rounds.csv``: one row per round; ``time_<step>`` columns give each server collection step's duration;
  with distributed DP, ``target_variance`` (sigma*^2), ``realised_variance`` (the noise left in the
  aggregate), ``accounted_variance`` and the cumulative ``epsilon`` at ``privacy.delta`` (model units);
  ``revealed``, the survivors whose sum the server unmasked (also for a round that then aborted).
  ``chunks`` is the chunk count of a pipelined round (1 otherwise); ``agg_time`` is the part of the round
  after the last client to enter the aggregation finished training (the distributed-DP aggregation,
  Dordis Figure 10's 'agg') and ``other_time`` the rest (model download and training); ``util_<resource>``
  is the fraction of the round a resource was busy (client CPU: training and protocol work; a link: any
  transfer under way; client columns are means over the sampled clients).
- ``clients.csv``: one row per round and sampled client.
- ``stages.csv``: one row per round and stage: client-side activity spans (``download``, ``train``,
  ``upload``: first start to last end over the clients that did it), server collection steps
  (``step.<name>``) and the server's aggregation (``aggregate``). Pipelined rounds add ``encode`` (clients
  encode their whole update), one row per chunk and Dordis Table 1 stage (``chunk.mask``, ``chunk.upload``,
  ``chunk.aggregate``, ``chunk.dispatch``, ``chunk.decode``, with ``chunk`` and ``pipeline_stage`` 1-5;
  first admission to last release over the parties that ran it) and ``update`` (the server decodes the
  concatenated sums). ``resource`` names what the stage runs on.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sim.round.records import ClientRecord, RoundPrivacy, RoundResult

ROUND_COLUMNS = (
    "run_id",
    "round",
    "t_start",
    "t_end",
    "round_time",
    "outcome",
    "sampled",
    "survivors",
    "dropped",
    "dropped_planned",
    "timed_out",
    "accuracy",
    "loss",
    "model_sha256",
    "download_s",
    "train_s",
    "upload_s",
    "aggregate_s",
    "client_bytes_down_mean",
    "client_bytes_up_mean",
    "server_bytes_out",
    "server_bytes_in",
    "server_compute_s",
    "client_compute_s_mean",
    "server_cpu_s",
    "client_cpu_s_mean",
    "target_variance",
    "realised_variance",
    "accounted_variance",
    "epsilon",
    "dp_scale",
    "revealed",
    "online",
    "chunks",
    "agg_time",
    "other_time",
    "util_client_cpu",
    "util_client_link",
    "util_server_cpu",
    "util_server_link",
)
CLIENT_COLUMNS = (
    "run_id",
    "round",
    "client",
    "slowdown",
    "bandwidth_mbps",
    "samples",
    "download_s",
    "train_s",
    "upload_s",
    "compute_s",
    "cpu_s",
    "bytes_down",
    "bytes_up",
    "dropped_stage",
    "left_at",
    "in_aggregate",
)
STAGE_COLUMNS = ("run_id", "round", "stage", "resource", "t_start", "t_end", "clients", "chunk", "pipeline_stage")

UTILISED = ("client_cpu", "client_link", "server_cpu", "server_link")

TABLES = {"rounds": ROUND_COLUMNS, "clients": CLIENT_COLUMNS, "stages": STAGE_COLUMNS}


def step_columns(steps: tuple[str, ...]) -> tuple[str, ...]:
    """``rounds.csv`` columns with the duration of each of the protocol's server steps."""
    return tuple(f"time_{step}" for step in steps)


def swept_value(value: Any) -> Any:
    """A sweep value as a table cell: scalars as they are, anything else as compact JSON."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def privacy_cells(privacy: RoundPrivacy | None) -> dict[str, float]:
    """The privacy columns of a round: NaN without distributed DP (epsilon inf: nothing protects it)."""
    if privacy is None:
        return {
            "target_variance": math.nan,
            "realised_variance": math.nan,
            "accounted_variance": math.nan,
            "epsilon": math.inf,
            "dp_scale": math.nan,
        }
    return {
        "target_variance": privacy.target_variance,
        "realised_variance": privacy.realised_variance,
        "accounted_variance": privacy.accounted_variance,
        "epsilon": privacy.epsilon,
        "dp_scale": privacy.scale,
    }


def round_rows(run_id: str, result: RoundResult, swept: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The rows one round adds to each table (step durations as ``time_<step>``, NaN if not reached)."""
    rec = result.record
    extra = {k: swept_value(v) for k, v in swept.items()}
    clients = rec.clients
    n = len(clients)
    round_time = rec.t_end - rec.t_start
    trained = rec.last_trained
    other = min(trained - rec.t_start, round_time) if trained is not None else round_time
    round_row = {
        "run_id": run_id,
        "round": rec.round,
        "t_start": rec.t_start,
        "t_end": rec.t_end,
        "round_time": round_time,
        "outcome": rec.outcome,
        "sampled": rec.sampled,
        "survivors": rec.survivors,
        "dropped": rec.sampled - rec.survivors,
        "dropped_planned": rec.dropped_planned,
        "timed_out": rec.timed_out,
        "accuracy": result.accuracy,
        "loss": result.loss,
        "model_sha256": result.model_sha256,
        "download_s": mean_of([c.download_end - c.download_start for c in clients]),
        "train_s": mean_of([c.train_end - c.train_start for c in clients]),
        "upload_s": mean_of([c.upload_s for c in clients if c.bytes_up]),
        "aggregate_s": rec.t_end - rec.aggregate_start,
        "client_bytes_down_mean": sum(c.bytes_down for c in clients) / n if n else math.nan,
        "client_bytes_up_mean": sum(c.bytes_up for c in clients) / n if n else math.nan,
        "server_bytes_out": rec.server_bytes_out,
        "server_bytes_in": rec.server_bytes_in,
        "server_compute_s": rec.server_compute_s,
        "client_compute_s_mean": mean_of([c.compute_s for c in clients]),
        "server_cpu_s": rec.server_cpu_s,
        "client_cpu_s_mean": mean_of([c.cpu_s for c in clients]),
        **privacy_cells(result.privacy),
        "revealed": rec.exposed if rec.exposed is not None else 0,
        "online": rec.online,
        "chunks": rec.chunks,
        "agg_time": round_time - other,
        "other_time": other,
        **{f"util_{k}": rec.utilisation.get(k, math.nan) for k in UTILISED},
        **{f"time_{step}": end - start for step, start, end in rec.steps},
        **extra,
    }
    aggregated = frozenset(rec.aggregate.survivors) if rec.aggregate is not None else frozenset()
    client_rows = [_client_row(run_id, rec.round, c, extra, aggregated) for c in clients]
    stage_rows = []
    for stage, start_attr, end_attr in (
        ("download", "download_start", "download_end"),
        ("train", "train_start", "train_end"),
    ):
        span = _span(clients, start_attr, end_attr)
        if span is not None:
            stage_rows.append(
                _stage_row(run_id, rec.round, stage, "network" if stage == "download" else "client", *span, extra)
            )
    uploaders = [c for c in clients if c.bytes_up and not math.isnan(c.train_end)]
    if uploaders:
        stage_rows.append(
            _stage_row(
                run_id,
                rec.round,
                "upload",
                "network",
                min(c.train_end for c in uploaders),
                max(c.last_upload_end for c in uploaders if not math.isnan(c.last_upload_end))
                if any(not math.isnan(c.last_upload_end) for c in uploaders)
                else math.nan,
                len(uploaders),
                extra,
            )
        )
    for step, start, end in rec.steps:
        stage_rows.append(_stage_row(run_id, rec.round, f"step.{step}", "server", start, end, rec.sampled, extra))
    stage_rows.append(
        _stage_row(run_id, rec.round, "aggregate", "server", rec.aggregate_start, rec.t_end, rec.survivors, extra)
    )
    for stage, resource, chunk, pipeline_stage, start, end, parties in rec.spans:
        stage_rows.append(
            _stage_row(run_id, rec.round, stage, resource, start, end, parties, extra, chunk, pipeline_stage)
        )
    return {"rounds": [round_row], "clients": client_rows, "stages": stage_rows}


def mean_of(values: list[float]) -> float:
    """Mean of the finite values, NaN when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _client_row(
    run_id: str, round: int, c: ClientRecord, extra: dict[str, Any], aggregated: frozenset[int] = frozenset()
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "round": round,
        "client": c.client,
        "slowdown": c.slowdown,
        "bandwidth_mbps": c.bandwidth_mbps,
        "samples": c.samples,
        "download_s": c.download_end - c.download_start,
        "train_s": c.train_end - c.train_start,
        "upload_s": c.upload_s if c.bytes_up else math.nan,
        "compute_s": c.compute_s,
        "cpu_s": c.cpu_s,
        "bytes_down": c.bytes_down,
        "bytes_up": c.bytes_up,
        "dropped_stage": c.dropped_stage,
        "left_at": c.left_at,
        "in_aggregate": c.client in aggregated,
        **extra,
    }


def _span(clients: list[ClientRecord], start: str, end: str) -> tuple[float, float, int] | None:
    done = [c for c in clients if not math.isnan(getattr(c, end))]
    if not done:
        return None
    return min(getattr(c, start) for c in done), max(getattr(c, end) for c in done), len(done)


def _stage_row(
    run_id: str,
    round: int,
    stage: str,
    resource: str,
    start: float,
    end: float,
    clients: int,
    extra: dict[str, Any],
    chunk: int | None = None,
    pipeline_stage: int | None = None,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "round": round,
        "stage": stage,
        "resource": resource,
        "t_start": start,
        "t_end": end,
        "clients": clients,
        "chunk": chunk,
        "pipeline_stage": pipeline_stage,
        **extra,
    }
