"""One federated round in virtual time: SimPy processes around the sans-IO protocol machines.

The frame of a round (DESIGN "A round"): the server sends the global model to every sampled client
(concurrent transfers share the server's downlink), each client trains (its cost-model time times its
slow-down), then enters the aggregation protocol with its update. From there the round is driven by the
machines (:mod:`sim.protocol.registry`): every message a machine emits crosses the simulated network with
its real encoded size (in ``full`` fidelity it is really encoded and decoded; in ``timing`` fidelity its
size is computed), and every operation a machine reports, plus encoding and decoding each frame
(``wire.encode``, ``wire.decode``), is charged from the cost model: to the client's CPU times its
slow-down, or to the server's divided by its speed. Each party computes one thing at a time. On a
testbed (``RoundSetup.host``) every compute charge is instead a job on the host's shared cores, followed
for a client by the sleep that emulates its slow-down (:mod:`sim.engine.host`).

Collection steps end when every client the server machine still expects has answered or has left, or
when the step's timeout passes; clients that have not answered by then are late (``timeout:<step>``) and
whatever they send afterwards is discarded. A client that drops out leaves just before its planned step;
unless ``dropout.silent`` the server learns of it at once (a closed connection), else only by the
timeout. A client machine that detects a misbehaving server aborts (``aborted: <why>``) and leaves. When
the server machine is done or aborts, the round ends: clients still busy are stopped and their transfers
cancelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.costs.model import CostModel
from sim.engine.gates import STAGED, BusyMeter
from sim.engine.host import SharedCores
from sim.engine.network import Flow, Link, Network
from sim.engine.population import Population
from sim.learning.trainer import Learner, local_batches
from sim.protocol import wire
from sim.protocol.fedavg import ModelDownload
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
from sim.protocol.private import PrivateRound
from sim.protocol.registry import AFTER_SAMPLING, AggregationParams, ClientFactory
from sim.protocol.wire import Blank, Message

TRANSPORT_OPS = ("deploy.send", "deploy.receive")
"""Cost-model operations of the testbed's sockets per message (:mod:`sim.costs.transport`): the sender's
framing and writing, the receiver's reading and checking, each a job on the host's cores while the bytes
flow."""
CALL_OP = "deploy.call"
"""Cost-model operation of handing one computation to a party's compute thread on the testbed."""

MBPS = 1e6
"""Bits per second in one Mbps."""

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
    """The real model (``full`` fidelity) or None (``timing``)."""
    aggregation: AggregationParams
    seed: int
    pipeline: PipelineParams | None = None
    """Pipelined aggregation (:class:`sim.engine.pipelined.PipelinedRound`), or None."""
    latency_s: float = 0.0
    """One-way delay of every message after its transfer (s)."""
    host: SharedCores | None = None
    call_s: float = 0.0
    """On a testbed: reference seconds of handing a computation to a party's compute thread
    (:data:`CALL_OP`), added to every compute charge."""
    """The testbed's cores, shared by every party's compute (scenario ``testbed``), or None: each party
    has its own processor."""


@dataclass(frozen=True)
class PipelineParams:
    """A pipelined round's shape (Dordis section 4): ``chunks`` protocol instances, one per chunk, and
    whether the server dispatches each chunk's sum to its clients (Table 1 stages 4 and 5)."""

    chunks: int
    dispatch: bool = True
    duplex: bool = False
    """Whether uploads and dispatches use the client's uplink and downlink as two resources (full-duplex
    links) rather than one ``comm`` resource as in Dordis Table 1 and the Hyades recurrence."""


