"""How a round's messages travel in virtual time: over the simulated links, or through a simulation engine.

Without an engine (:class:`Links`) every message crosses the sender's uplink and the receiver's downlink of
the network (:mod:`sim.engine.network`), with its bytes on the wire, then the server's one-way delay
(``server.latency_ms``); on a testbed the transfer also costs CPU at both ends while it flows
(:meth:`sim.engine.charges.Charges.transport_jobs`). A client handles each message as soon as it has it.

On a simulation engine's testbed (``testbed: {emulation: engine}``; :class:`EngineQueues`) the parties share
one host and no link: a message the server sends waits for the engine's next sweep, a client's reply for the
server's next poll (:class:`sim.engine.actors.ActorEngine`), and each client handles a message on one of the
engine's workers, which it holds until its replies are handed back, with the engine's own reference seconds
per message (docs/time-model.md, "A simulation engine").

The round (:class:`sim.engine.virtual_round.Round`) asks either the same questions, so it never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

import simpy

from sim.engine.actors import ActorEngine
from sim.protocol.machine import SERVER
from sim.protocol.params import AggregationParams
from sim.protocol.spec import ProtocolSpec
from sim.protocol.wire import Message

if TYPE_CHECKING:
    from sim.engine.virtual_round import Round


class Transport(Protocol):
    """How one round's messages travel and are handed to the clients."""

    def carry(
        self, r: Round, sender: int, to: int, nbytes: int, sent: Callable[[], None] | None
    ) -> Generator[simpy.Event, Any, None]:
        """Carry ``nbytes`` from ``sender`` to ``to`` (its bytes already counted); ``sent`` is called when
        the message has left the sender."""
        ...

    def sent(self) -> None:
        """The server sent messages now."""
        ...

    def reply_at(self, at: float) -> float:
        """When a client's reply (or closed connection) sent at ``at`` reaches the server's collection."""
        ...

    def take_worker(self, c: int) -> Generator[simpy.Event, Any, None]:
        """Client ``c`` waits for what handles its message, and holds it until :meth:`free_worker`."""
        ...

    def free_worker(self, c: int) -> None:
        """Client ``c`` gives back what it holds or waits for (if anything)."""
        ...

    def received_seconds(self, r: Round, messages: tuple[Message, ...]) -> float:
        """Reference seconds of handing a client ``messages`` received together."""
        ...

    def replies_seconds(self, r: Round, replies: list[Message]) -> float:
        """Reference seconds of taking back a client's ``replies``."""
        ...

    def model_with_upload(self, spec: ProtocolSpec, aggregation: AggregationParams) -> bool:
        """Whether the model travels with the upload request (and clients train and encode then), for
        protocol ``spec`` under ``aggregation``."""
        ...


class Links:
    """The simulated network's links (:mod:`sim.engine.network`)."""

    def carry(
        self, r: Round, sender: int, to: int, nbytes: int, sent: Callable[[], None] | None
    ) -> Generator[simpy.Event, Any, None]:
        s = r.s
        if sender == SERVER:
            client, path = to, (s.server_down, r.links[to][1])
        else:
            client, path = sender, (r.links[sender][0], s.server_up)
        flow = s.network.transfer(nbytes, path)
        r.flows[id(flow)] = flow
        meters = (r.link_meters[client], r.server_link)
        for meter in meters:
            meter.start()
        jobs = r.charges.transport_jobs(s.costs, nbytes, sender, to)
        try:
            yield flow.done
            for job in jobs:
                yield job.done
        except simpy.Interrupt:
            s.network.cancel(flow)  # the sender or receiver left: the link is free again
            r.charges.cancel(jobs)
            raise
        finally:
            for meter in meters:
                meter.stop()
            r.flows.pop(id(flow), None)
        if sent is not None:
            sent()
        if s.latency_s > 0:
            yield r.env.timeout(s.latency_s)  # sent, the link free, the message not there yet

    def sent(self) -> None:
        return None

    def reply_at(self, at: float) -> float:
        return at

    def take_worker(self, c: int) -> Generator[simpy.Event, Any, None]:
        return
        yield

    def free_worker(self, c: int) -> None:
        return None

    def received_seconds(self, r: Round, messages: tuple[Message, ...]) -> float:
        return 0.0

    def replies_seconds(self, r: Round, replies: list[Message]) -> float:
        return 0.0

    def model_with_upload(self, spec: ProtocolSpec, aggregation: AggregationParams) -> bool:
        return False


class EngineQueues:
    """A simulation engine's queues and workers (:class:`sim.engine.actors.ActorEngine`), for one round."""

    def __init__(self, engine: ActorEngine) -> None:
        self.engine = engine
        self.held: dict[int, simpy.resources.resource.Request] = {}
        """Client -> the engine's worker it holds while it handles a message."""

    def carry(
        self, r: Round, sender: int, to: int, nbytes: int, sent: Callable[[], None] | None
    ) -> Generator[simpy.Event, Any, None]:
        """One host, no links: the engine's sweep, or the server's next poll."""
        now = r.env.now
        engine = self.engine
        yield r.env.timeout((engine.next_sweep(now) if sender == SERVER else engine.next_poll(now)) - now)
        if sent is not None:
            sent()

    def sent(self) -> None:
        self.engine.sent()

    def reply_at(self, at: float) -> float:
        return self.engine.next_poll(at)

    def take_worker(self, c: int) -> Generator[simpy.Event, Any, None]:
        """First come, first served."""
        request = self.held[c] = self.engine.workers.request()
        yield request

    def free_worker(self, c: int) -> None:
        request = self.held.pop(c, None)
        if request is not None:
            request.cancel()
            self.engine.workers.release(request)

    def received_seconds(self, r: Round, messages: tuple[Message, ...]) -> float:
        return self.engine.received_seconds(sum(r.wire_bytes(message) for message in messages))

    def replies_seconds(self, r: Round, replies: list[Message]) -> float:
        return self.engine.replies_seconds([r.wire_bytes(message) for message in replies])

    def model_with_upload(self, spec: ProtocolSpec, aggregation: AggregationParams) -> bool:
        """On an engine whose implementation does so (Flower's workflow: ``model_with_upload``), for a
        protocol whose server asks for the upload (not one whose clients upload first: FedAvg, plain)."""
        if not self.engine.costs.model_with_upload:
            return False
        upload = spec.dropout_stages_for(aggregation).get("before_upload")
        return upload is not None and upload != spec.steps[0]
