"""One federated round in virtual time: SimPy processes around the sans-IO protocol machines.

The frame of a round (docs/architecture.md, "A round"): the server sends the global model to every sampled client
(concurrent transfers share the server's downlink), each client trains (its cost-model time times its
slow-down), then enters the aggregation protocol with its update. From there the round is driven by the
machines (:mod:`sim.protocol.registry`): every message a machine emits crosses the simulated network with
its real encoded size (in ``full`` fidelity it is really encoded and decoded; in ``learning`` and
``timing`` fidelity, whose messages hold sized stand-ins for the cryptography, its size is computed), and
every operation a machine reports, plus encoding and decoding each frame (``wire.encode``,
``wire.decode``), is charged from the cost model: to the client's CPU times its slow-down, or to the
server's divided by its speed. Each party computes one thing at a time. On a
testbed (``RoundSetup.host``) every compute charge is instead a job on the host's shared cores, followed
for a client by the sleep that emulates its slow-down (:mod:`sim.engine.host`). On a simulation engine's
testbed (``RoundSetup.engine``: ``testbed: {emulation: engine}``) messages cross no link: they wait for the
engine's sweep or the server's poll, and each client handles every message it receives on one of the
engine's workers, with the engine's own cost per message (:mod:`sim.engine.actors`). In ``full`` fidelity with
``aggregation.threads`` > 1 the clients' machine calls are made ahead of virtual time on threads and taken
where each client reaches them (:mod:`sim.engine.ahead`): the same round whatever the count.

Collection steps end when every client the server machine still expects has answered or has left, or
when the step's timeout passes; clients that have not answered by then are late (``timeout:<step>``) and
whatever they send afterwards is discarded (the decisions and labels are the round layer's:
:class:`sim.round.collector.StepCollector`). A client that drops out leaves just before its planned step;
unless ``dropout.silent`` the server learns of it at once (a closed connection), else only by the
timeout. A client machine that detects a misbehaving server aborts (``aborted: <why>``) and leaves. When
the server machine is done or aborts, the round ends: clients still busy are stopped and their transfers
cancelled.

The core asks components what differs (docs/architecture.md, "A round in the engine"), never whether a
feature is present:

- its shape (:mod:`sim.engine.single`, :mod:`sim.engine.pipelined`): one protocol instance, or one per chunk
  (``plan.chunks``: m instances through the gates of Dordis Table 1, the parties computing on processors);
- where a compute charge runs (:mod:`sim.engine.charges`): each party's own processor, or the testbed host's
  CPUs;
- how a message travels (:mod:`sim.engine.transport`): the simulated links, or a simulation engine's queues
  and workers;
- when a client's machine calls are made (:mod:`sim.engine.calls`): in turn, or ahead on threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import simpy

from sim.clients.population import MBPS, Population
from sim.costs.model import CLIENT_ROLE, SERVER_ROLE, CostModel, frame_size
from sim.engine.actors import ActorEngine
from sim.engine.calls import CallsInTurn, CallsMadeAhead
from sim.engine.charges import Charges, Hold, HostCores, OwnProcessors
from sim.engine.host import PartyQuotas, SharedHost
from sim.engine.network import Flow, Link, Network
from sim.engine.pipelined import ChunkedInstances
from sim.engine.processor import BusyMeter
from sim.engine.single import OneInstance
from sim.engine.transport import EngineQueues, Links, Transport
from sim.learning.trainer import Learner, local_batches
from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import (
    SERVER,
    Aggregate,
    ClientMachine,
    Reaction,
    RemoteProtocolError,
    RoundAbortedError,
    RoundSetupError,
    ServerMachine,
    Work,
)
from sim.protocol.messages import ModelDownload
from sim.protocol.params import AFTER_SAMPLING, AggregationParams
from sim.protocol.registry import spec_of
from sim.protocol.wire import Blank, Message
from sim.round.closing import client_cpu_share, close_record, expose
from sim.round.collector import ACCEPT, CLOSE, GONE, MESSAGE, UNASKED, Roster, StepCollector
from sim.round.departure import STAYS, Departure
from sim.round.gates import STAGED
from sim.round.pipelining import Section
from sim.round.plan import RoundPlan
from sim.round.records import ClientRecord, RoundRecord


class Shape(Protocol):
    """What the core asks of a round's shape: one protocol instance (:class:`~sim.engine.single.OneInstance`)
    or one per chunk (:class:`~sim.engine.pipelined.ChunkedInstances`)."""

    @property
    def chunked(self) -> bool:
        """Whether the round runs an instance per chunk."""
        ...

    @property
    def model_with_upload(self) -> bool:
        """Whether the model travels with the upload request (clients train and encode then)."""
        ...

    def serve(self) -> Generator[simpy.Event, Any, Aggregate | None]:
        """The server's side of the round; returns its aggregate (None: aborted)."""
        ...

    def close(self, rec: RoundRecord) -> None:
        """What the shape adds to the record once the round is over (steps, stage spans)."""
        ...

    def server_busy(self) -> float:
        """Seconds of the round during which the server computed."""
        ...

    def compute_server(self, seconds: float, priority: int, hold: Hold | None) -> Generator[simpy.Event, Any, None]:
        """The server computes ``seconds`` at ``priority`` (``hold``: on the testbed's CPUs)."""
        ...

    def out(self, clients: list[int]) -> None:
        """Clients put out of the round (late, refused)."""
        ...

    def trained(self, c: int, update: wire.Vector, weight: float) -> None:
        """Client ``c`` has trained ``update``."""
        ...

    def compute_client(
        self, c: int, rec: ClientRecord, seconds: float, priority: int, hold: Hold | None
    ) -> Generator[simpy.Event, Any, None]:
        """Client ``c`` computes ``seconds`` at ``priority`` (``hold``: on the testbed's CPUs)."""
        ...

    def client(self, c: int, update: wire.Vector, weight: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s part of the protocol once trained."""
        ...

    def leave(self, c: int, notify: bool) -> None:
        """Client ``c`` has left the round."""
        ...

    def has_left(self, c: int) -> bool:
        """Whether client ``c`` is out of the round already."""
        ...

    def current_step(self) -> str:
        """The server step under way (for ``offline:<step>``)."""
        ...

    def procs_of(self, c: int) -> list[simpy.Process]:
        """Client ``c``'s processes besides its own."""
        ...

    def decoding(self, c: int) -> bool:
        """Whether something sent to client ``c`` is still to be decoded after its machines are done."""
        ...


@dataclass
class RoundSetup:
    """What stays the same across the rounds of a run."""

    env: simpy.Environment
    network: Network
    server_up: Link
    server_down: Link
    population: Population
    costs: CostModel
    server_speed: float
    timeouts: dict[str, float]
    silent_dropout: bool
    dim: int
    train_op: str
    local_epochs: int
    batch_size: int
    samples: Any
    """Callable ``client -> number of local samples``."""
    learner: Learner | None
    """The real model (``full`` and ``learning`` fidelity) or None (``timing``)."""
    aggregation: AggregationParams
    seed: int
    pipeline: Section | None = None
    """The scenario's ``pipeline:`` section (pipelined rounds: :class:`sim.engine.pipelined.ChunkedInstances`), or
    None: its defaults."""
    latency_s: float = 0.0
    """One-way delay of every message after its transfer (s)."""
    host: SharedHost | PartyQuotas | None = None
    """The testbed's CPUs: its cores shared by every party's compute (scenario ``testbed``), each party's
    own quota (a kernel testbed), or None: each party has its own processor."""
    call_s: float = 0.0
    """On a testbed: reference seconds of handing a computation to a client's compute thread
    (:data:`CALL_OP`), added to every compute charge."""
    server_call_s: float = 0.0
    """The same at the server."""
    payload_fraction: float = 1.0
    """Bytes of a message per byte a link carries: 1, or on a kernel testbed the share of a shaped frame
    that is TCP payload (:data:`sim.testbed.PAYLOAD_FRACTION`)."""
    engine: ActorEngine | None = None
    """The cost profile's simulation engine (``testbed: {emulation: engine}``), or None."""
    fidelity: str = "full"
    """The scenario's fidelity: the suite of the round's machines (:class:`RoundInstances`) and whether its
    messages are really encoded (``full``) or sized (``learning``, ``timing``)."""
    ahead: ThreadPoolExecutor | None = None
    """The threads on which clients' protocol calls are made ahead of virtual time (``full`` fidelity,
    ``aggregation.threads`` > 1: :mod:`sim.engine.ahead`), or None: each call is made when its client reaches
    it."""

    def charges(self) -> Charges:
        """Where the parties' compute charges run (:mod:`sim.engine.charges`)."""
        if self.host is None:
            return OwnProcessors()
        return HostCores(self.host, self.call_s, self.server_call_s)

    def transport(self) -> Transport:
        """How a round's messages travel (:mod:`sim.engine.transport`), one per round."""
        return Links() if self.engine is None else EngineQueues(self.engine)

    def calls(self, r: Round) -> CallsInTurn:
        """When round ``r``'s clients' machine calls are made (:mod:`sim.engine.calls`), one per round."""
        if self.ahead is None or self.fidelity != "full":
            return CallsInTurn(r.finished)
        return CallsMadeAhead(r.finished, self.ahead, r.leaves_before, r.encoded, r.frame)


class Round:
    """The processes of one round; :meth:`run` is the server's process and returns a :class:`RoundRecord`."""

    def __init__(self, setup: RoundSetup, plan: RoundPlan) -> None:
        self.s = setup
        self.plan = plan
        self.private = plan.private
        self.offline = {c: t for c, t in plan.offline.items() if math.isfinite(t)}
        """Sampled client -> virtual time its availability ends (trace replay): it leaves then, mid-step."""
        self.client_procs: dict[int, simpy.Process] = {}
        self.client_machines: dict[tuple[int, int], ClientMachine] = {}
        """(client, instance) -> its machine, once it has entered the protocol."""
        self.transfers: dict[int, list[simpy.Process]] = {}
        """Client -> the deliveries to or from it in flight (cut when it goes offline)."""
        self.env = setup.env
        self.number = plan.number
        self.sampled = tuple(int(c) for c in plan.sampled)
        self.full = setup.fidelity == "full"
        """Whether messages are really encoded and decoded (their cryptography is real)."""
        self.drops = dict(plan.drops)
        self.spec = spec_of(setup.aggregation)
        """The round's protocol."""
        self.departures = {c: Departure.plan(self.spec, setup.aggregation, stage) for c, stage in self.drops.items()}
        """Client -> where its planned dropout leaves the round."""
        if setup.learner is not None and not plan.refused:  # training.workers > 1: train them in the background
            setup.learner.prefetch(self.number, [c for c in self.sampled if not self.departure(c).before_download])
        self.m = plan.chunks or 1
        """Protocol instances of the round (its chunks; 1 when it is not pipelined)."""
        self.inboxes = [simpy.Store(self.env) for _ in range(self.m)]
        """Per instance: the server's arrivals, ``(kind, sender, message, arrived)``."""
        self.client_inbox = {(c, j): simpy.Store(self.env) for c in self.sampled for j in range(self.m)}
        self.flows: dict[int, Flow] = {}
        self.procs: list[simpy.Process] = []
        self.encoded: dict[int, tuple[Message, bytes]] = {}
        """Frames of messages already encoded this round, by message identity (a broadcast is serialised
        once); the message is kept alive with its frame so that its id cannot be reused."""
        self._model: ModelDownload | None = None
        self.finished: set[tuple[int, int]] = set()
        """(client, instance) whose machine has done its part, as of the calls taken so far."""
        self.charges = setup.charges()
        """Where the parties' compute charges run."""
        self.transport = setup.transport()
        """How the round's messages travel."""
        self.calls = setup.calls(self)
        """When the clients' machine calls are made."""
        pop = setup.population
        self.links: dict[int, tuple[Link, Link]] = {}
        self.record = RoundRecord(round=self.number, t_start=self.env.now, sampled=len(self.sampled), chunks=self.m)
        self.clients: dict[int, ClientRecord] = {}
        self.link_meters = {c: BusyMeter(self.env) for c in self.sampled}
        self.server_link = BusyMeter(self.env)
        ids = np.asarray(self.sampled, dtype=np.int64)
        slowdowns, mbps = pop.slowdown[ids].tolist(), pop.bandwidth_mbps[ids].tolist()  # computed from the ids
        for c, slowdown, link_mbps in zip(self.sampled, slowdowns, mbps, strict=True):
            bps = link_mbps * MBPS * setup.payload_fraction
            self.links[c] = (Link(f"client{c}.up", bps), Link(f"client{c}.down", bps))
            self.clients[c] = ClientRecord(
                client=c, slowdown=slowdown, bandwidth_mbps=link_mbps, samples=int(setup.samples(c))
            )
        self.roster = Roster(self.clients)
        """Who is out of the round and why (shared by every instance)."""
        self.instances: RoundInstances | None = None
        self.servers: list[ServerMachine] = []
        """The server machine of each instance."""
        self.setup_error = plan.refused
        """Why the round cannot run (it then aborts at once), or empty."""
        if not self.setup_error:
            try:
                self.instances = RoundInstances(
                    setup.aggregation,
                    setup.seed,
                    self.number,
                    self.sampled,
                    setup.dim,
                    self.private,
                    plan.chunks,
                    setup.fidelity,
                )
            except RoundSetupError as exc:
                self.setup_error = str(exc)
            else:
                self.servers = self.instances.servers
        self.shape: Shape
        """One instance, or one per chunk (their gates and processors): what the round's parties run."""
        if plan.chunks is None:
            self.shape = OneInstance(self)
        else:
            self.shape = ChunkedInstances(self, setup.pipeline)

    # -- server -----------------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, RoundRecord]:
        env, rec = self.env, self.record
        if not self.servers:
            rec.t_end, rec.outcome = env.now, f"aborted: {self.setup_error}"
            rec.clients = [self.clients[c] for c in self.sampled]
            return rec
        yield from self.server_compute([Work("wire.encode", frame_size(self.model_message()))])
        self.transport.sent()
        for c in self.sampled:
            self.client_procs[c] = proc = env.process(self._client(c))
            self.procs.append(proc)
        for c, at in self.offline.items():
            self.procs.append(env.process(self._offline_watch(c, at)))
        aggregate = yield from self.shape.serve()
        self._stop_clients()
        rec.t_end = env.now
        rec.aggregate = aggregate
        expose(rec, self.servers, self.shape.chunked)
        self.shape.close(rec)
        self._close_record(set(aggregate.survivors) if aggregate is not None else set())
        return rec

    def _close_record(self, survivors: set[int]) -> None:
        """Final counts, client outcomes and utilisation of the round."""
        rec = self.record
        close_record(rec, self.roster, self.sampled, survivors, len(self.drops))
        length = rec.t_end - rec.t_start
        if length > 0:
            links = [self.link_meters[c].total() / length for c in self.sampled]
            rec.utilisation = {
                "client_cpu": client_cpu_share([self.clients[c] for c in self.sampled], length),
                "client_link": sum(links) / len(links) if links else math.nan,
                "server_cpu": self.shape.server_busy() / length,
                "server_link": self.server_link.total() / length,
            }

    def collect(
        self, machine: ServerMachine, j: int, priority: int = STAGED, lazy: bool = False
    ) -> Generator[simpy.Event, Any, None]:
        """Handle the answers to ``machine``'s step (instance ``j``) until nobody is awaited or its timeout
        passes (:class:`~sim.round.collector.StepCollector`; with ``lazy`` the timeout counts from the
        first answer). A message counts if it arrived by the deadline, even when the busy server gets to it
        later; one that arrived after the deadline closes the step (the inbox is in arrival order). The
        server's work runs at ``priority``."""
        env, inbox = self.env, self.inboxes[j]
        collector = StepCollector(machine, self.roster, self.s.timeouts.get(machine.step), env.now, lazy, j)
        deadline: simpy.Event | None = None
        if collector.deadline is not None and collector.timeout is not None:
            deadline = env.timeout(collector.timeout)
        while collector.waiting():
            get = inbox.get()
            yield get if deadline is None else env.any_of([get, deadline])
            if not get.triggered:
                get.cancel()
                self._missed(collector.expire())
                return
            kind, sender, message, arrived = cast(tuple[str, int, Message, float], get.value)
            lazily = collector.deadline is None
            decision = collector.arrival(kind, sender, arrived)
            if decision is CLOSE:
                self._missed(collector.missed)
                return
            if lazily and collector.deadline is not None:
                deadline = env.timeout(collector.deadline - env.now)
            if decision is UNASKED:
                self._reject(sender, collector.unasked(type(message).__name__))
            if decision is not ACCEPT:
                continue
            yield from self.server_compute([Work("wire.decode", frame_size(message))], priority)
            try:
                reaction = machine.receive(sender, message)
            except RemoteProtocolError as exc:
                self._reject(sender, exc.reason)
                continue
            collector.took(sender)
            yield from self.server_react(reaction, priority, machine)

    def close_step(self, machine: ServerMachine) -> Reaction:
        """``machine.close_step()``. On :class:`RoundAbortedError` (what the clients sent contradicts itself)
        the machine has aborted already and its outcome says why: the round ends as for any abort, and the
        clients found lying are refused."""
        try:
            return machine.close_step()
        except RoundAbortedError as exc:
            self._out(self.roster.blame(exc))
            return Reaction()

    def _missed(self, late: list[int]) -> None:
        """Clients ``late`` missed a step's deadline: they are out of the round from now on. In a pipelined
        round the other chunks' instances stop waiting for them (a silent leaver costs one timeout, not one
        per chunk); the sums they are already in keep them."""
        self._out(late)

    def _reject(self, sender: int, reason: str) -> None:
        """The server refused ``sender``'s message: it is out of the round."""
        self.roster.reject(sender, reason)
        self._out([sender])

    def _out(self, clients: list[int]) -> None:
        """Clients put out of the round (late, refused): the shape tells its instances (pipelined, the other
        chunks' instances stop waiting for them, as the deployment's server does)."""
        self.shape.out(clients)

    def server_compute(
        self, work: list[Work] | tuple[Work, ...], priority: int = STAGED
    ) -> Generator[simpy.Event, Any, None]:
        """Charge ``work`` to the server's CPU, divided by its speed, at ``priority``."""
        seconds = self.s.costs.work_seconds(work, SERVER_ROLE) / self.s.server_speed
        self.record.server_cpu_s += seconds
        if seconds <= 0:
            return
        seconds += self.charges.overhead(SERVER)
        yield from self.shape.compute_server(seconds, priority, self.charges.hold(seconds, 1.0, SERVER))

    def charge_server(self, seconds: float) -> None:
        """The server worked ``seconds`` (told by a processor)."""
        self.record.server_compute_s += seconds

    def server_react(
        self, reaction: Reaction, priority: int = STAGED, machine: ServerMachine | None = None
    ) -> Generator[simpy.Event, Any, None]:
        """Do the server's work of ``reaction`` and send its messages (``machine``: the instance it came
        from, whose clients' inboxes they go to)."""
        encode = [Work("wire.encode", frame_size(send.message)) for send in reaction.sends]
        yield from self.server_compute([*reaction.work, *self._first_encodings(reaction, encode)], priority)
        chunk = self.servers.index(machine) if machine is not None and machine in self.servers else 0
        if reaction.sends:
            self.transport.sent()
        for send in reaction.sends:
            self.spawn_delivery(SERVER, send.to, send.message, chunk)

    def _first_encodings(self, reaction: Reaction, encode: list[Work]) -> list[Work]:
        """Encoding work of the messages not serialised before (a broadcast is encoded once)."""
        seen: set[int] = set()
        out = []
        for send, work in zip(reaction.sends, encode, strict=True):
            if id(send.message) not in seen:
                seen.add(id(send.message))
                out.append(work)
        return out

    def _stop_clients(self) -> None:
        for proc in self.procs:
            if proc.is_alive:
                proc.interrupt("round over")
        for flow in list(self.flows.values()):
            self.s.network.cancel(flow)
        self.flows.clear()

    # -- clients ----------------------------------------------------------------------------------
    def _download_and_train(self, c: int) -> Generator[simpy.Event, Any, tuple[wire.Vector, float] | None]:
        """Client ``c`` fetches the model and trains; returns its update and weight, or None if it left
        before the download (a dropout after sampling). Where the model travels with the upload request
        (:attr:`sim.engine.single.OneInstance.model_with_upload`), this first message is the request to set
        up, and the model's bytes and decoding and the training are charged with the upload request."""
        env, rec, s = self.env, self.clients[c], self.s
        if self.departure(c).before_download:
            self.leave(c, AFTER_SAMPLING)
            return None
        rec.download_start = env.now
        model = self.model_message()
        late = self.shape.model_with_upload
        yield from self.transfer(SERVER, c, model)
        yield from self.transport.take_worker(c)
        if late:
            yield from self.client_compute(c, [], extra=self.transport.received_seconds(self, ()))
        else:
            work = [Work("wire.decode", frame_size(model))]
            yield from self.client_compute(c, work, extra=self.transport.received_seconds(self, (model,)))
        rec.download_end = rec.train_start = env.now
        update: wire.Vector
        if s.learner is not None:
            update, weight = s.learner.local_update(c, self.number)
            self.shape.trained(c, update, weight)
        else:
            update, weight = Blank(s.dim, np.dtype("<f4")), float(rec.samples)
        if not late:
            yield from self.train(c)
        return update, weight

    def train(self, c: int) -> Generator[simpy.Event, Any, None]:
        """Charge client ``c``'s local training (its cost-model time times its slow-down)."""
        env, rec, s = self.env, self.clients[c], self.s
        rec.train_start = env.now
        samples = rec.samples
        train_cost = s.costs.seconds(
            s.train_op,
            {
                "samples": samples * s.local_epochs,
                "batches": local_batches(samples, s.batch_size, s.local_epochs),
            },
            CLIENT_ROLE,
        )
        rec.cpu_s += train_cost
        yield from self.charges.train(env, train_cost, rec.slowdown, c)
        rec.train_end = env.now

    def _client(self, c: int) -> Generator[simpy.Event, Any, None]:
        try:
            trained = yield from self._download_and_train(c)
            if trained is None:
                return
            update, weight = trained
            yield from self.shape.client(c, update, weight)
        except simpy.Interrupt:
            return
        finally:
            self.transport.free_worker(c)

    def departure(self, c: int) -> Departure:
        """Where client ``c``'s planned dropout leaves the round (it may stay)."""
        return self.departures.get(c, STAYS)

    def model_message(self) -> ModelDownload:
        """The round's global model, one message for every client (encoded once)."""
        if self._model is None:
            s = self.s
            params = s.learner.params if s.learner is not None else Blank(s.dim, np.dtype("<f4"))
            self._model = ModelDownload(self.number, params)
        return self._model

    def client_machine(self, c: int, chunk: int | None = None) -> ClientMachine:
        assert self.instances is not None
        return self.instances.client(c, chunk)

    def leaves_before(self, c: int, machine: ClientMachine, message: Message) -> bool:
        """Whether client ``c`` leaves before handling ``message`` (its planned dropout): where it leaves, and
        where its lane of calls made ahead closes."""
        return self.departure(c).before(machine.stage_of(message))

    def release(self) -> None:
        """The round is over: calls made ahead and not taken are dropped or waited for."""
        self.calls.close()

    def client_compute(
        self, c: int, work: list[Work] | tuple[Work, ...], priority: int = STAGED, extra: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        """Charge ``work`` (and ``extra`` reference-device seconds) to client ``c``'s CPU, times its slow-down."""
        rec = self.clients[c]
        reference = self.s.costs.work_seconds(work, CLIENT_ROLE) + extra
        rec.cpu_s += reference
        if reference > 0:
            reference += self.charges.overhead(c)
        seconds = reference * rec.slowdown
        if seconds <= 0:
            return
        hold = self.charges.hold(reference, rec.slowdown, c)
        yield from self.shape.compute_client(c, rec, seconds, priority, hold)

    def client_react(self, c: int, reaction: Reaction) -> Generator[simpy.Event, Any, None]:
        """Do client ``c``'s work of ``reaction`` (with the replies' handing back on an engine) and send its
        messages."""
        encode = [Work("wire.encode", frame_size(send.message)) for send in reaction.sends]
        extra = self.transport.replies_seconds(self, [send.message for send in reaction.sends])
        yield from self.client_compute(c, [*reaction.work, *encode], extra=extra)
        for send in reaction.sends:
            self.spawn_delivery(c, send.to, send.message)

    def spawn_delivery(self, sender: int, to: int, message: Message, chunk: int = 0) -> simpy.Process:
        if sender == SERVER:
            self.calls.server_sent(to, chunk, message)
        proc = self.env.process(self.deliver(sender, to, message, chunk))
        self.procs.append(proc)
        self.transfers.setdefault(to if sender == SERVER else sender, []).append(proc)
        return proc

    def _offline_watch(self, c: int, at: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s online interval ends at ``at``: it leaves at whatever stage it is in, its transfers
        in flight are cut, and the server notices as for any other dropout (unless ``dropout.silent``)."""
        try:
            yield self.env.timeout(max(0.0, at - self.env.now))
        except simpy.Interrupt:
            return
        if not self._client_alive(c) or self.shape.has_left(c):
            return
        sending = any(t.is_alive for t in self.transfers.get(c, []))
        if self._has_finished(c) and not sending:
            return  # it had done its part and sent it all: going offline afterwards changes nothing
        step = self.shape.current_step()
        self._interrupt_client(c, "offline")
        for transfer in self.transfers.get(c, []):
            if transfer.is_alive:
                transfer.interrupt("offline")
        self.leave(c, f"offline:{step}")

    def _client_alive(self, c: int) -> bool:
        proc = self.client_procs.get(c)
        alive = proc is not None and proc.is_alive
        return alive or any(p.is_alive for p in self.shape.procs_of(c))

    def _interrupt_client(self, c: int, why: str) -> None:
        for proc in [self.client_procs[c], *self.shape.procs_of(c)]:
            if proc.is_alive:
                proc.interrupt(why)

    def _has_finished(self, c: int) -> bool:
        """Whether client ``c`` has done its whole part of the protocol (pipelined: every chunk's instance,
        and decoded every sum sent to it)."""
        protocol_done = all((c, j) in self.finished for j in range(self.m))
        return protocol_done and not self.shape.decoding(c)

    def leave(self, c: int, stage: str, notify: bool = False) -> None:
        """Client ``c`` leaves the round at ``stage``; the server learns it at once unless ``dropout.silent``
        (with ``notify``: in any case, as a client refusing the server closes its connection)."""
        self.clients[c].dropped_stage = stage
        self.clients[c].left_at = self.env.now
        if not self.s.silent_dropout:
            self.notify_gone(c)
        self.shape.leave(c, notify)

    def notify_gone(self, c: int) -> None:
        """Tell the server that client ``c``'s connection closed (every instance of the round); on a
        simulation engine, its error reply reaches the server at the server's next poll."""
        if self.transport.reply_at(self.env.now) > self.env.now:
            self.procs.append(self.env.process(self._gone_later(c)))
            return
        for inbox in self.inboxes:
            inbox.put((GONE, c, None, self.env.now))

    def _gone_later(self, c: int) -> Generator[simpy.Event, Any, None]:
        try:
            yield self.env.timeout(self.transport.reply_at(self.env.now) - self.env.now)
        except simpy.Interrupt:
            return
        for inbox in self.inboxes:
            inbox.put((GONE, c, None, self.env.now))

    # -- network ----------------------------------------------------------------------------------
    def transfer(
        self, sender: int, to: int, message: Message, sent: Callable[[], None] | None = None, decode: bool = True
    ) -> Generator[simpy.Event, Any, Message]:
        """Carry ``message`` from ``sender`` to ``to``; returns what the receiver decodes (``message`` itself
        without ``decode``: it is decoded elsewhere). ``sent`` is called when its last bit has left (before the
        server's ``latency_ms``)."""
        data = b""
        if self.full:
            data = self.frame(message)
        nbytes = self.wire_bytes(message)
        if sender == SERVER:
            self.record.server_bytes_out += nbytes
            self.clients[to].bytes_down += nbytes
        else:
            self.record.server_bytes_in += nbytes
            self.clients[sender].bytes_up += nbytes
        yield from self.transport.carry(self, sender, to, nbytes, sent)
        return wire.decode(data) if self.full and decode else message

    def frame(self, message: Message) -> bytes:
        """``message`` encoded (once per message and round: a broadcast is serialised once)."""
        cached = self.encoded.get(id(message))
        if cached is None or cached[0] is not message:
            cached = self.encoded[id(message)] = (message, message.encode())
        return cached[1]

    def wire_bytes(self, message: Message) -> int:
        """Bytes ``message`` takes on the wire: its frame, or its size in the encoding of the cost profile's
        implementation (:mod:`sim.costs.wire`)."""
        encoding = self.s.costs.wire
        if encoding is not None:
            return encoding.size(message)
        return len(self.frame(message)) if self.full else message.wire_size()

    def deliver(
        self, sender: int, to: int, message: Message, chunk: int = 0, sent: Callable[[], None] | None = None
    ) -> Generator[simpy.Event, Any, None]:
        try:
            start = self.env.now
            # with calls made ahead, a client decodes the server's messages, and the server its replies, there
            decoded = self.calls.decoded_reply(message) if sender != SERVER else None
            decode = decoded is None and (sender != SERVER or self.calls.decodes_on_arrival)
            received = yield from self.transfer(sender, to, message, sent, decode)
            if decoded is not None:
                received = decoded
            if sender == SERVER:
                self.client_inbox[(to, chunk)].put(received)
            else:
                rec = self.clients[sender]
                rec.upload_s += self.env.now - start
                rec.last_upload_end = self.env.now
                self.inboxes[chunk].put((MESSAGE, sender, received, self.env.now))
        except simpy.Interrupt:
            return
