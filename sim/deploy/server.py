"""The deployment's server: an asyncio TCP server driving the protocol's server machines in wall-clock time.

Workers (:mod:`sim.deploy.worker`) connect and authenticate; each round the server gives each sampled
client to an idle worker, sends it the round's start and the model, and drives the round's server
machines exactly as the simulator's engine does (:mod:`sim.engine.virtual_round`, :mod:`sim.engine.pipelined`):
a collection step ends when every client the machine still expects has answered or has gone, or when
the step's timeout passes; answers after that are discarded. Machine calls and the encoding of their
messages run on the server's processor (one thread; a pipelined round has a second lane for the work that
answers clients outside a chunk's aggregation, as the engine's server). Every byte the server sends
crosses its downlink's token bucket, every byte it reads its uplink's.

Faults are the protocol's business where the protocol defines them, and the connection's otherwise:

- a worker whose connection closes (a killed process, a planned dropout) is gone for the round, which
  goes on or aborts as the machines say;
- a frame that is oversized, unauthenticated, replayed or out of order closes that connection, with the
  reason logged; a message that does not decode, or that the machine refuses (a replayed or out-of-turn
  protocol message), puts its client out of the round (``rejected: <why>``) and is logged;
- a connection that does not complete its handshake in time is closed, and a client that stalls
  mid-round misses the step's deadline (``deploy.step_timeout_s`` where the scenario sets none).

Times are wall-clock seconds since the deployment started, in the simulator's records
(:class:`~sim.round.records.RoundRecord`), so the result tables are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sim.clients.population import MBPS
from sim.costs.model import frame_size
from sim.deploy import control
from sim.deploy.compute import STAGED, ComputeThread
from sim.deploy.connection import Connection
from sim.deploy.framing import Closed, FrameError, server_handshake
from sim.deploy.identity import Identity
from sim.deploy.loopclock import LoopClock
from sim.deploy.operations import Entry, entries, from_message
from sim.deploy.policy import POLICY_REFUSAL, PolicyError, policy_from_mapping
from sim.deploy.shaping import UNSHAPED_BPS, TokenBucket
from sim.learning.trainer import Learner
from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import (
    Aggregate,
    Reaction,
    RemoteProtocolError,
    RoundAbortedError,
    RoundSetupError,
    ServerMachine,
    Work,
)
from sim.protocol.messages import ModelDownload
from sim.protocol.private import PrivateRound
from sim.protocol.registry import spec_of
from sim.round.closing import client_cpu_share, close_record, expose, step_spans
from sim.round.collector import ACCEPT, CLOSE, GONE, MESSAGE, OUT, UNASKED, Roster, StepCollector
from sim.round.pipelining import PipelineRules
from sim.round.plan import RoundPlan
from sim.round.records import ClientRecord, RoundRecord
from sim.round.stages import AGGREGATE, DISPATCH, UPLOAD
from sim.scenario.types import Scenario
from sim.testbed import is_kernel

log = logging.getLogger("sim.deploy.server")

CLOCK_SLACK_S = 60.0
"""Seconds a worker's instants, on the server's clock, may lie after the server's now: its clock's offset is
measured through one message, which a busy link may delay (the bound refuses nonsense, not a late clock)."""
REPORT_WAIT_S = 5.0
"""How long the server waits after a round for its workers' timelines (a stalled worker sends none)."""


@dataclass
class Peer:
    """An authenticated worker connection."""

    index: int
    conn: Connection = field(init=False)
    """Set once made (its callbacks need the peer)."""
    offset: float = math.nan
    """Server monotonic clock minus the worker's (from its :class:`~sim.deploy.control.Clock`)."""
    round: int = 0
    """The round it plays in (0: idle)."""
    client: int = -1


