"""A round of one protocol instance: the whole update aggregated at once (the round not pipelined).

The server's side goes step by step through its machine: it collects each step's answers
(:meth:`sim.engine.virtual_round.Round.collect`), closes the step, and sends what the machine says. Each client,
once trained, starts its machine and answers each message from the server in turn, one computation at a
time. :class:`OneInstance` is the round's shape when ``plan.chunks`` is unset; a pipelined round has
:class:`sim.engine.pipelined.ChunkedInstances` instead, which answers the same questions.

On a simulation engine whose implementation sends the model with the upload request (Flower's workflow:
``model_with_upload``, docs/time-model.md, "A simulation engine"), a client trains and encodes its update only
when that request arrives, and the model's bytes are handed to it with the request.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import simpy

from sim.costs.model import frame_size
from sim.engine.charges import Hold
from sim.protocol.machine import Aggregate, RemoteProtocolError, ServerMachine, Work
from sim.protocol.wire import Vector
from sim.round.gates import STAGED
from sim.round.records import ClientRecord, RoundRecord

if TYPE_CHECKING:
    from sim.engine.virtual_round import Round

UPDATE_WORK = ("encode.", "noise.")
"""Operations on a client's update (its encoding, its noise): with the model when the model travels with
the upload request (:attr:`OneInstance.model_with_upload`)."""


class OneInstance:
    """Round ``r``'s one instance: the server's steps and each client's answers."""

    chunked = False
    """Whether the round runs an instance per chunk."""

    def __init__(self, r: Round) -> None:
        self.r = r

    @cached_property
    def model_with_upload(self) -> bool:
        """Whether the model travels with the upload request, and clients train and encode then."""
        return self.r.transport.model_with_upload(self.r.spec, self.r.s.aggregation)

    # -- server -----------------------------------------------------------------------------------
    def serve(self) -> Generator[simpy.Event, Any, Aggregate | None]:
        """The server's side of the round's one instance, step by step; returns its aggregate."""
        r = self.r
        machine: ServerMachine = r.servers[0]
        env, rec = r.env, r.record
        yield from r.server_react(machine.begin(), STAGED, machine)
        step_start = rec.t_start
        while machine.step not in ("done", "aborted"):
            step = machine.step
            yield from r.collect(machine, 0)
            collected = env.now
            yield from r.server_react(r.close_step(machine), STAGED, machine)
            final = machine.step in ("done", "aborted")
            # A step lasts until the next one starts (its closing work included); the last step's closing
            # work is the aggregation (``aggregate_s``), so the steps and it add up to the round.
            rec.steps.append((step, step_start, collected if final else env.now))
            rec.aggregate_start = collected
            step_start = env.now
        rec.outcome = machine.outcome
        return machine.aggregate

    def close(self, rec: RoundRecord) -> None:
        """Nothing to add: the steps were recorded as they ended."""
        return None

    def server_busy(self) -> float:
        """Seconds of the round during which the server computed."""
        return self.r.record.server_compute_s

    def compute_server(self, seconds: float, priority: int, hold: Hold | None) -> Generator[simpy.Event, Any, None]:
        """The server computes ``seconds`` (``hold``: on the testbed's CPUs), one thing at a time."""
        r = self.r
        if hold is None:
            r.record.server_compute_s += seconds
            yield r.env.timeout(seconds)
            return
        start = r.env.now
        try:
            yield from hold()
        finally:
            r.record.server_compute_s += r.env.now - start

    def out(self, clients: list[int]) -> None:
        """Clients put out of the round (late, refused): the one instance knows already."""
        return None

    # -- clients ----------------------------------------------------------------------------------
    def trained(self, c: int, update: Vector, weight: float) -> None:
        """Client ``c`` has trained ``update``: its start may be made ahead now (:mod:`sim.engine.calls`)."""
        r = self.r
        r.calls.trained(c, lambda: r.client_machine(c), lambda m: r.departure(c).before(m.first_step), update, weight)

    def compute_client(
        self, c: int, rec: ClientRecord, seconds: float, priority: int, hold: Hold | None
    ) -> Generator[simpy.Event, Any, None]:
        """Client ``c`` computes ``seconds`` (``hold``: on the testbed's CPUs), one thing at a time."""
        env = self.r.env
        start = env.now
        try:
            if hold is None:
                yield env.timeout(seconds)
            else:
                yield from hold()
        except simpy.Interrupt:
            rec.compute_s += env.now - start  # cut short: only what it did
            raise
        rec.compute_s += seconds if hold is None else env.now - start

    def client(self, c: int, update: Vector, weight: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s part once trained: it starts its machine and answers the server's messages."""
        r = self.r
        rec, departure, transport = r.clients[c], r.departure(c), r.transport
        early = r.calls.early_machine(c)
        machine = r.client_machines[(c, 0)] = early if early is not None else r.client_machine(c)
        if departure.before(machine.first_step):
            r.leave(c, departure.stage)
            return
        reaction = r.calls.start(c, 0, machine, update, weight)
        update_work: list[Work] = []
        upload_step = None
        if self.model_with_upload:  # the update's work waits for the model, with the upload request
            update_work = [w for w in reaction.work if w.op.startswith(UPDATE_WORK)]
            reaction = replace(reaction, work=tuple(w for w in reaction.work if w not in update_work))
            upload_step = r.spec.dropout_stages_for(r.s.aggregation).get("before_upload")
        yield from r.client_react(c, reaction)
        transport.free_worker(c)
        inbox = r.client_inbox[(c, 0)]
        while True:
            message = yield inbox.get()
            message, ahead = r.calls.arrived(c, 0, message)
            yield from transport.take_worker(c)
            late = upload_step is not None and machine.stage_of(message) == upload_step
            work = [Work("wire.decode", frame_size(message))]
            if late:  # the model comes in this request, one message (a client leaving in fit has taken it)
                model = r.model_message()
                extra = transport.received_seconds(r, (message, model))
                work.append(Work("wire.decode", frame_size(model)))
            else:
                extra = transport.received_seconds(r, (message,))
            yield from r.client_compute(c, work, extra=extra)
            if r.leaves_before(c, machine, message):
                r.leave(c, departure.stage)
                return
            if late:
                yield from r.train(c)
                yield from r.client_compute(c, update_work)
            try:
                reaction = r.calls.receive(c, 0, machine, message, ahead)
            except RemoteProtocolError as exc:
                rec.dropped_stage = f"aborted: {exc.reason}"
                r.notify_gone(c)
                return
            yield from r.client_react(c, reaction)
            transport.free_worker(c)

    # -- leaving ----------------------------------------------------------------------------------
    def leave(self, c: int, notify: bool) -> None:
        """Client ``c`` has left: the one instance learns it as the server does."""
        return None

    def has_left(self, c: int) -> bool:
        """Whether client ``c`` is out of the round already (dropped, late, rejected)."""
        return bool(self.r.clients[c].dropped_stage)

    def current_step(self) -> str:
        """The server step under way (for ``offline:<step>``)."""
        servers = self.r.servers
        return servers[0].step if servers else ""

    def procs_of(self, c: int) -> list[simpy.Process]:
        """Client ``c``'s processes besides its own: none."""
        return []

    def decoding(self, c: int) -> bool:
        """Whether something sent to client ``c`` is still to be decoded after its machine is done: no."""
        return False
