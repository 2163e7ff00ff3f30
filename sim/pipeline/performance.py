"""Per-stage latency of one chunk (Dordis eq. 3) and its fit from measured stage times.

    tau_s(m) = beta_s1 * d / m + beta_s2 * m + beta_s3            (seconds)

for an update of d values cut into m equal chunks: beta_s1 is the time per value, beta_s2 the interference
of the other pipelined chunk tasks (Dordis 4.2: a client's CPU also serves the network IO of the chunks in
flight), beta_s3 a constant per chunk. :func:`fit_stages` finds non-negative betas per stage by least
squares from ``(stage, d, m, seconds)`` observations; :meth:`PerformanceModel.best` enumerates m through
the recurrence of Hyades appendix F (:mod:`sim.pipeline.recurrence`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls  # type: ignore[import-untyped]

from sim.pipeline.recurrence import DORDIS_RESOURCES, best_chunks, completion_time


@dataclass(frozen=True)
class StageModel:
    """Dordis eq. 3 for one stage: seconds per chunk = ``per_value * d/m + per_chunk * m + constant``."""

    per_value: float
    """beta_s1: seconds per update value (s)."""
    per_chunk: float
    """beta_s2: seconds added to each chunk per chunk in the pipeline (s)."""
    constant: float
    """beta_s3: seconds per chunk whatever its size (s)."""
    r2: float = 1.0
    """Coefficient of determination of the fit (1 for given betas)."""
    points: int = 0
    """Observations it was fitted on (0 for given betas)."""

    def latency(self, dim: int, chunks: int) -> float:
        return self.per_value * dim / chunks + self.per_chunk * chunks + self.constant


@dataclass(frozen=True)
class PerformanceModel:
    """The stages of a chunk-aggregation task, each with its latency model and dominant resource."""

    stages: tuple[StageModel, ...]
    resources: tuple[str, ...] = DORDIS_RESOURCES

    def __post_init__(self) -> None:
        if len(self.stages) != len(self.resources):
            raise ValueError(f"{len(self.stages)} stage models for {len(self.resources)} resources")

    def latencies(self, dim: int, chunks: int) -> list[float]:
        return [stage.latency(dim, chunks) for stage in self.stages]

    def completion(self, dim: int, chunks: int) -> float:
        """Predicted seconds from the first chunk entering stage 1 to the last leaving the last stage."""
        return completion_time(self.latencies(dim, chunks), self.resources, chunks)

    def best(self, dim: int, candidates: Sequence[int] = tuple(range(1, 21))) -> tuple[int, dict[int, float]]:
        """The chunk count with the earliest predicted completion, and each candidate's prediction."""
        return best_chunks(lambda m: self.latencies(dim, m), self.resources, candidates)


def fit_stage(observations: Sequence[tuple[int, int, float]]) -> StageModel:
    """Non-negative least squares of seconds on ``(d/m, m, 1)`` from ``(d, m, seconds)`` observations."""
    if not observations:
        raise ValueError("no observations to fit")
    x = np.array([[d / m, m, 1.0] for d, m, _ in observations], dtype=np.float64)
    y = np.array([s for _, _, s in observations], dtype=np.float64)
    # Columns differ by orders of magnitude (d/m ~ 1e6, m ~ 10): fit on scaled columns.
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(x / norms, y)
    coef = coef / norms
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return StageModel(float(coef[0]), float(coef[1]), float(coef[2]), r2, len(observations))


def fit_stages(
    observations: Iterable[tuple[int, int, int, float]], resources: Sequence[str] = DORDIS_RESOURCES
) -> PerformanceModel:
    """Fit every stage from ``(stage, d, m, seconds)`` observations (stages numbered from 0)."""
    by_stage: dict[int, list[tuple[int, int, float]]] = {s: [] for s in range(len(resources))}
    for stage, d, m, seconds in observations:
        if stage not in by_stage:
            raise ValueError(f"observation of stage {stage}; the pipeline has stages 0..{len(resources) - 1}")
        by_stage[stage].append((d, m, seconds))
    missing = [s for s, obs in by_stage.items() if not obs]
    if missing:
        raise ValueError(f"no observations of stage(s) {', '.join(map(str, missing))}")
    return PerformanceModel(tuple(fit_stage(by_stage[s]) for s in range(len(resources))), tuple(resources))
