"""The ``aggregation:`` parameters of a scenario (:class:`AggregationParams`).

Light on purpose: nothing here imports the machines, a protocol or ``cryptography``, so the scenario's types
(:mod:`sim.scenario.types`) can hold :class:`AggregationParams`. What depends on the protocol (its steps,
dropout stages, operations) comes from its registry entry (:mod:`sim.protocol.registry`, imported when first
asked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.protocol.spec import ProtocolSpec

AFTER_SAMPLING = "after_sampling"
"""The ``dropout.stage`` every protocol has: before the model download."""


@dataclass(frozen=True)
class AggregationParams:
    """The ``aggregation:`` section of a scenario."""

    protocol: str = "fedavg"
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

    @property
    def spec(self) -> ProtocolSpec:
        """The protocol's registry entry."""
        from sim.protocol.registry import PROTOCOLS

        return PROTOCOLS[self.protocol]

    def steps(self) -> tuple[str, ...]:
        """The server's steps under this adversary model and privacy strategy."""
        return self.spec.steps_for(self)

    def after_upload(self) -> frozenset[str]:
        """Steps after the uploads are in: a pipelined client dropping before one of them has uploaded
        every chunk's input first (see docs/pipeline.md, "Dropout across chunks")."""
        return self.spec.after_upload(self)

    def dropout_stages(self) -> dict[str, str]:
        """``dropout.stage`` values allowed with this privacy strategy -> the client step they precede."""
        return self.spec.dropout_stages_for(self)
