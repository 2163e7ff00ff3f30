"""An in-memory driver for the protocol machines: no virtual time, no network, every frame really encoded.

The third driver of the sans-IO machines, beside the SimPy engine and the socket mode: the reference for
tests and benchmarks (in the manner of h11's tests, which drive a pair of connections through an
in-memory link). It delivers each step's messages in ascending client order,
encoding every message to bytes and decoding it on the other side, lets clients leave before a chosen
step, and records per party the wall-clock seconds spent inside machine calls, the work they reported
and the bytes sent. The clients' calls of a step may run on several threads (``workers``), with the same
results as in turn.

:class:`LoopbackDriver` is the same in-memory delivery as a :class:`sim.round.driver.Driver`: it plays a
round plan of a run (training, planned dropouts, pipelined rounds) and takes each decision through the
round layer, as the simulator and the deployment do, with no clock (``tests/test_driver_conformance.py``
holds its decisions to the simulator's). :func:`run_loopback` drives machines a test builds itself (a
misbehaving server, a tampered message).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import (
    Aggregate,
    ClientMachine,
    Reaction,
    RemoteProtocolError,
    RoundAbortedError,
    RoundSetupError,
    ServerMachine,
    Work,
)
from sim.protocol.params import AFTER_SAMPLING
from sim.protocol.registry import spec_of
from sim.protocol.wire import Blank, Message, Vector
from sim.round.closing import close_record, expose, step_spans
from sim.round.collector import ACCEPT, GONE, MESSAGE, UNASKED, Roster, StepCollector
from sim.round.departure import STAYS, Departure
from sim.round.pipelining import PipelineRules
from sim.round.plan import RoundPlan
from sim.round.records import ClientRecord, RoundRecord

if TYPE_CHECKING:
    from sim.world import World

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class LoopbackResult:
    server: ServerMachine
    aborted: dict[int, RemoteProtocolError] = field(default_factory=dict)
    """Clients whose machine refused a server message, with the error."""
    left: set[int] = field(default_factory=set)
    client_seconds: dict[int, float] = field(default_factory=dict)
    server_rejected: dict[int, str] = field(default_factory=dict)
    """Clients whose message the server refused (as the engine does: the client is then ignored), with why."""
    server_seconds: float = 0.0
    bytes_up: dict[int, int] = field(default_factory=dict)
    bytes_down: dict[int, int] = field(default_factory=dict)
    client_work: dict[int, list[Work]] = field(default_factory=dict)
    """The work each client's machine reported (for comparing the cost model with the clock)."""
    server_work: list[Work] = field(default_factory=list)
    round_error: RoundAbortedError | None = None
    """The error with which the server machine aborted the round while closing a step, if it did."""
    server_liars: dict[int, str] = field(default_factory=dict)
    """Clients whose shares the server outvoted while closing a step (``Reaction.liars``), with why."""


