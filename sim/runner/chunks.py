"""Choosing the chunk count: profile short runs, fit Dordis eq. 3, enumerate m through the recurrence.

Dordis (section 4.2) profiles each stage's per-chunk latency "by linear regression with offline
micro-benchmarking, which executes the protocol with small-scale proxy data for certain rounds". Here the
proxy runs are simulated: the scenario's first round in ``timing`` fidelity, with an abstract model of d'
parameters whose training takes no time (the pipeline starts at once), for d' in {d, d/4} and m in
{1, 2, 4, 8, 16} (those up to ``pipeline.max_chunks``). From each proxy round and stage s, the per-chunk
latency is the time from the last party's admission to stage s of a chunk to the last party's release of
it (on its resource: the clients', or the server's), averaged over the chunks. :func:`fit_stages` fits
tau_s = beta_s1 d/m + beta_s2 m + beta_s3 to those, and :meth:`PerformanceModel.best` picks the m in
1..``max_chunks`` with the earliest completion under the Hyades appendix F recurrence.

:func:`check_chunks` simulates the scenario's first rounds at every m and reports the simulated
aggregation time next to the prediction, so the analytic choice can be compared with the simulated best.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sim.errors import InputError
from sim.pipeline.performance import PerformanceModel, fit_stages
from sim.pipeline.recurrence import DORDIS_RESOURCES, DUPLEX_RESOURCES
from sim.round.privacy import padded
from sim.round.records import RoundRecord
from sim.scenario.dropout_modes import DEFAULT_MODE
from sim.scenario.types import Model, Scenario

PROXY_CHUNKS = (1, 2, 4, 8, 16)
"""Chunk counts of the profiling runs (those up to ``pipeline.max_chunks``)."""
PROXY_FRACTIONS = (1.0, 0.25)
"""Update sizes of the profiling runs, as fractions of the scenario's."""


@dataclass(frozen=True)
class ChunkPlan:
    """The chosen chunk count with the model behind it."""

    chunks: int
    """The m chosen: the predicted best, unless a proxy run at another m was faster than it."""
    dim: int
    """The update length d the prediction is for (values)."""
    model: PerformanceModel
    predicted: dict[int, float]
    """Predicted seconds from the first chunk's stage 1 to the last chunk's last stage, per m."""
    observations: tuple[tuple[int, int, int, float], ...]
    """``(stage, d, m, seconds)`` measured in the proxy runs (stages numbered from 0)."""
    predicted_best: int = 1
    """The m with the earliest predicted completion."""
    proxy_seconds: dict[int, float] = field(default_factory=dict)
    """Simulated aggregation seconds of the full-size proxy round per m (profiled m and the predicted
    best)."""


class PlanError(InputError):
    """``pipeline.chunks: auto`` cannot profile the scenario."""


def _proxy(scenario: Scenario, dim: int, chunks: int, calm: bool = False) -> Scenario:
    """The scenario's first round in timing fidelity with an update of ``dim`` values and no training
    (``calm``: and nobody dropping)."""
    assert scenario.pipeline is not None
    dropout = scenario.dropout
    if calm:
        dropout = dataclasses.replace(dropout, mode=DEFAULT_MODE, rate=0.0)  # the default mode at rate 0: nobody
    return dataclasses.replace(
        scenario,
        rounds=1,
        fidelity="timing",
        model=Model(name=None, params=dim),
        pipeline=dataclasses.replace(scenario.pipeline, chunks=chunks),
        dropout=dropout,
    )


def _simulate(scenario: Scenario) -> list[RoundRecord]:
    # deferred: sim.runner.experiment imports sim.runner.chunks at import time
    from sim.runner.experiment import Simulation

    simulation = Simulation(scenario)
    return [simulation.step().record for _ in range(scenario.rounds)]


def stage_latencies(record: RoundRecord, stages: int) -> list[float]:
    """Per-chunk latency of each stage in one simulated round: for each chunk, from the last party's
    admission to the stage to the last party's release of it (the recurrence's l_s = f(s, c) - b(s, c)
    for the parties taken together); then the mean over the chunks (NaN for a stage that never ran)."""
    out = []
    for s in range(1, stages + 1):
        per_chunk = [
            max(end for _, end in spans) - max(start for start, _ in spans)
            for (stage, _), spans in record.held.items()
            if stage == s and spans
        ]
        out.append(sum(per_chunk) / len(per_chunk) if per_chunk else float("nan"))
    return out


