"""The ``aggregation:`` parameters of a scenario (:class:`AggregationParams`).

Plain data on purpose: nothing here imports the machines, a protocol, the registry or ``cryptography``, so the
scenario's types (:mod:`sim.scenario.types`) can hold :class:`AggregationParams`. What depends on the protocol
(its steps, dropout stages, operations) is its :class:`~sim.protocol.spec.ProtocolSpec`, which its callers get
from the registry (:func:`sim.protocol.registry.spec_of`) and ask with these parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

AFTER_SAMPLING = "after_sampling"
"""The ``dropout.stage`` every protocol has: before the model download."""


@dataclass(frozen=True)
class AggregationParams:
    """The ``aggregation:`` section of a scenario."""

    protocol: str = "fedavg"
    """The ``aggregation.protocol``: a name in the registry (:data:`sim.protocol.registry.PROTOCOLS`)."""
    bits: int = 20
    clip: float = 1.0
    """L2 norm bound of updates in the fixed-point encoding (model units)."""
    threshold: float = 0.5
    """Fraction of share holders strictly exceeded by the reconstruction threshold."""
    neighbours: int | None = None
    """SecAgg+ degree; None for ``auto`` (2 ceil(log2 n))."""
    malicious: bool = False
    strategy: str = "none"
    """The ``privacy.strategy`` (a strategy removing noise adds the protocol's noise-removal step)."""
    collusion: int = 0
    """The ``privacy.collusion`` T_C: clients that may collude with the server. The malicious variant's
    consistency check must withstand them (:mod:`sim.protocol.collusion`)."""
