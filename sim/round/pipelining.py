"""A pipelined round's decisions, the same in both drivers (Dordis section 4 and Table 1).

A pipelined round runs one protocol instance per chunk of the update (``pipeline.chunks``: m). Both drivers
(the engine's :class:`sim.engine.pipelined.ChunkedInstances`, the deployment's server and workers) take from
a :class:`PipelineRules` what they must agree on:

- the gates of each party's resources (:class:`~sim.round.gates.StageGate`, stages of
  :mod:`sim.round.stages`), built for ``pipeline.links`` and ``pipeline.dispatch``;
- a client's side: whether its planned dropout leaves before encoding (before the instances' first step),
  which message is a chunk's upload (stage 2, which ends the chunk's stage 1 on its CPU), and the priority
  of its answers (staged within stage 1, side work after);
- the server's side of chunk j: its first step's timeout counts from the first answer for j > 0 (the
  clients get to a later chunk one after another), its work runs on the side lane (:data:`SIDE`) until the
  collection of the uploads' step (``aggregate_from``) ends, and then waits for the server CPU's stage 3
  gate and runs staged (:data:`STAGED`); a chunk whose instance aborted, or ended without a sum, aborts the
  round (:meth:`PipelineRules.failure`); the clients outside a chunk's sum leave that chunk (their gates
  abandon it); the sum goes back to the survivors as an :class:`~sim.protocol.messages.AggregateChunk`
  (stage 4) when ``dispatch`` is on, the stage 3 gate released once it is encoded.

How each driver waits (SimPy events or asyncio) stays its own; what it decides comes from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sim.protocol.machine import Aggregate, ServerMachine
from sim.protocol.messages import AggregateChunk
from sim.protocol.spec import PipelineShape, ProtocolSpec
from sim.protocol.wire import Message, ModVector
from sim.round.departure import Departure
from sim.round.gates import SIDE, STAGED, Clock, Event, StageGate
from sim.round.stages import DUPLEX, MASK, SHARED, UPLOAD, gated

E = TypeVar("E", bound=Event)


class Section(Protocol):
    """What a scenario's ``pipeline:`` section says of the links and the dispatch."""

    @property
    def links(self) -> str: ...

    @property
    def dispatch(self) -> bool: ...


@dataclass(frozen=True)
class PipelineRules:
    """The shape of a pipelined round: ``chunks`` instances of a protocol whose pipeline is ``shape``, over
    ``links`` (:data:`~sim.round.stages.SHARED` or :data:`~sim.round.stages.DUPLEX`), with or without the
    dispatch of each chunk's sum (``dispatch``: Table 1 stages 4 and 5)."""

    chunks: int
    shape: PipelineShape
    links: str = SHARED
    dispatch: bool = True

    @classmethod
    def of(cls, spec: ProtocolSpec, chunks: int, links: str = SHARED, dispatch: bool = True) -> PipelineRules:
        """The pipelined round of protocol ``spec`` (which must offer a pipeline)."""
        if spec.pipeline is None:
            raise ValueError(f"protocol {spec.name} cannot be pipelined")
        if links not in (SHARED, DUPLEX):
            raise ValueError(f"pipeline.links is {SHARED!r} or {DUPLEX!r}, not {links!r}")
        return cls(chunks, spec.pipeline, links, dispatch)

    @classmethod
    def for_section(cls, spec: ProtocolSpec, chunks: int, section: Section | None) -> PipelineRules:
        """The pipelined round of ``spec`` in ``chunks`` as a scenario's ``pipeline:`` section says (None: the
        defaults, shared links and the sums dispatched)."""
        if section is None:
            return cls.of(spec, chunks)
        return cls.of(spec, chunks, section.links, section.dispatch)

    @property
    def duplex(self) -> bool:
        """Whether a client's uploads and dispatches use its uplink and downlink as two resources."""
        return self.links == DUPLEX

    # -- gates ------------------------------------------------------------------------------------
    def gate(self, clock: Clock[E], resource: str, name: str) -> StageGate[E]:
        """The gate of ``resource`` (``server.cpu``, ``client.cpu``, ``client.link``, ``client.uplink``,
        ``client.downlink``), named ``name``: the stages of Table 1 that run on it."""
        return StageGate(clock, name, gated(resource, self.links, self.dispatch), self.chunks)

    @property
    def upload_resource(self) -> str:
        """The client resource its uploads (stage 2) take: its link, or its uplink when duplex."""
        return "client.uplink" if self.duplex else "client.link"

    @property
    def dispatch_resource(self) -> str:
        """The client resource the chunks' sums (stage 4) take: its link, or its downlink when duplex."""
        return "client.downlink" if self.duplex else "client.link"

    def uploads_gate(self, clock: Clock[E], name: str) -> StageGate[E]:
        """A client's own gate of its uploads alone (stage 2), as a client process sees its link: the server
        gates what it sends the client."""
        return StageGate(clock, name, (UPLOAD,), self.chunks)

    # -- a client ---------------------------------------------------------------------------------
    def leaves_before_encoding(self, departure: Departure) -> bool:
        """Whether a client's planned dropout leaves before it encodes its update (before the instances'
        first step)."""
        return departure.before(self.shape.first_step)

    def is_upload(self, message: Message) -> bool:
        """Whether ``message`` is a chunk's upload (stage 2: its computing ends the chunk's stage 1)."""
        return isinstance(message, self.shape.upload)

    @staticmethod
    def answer_priority(cpu_gate: StageGate[Any], j: int) -> int:
        """A client's priority for handling a message of chunk ``j``: staged while the chunk's stage 1 holds
        its CPU (``cpu_gate``), side work once its masked input is computed (its share of unmasking)."""
        return STAGED if (MASK, j) not in cpu_gate.done else SIDE

    # -- the server -------------------------------------------------------------------------------
    @staticmethod
    def lazy(j: int, first: bool) -> bool:
        """Whether chunk ``j``'s step counts its timeout from the first answer: its first step, after chunk 0
        (the clients get to a later chunk one after another)."""
        return first and j > 0

    def opens_aggregation(self, step: str) -> bool:
        """Whether the end of ``step``'s collection starts the chunk's aggregation (stage 3): the uploads are in."""
        return step == self.shape.aggregate_from

    @staticmethod
    def priority(aggregating: bool) -> int:
        """The server's priority for a chunk's work: staged once its aggregation began, else side work."""
        return STAGED if aggregating else SIDE

    @staticmethod
    def failure(j: int, machine: ServerMachine) -> str | None:
        """Why chunk ``j``'s instance ends the round (it aborted, or ended without a sum), or None."""
        if machine.step == "aborted" or machine.aggregate is None:
            return f"chunk {j}: {machine.outcome.removeprefix('aborted: ')}"
        return None

    @staticmethod
    def left_out(sampled: Iterable[int], aggregate: Aggregate) -> list[int]:
        """The sampled clients outside chunk's sum ``aggregate``: that chunk goes on without them."""
        survivors = set(aggregate.survivors)
        return [c for c in sampled if c not in survivors]

    @staticmethod
    def sum_message(number: int, j: int, aggregate: Aggregate, bits: int) -> AggregateChunk:
        """What the server dispatches of chunk ``j``'s sum in round ``number``: its values mod 2^``bits``."""
        return AggregateChunk(number, j, ModVector(bits, aggregate.vector))