def run_loopback(
    server: ServerMachine,
    clients: Mapping[int, ClientMachine],
    updates: Mapping[int, Vector],
    leave_before: Mapping[int, str] | None = None,
    tamper: Callable[[int, Message], Message] | None = None,
    encode: bool = True,
    observe: Callable[[int, Message], None] | None = None,
    workers: int | ClientSteps = 1,
) -> LoopbackResult:
    """Run one round to its end. ``leave_before[c]`` is the step before which client c leaves;
    ``tamper(to, message)`` may replace any server-to-client message (to test a misbehaving server);
    ``observe(sender, message)`` sees every client-to-server message.

    ``workers`` > 1 runs the clients' calls of each step (their machine calls, and encoding and decoding
    their frames) on that many threads (:class:`ClientSteps`; or pass one, whose threads then outlive the
    round): the machines are independent within a step, and the results are taken in ascending client
    order, so the frames, the aggregate and every record but the clocks are the same as with one worker.
    That needs each client machine to have its own random sources (numpy Generator, ``RandomSource``), as
    the round factories give them. ``observe`` then sees a step's messages once every client has made
    them. Most of the work is numpy passes and AES-CTR, which release the interpreter's lock; what that
    gains on a host is measured in docs/performance.md (section 2)."""
    leave = dict(leave_before or {})
    result = LoopbackResult(server, client_seconds=dict.fromkeys(clients, 0.0))
    result.bytes_up = dict.fromkeys(clients, 0)
    result.bytes_down = dict.fromkeys(clients, 0)
    result.client_work = {c: [] for c in clients}
    to_server: list[tuple[int, Message]] = []
    to_clients: list[tuple[int, Message]] = []

    def carry(message: Message) -> tuple[Message, int]:
        if not encode:
            return message, message.wire_size()
        data = message.encode()
        return wire.decode(data), len(data)

    steps = workers if isinstance(workers, ClientSteps) else ClientSteps(workers)
    serial = steps.executor is None

    def client_turn(c: int, calls: list[tuple[Message | None, Callable[[], Reaction]]]) -> _Turn:
        """Client ``c``'s calls of one step, in order (``message`` None: its start), on any thread: touches
        nothing shared; ``take`` records what it returns (``observe`` sees its messages then). In turn, each
        call is taken at once, as a driver without threads does."""
        turn = _Turn(c)
        for message, call in calls:
            if message is not None and leave.get(c) and clients[c].stage_of(message) == leave[c]:
                turn.left = True
                return turn
            start = time.perf_counter()
            try:
                reaction = call()
            except RemoteProtocolError as exc:
                turn.aborted = exc
                return turn
            finally:
                turn.seconds += time.perf_counter() - start
            turn.work.extend(reaction.work)
            turn.sent.extend(carry(send.message) for send in reaction.sends)
            if serial:
                take(turn)
                turn = _Turn(c)
        return turn

    def take(turn: _Turn) -> None:
        c = turn.client
        result.client_seconds[c] += turn.seconds
        result.client_work[c].extend(turn.work)
        for message, n in turn.sent:
            result.bytes_up[c] += n
            if observe is not None:
                observe(c, message)
            to_server.append((c, message))
        if turn.aborted is not None:
            result.aborted[c] = turn.aborted
        if turn.left:
            result.left.add(c)

    def server_call(call: Callable[[], Reaction]) -> None:
        start = time.perf_counter()
        reaction = call()
        result.server_seconds += time.perf_counter() - start
        result.server_work.extend(reaction.work)
        result.server_liars.update(reaction.liars)
        for send in reaction.sends:
            message = tamper(send.to, send.message) if tamper is not None else send.message
            delivered, n = carry(message)
            result.bytes_down[send.to] += n
            to_clients.append((send.to, delivered))

    def active(c: int) -> bool:
        return c not in result.left and c not in result.aborted

    with steps if steps is not workers else contextlib.nullcontext():
        server_call(server.begin)
        starting: dict[int, list[tuple[Message | None, Callable[[], Reaction]]]] = {}
        for c in sorted(clients):
            machine = clients[c]
            if leave.get(c) == machine.first_step:
                result.left.add(c)
                continue
            starting[c] = [(None, partial(machine.start, updates[c], 1.0))]
        steps.run(client_turn, starting, take)
        while server.step not in ("done", "aborted"):
            for sender, message in sorted(to_server, key=lambda item: item[0]):
                if active(sender) and sender not in result.server_rejected and server.awaits(sender):
                    try:
                        server_call(partial(server.receive, sender, message))
                    except RemoteProtocolError as exc:
                        result.server_rejected[sender] = exc.reason
            to_server.clear()
            try:
                server_call(server.close_step)
            except RoundAbortedError as exc:  # the machine is aborted already: the loop ends
                result.round_error = exc
            receiving: dict[int, list[tuple[Message | None, Callable[[], Reaction]]]] = {}
            for c, message in sorted(to_clients, key=lambda item: item[0]):
                if active(c):
                    receiving.setdefault(c, []).append((message, partial(clients[c].receive, message)))
            to_clients.clear()
            steps.run(client_turn, receiving, take)
    return result


@dataclass
class _Turn:
    """What one client did in one step of :func:`run_loopback`."""

    client: int
    seconds: float = 0.0
    work: list[Work] = field(default_factory=list)
    sent: list[tuple[Message, int]] = field(default_factory=list)
    """Its messages as the server decodes them, with their frames' sizes."""
    aborted: RemoteProtocolError | None = None
    left: bool = False


