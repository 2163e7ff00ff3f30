"""The records of a round, shared by every driver and by the result tables (:mod:`sim.results.tables`).

Times are seconds on the driver's clock: virtual seconds in the simulator, wall-clock seconds since the
deployment started in a deployment. Importing this module loads no simpy, torch or dp_accounting, so
that reading and writing results stays light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.protocol.machine import Aggregate

_NAN = float("nan")


@dataclass
class ClientRecord:
    """What one sampled client did in a round (virtual seconds; NaN for what it never did)."""

    client: int
    slowdown: float
    bandwidth_mbps: float
    samples: int
    download_start: float = _NAN
    download_end: float = _NAN
    train_start: float = _NAN
    train_end: float = _NAN
    upload_s: float = 0.0
    """Total time of this client's transfers to the server."""
    compute_s: float = 0.0
    """Total protocol compute time charged to this client (besides training)."""
    cpu_s: float = 0.0
    """CPU seconds of all its computations, training included, without its slow-down: simulated, the
    reference-device seconds charged (the cost profile's, as each computation starts); deployed, the CPU
    time of the worker's compute thread."""
    bytes_down: int = 0
    bytes_up: int = 0
    dropped_stage: str = ""
    """Empty for a survivor, else the planned dropout stage, ``offline:<step>`` (its availability ended
    during that server step), ``timeout:<step>``, ``rejected: <why>`` (the server refused its message) or
    ``aborted: <why>`` (it refused the server's)."""
    last_upload_end: float = _NAN
    left_at: float = _NAN
    """Virtual time it left the round (a planned dropout or going offline); NaN if it did not."""


@dataclass
class RoundRecord:
    """The outcome and timeline of one round."""

    round: int
    t_start: float
    t_end: float = _NAN
    outcome: str = ""
    sampled: int = 0
    survivors: int = 0
    online: int = 0
    """Clients the server could sample from (online under a trace; else the population)."""
    dropped_planned: int = 0
    timed_out: int = 0
    clients: list[ClientRecord] = field(default_factory=list)
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    """Server collection steps as ``(name, start, end)``."""
    aggregate_start: float = _NAN
    server_bytes_in: int = 0
    server_bytes_out: int = 0
    server_compute_s: float = 0.0
    server_cpu_s: float = 0.0
    """CPU seconds of the server's computations (:attr:`ClientRecord.cpu_s`'s counterpart)."""
    aggregate: Aggregate | None = None
    exposed: int | None = None
    """Survivors whose noisy sum the server unmasked, even if the round then aborted (XNoise's noise
    removal); None if nothing was revealed."""
    exposures: list[int] = field(default_factory=list)
    """Pipelined: the survivor count of every chunk whose sum the server unmasked (``exposed`` is the
    smallest)."""
    chunks: int = 1
    """Chunks the update was cut into (1: not pipelined)."""
    utilisation: dict[str, float] = field(default_factory=dict)
    """Fraction of the round each resource was busy: ``client_cpu``, ``client_link`` (means over the sampled
    clients), ``server_cpu``, ``server_link``."""
    spans: list[tuple[str, str, int | None, int | None, float, float, int]] = field(default_factory=list)
    """Further rows of the stages table: ``(stage, resource, chunk, pipeline_stage, start, end, parties)``."""
    held: dict[tuple[int, int], list[tuple[float, float]]] = field(default_factory=dict)
    """Pipelined: (Table 1 stage, chunk) -> when each party was admitted to that stage of that chunk and
    when it released it (virtual s)."""

    @property
    def last_trained(self) -> float | None:
        """When the last client to enter the aggregation finished training (where ``agg_time`` starts);
        None if no client trained."""
        trained = [c.train_end for c in self.clients if not math.isnan(c.train_end)]
        return max(trained) if trained else None


@dataclass(frozen=True)
class RoundPrivacy:
    """What a round's privacy columns report."""

    target_variance: float
    """sigma*^2, model units."""
    realised_variance: float
    """The noise variance really left in the aggregate (NaN if no aggregate)."""
    accounted_variance: float
    """The variance the round was accounted at (the residual less what colluders know)."""
    epsilon: float
    """Cumulative epsilon at ``privacy.delta`` after this round."""
    scale: float
    """DSkellam scale s of the round (NaN without DP)."""


@dataclass
class RoundResult:
    """A finished round with the model's state after it."""

    record: RoundRecord
    accuracy: float
    loss: float
    model_sha256: str
    privacy: RoundPrivacy | None = None
