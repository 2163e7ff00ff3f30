"""Dordis Table 1: the five stages of one chunk of a pipelined round, defined once for every user.

A pipelined round (docs/pipeline.md) cuts each client's encoded update into m chunks and aggregates each
with its own protocol instance. Every chunk goes through five stages, each dominated by one resource:

====  ==================  ======  =================  =====================================================
 #    stages-table name   kind    resource           what happens
====  ==================  ======  =================  =====================================================
 1    ``chunk.mask``      c-comp  ``client.cpu``     clients run the instance's key exchange, noise, mask
 2    ``chunk.upload``    comm    ``client.link``    clients upload the chunk's masked input
 3    ``chunk.aggregate`` s-comp  ``server.cpu``     the server unmasks, removes excess noise, sums
 4    ``chunk.dispatch``  comm    ``client.link``    the server sends the chunk's sum to its survivors
 5    ``chunk.decode``    c-comp  ``client.cpu``     each survivor decodes the chunk's sum
====  ==================  ======  =================  =====================================================

With ``pipeline.links: duplex`` the upload and the dispatch use the two directions of the client's link
(``client.uplink``, ``client.downlink``) as two resources; with ``shared`` (Dordis, and the Hyades
recurrence of :mod:`sim.pipeline.recurrence`) they take turns on one. Without ``pipeline.dispatch``
stages 4 and 5 do not exist. The drivers gate each resource by these stages (:mod:`sim.round.gates`),
the stages table names them (:mod:`sim.results.tables`), the performance model fits them
(:mod:`sim.runner.chunks`) and the plots colour them (:mod:`sim.plots`).
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED, DUPLEX = "shared", "duplex"
"""The values of ``pipeline.links``."""


@dataclass(frozen=True)
class Stage:
    """One stage of Dordis Table 1."""

    number: int
    """1 to 5, as in the paper (``pipeline_stage`` in the stages table)."""
    name: str
    """Its rows' ``stage`` in the stages table."""
    kind: str
    """The paper's kind: ``c-comp``, ``comm`` or ``s-comp``."""
    resource: str
    """What it runs on when uploads and dispatches share the client's link (``pipeline.links: shared``)."""
    duplex_resource: str
    """What it runs on with ``pipeline.links: duplex``."""
    what: str
    """What happens in it, for legends."""
    dispatched: bool = False
    """Whether it exists only when the server dispatches each chunk's sum (``pipeline.dispatch``)."""

    def on(self, links: str) -> str:
        """The resource it runs on under ``pipeline.links``."""
        return self.duplex_resource if links == DUPLEX else self.resource


MASK, UPLOAD, AGGREGATE, DISPATCH, DECODE = 1, 2, 3, 4, 5

TABLE_1: tuple[Stage, ...] = (
    Stage(MASK, "chunk.mask", "c-comp", "client.cpu", "client.cpu", "clients mask"),
    Stage(UPLOAD, "chunk.upload", "comm", "client.link", "client.uplink", "clients upload"),
    Stage(AGGREGATE, "chunk.aggregate", "s-comp", "server.cpu", "server.cpu", "server unmasks and sums"),
    Stage(DISPATCH, "chunk.dispatch", "comm", "client.link", "client.downlink", "server dispatches", True),
    Stage(DECODE, "chunk.decode", "c-comp", "client.cpu", "client.cpu", "clients decode", True),
)
STAGES = {stage.number: stage for stage in TABLE_1}


def used(dispatch: bool) -> tuple[Stage, ...]:
    """The stages of a chunk: all five, or the first three without ``pipeline.dispatch``."""
    return tuple(s for s in TABLE_1 if dispatch or not s.dispatched)


def resources(links: str = SHARED) -> tuple[str, ...]:
    """Each stage's resource in order (the recurrence's ``resources``: stages on one resource take turns)."""
    return tuple(stage.on(links) for stage in TABLE_1)


def gated(resource: str, links: str, dispatch: bool) -> tuple[int, ...]:
    """The stages that run on ``resource`` (a :class:`~sim.round.gates.StageGate`'s ``stages``)."""
    return tuple(s.number for s in used(dispatch) if s.on(links) == resource)
