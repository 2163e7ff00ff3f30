"""A sampled client's planned dropout: before which of its steps it leaves the round.

A client planned to drop at ``dropout.stage`` s leaves just before the client step the protocol maps s to
(:meth:`sim.protocol.spec.ProtocolSpec.dropout_stages_for`): before the model download for
``after_sampling``, before its first step, or before handling the server message whose step is that one
(``stage_of``). In a pipelined round a client that drops after the uploads (the steps after the
protocol's ``aggregate_from``) first finishes uploading every chunk's input: it reaches the first chunk's
later steps while later chunks may still be uploading (docs/pipeline.md, "Dropout across chunks"). Both
drivers' clients ask a :class:`Departure`, so that a planned dropout leaves at the same point in each.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.protocol.params import AggregationParams
from sim.protocol.spec import ProtocolSpec


@dataclass(frozen=True)
class Departure:
    """Where one client leaves (the default: it stays)."""

    stage: str = ""
    """Its ``dropout.stage`` (empty: it does not drop)."""
    step: str | None = None
    """The client step it leaves before (``""``: before the model download; None: it stays)."""
    waits_for_uploads: bool = False
    """Pipelined: it leaves only once every chunk's input is uploaded."""

    @classmethod
    def plan(cls, spec: ProtocolSpec, aggregation: AggregationParams, stage: str) -> Departure:
        """The departure of a client planned to drop at ``stage`` (empty: it stays) under ``aggregation``, whose
        protocol's entry is ``spec``; ValueError if the protocol has no such stage under these settings."""
        if not stage:
            return cls()
        stages = spec.dropout_stages_for(aggregation)
        if stage not in stages:
            raise ValueError(
                f"dropout stage {stage[:40]!r} is not one of {aggregation.protocol}'s: {', '.join(stages)}"
            )
        step = stages[stage]
        return cls(stage, step, step in spec.after_upload(aggregation))

    @property
    def before_download(self) -> bool:
        """Whether it leaves before the model download (``after_sampling``)."""
        return self.step == ""

    def before(self, step: str) -> bool:
        """Whether it leaves before performing client ``step`` (its first step, or the step of a server
        message: ``stage_of``)."""
        return bool(self.step) and step == self.step


STAYS = Departure()
"""A client with no planned dropout."""