class Round:
    """The processes of one round; :meth:`run` is the server's process and returns a :class:`RoundRecord`."""

    def __init__(
        self,
        setup: RoundSetup,
        number: int,
        sampled: np.ndarray,
        drops: dict[int, str],
        private: PrivateRound | None = None,
        setup_error: str = "",
        offline: dict[int, float] | None = None,
    ) -> None:
        self.s = setup
        self.private = private
        self.offline = {c: t for c, t in (offline or {}).items() if math.isfinite(t)}
        """Sampled client -> virtual time its availability ends (trace replay): it leaves then, mid-step."""
        self.client_procs: dict[int, simpy.Process] = {}
        self.client_machines: dict[int, ClientMachine] = {}
        self.transfers: dict[int, list[simpy.Process]] = {}
        """Client -> the deliveries to or from it in flight (cut when it goes offline)."""
        self.env = setup.env
        self.number = number
        self.sampled = tuple(int(c) for c in sampled)
        self.full = setup.learner is not None
        stages = setup.aggregation.dropout_stages()
        self.leave_before = {c: stages[stage] for c, stage in drops.items()}
        """Client -> the step it leaves before (``""``: before the download)."""
        if setup.learner is not None and not setup_error:  # training.workers > 1: train them in the background
            setup.learner.prefetch(number, [c for c in self.sampled if self.leave_before.get(c) != ""])
        self.drops = drops
        self.inbox = simpy.Store(self.env)
        self.client_inbox = {c: simpy.Store(self.env) for c in self.sampled}
        self.gone: set[int] = set()
        self.late: set[int] = set()
        self.flows: dict[int, Flow] = {}
        self.procs: list[simpy.Process] = []
        self.encoded: dict[int, tuple[Message, bytes]] = {}
        """Frames of messages already encoded this round, by message identity (a broadcast is serialised
        once); the message is kept alive with its frame so that its id cannot be reused."""
        self._model: ModelDownload | None = None
        pop = setup.population
        self.links: dict[int, tuple[Link, Link]] = {}
        self.record = RoundRecord(round=number, t_start=self.env.now, sampled=len(self.sampled))
        self.clients: dict[int, ClientRecord] = {}
        self.link_meters = {c: BusyMeter(self.env) for c in self.sampled}
        self.server_link = BusyMeter(self.env)
        for c in self.sampled:
            bps = float(pop.bandwidth_mbps[c]) * MBPS
            self.links[c] = (Link(f"client{c}.up", bps), Link(f"client{c}.down", bps))
            self.clients[c] = ClientRecord(
                client=c,
                slowdown=float(pop.slowdown[c]),
                bandwidth_mbps=float(pop.bandwidth_mbps[c]),
                samples=int(setup.samples(c)),
            )
        self.signing: dict[int, wire.Data] = {}
        """Long-term signing keys of the sampled clients (malicious variant)."""
        self.instances: RoundInstances | None = None
        self.machine: ServerMachine | None = None
        self.client_factory: ClientFactory | None = None
        self.setup_error = setup_error
        """Why the round cannot run (it then aborts at once), or empty."""
        if not setup_error:
            try:
                self.machine, self.client_factory = self._machines()
            except RoundSetupError as exc:
                self.setup_error = str(exc)

    def _machines(self) -> tuple[ServerMachine, ClientFactory]:
        self.instances = self._instances(None)
        self.signing = self.instances.signing
        return self.instances.servers[0], self.instances.factories[0]

    def _instances(self, chunks: int | None) -> RoundInstances:
        """The round's protocol machines, as every driver builds them from the seed."""
        s = self.s
        return RoundInstances(s.aggregation, s.seed, self.number, self.sampled, s.dim, self.private, chunks, self.full)

    # -- server -----------------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, RoundRecord]:
        env, rec = self.env, self.record
        if self.machine is None:
            rec.t_end, rec.outcome = env.now, f"aborted: {self.setup_error}"
            rec.clients = [self.clients[c] for c in self.sampled]
            return rec
        machine = self.machine
        yield from self._server_compute([Work("wire.encode", _frame_size(self._model_message()))])
        for c in self.sampled:
            self.client_procs[c] = proc = env.process(self._client(c))
            self.procs.append(proc)
        for c, at in self.offline.items():
            self.procs.append(env.process(self._offline_watch(c, at)))
        yield from self._server_react(machine.begin(), STAGED, machine)
        step_start = rec.t_start
        while machine.step not in ("done", "aborted"):
            step = machine.step
            yield from self._collect(machine, step, self.inbox, self.late)
            collected = env.now
            yield from self._server_react(self._close_step(machine), STAGED, machine)
            final = machine.step in ("done", "aborted")
            # A step lasts until the next one starts (its closing work included); the last step's closing
            # work is the aggregation (``aggregate_s``), so the steps and it add up to the round.
            rec.steps.append((step, step_start, collected if final else env.now))
            rec.aggregate_start = collected
            step_start = env.now
        self._stop_clients()
        rec.t_end = env.now
        rec.outcome = machine.outcome
        rec.aggregate = machine.aggregate
        rec.exposed = revealed(machine)
        survivors = set(machine.aggregate.survivors) if machine.aggregate is not None else set()
        self._close_record(survivors)
        return rec

    def _close_record(self, survivors: set[int]) -> None:
        """Final counts, utilisation and client outcomes of the round."""
        rec = self.record
        rec.survivors = len(survivors)
        rec.dropped_planned = len(self.drops)
        rec.timed_out = sum(1 for c in self.clients.values() if c.dropped_stage.startswith("timeout:"))
        for c in self.sampled:
            record = self.clients[c]
            if c not in survivors and not record.dropped_stage:
                record.dropped_stage = "not aggregated"
            rec.clients.append(record)
        length = rec.t_end - rec.t_start
        if length > 0:
            links = [self.link_meters[c].total() / length for c in self.sampled]
            rec.utilisation = {
                "client_cpu": client_cpu_share([self.clients[c] for c in self.sampled], length),
                "client_link": sum(links) / len(links) if links else math.nan,
                "server_cpu": self._server_busy() / length,
                "server_link": self.server_link.total() / length,
            }

    def _server_busy(self) -> float:
        """Seconds of the round during which the server computed."""
        return self.record.server_compute_s

    def _collect(
        self,
        machine: ServerMachine,
        step: str,
        inbox: simpy.Store,
        late: set[int],
        priority: int = STAGED,
        from_first: bool = False,
    ) -> Generator[simpy.Event, Any, None]:
        """Handle answers to ``step`` until nobody is awaited or its timeout passes. A message counts if it
        arrived by the deadline, even when the busy server gets to it later; one that arrived after the
        deadline closes the step (the inbox is in arrival order). ``late`` collects the clients that missed
        a deadline (their later messages are discarded); the server's work runs at ``priority``. With
        ``from_first`` the timeout counts from the first answer (a pipelined round's later chunks, whose
        clients reach them one chunk after another)."""
        env = self.env
        timeout = self.s.timeouts.get(step)
        deadline_at: float | None = None
        deadline: simpy.Event | None = None
        if timeout is not None and not from_first:
            deadline_at, deadline = env.now + timeout, env.timeout(timeout)
        while True:
            waiting = machine.expected() - self.gone
            if not waiting:
                return
            get = inbox.get()
            yield get if deadline is None else env.any_of([get, deadline])
            missed = not get.triggered
            if missed:
                get.cancel()
            else:
                kind, sender, message, arrived = get.value  # type: ignore[misc]
                missed = deadline_at is not None and arrived > deadline_at
                if timeout is not None and deadline_at is None and kind == "msg":
                    deadline_at = arrived + timeout
                    deadline = env.timeout(deadline_at - env.now)
            if missed:
                for c in sorted(waiting):
                    late.add(c)
                    self._missed(c)
                    if not self.clients[c].dropped_stage:
                        self.clients[c].dropped_stage = f"timeout:{step}"
                return
            if kind == "gone":
                self.gone.add(sender)
                continue
            if sender in late or sender not in machine.expected():
                continue
            yield from self._server_compute([Work("wire.decode", _frame_size(message))], priority)
            try:
                reaction = machine.receive(sender, message)
            except RemoteProtocolError as exc:
                self._reject(sender, exc.reason)
                continue
            yield from self._server_react(reaction, priority, machine)

    @staticmethod
    def _close_step(machine: ServerMachine) -> Reaction:
        """``machine.close_step()``. On :class:`RoundAbortedError` (what the clients sent contradicts itself)
        the machine has aborted already and its outcome says why: the round ends as for any abort."""
        try:
            return machine.close_step()
        except RoundAbortedError:
            return Reaction()

    def _missed(self, c: int) -> None:
        """Client ``c`` missed a step's deadline (it is late; the server ignores it from now on)."""

    def _reject(self, sender: int, reason: str) -> None:
        """The server refused ``sender``'s message: it is out of the round."""
        self.gone.add(sender)
        self.clients[sender].dropped_stage = f"rejected: {reason}"

    def _server_compute(
        self, work: list[Work] | tuple[Work, ...], priority: int = STAGED
    ) -> Generator[simpy.Event, Any, None]:
        seconds = self.s.costs.work_seconds(work) / self.s.server_speed
        self.record.server_cpu_s += seconds
        if seconds > 0:
            host = self.s.host
            if host is None:
                self.record.server_compute_s += seconds
                yield self.env.timeout(seconds)
                return
            seconds += self.s.call_s
            start = self.env.now
            try:
                yield from host.compute(seconds)
            finally:
                self.record.server_compute_s += self.env.now - start

    def _server_react(
        self, reaction: Reaction, priority: int = STAGED, machine: ServerMachine | None = None
    ) -> Generator[simpy.Event, Any, None]:
        """Do the server's work of ``reaction`` and send its messages (``machine``: the instance it came
        from, which routes them in a pipelined round)."""
        encode = [Work("wire.encode", _frame_size(send.message)) for send in reaction.sends]
        yield from self._server_compute([*reaction.work, *self._first_encodings(reaction, encode)], priority)
        for send in reaction.sends:
            self._spawn_delivery(SERVER, send.to, send.message, self._chunk_of(machine))

    def _chunk_of(self, machine: ServerMachine | None) -> int:
        return 0

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
        before the download (a dropout after sampling)."""
        env, rec, s = self.env, self.clients[c], self.s
        if self.leave_before.get(c) == "":
            self._leave(c, AFTER_SAMPLING)
            return None
        rec.download_start = env.now
        yield from self._transfer(SERVER, c, self._model_message())
        yield from self._client_compute(c, [Work("wire.decode", _frame_size(self._model_message()))])
        rec.download_end = rec.train_start = env.now
        samples = rec.samples
        train_cost = s.costs.seconds(
            s.train_op,
            {
                "samples": samples * s.local_epochs,
                "batches": local_batches(samples, s.batch_size, s.local_epochs),
            },
        )
        train_seconds = rec.slowdown * train_cost
        rec.cpu_s += train_cost
        update: wire.Vector
        if s.learner is not None:
            update, weight = s.learner.local_update(c, self.number)
        else:
            update, weight = Blank(s.dim, np.dtype("<f4")), float(samples)
        if s.host is None:
            yield env.timeout(train_seconds)
        else:
            yield from s.host.compute(train_cost + s.call_s, rec.slowdown)
        rec.train_end = env.now
        return update, weight

    def _client(self, c: int) -> Generator[simpy.Event, Any, None]:
        env, rec = self.env, self.clients[c]
        leave_before = self.leave_before.get(c)
        try:
            trained = yield from self._download_and_train(c)
            if trained is None:
                return
            update, weight = trained
            machine = self.client_machines[c] = self._client_machine(c)
            if leave_before == machine.first_step:
                self._leave(c, self.drops[c])
                return
            yield from self._client_react(c, machine.start(update, weight))
            inbox = self.client_inbox[c]
            while True:
                message = yield inbox.get()
                yield from self._client_compute(c, [Work("wire.decode", _frame_size(message))])
                if leave_before and machine.stage_of(message) == leave_before:
                    self._leave(c, self.drops[c])
                    return
                try:
                    reaction = machine.receive(message)
                except RemoteProtocolError as exc:
                    rec.dropped_stage = f"aborted: {exc.reason}"
                    self.inbox.put(("gone", c, None, env.now))
                    return
                yield from self._client_react(c, reaction)
        except simpy.Interrupt:
            return

    def _model_message(self) -> ModelDownload:
        """The round's global model, one message for every client (encoded once)."""
        if self._model is None:
            s = self.s
            params = s.learner.params if s.learner is not None else Blank(s.dim, np.dtype("<f4"))
            self._model = ModelDownload(self.number, params)
        return self._model

    def _client_machine(self, c: int) -> ClientMachine:
        assert self.instances is not None
        return self.instances.client(c)

    def _client_compute(
        self, c: int, work: list[Work] | tuple[Work, ...], priority: int = STAGED, extra: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        """Charge ``work`` (and ``extra`` reference-device seconds) to client ``c``'s CPU."""
        rec, host = self.clients[c], self.s.host
        reference = self.s.costs.work_seconds(work) + extra
        rec.cpu_s += reference
        if reference > 0 and host is not None:
            reference += self.s.call_s
        seconds = reference * rec.slowdown
        if seconds > 0:
            start = self.env.now
            try:
                if host is None:
                    yield self.env.timeout(seconds)
                else:
                    yield from host.compute(reference, rec.slowdown)
            except simpy.Interrupt:
                rec.compute_s += self.env.now - start  # cut short: only what it did
                raise
            rec.compute_s += seconds if host is None else self.env.now - start

    def _client_react(self, c: int, reaction: Reaction) -> Generator[simpy.Event, Any, None]:
        encode = [Work("wire.encode", _frame_size(send.message)) for send in reaction.sends]
        yield from self._client_compute(c, [*reaction.work, *encode])
        for send in reaction.sends:
            self._spawn_delivery(c, send.to, send.message)

    def _spawn_delivery(self, sender: int, to: int, message: Message, chunk: int = 0) -> simpy.Process:
        proc = self.env.process(self._deliver(sender, to, message, chunk))
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
        if not self._client_alive(c) or self._has_left(c):
            return
        sending = any(t.is_alive for t in self.transfers.get(c, []))
        if self._has_finished(c) and not sending:
            return  # it had done its part and sent it all: going offline afterwards changes nothing
        step = self._current_step()
        self._interrupt_client(c, "offline")
        for transfer in self.transfers.get(c, []):
            if transfer.is_alive:
                transfer.interrupt("offline")
        self._leave(c, f"offline:{step}")

    def _has_left(self, c: int) -> bool:
        """Whether client ``c`` is out of the round already (dropped, late, rejected)."""
        return bool(self.clients[c].dropped_stage)

    def _current_step(self) -> str:
        """The server step under way (for ``offline:<step>``)."""
        return self.machine.step if self.machine is not None else ""

    def _client_alive(self, c: int) -> bool:
        proc = self.client_procs.get(c)
        return proc is not None and proc.is_alive

    def _interrupt_client(self, c: int, why: str) -> None:
        self.client_procs[c].interrupt(why)

    def _has_finished(self, c: int) -> bool:
        """Whether client ``c`` has done its whole part of the protocol."""
        machine = self.client_machines.get(c)
        return machine is not None and bool(getattr(machine, "finished", False))

    def _leave(self, c: int, stage: str) -> None:
        self.clients[c].dropped_stage = stage
        self.clients[c].left_at = self.env.now
        if not self.s.silent_dropout:
            self._notify_gone(c)

    def _notify_gone(self, c: int) -> None:
        """Tell the server that client ``c``'s connection closed."""
        self.inbox.put(("gone", c, None, self.env.now))

    # -- network ----------------------------------------------------------------------------------
    def _transfer(
        self, sender: int, to: int, message: Message, sent: Callable[[], None] | None = None
    ) -> Generator[simpy.Event, Any, Message]:
        """Carry ``message`` from ``sender`` to ``to``; returns what the receiver decodes. ``sent`` is called
        when its last bit has left (before the server's ``latency_ms``)."""
        data = b""
        if self.full:
            cached = self.encoded.get(id(message))
            if cached is None or cached[0] is not message:
                cached = self.encoded[id(message)] = (message, message.encode())
            data = cached[1]
            nbytes = len(data)
        else:
            nbytes = message.wire_size()
        client = to if sender == SERVER else sender
        if sender == SERVER:
            path = (self.s.server_down, self.links[to][1])
            self.record.server_bytes_out += nbytes
            self.clients[to].bytes_down += nbytes
        else:
            path = (self.links[sender][0], self.s.server_up)
            self.record.server_bytes_in += nbytes
            self.clients[sender].bytes_up += nbytes
        flow = self.s.network.transfer(nbytes, path)
        self.flows[id(flow)] = flow
        meters = (self.link_meters[client], self.server_link)
        for meter in meters:
            meter.start()
        host, jobs = self.s.host, []
        if host is not None:  # the testbed's sockets: framing and copying at both ends, while it flows
            jobs = [host.start(self.s.costs.seconds(op, {"bytes": nbytes})) for op in TRANSPORT_OPS]
        try:
            yield flow.done
            for job in jobs:
                yield job.done
        except simpy.Interrupt:
            self.s.network.cancel(flow)  # the sender or receiver left: the link is free again
            for job in jobs:
                assert host is not None
                host.cancel(job)
            raise
        finally:
            for meter in meters:
                meter.stop()
            self.flows.pop(id(flow), None)
        if sent is not None:
            sent()
        if self.s.latency_s > 0:
            yield self.env.timeout(self.s.latency_s)  # sent, the link free, the message not there yet
        return wire.decode(data) if self.full else message

    def _deliver(
        self, sender: int, to: int, message: Message, chunk: int = 0, sent: Callable[[], None] | None = None
    ) -> Generator[simpy.Event, Any, None]:
        try:
            start = self.env.now
            received = yield from self._transfer(sender, to, message, sent)
            if sender == SERVER:
                self._client_box(to, chunk).put(received)
            else:
                rec = self.clients[sender]
                rec.upload_s += self.env.now - start
                rec.last_upload_end = self.env.now
                self._server_box(chunk).put(("msg", sender, received, self.env.now))
        except simpy.Interrupt:
            return

    def _client_box(self, c: int, chunk: int) -> simpy.Store:
        """Where client ``c``'s messages of instance ``chunk`` arrive."""
        return self.client_inbox[c]

    def _server_box(self, chunk: int) -> simpy.Store:
        """Where the server's messages of instance ``chunk`` arrive."""
        return self.inbox


def revealed(server: ServerMachine) -> int | None:
    """Survivors whose sum the server unmasked, even if the round then aborted (XNoise's noise removal);
    None if nothing was revealed."""
    if server.aggregate is not None:
        return len(server.aggregate.survivors)
    exposed = getattr(server, "exposed", None)
    return int(exposed) if exposed is not None else None


def client_cpu_share(records: list[ClientRecord], length: float) -> float:
    """Mean fraction of a round of ``length`` seconds the clients' CPUs were busy (training and protocol
    compute); NaN without clients."""
    cpu = [(r.compute_s + _finite(r.train_end - r.train_start)) / length for r in records]
    return sum(cpu) / len(cpu) if cpu else math.nan


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _frame_size(message: Message) -> dict[str, float]:
    """Cost features of encoding or decoding ``message``: frame bytes and bit-packed values."""
    return {"bytes": message.wire_size(), "packed": message.packed_elements()}