def plan_chunks(scenario: Scenario, dim: int, say: Callable[[str], None] | None = None) -> ChunkPlan:
    """Profile proxy runs of ``scenario`` (which has a pipeline section; its updates have ``dim`` values)
    and choose its chunk count."""
    assert scenario.pipeline is not None
    say = say or (lambda _msg: None)
    stages = 5 if scenario.pipeline.dispatch else 3
    layout = DUPLEX_RESOURCES if scenario.pipeline.links == "duplex" else DORDIS_RESOURCES
    resources = layout[:stages]
    calm = False
    observations, proxy_seconds = _profile(scenario, dim, stages, say)
    if not observations:
        # Its first round aborts (e.g. too many dropouts for the threshold): time the stages without dropout.
        say("the scenario's first round aborts: profiling it without dropout")
        calm = True
        observations, proxy_seconds = _profile(scenario, dim, stages, say, calm)
    if not observations:
        raise PlanError(
            "pipeline.chunks: auto: no profiling round completed, even without dropout (the round aborts: see "
            "`dropsim run` with pipeline.chunks: 1); set pipeline.chunks to a number"
        )
    try:
        model = fit_stages(observations, resources)
    except ValueError as exc:
        raise PlanError(f"pipeline.chunks: auto: {exc}; set pipeline.chunks to a number") from None
    largest = min(scenario.pipeline.max_chunks, _encoded_length(scenario, dim))
    best, predicted = model.best(dim, range(1, largest + 1))
    if best not in proxy_seconds:
        say(f"simulating the predicted best, m = {best}")
        seconds = _proxy_seconds(_simulate(_proxy(scenario, dim, best, calm)))
        if seconds is not None:
            proxy_seconds[best] = seconds
    # The recurrence is an approximation (it sums the slowest party's latency stage by stage): keep the
    # predicted best unless a proxy round at another m was faster than it.
    chosen = best
    if best in proxy_seconds:
        chosen = min(proxy_seconds, key=lambda m: (proxy_seconds[m], m != best, m))
    return ChunkPlan(chosen, dim, model, predicted, tuple(observations), best, proxy_seconds)


def _encoded_length(scenario: Scenario, dim: int) -> int:
    """Values per encoded update: DSkellam pads to a power of two."""
    return padded(dim) if scenario.privacy.enabled else dim


def _proxy_seconds(records: list[RoundRecord]) -> float | None:
    """Aggregation seconds of a proxy round (its clients train in no time), None if it aborted."""
    done = [r for r in records if r.outcome == "ok"]
    if not done:
        return None
    return sum(r.t_end - _aggregation_start(r) for r in done) / len(done)


def _aggregation_start(record: RoundRecord) -> float:
    """When the last client to enter the aggregation finished training (``agg_time`` starts there)."""
    trained = record.last_trained
    return trained if trained is not None else record.t_start


def _profile(
    scenario: Scenario, dim: int, stages: int, say: Callable[[str], None], calm: bool = False
) -> tuple[list[tuple[int, int, int, float]], dict[int, float]]:
    """``(stage, d, m, seconds)`` from the proxy rounds that completed, and the full-size proxies'
    aggregation seconds per m."""
    assert scenario.pipeline is not None
    observations: list[tuple[int, int, int, float]] = []
    full: dict[int, float] = {}
    for fraction in PROXY_FRACTIONS:
        d = max(int(dim * fraction), 1)
        for m in PROXY_CHUNKS:
            if m > scenario.pipeline.max_chunks or m > _encoded_length(scenario, d):
                continue
            say(f"profiling d = {d}, m = {m}")
            records = _simulate(_proxy(scenario, d, m, calm))
            for record in records:
                if record.outcome != "ok":
                    continue
                for s, seconds in enumerate(stage_latencies(record, stages)):
                    if not math.isnan(seconds):
                        observations.append((s, d, m, seconds))
            took = _proxy_seconds(records)
            if d == dim and took is not None:
                full[m] = took
    return observations, full


@dataclass(frozen=True)
class CheckRow:
    chunks: int
    simulated_s: float
    """Mean simulated aggregation time (``agg_time``) of the checked rounds (s)."""
    round_time_s: float
    """Mean simulated round time of the checked rounds (s)."""


def check_chunks(
    scenario: Scenario,
    candidates: Sequence[int],
    rounds: int = 1,
    say: Callable[[str], None] | None = None,
) -> list[CheckRow]:
    """Simulate the scenario's first ``rounds`` (timing fidelity, its own model) at every m of
    ``candidates``: the times to set beside a :class:`ChunkPlan`'s predictions."""
    assert scenario.pipeline is not None
    say = say or (lambda _msg: None)
    rows = []
    for m in candidates:
        say(f"simulating m = {m}")
        proxy = dataclasses.replace(
            scenario,
            rounds=min(rounds, scenario.rounds),
            fidelity="timing",
            pipeline=dataclasses.replace(scenario.pipeline, chunks=m),
        )
        agg, total = [], []
        for rec in _simulate(proxy):
            if rec.outcome != "ok":
                continue
            agg.append(rec.t_end - _aggregation_start(rec))
            total.append(rec.t_end - rec.t_start)
        nan = float("nan")
        rows.append(
            CheckRow(
                m,
                sum(agg) / len(agg) if agg else nan,
                sum(total) / len(total) if total else nan,
            )
        )
    return rows
