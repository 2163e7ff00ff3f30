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
from dataclasses import dataclass

from sim.engine.round import RoundRecord
from sim.pipeline.performance import PerformanceModel, fit_stages
from sim.pipeline.recurrence import DORDIS_RESOURCES, DUPLEX_RESOURCES
from sim.scenario.schema import Model, Scenario

PROXY_CHUNKS = (1, 2, 4, 8, 16)
"""Chunk counts of the profiling runs (those up to ``pipeline.max_chunks``)."""
PROXY_FRACTIONS = (1.0, 0.25)
"""Update sizes of the profiling runs, as fractions of the scenario's."""


@dataclass(frozen=True)
class ChunkPlan:
    """The chosen chunk count with the model behind it."""

    chunks: int
    dim: int
    """The update length d the prediction is for (values)."""
    model: PerformanceModel
    predicted: dict[int, float]
    """Predicted seconds from the first chunk's stage 1 to the last chunk's last stage, per m."""
    observations: tuple[tuple[int, int, int, float], ...]
    """``(stage, d, m, seconds)`` measured in the proxy runs (stages numbered from 0)."""


def _proxy(scenario: Scenario, dim: int, chunks: int, rounds: int = 1) -> Scenario:
    """The scenario's first ``rounds`` in timing fidelity with an update of ``dim`` values and no training."""
    assert scenario.pipeline is not None
    return dataclasses.replace(
        scenario,
        rounds=min(rounds, scenario.rounds),
        fidelity="timing",
        model=Model(name=None, params=dim),
        pipeline=dataclasses.replace(scenario.pipeline, chunks=chunks),
    )


def _simulate(scenario: Scenario) -> list[RoundRecord]:
    from sim.engine.simulation import Simulation

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
    observations: list[tuple[int, int, int, float]] = []
    for fraction in PROXY_FRACTIONS:
        d = max(int(dim * fraction), 1)
        for m in PROXY_CHUNKS:
            if m > scenario.pipeline.max_chunks or m > d:
                continue
            say(f"profiling d = {d}, m = {m}")
            for record in _simulate(_proxy(scenario, d, m)):
                if record.outcome != "ok":
                    continue
                for s, seconds in enumerate(stage_latencies(record, stages)):
                    if not math.isnan(seconds):
                        observations.append((s, d, m, seconds))
    if not observations:
        raise ValueError("no profiling round of the pipeline completed: the scenario's first round aborts")
    model = fit_stages(observations, resources)
    best, predicted = model.best(dim, range(1, scenario.pipeline.max_chunks + 1))
    return ChunkPlan(best, dim, model, predicted, tuple(observations))


@dataclass(frozen=True)
class CheckRow:
    chunks: int
    predicted_s: float
    """Predicted pipeline completion (recurrence) for this m (s)."""
    simulated_s: float
    """Mean simulated aggregation time (``agg_time``) of the checked rounds (s)."""
    round_time_s: float
    """Mean simulated round time of the checked rounds (s)."""


def check_chunks(
    scenario: Scenario,
    plan: ChunkPlan,
    candidates: Sequence[int],
    rounds: int = 1,
    say: Callable[[str], None] | None = None,
) -> list[CheckRow]:
    """Simulate the scenario's first ``rounds`` (timing fidelity, its own model) at every m of
    ``candidates`` and report the simulated times beside the predictions."""
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
            trained = [c.train_end for c in rec.clients if not math.isnan(c.train_end)]
            start = max(trained) if trained else rec.t_start
            agg.append(rec.t_end - start)
            total.append(rec.t_end - rec.t_start)
        nan = float("nan")
        rows.append(
            CheckRow(
                m,
                plan.model.completion(plan.dim, m),
                sum(agg) / len(agg) if agg else nan,
                sum(total) / len(total) if total else nan,
            )
        )
    return rows