class ClientSteps:
    """The clients' turns of one step, on ``workers`` threads (1: in this thread, in turn); results in
    ascending client order whatever order they finish in. A context manager: the threads end with it."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="dropsim-client") if workers > 1 else None

    def run(self, turn: Callable[[int, _T], _R], inputs: Mapping[int, _T], take: Callable[[_R], None]) -> None:
        """``take(turn(c, inputs[c]))`` for every client c in ascending order of c. In turn, each ``take``
        follows its own turn (as a driver without threads does); on threads, the turns run at once and are
        taken once all have ended. An exception raised by a turn is raised here (on threads, the first
        client's, after every turn has ended and none is taken)."""
        order = sorted(inputs)
        if self.executor is None or len(order) <= 1:
            for c in order:
                take(turn(c, inputs[c]))
            return
        futures = [self.executor.submit(turn, c, inputs[c]) for c in order]
        wait(futures)
        for result in [future.result() for future in futures]:
            take(result)

    def __enter__(self) -> ClientSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


class LoopbackDriver:
    """The in-memory driver as a :class:`sim.round.driver.Driver`: it plays a round plan with no clock and no
    network, every frame really encoded in ``full`` fidelity (sized in ``learning`` and ``timing``).

    It builds the round's machines (:class:`~sim.protocol.instances.RoundInstances`), trains each client
    with the run's learner, and takes every decision as the other drivers do: a planned dropout leaves
    where its :class:`~sim.round.departure.Departure` says, and the server learns it at once unless
    ``dropout.silent``; each server event goes through a :class:`~sim.round.collector.StepCollector` over
    one :class:`~sim.round.collector.Roster`; in a pipelined round (:class:`~sim.round.pipelining.PipelineRules`)
    a client starts its chunks one after another, each once the one before is uploaded, and one that leaves
    leaves every chunk at once (after its uploads, where its departure waits for them). A step
    whose awaited clients will never answer (they left silently) closes as at its deadline
    (``timeout:<step>``). Every time in its records is 0: it decides, it does not time. Trace replay needs a
    clock, and is refused."""

    name = "loopback"

    def __init__(self, world: World) -> None:
        if world.availability is not None:
            raise ValueError("the in-memory driver has no clock: trace replay needs the simulator or a deployment")
        self.world = world

    @property
    def now(self) -> float:
        return 0.0

    def wait_until(self, t: float) -> None:
        return None

    def manifest_entries(self) -> dict[str, object]:
        return {}

    def close(self) -> None:
        return None

    def play(self, plan: RoundPlan) -> RoundRecord:
        return _LoopbackRound(self.world, plan).play()


class _LoopbackRound:
    """One round of :class:`LoopbackDriver`: the server's instances and the clients take turns until the
    round ends, each acting on whatever has reached it (a fixpoint: no clock orders them)."""

    def __init__(self, world: World, plan: RoundPlan) -> None:
        sc = world.scenario
        self.world, self.plan = world, plan
        self.spec = spec_of(sc.aggregation)
        self.sampled = tuple(int(c) for c in plan.sampled)
        self.silent = sc.dropout.silent
        self.full = sc.fidelity == "full"
        pop = world.population
        ids = np.asarray(self.sampled, dtype=np.int64)
        slowdowns, mbps = pop.slowdown[ids].tolist(), pop.bandwidth_mbps[ids].tolist()
        self.records = {
            c: ClientRecord(client=c, slowdown=s, bandwidth_mbps=b, samples=int(world.data.num_samples(c)))
            for c, s, b in zip(self.sampled, slowdowns, mbps, strict=True)
        }
        self.roster = Roster(self.records)
        self.departures = {c: Departure.plan(self.spec, sc.aggregation, stage) for c, stage in plan.drops.items()}
        self.record = RoundRecord(
            round=plan.number, t_start=0.0, t_end=0.0, sampled=len(self.sampled), chunks=plan.chunks or 1
        )
        self.rules: PipelineRules | None = None
        if plan.chunks is not None:
            self.rules = PipelineRules.for_section(self.spec, plan.chunks, sc.pipeline)
        self.inboxes: list[list[tuple[str, int, Message | None]]] = []
        """Per instance: the server's arrivals ``(kind, sender, message)``, in the order they happened."""
        self.mail: dict[int, list[tuple[int, Message]]] = {}
        """Client -> the server's messages ``(instance, message)`` it has not handled yet, in order."""
        self.machines: dict[tuple[int, int], ClientMachine] = {}
        """(client, instance) -> its machine, once started."""
        self.pieces: dict[int, tuple[Vector, float]] = {}
        """Client -> its encoded update and weight (pipelined: its chunks start one after another)."""
        self.uploaded: dict[int, int] = {}
        """Client -> chunks whose input it has uploaded (pipelined)."""
        self.leaving: dict[int, str] = {}
        """Pipelined: client -> the stage it leaves at once every chunk's input is uploaded."""
        self.left: set[int] = set()
        """Clients out of the round (left, aborted)."""
        self.instances: RoundInstances | None = None

    def departure(self, c: int) -> Departure:
        return self.departures.get(c, STAYS)

    def carry(self, message: Message) -> Message:
        """``message`` as the receiver decodes it (its frame, in ``full`` fidelity)."""
        return wire.decode(message.encode()) if self.full else message

    def leave(self, c: int, stage: str, notify: bool = False) -> None:
        """Client ``c`` leaves at ``stage``; the server learns it at once unless ``dropout.silent`` (with
        ``notify``: in any case, as a client refusing the server closes its connection)."""
        if not self.records[c].dropped_stage:
            self.records[c].dropped_stage = stage
        self.left.add(c)
        self.mail.pop(c, None)
        if notify or not self.silent:
            for inbox in self.inboxes:
                inbox.append((GONE, c, None))

    def play(self) -> RoundRecord:
        world, plan, rec = self.world, self.plan, self.record
        sc = world.scenario
        if plan.refused:
            rec.outcome = f"aborted: {plan.refused}"
            rec.clients = [self.records[c] for c in self.sampled]
            return rec
        try:
            self.instances = instances = RoundInstances(
                sc.aggregation, sc.seed, plan.number, self.sampled, world.dim, plan.private, plan.chunks, sc.fidelity
            )
        except RoundSetupError as exc:
            rec.outcome = f"aborted: {exc}"
            rec.clients = [self.records[c] for c in self.sampled]
            return rec
        servers = instances.servers
        self.inboxes = [[] for _ in servers]
        for j, server in enumerate(servers):
            self._send(j, server.begin())
        self._train()
        collectors: dict[int, StepCollector] = {}
        steps: list[tuple[str, float, float]] = []
        while any(server.step not in ("done", "aborted") for server in servers):
            moved = self._deliver()
            for j, server in enumerate(servers):
                if server.step in ("done", "aborted"):
                    continue
                collector = collectors.get(j)
                if collector is None:
                    collector = collectors[j] = StepCollector(server, self.roster, None, 0.0, False, j)
                moved = self._collect(server, j, collector) or moved
                if not collector.waiting():
                    self._close(server, j, collectors.pop(j), steps)
                    moved = True
            if (
                not moved
            ):  # nothing more can reach anyone: the first step's awaited clients are late, as at its deadline
                j = min(collectors)
                collectors[j].expire()
                self._close(servers[j], j, collectors.pop(j), steps)
        rec.steps = step_spans(steps)
        aggregate = self._conclude(instances)
        rec.aggregate = aggregate
        expose(rec, servers, self.rules is not None)
        close_record(rec, self.roster, self.sampled, set(aggregate.survivors) if aggregate else set(), len(plan.drops))
        return rec

    def _close(
        self, server: ServerMachine, j: int, collector: StepCollector, steps: list[tuple[str, float, float]]
    ) -> None:
        """Close instance ``j``'s step and send what it says."""
        try:
            reaction = server.close_step()
        except RoundAbortedError as exc:
            self.roster.blame(exc)
            reaction = Reaction()
        self._send(j, reaction)
        steps.append((collector.step, 0.0, 0.0))

    def _train(self) -> None:
        """Each client trains, then starts its machine (pipelined: its first chunk's, once its update is
        encoded) unless it leaves first."""
        learner, dim, instances = self.world.learner, self.world.dim, self.instances
        assert instances is not None
        for c in self.sampled:
            departure = self.departure(c)
            if departure.before_download:
                self.leave(c, AFTER_SAMPLING)
                continue
            update: Vector
            if learner is not None:
                update, weight = learner.local_update(c, self.plan.number)
            else:
                update, weight = Blank(dim, np.dtype("<f4")), float(self.records[c].samples)
            if self.rules is None:
                machine = instances.client(c)
                if departure.before(machine.first_step):
                    self.leave(c, departure.stage)
                    continue
                self.machines[(c, 0)] = machine
                self._react(c, 0, partial(machine.start, update, weight))
                continue
            if self.rules.leaves_before_encoding(departure):
                self.leave(c, departure.stage)
                continue
            self.pieces[c] = (instances.encode(c, update), weight)
            self.uploaded[c] = 0
            self._start_chunk(c, 0)

    def _start_chunk(self, c: int, j: int) -> None:
        """Client ``c`` starts its instance of chunk ``j``: its CPU takes the chunks' first stage (Dordis
        Table 1) one after another, each once the one before is uploaded."""
        instances = self.instances
        assert instances is not None
        if j >= len(instances.slots) or c in self.left:
            return
        encoded, weight = self.pieces[c]
        slot = instances.slots[j]
        piece = encoded if isinstance(encoded, Blank) else encoded[slot.start : slot.stop]
        machine = self.machines[(c, j)] = instances.client(c, j)
        self._react(c, j, partial(machine.start, piece, weight))

    def _react(self, c: int, j: int, call: Callable[[], Reaction]) -> None:
        """Client ``c``'s call of its machine of instance ``j``; its replies go to that instance's inbox. A
        machine that refuses the server aborts the client, which leaves (the server sees it close)."""
        try:
            reaction = call()
        except RemoteProtocolError as exc:
            self.leave(c, f"aborted: {exc.reason}", notify=True)
            return
        uploads = 0
        for send in reaction.sends:
            self.inboxes[j].append((MESSAGE, c, self.carry(send.message)))
            uploads += self.rules is not None and self.rules.is_upload(send.message)
        if uploads:
            self.uploaded[c] += 1
            if c in self.leaving and self.uploaded[c] == self._chunks():
                self.leave(c, self.leaving.pop(c))
                return
            self._start_chunk(c, j + 1)

    def _chunks(self) -> int:
        assert self.instances is not None
        return len(self.instances.slots)

    def _send(self, j: int, reaction: Reaction) -> None:
        """The server's messages of instance ``j``'s ``reaction``, to their clients."""
        for send in reaction.sends:
            if send.to not in self.left:
                self.mail.setdefault(send.to, []).append((j, self.carry(send.message)))

    def _deliver(self) -> bool:
        """Each client, in ascending order, handles the server's messages to its started instances, in
        order; returns whether anyone handled one."""
        moved = False
        for c in sorted(self.mail):
            pending, kept = self.mail.get(c, []), list[tuple[int, Message]]()
            self.mail[c] = kept
            for j, message in pending:
                machine = self.machines.get((c, j))
                if c in self.left:
                    break
                if machine is None:
                    kept.append((j, message))  # its instance has not started
                    continue
                departure = self.departure(c)
                if departure.before(machine.stage_of(message)):
                    if departure.waits_for_uploads and self.uploaded.get(c, 0) < self._chunks():
                        self.leaving[c] = departure.stage  # every chunk's input goes out first: it waits
                        kept.append((j, message))
                        continue
                    self.leave(c, departure.stage)
                    moved = True
                    break
                moved = True
                self._react(c, j, partial(machine.receive, message))
            if not self.mail.get(c):
                self.mail.pop(c, None)
        return moved

    def _collect(self, server: ServerMachine, j: int, collector: StepCollector) -> bool:
        """What has reached instance ``j``'s server, in order, while its step awaits someone; returns whether
        it took anything from its inbox."""
        inbox = self.inboxes[j]
        moved = False
        while inbox and collector.waiting():
            moved = True
            kind, sender, message = inbox.pop(0)
            decision = collector.arrival(kind, sender, 0.0)
            if decision is UNASKED:
                assert message is not None
                self.roster.reject(sender, collector.unasked(type(message).__name__))
            if decision is not ACCEPT:
                continue
            assert message is not None
            try:
                reaction = server.receive(sender, message)
            except RemoteProtocolError as exc:
                self.roster.reject(sender, exc.reason)
                continue
            collector.took(sender)
            self._send(j, reaction)
        return moved

    def _conclude(self, instances: RoundInstances) -> Aggregate | None:
        """The round's aggregate and outcome: the one instance's, or every chunk's combined."""
        rec, servers = self.record, instances.servers
        if self.rules is None:
            rec.outcome = servers[0].outcome
            return servers[0].aggregate
        for j, server in enumerate(servers):
            failure = self.rules.failure(j, server)
            if failure is not None:
                rec.outcome = f"aborted: {failure}"
                return None
        rec.outcome = "ok"
        return instances.combine([server.aggregate for server in servers if server.aggregate is not None])