@dataclass
class RoundState:
    """One round under way."""

    number: int
    sampled: tuple[int, ...]
    inboxes: list[asyncio.Queue[tuple[str, int, bytes | str, float]]]
    """Per instance: the server's arrivals, ``(kind, sender, payload or reason, arrived)``."""
    roster: Roster
    """Who is out of the round and why (the clients' records), shared by every instance."""
    peers: dict[int, Peer] = field(default_factory=dict)
    reports: dict[int, tuple[control.ClientReport, float]] = field(default_factory=dict)
    decoded: set[int] = field(default_factory=set)
    """Pipelined: clients that have decoded every chunk's sum."""
    leaving: dict[int, str] = field(default_factory=dict)
    """Why each client that said so left (its planned stage, or ``aborted: <why>``)."""
    machines: list[ServerMachine] = field(default_factory=list)
    """The round's server machines (one per chunk), for observers: ``machines[j].step``."""
    limits: wire.RoundLimits = field(default_factory=lambda: wire.RoundLimits(0, 0))
    """What a client's message may hold this round, per type (checked before decoding allocates)."""
    operations: dict[str, list[Entry]] = field(default_factory=dict)
    """What each party computed (``server``, and each client that said: ``operations.csv``)."""
    frames_out: list[int] = field(default_factory=list)
    """Bytes of each protocol frame the server sent."""
    frames_in: list[int] = field(default_factory=list)
    """Bytes of each protocol frame the server received."""

    @property
    def clients(self) -> Mapping[int, ClientRecord]:
        return self.roster.records

    def closed(self, c: int) -> bool:
        """Whether client ``c``'s connection closed during the round (the server saw it leave)."""
        return c in self.roster.departed


class DeployServer:
    """The server of one deployment; :meth:`play` runs a round."""

    def __init__(
        self,
        scenario: Scenario,
        learner: Learner,
        identity: Identity,
        directory: dict[int, bytes],
        config: control.Config,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int = 64 << 20,
        handshake_timeout: float = 10.0,
        step_timeout: float = 300.0,
    ) -> None:
        self.scenario = scenario
        self.learner = learner
        self.signing = identity.signing
        self.verification = directory
        """Each worker's verification key (its own; the launcher may add workers' keys as they announce them)."""
        self.config = config.encode()
        self.deployment = config.deployment
        """The deployment's id, to which every protocol signature is bound."""
        self.host, self.port = host, port
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self.step_timeout = step_timeout
        # on a kernel testbed tc shapes the server's link: no buckets here
        bps = UNSHAPED_BPS if is_kernel(scenario) else scenario.server.bandwidth_mbps * MBPS
        self.up = TokenBucket(bps)
        self.down = TokenBucket(bps)
        self.peers: dict[int, Peer] = {}
        self.current: RoundState | None = None
        self.last: RoundState | None = None
        """The round played last (for observers: its machines hold what the clients sent)."""
        self.changed = asyncio.Event()
        self.t0 = time.monotonic()
        self._server: asyncio.AbstractServer | None = None
        self.failed: dict[int, str] = {}
        """Workers that quit, with why (e.g. they could not build the scenario)."""
        self.rejected: list[str] = []
        """Every refused connection, frame or message, with why (also logged)."""
        self.policies: dict[int, dict[str, object]] = {}
        """What each worker that connected said it accepts (:class:`~sim.deploy.control.Accepts`), for the
        manifest; each worker enforces its own."""
        self.on_assign: Callable[[dict[int, int]], None] | None = None
        """Told which worker plays which client (worker index -> client) before a round starts: a kernel
        testbed sets each worker's CPU quota and link rate to its client's."""

    def now(self) -> float:
        """Seconds since the deployment started."""
        return time.monotonic() - self.t0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self, reason: str = "the deployment is over") -> None:
        for peer in list(self.peers.values()):
            if not peer.conn.closed:
                peer.conn.send(control.CONTROL, control.Shutdown(reason.encode()).encode())
        for peer in list(self.peers.values()):
            await peer.conn.drain_and_close(2.0)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _refuse(self, what: str) -> None:
        self.rejected.append(what)
        log.warning("%s", what)

    # -- connections ---------------------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        where = writer.get_extra_info("peername")
        try:
            party, session = await server_handshake(
                reader, writer, self.verification.get, self.signing, timeout=self.handshake_timeout
            )
        except (FrameError, Closed, ConnectionError) as exc:
            self._refuse(f"connection from {where} refused: {getattr(exc, 'reason', exc) or 'closed'}")
            writer.close()
            return
        peer = Peer(party)
        peer.conn = Connection(
            reader,
            writer,
            session,
            self.max_frame,
            partial(self._frame, peer),
            partial(self._closed, peer),
            self.up,
        )
        peer.conn.send_buckets = (self.down,)
        old = self.peers.get(party)
        if old is not None and not old.conn.closed:
            self._refuse(f"worker {party} connected again: its previous connection is closed")
            old.conn.close()
        self.peers[party] = peer
        peer.conn.start()
        peer.conn.send(control.CONTROL, self.config)

    def _frame(self, peer: Peer, channel: int, payload: bytes, arrived: float) -> None:
        st = self.current
        if channel == control.CONTROL:
            try:
                message = control.decode_from_worker(payload)
            except wire.WireError as exc:
                peer.conn.close(f"malformed control message: {exc}")  # logged as the connection closes
                return
            if isinstance(message, control.Clock):
                if not math.isfinite(message.now):
                    peer.conn.close(f"malformed clock: {message.now!r}")
                    return
                peer.offset = arrived - message.now
                self.changed.set()
            elif isinstance(message, control.Accepts):
                try:
                    self.policies[peer.index] = policy_from_mapping(json.loads(message.policy)).as_dict()
                except (ValueError, RecursionError, PolicyError) as exc:
                    peer.conn.close(f"malformed policy: {control.worker_text(str(exc).encode())}")
            elif isinstance(message, control.Shutdown):
                why = control.worker_text(message.reason)
                if math.isnan(peer.offset):  # before it was ready: it cannot run the scenario
                    self.failed[peer.index] = why
                    self._refuse(f"worker {peer.index} quit: {why}")
                    peer.conn.close()
                else:  # it leaves: the round goes on without it (a dropout), and so does the deployment
                    peer.conn.close(f"quit: {why}")
                self.changed.set()
            elif isinstance(message, control.Decoded):
                if st is not None and peer.round == st.number == message.round:
                    st.decoded.add(peer.client)
                    self.changed.set()
            elif isinstance(message, control.Leaving):
                if st is not None and peer.round == st.number == message.round:
                    st.leaving[peer.client] = control.worker_text(message.reason)
            elif isinstance(message, control.Operations):
                if st is not None and peer.round == st.number == message.round:
                    try:
                        bounds = (0.0, self.now() + CLOCK_SLACK_S)  # in the run, and not after now
                        st.operations[str(peer.client)] = from_message(message, peer.offset - self.t0, bounds)
                    except ValueError as exc:
                        self._refuse(f"worker {peer.index}: its operations of round {message.round}: {exc}")
            elif isinstance(message, control.ClientReport):
                if st is not None and peer.round == st.number == message.round:
                    st.reports[peer.client] = (message, peer.offset)
                    self.changed.set()
            else:
                peer.conn.close(f"unexpected control message {type(message).__name__}")
            return
        if st is None or peer.round != st.number:
            return  # a frame of a round that is over: discarded
        st.frames_in.append(len(payload))
        if channel >= len(st.inboxes):
            peer.conn.close(f"frame on channel {channel}; the round has {len(st.inboxes)}")
            return
        st.inboxes[channel].put_nowait((MESSAGE, peer.client, payload, arrived - self.t0))

    def _closed(self, peer: Peer, reason: str) -> None:
        if reason:
            who = f"worker {peer.index}" + (f" (client {peer.client})" if peer.round else "")
            self._refuse(f"{who}: {reason}; connection closed")
        st = self.current
        if st is not None and peer.round == st.number:
            for inbox in st.inboxes:
                inbox.put_nowait((GONE, peer.client, reason, self.now()))
        self.changed.set()

    def idle(self) -> list[Peer]:
        """Connected workers ready for a round (clock received), in index order."""
        return sorted(
            (p for p in self.peers.values() if not p.conn.closed and not math.isnan(p.offset) and p.round == 0),
            key=lambda p: p.index,
        )

    async def wait_for_workers(self, want: int, live: Callable[[], int], timeout: float) -> list[Peer]:
        """Up to ``want`` idle workers: waits until as many as are alive (``live()``: running, and not among
        those that said they cannot run the scenario) are ready, or ``timeout`` seconds. Raises
        :class:`WorkerFailedError` once every worker has said it cannot run the scenario (one worker alone
        cannot end the deployment)."""
        deadline = time.monotonic() + timeout
        while True:
            alive = live()
            if self.failed and alive <= 0:  # every worker has said it cannot run the scenario
                j, why = next(iter(self.failed.items()))
                raise WorkerFailedError(f"worker {j} {why}")
            ready = [p for p in self.idle() if p.index not in self.failed]
            if len(ready) >= min(want, alive) or time.monotonic() >= deadline:
                return ready[:want]
            self.changed.clear()
            # woken by a connection, or after a while to see whether a worker process ended
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(0.25, max(0.0, deadline - time.monotonic())))

    # -- a round ---------------------------------------------------------------------------------------
    async def play(
        self,
        plan: RoundPlan,
        private: PrivateRound | None,
        records: dict[int, ClientRecord],
        live: Callable[[], int],
        connect_timeout: float,
    ) -> RoundRecord:
        """Play ``plan`` (with ``private``: its privacy plan as this server holds it, the central noise seed
        its own) with the workers; ``records`` are the sampled clients' fresh records."""
        number, sampled, chunks = plan.number, plan.sampled, plan.chunks
        # the round starts once its workers are ready (a worker reconnecting after leaving the last round)
        peers = await self.wait_for_workers(len(sampled), live, connect_timeout)
        if self.on_assign is not None and not plan.refused:
            self.on_assign({peer.index: c for c, peer in zip(sampled, peers, strict=False)})
        rec = RoundRecord(round=number, t_start=self.now(), sampled=len(sampled), chunks=chunks or 1)
        sc = self.scenario
        if plan.refused:
            rec.t_end, rec.outcome = self.now(), f"aborted: {plan.refused}"
            rec.clients = [records[c] for c in sampled]
            return rec
        for c, peer in zip(sampled, peers, strict=False):
            peer.round, peer.client = number, c
        played = {peer.client: peer for peer in peers}
        roster = {c: self.verification[played[c].index] if c in played else b"" for c in sampled}
        try:
            inst = RoundInstances(
                sc.aggregation,
                sc.seed,
                number,
                sampled,
                self.learner.dim,
                private,
                chunks,
                identities=roster if sc.aggregation.malicious else None,
                context=self.deployment,
            )
        except RoundSetupError as exc:  # e.g. a Poisson round too small for a safe threshold: as the engine
            for peer in peers:
                peer.round, peer.client = 0, -1
            rec.t_end, rec.outcome = self.now(), f"aborted: {exc}"
            rec.clients = [records[c] for c in sampled]
            return rec
        m = len(inst.servers)
        st = RoundState(number, sampled, [asyncio.Queue() for _ in range(m)], Roster(records), machines=inst.servers)
        st.limits = control.round_limits(self.learner.dim, len(sampled), private)
        self.current = st
        server_cpu = ComputeThread("server")
        side = ComputeThread("server-side") if chunks is not None else server_cpu
        process_cpu = time.process_time()
        try:
            for c, peer in played.items():
                st.peers[c] = peer
            # workers whose policy refused the configuration: each would have played one client of the round
            refusals = iter(why for _, why in sorted(self.failed.items()) if why.startswith(POLICY_REFUSAL))
            for c in sampled:
                if c not in st.peers:  # no worker to play it: it never connects
                    st.roster.depart(c, "connect", self.now())
                    refused = next(refusals, None)
                    records[c].dropped_stage = "offline:connect" if refused is None else f"refused: {refused}"
            rate_cell = control.NO_RATE if plan.rate is None else plan.rate
            keys = tuple(roster[c] for c in sampled) if sc.aggregation.malicious else ()
            for c, peer in st.peers.items():
                drop = plan.drops.get(c, "").encode()
                start = control.RoundStart(number, c, sampled, drop, chunks or 0, rate_cell, keys)
                peer.conn.send(control.CONTROL, start.encode())
            download = ModelDownload(number, self.learner.params)
            model = await server_cpu.run(download.encode, work=lambda _: (Work("wire.encode", frame_size(download)),))
            for c in st.peers:
                records[c].download_start = self.now()
                self._send(st, rec, c, 0, model)
            if chunks is None:
                await self._serve_single(st, rec, inst.servers[0], server_cpu)
            else:
                await self._serve_pipelined(st, rec, inst, server_cpu, side)
        finally:
            rec.t_end = self.now()
            await self._end(st, rec)
            server_cpu.shutdown()
            side.shutdown()
        expose(rec, inst.servers, chunks is not None)
        survivors = set(rec.aggregate.survivors) if rec.aggregate is not None else set()
        lanes = (server_cpu,) if side is server_cpu else (server_cpu, side)
        rec.server_cpu_s = sum(lane.cpu_s for lane in lanes)
        calls = [call for lane in lanes for call in lane.calls]
        done = entries(calls, time.process_time() - process_cpu, st.frames_out, st.frames_in)
        st.operations["server"] = [e.shifted(-self.t0) for e in done]
        self._close_record(st, rec, survivors, len(plan.drops), sum(lane.busy_s for lane in lanes))
        return rec

    def _send(self, st: RoundState, rec: RoundRecord, c: int, channel: int, payload: bytes) -> asyncio.Future[Any]:
        """Send ``payload`` to client ``c`` on ``channel`` (nothing to one out of the round); the future is
        done once it is written."""
        peer = st.peers.get(c)
        if peer is None or peer.conn.closed or st.roster.excluded(c):
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        rec.server_bytes_out += len(payload)
        st.clients[c].bytes_down += len(payload)
        st.frames_out.append(len(payload))
        return peer.conn.send(channel, payload)

    async def _react(
        self,
        st: RoundState,
        rec: RoundRecord,
        reaction_of: Callable[[], Reaction],
        cpu: ComputeThread,
        channel: int,
        priority: int = STAGED,
        decoded: list[wire.Message] | None = None,
    ) -> None:
        """Run a machine call on ``cpu``, encode its messages there (a broadcast once), and send them.
        ``decoded``: where the call puts the message it decoded (the operations it names for calibration)."""
        charged: list[Work] = []

        def work() -> tuple[list[tuple[int, bytes]], tuple[tuple[int, str], ...]]:
            reaction = reaction_of()
            frames: dict[int, bytes] = {}
            out = []
            charged.extend(Work("wire.decode", frame_size(m)) for m in decoded or ())
            charged.extend(reaction.work)
            for send in reaction.sends:
                key = id(send.message)
                if key not in frames:
                    frames[key] = send.message.encode()
                    charged.append(Work("wire.encode", frame_size(send.message)))
                out.append((send.to, frames[key]))
            return out, reaction.liars

        sends, liars = await cpu.run(work, priority, lambda _: charged)
        for c, why in liars:  # outvoted: their shares were set aside and the round went on without them
            self._refuse(f"round {st.number}: client {c} {why}")
        for to, payload in sends:
            self._send(st, rec, to, channel, payload)

    async def _collect(
        self,
        st: RoundState,
        rec: RoundRecord,
        machine: ServerMachine,
        channel: int,
        cpu: ComputeThread,
        priority: int = STAGED,
        lazy: bool = False,
        accepted: Callable[[int], None] | None = None,
    ) -> None:
        """Feed ``machine`` the step's answers until it expects nobody, or the step's deadline passes (with
        ``lazy``: counted from the first answer, as the engine's later chunks). The decisions and labels are
        the round layer's (:class:`~sim.round.collector.StepCollector`): an answer counts if it arrived by
        the deadline, even when the busy server reads it later. ``accepted`` is told each sender whose
        message the machine took."""
        timeout = self.scenario.timeouts.get(machine.step, self.step_timeout)
        collector = StepCollector(machine, st.roster, timeout, self.now(), lazy, channel)
        inbox = st.inboxes[channel]
        while collector.waiting():
            try:
                kind, sender, payload, arrived = inbox.get_nowait()  # what has arrived counts by its arrival
            except asyncio.QueueEmpty:
                wait = self.step_timeout if collector.deadline is None else collector.deadline - self.now()
                try:
                    kind, sender, payload, arrived = await asyncio.wait_for(inbox.get(), max(0.0, wait))
                except asyncio.TimeoutError:
                    self._out(st, collector.expire())
                    return
            reason = payload if kind == GONE and isinstance(payload, str) else ""
            decision = collector.arrival(kind, sender, arrived, reason)
            if decision is CLOSE:
                self._out(st, collector.missed)
                return
            if kind == GONE:
                if math.isnan(st.clients[sender].left_at):
                    st.clients[sender].left_at = arrived
                continue
            if decision is UNASKED:
                assert isinstance(payload, bytes)
                self._reject(st, sender, collector.unasked(wire.message_name(payload)))
            if decision is not ACCEPT:
                continue
            assert isinstance(payload, bytes)
            record = st.clients[sender]
            record.bytes_up += len(payload)
            rec.server_bytes_in += len(payload)

            decoded: list[wire.Message] = []

            def receive(
                sender: int = sender, payload: bytes = payload, decoded: list[wire.Message] = decoded
            ) -> Reaction:
                decoded.append(wire.decode(payload, round=st.limits))
                return machine.receive(sender, decoded[0])

            try:
                await self._react(st, rec, receive, cpu, channel, priority, decoded)
            except wire.WireError as exc:
                self._reject(st, sender, f"malformed message: {exc}")
                continue
            except RemoteProtocolError as exc:
                self._reject(st, sender, exc.reason)
                continue
            collector.took(sender)
            if accepted is not None:
                accepted(sender)

    async def _close_step(
        self,
        st: RoundState,
        rec: RoundRecord,
        machine: ServerMachine,
        cpu: ComputeThread,
        channel: int,
        priority: int = STAGED,
    ) -> None:
        """Close the machine's step. What the clients sent may not fit together (shares that contradict each
        other): the machine has then aborted the round, which ends here with the reason logged and the
        clients found lying refused; the deployment goes on with the next round."""
        try:
            await self._react(st, rec, machine.close_step, cpu, channel, priority)
        except RoundAbortedError as exc:
            named = f" (found lying: clients {', '.join(map(str, exc.suspects))})" if exc.suspects else ""
            self._refuse(f"round {st.number}: aborted: {exc.reason}{named}")
            self._out(st, st.roster.blame(exc))

    def _reject(self, st: RoundState, c: int, reason: str) -> None:
        self._refuse(f"round {st.number}: client {c}'s message refused: {reason}")
        st.roster.reject(c, reason)
        self._out(st, [c])

    def _out(self, st: RoundState, clients: list[int]) -> None:
        """Clients put out of the round (late, refused): wake every instance waiting for them."""
        for c in clients:
            for inbox in st.inboxes:
                inbox.put_nowait((OUT, c, "", self.now()))

    async def _serve_single(self, st: RoundState, rec: RoundRecord, machine: ServerMachine, cpu: ComputeThread) -> None:
        await self._react(st, rec, machine.begin, cpu, 0)
        step_start = rec.t_start
        while machine.step not in ("done", "aborted"):
            step = machine.step
            await self._collect(st, rec, machine, 0, cpu)
            collected = self.now()
            await self._close_step(st, rec, machine, cpu, 0)
            final = machine.step in ("done", "aborted")
            rec.steps.append((step, step_start, collected if final else self.now()))
            rec.aggregate_start = collected
            step_start = self.now()
        rec.outcome = machine.outcome
        rec.aggregate = machine.aggregate

    async def _serve_pipelined(
        self, st: RoundState, rec: RoundRecord, inst: RoundInstances, cpu: ComputeThread, side: ComputeThread
    ) -> None:
        """Every chunk's instance, as the engine's :class:`~sim.engine.pipelined.ChunkedInstances`: the server's CPU
        takes one chunk's aggregation at a time (Dordis Table 1, stage 3), and each chunk's sum goes to a
        client once that client's link may take it (stage 4: with ``pipeline.links: shared`` after every
        chunk's upload of that client, on its one link; with ``duplex`` on its downlink, in chunk order)."""
        m = len(inst.servers)
        sc = self.scenario
        rules = PipelineRules.for_section(spec_of(sc.aggregation), m, sc.pipeline)
        clock = LoopClock()
        gate = rules.gate(clock, "server.cpu", "server.cpu")
        client_link = {c: rules.gate(clock, rules.dispatch_resource, f"client{c}.link") for c in st.sampled}
        """Each client's link as the server sees it: its uploads (stage 2) end as they arrive."""
        results: dict[int, Aggregate] = {}
        chunk_steps: list[tuple[str, float, float]] = []
        dispatches: list[asyncio.Task[None]] = []

        def uploaded(j: int) -> Callable[[int], None]:
            def done(c: int) -> None:
                if UPLOAD in client_link[c].stages:
                    client_link[c].release(UPLOAD, j)

            return done

        async def send_sum(c: int, j: int, payload: bytes) -> None:
            link = client_link[c]
            await link.admit(DISPATCH, j)
            try:
                await self._send(st, rec, c, j, payload)
            except Closed:
                pass  # its connection closed meanwhile: it left, and gets no more
            finally:
                link.release(DISPATCH, j)

        async def serve(j: int) -> None:
            machine = inst.servers[j]
            lane, priority = side, rules.priority(aggregating=False)
            await self._react(st, rec, machine.begin, lane, j, priority)
            start, first = self.now(), True
            while machine.step not in ("done", "aborted"):
                step = machine.step
                upload = rules.opens_aggregation(step)
                await self._collect(
                    st, rec, machine, j, lane, priority, rules.lazy(j, first), uploaded(j) if upload else None
                )
                first = False
                if upload:
                    for c in st.sampled:  # whoever did not upload this chunk will not: its link is free of it
                        uploaded(j)(c)
                    await gate.admit(AGGREGATE, j)
                    lane, priority = cpu, rules.priority(aggregating=True)
                await self._close_step(st, rec, machine, lane, j, priority)
                chunk_steps.append((step, start, self.now()))
                start = self.now()
            failure = rules.failure(j, machine)
            if failure is not None:
                gate.abandon(j)
                raise _ChunkAbortedError(failure)
            aggregate = machine.aggregate
            assert aggregate is not None
            results[j] = aggregate
            for c in rules.left_out(st.sampled, aggregate):
                client_link[c].abandon(j)
            if rules.dispatch:
                bits = sc.aggregation.bits if inst.private is None else inst.private.bits
                message = rules.sum_message(st.number, j, aggregate, bits)
                encoded: tuple[Work, ...] = (Work("wire.encode", frame_size(message)),)
                payload = await cpu.run(message.encode, work=lambda _: encoded)
                gate.release(AGGREGATE, j)
                for c in aggregate.survivors:
                    if not st.closed(c):
                        dispatches.append(asyncio.create_task(send_sum(c, j, payload)))
            else:
                gate.release(AGGREGATE, j)

        tasks = [asyncio.create_task(serve(j)) for j in range(m)]
        try:
            try:
                await asyncio.gather(*tasks)
            except _ChunkAbortedError as exc:
                rec.outcome = f"aborted: {exc}"
                return
            rec.aggregate_start = self.now()
            rec.aggregate = await cpu.run(
                lambda: inst.combine([results[j] for j in range(m)]), work=lambda _: inst.combine_work()
            )
            if rules.dispatch:  # as the engine: the round ends when every survivor still there has decoded every chunk
                await self._decoded(st, set(rec.aggregate.survivors))
            rec.outcome = "ok"
        finally:  # the round is over: no chunk goes on, no sum is still sent (as the engine stops its clients)
            rec.steps = step_spans(chunk_steps)
            for task in [*tasks, *dispatches]:
                task.cancel()
            await asyncio.gather(*tasks, *dispatches, return_exceptions=True)

    async def _decoded(self, st: RoundState, survivors: set[int]) -> None:
        """Wait (``step_timeout`` at most) until every survivor still in the round has decoded every chunk's
        sum; one out of the round (left, late, refused) gets no sums and is not waited for."""
        deadline = time.monotonic() + self.step_timeout
        while time.monotonic() < deadline:
            waiting = [c for c in survivors if c in st.peers and c not in st.decoded]
            if all(st.closed(c) or st.roster.excluded(c) or st.peers[c].conn.closed for c in waiting):
                return
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - time.monotonic()))

    async def _end(self, st: RoundState, rec: RoundRecord) -> None:
        """Tell the round's workers it is over, collect their reports, free them."""
        outcome = (rec.outcome or "aborted").encode()
        for peer in st.peers.values():
            if not peer.conn.closed:
                peer.conn.send(control.CONTROL, control.RoundEnd(st.number, outcome).encode())
        deadline = time.monotonic() + REPORT_WAIT_S
        while time.monotonic() < deadline:
            # a late or refused client's connection is closed below: its timeline is not waited for
            if all(c in st.reports or p.conn.closed or st.roster.excluded(c) for c, p in st.peers.items()):
                break
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        for c, peer in st.peers.items():
            peer.round, peer.client = 0, -1
            if st.roster.excluded(c):
                peer.conn.close()  # a stalled or misbehaving connection starts afresh
        self.current, self.last = None, st
        for c, (report, offset) in st.reports.items():
            record = st.clients[c]

            def place(t: float, offset: float = offset) -> float:
                """A time of the worker's clock on the server's."""
                return t + offset - self.t0

            # the reports' own wait counts as the round's: a write can end after the round has
            wrong = control.report_problem(report, place, rec.t_start, rec.t_end + REPORT_WAIT_S)
            if wrong:
                self._refuse(f"round {st.number}: client {c}'s report refused: {wrong}")
                continue

            record.download_end = place(report.download_end)
            record.train_start = place(report.train_start)
            record.train_end = place(report.train_end)
            record.compute_s = report.compute_s
            record.cpu_s = report.cpu_s
            record.upload_s = report.upload_s
            record.last_upload_end = place(report.last_upload_end)
            if report.left:  # a silent leaver: it stopped answering, and says so now
                st.leaving[c] = control.worker_text(report.left)
                record.left_at = place(report.left_at)

    def _close_record(self, st: RoundState, rec: RoundRecord, survivors: set[int], planned: int, busy: float) -> None:
        """The round layer's closing (:func:`~sim.round.closing.close_record`), after the labels only a
        deployment learns: what a client said of its leaving, and a connection that closed without a word
        (killed, crashed, cut: ``offline:<step>``)."""
        rec.server_compute_s = busy
        for c in st.sampled:
            record = st.clients[c]
            if c in st.leaving:  # it said why (its planned stage, or that it refused the server)
                record.dropped_stage = st.leaving[c]
            elif st.closed(c):
                st.roster.label(c, f"offline:{st.roster.departed[c][0]}")
        close_record(rec, st.roster, st.sampled, survivors, planned)
        length = rec.t_end - rec.t_start
        if length > 0:
            rec.utilisation = {
                "client_cpu": client_cpu_share(rec.clients, length),
                "server_cpu": busy / length,
            }


class WorkerFailedError(Exception):
    """The deployment cannot go on (a worker cannot run the scenario)."""


class _ChunkAbortedError(Exception):
    """A pipelined round's chunk aborted (so does the round)."""
