"""A pipelined round: the update cut into m chunks, one protocol instance per chunk (Dordis section 4).

Each sampled client downloads the model, trains, and encodes its whole update once (clipping and the
DSkellam rotation need all of it: ``encode`` in the stages table). The encoding is cut into m contiguous
chunks (:func:`sim.protocol.registry.chunk_slots`) and each chunk is aggregated by its own SecAgg/SecAgg+
instance, with its own keys, masks and noise seeds, so a chunk's dropouts, unmasking and noise removal
concern that chunk alone. The stages of Dordis Table 1 map onto the instance's real steps:

1. c-comp (client CPU): the instance's key exchange, its noise and its masked input (held from the
   client's first operation of the chunk until its masked input is computed);
2. comm (client link): the upload of the masked input;
3. s-comp (server CPU): from the end of the chunk's masked-input collection to its unmasked, de-noised sum
   (consistency check, unmasking and noise removal included);
4. comm (client link): the server sends the chunk's sum to the chunk's survivors (``pipeline.dispatch``);
5. c-comp (client CPU): each survivor decodes it.

Each of those resources is a :class:`~sim.engine.gates.StageGate`, so it runs one chunk's stage at a time
in the order of Hyades appendix F; a client's CPU is a :class:`~sim.engine.gates.Processor`, one operation
at a time, serving the small work that answers other parties outside its gated stages first; the server's
does that work (key routing, summing arriving inputs) on a second lane beside its chunk aggregation. The server
link is shared by concurrent transfers as in any round. A client's compute stages of a pipeline m deep
take ``costs.interference_s * (m - 1)`` more reference seconds (Dordis eq. 3's beta_2 m: CPU spent on
the other chunks' network IO), scaled by its slow-down. On a testbed (:mod:`sim.engine.host`) each of
those operations, and each operation of either server lane, is a job on the host's shared cores.

The round ends when the server has decoded the concatenated sums (``update``) and every survivor has
decoded every chunk sent to it. If any chunk's instance aborts, the round aborts. Without noise the
concatenated aggregate is identical for every m; with distributed DP each chunk's noise comes from its
own seeds (a seed revealed to remove one chunk's excess noise must not unlock another's), so it differs
in its noise only.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy

from sim.engine.gates import SIDE, STAGED, Processor, StageGate
from sim.engine.round import ClientRecord, Round, RoundSetup, _frame_size, revealed
from sim.protocol.machine import (
    SERVER,
    Aggregate,
    ClientMachine,
    Reaction,
    RemoteProtocolError,
    ServerMachine,
    Work,
)
from sim.protocol.messages import AggregateChunk, MaskedInput
from sim.protocol.private import PrivateRound
from sim.protocol.registry import (
    ChunkSlot,
    ClientFactory,
)
from sim.protocol.wire import Blank, Message, ModVector, Vector

STAGE_NAMES = {1: "chunk.mask", 2: "chunk.upload", 3: "chunk.aggregate", 4: "chunk.dispatch", 5: "chunk.decode"}
"""Names of Dordis Table 1's stages in the stages table."""
STAGE_RESOURCES = {1: "client.cpu", 2: "client.link", 3: "server.cpu", 4: "client.link", 5: "client.cpu"}


class PipelinedRound(Round):
    """The processes of one pipelined round; :meth:`run` returns its :class:`~sim.engine.round.RoundRecord`."""

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
        assert setup.pipeline is not None
        self.m = setup.pipeline.chunks
        self.dispatch = setup.pipeline.dispatch
        self.servers: list[ServerMachine] = []
        self.factories: list[ClientFactory] = []
        self.slots: tuple[ChunkSlot, ...] = ()
        super().__init__(setup, number, sampled, drops, private, setup_error, offline)
        env, m = self.env, self.m
        self.record.chunks = m
        self.cpu = {c: Processor(env) for c in self.sampled}
        self.server_cpu = Processor(env, lanes=2)
        self.duplex = setup.pipeline.duplex
        cpu_stages = (1, 5) if self.dispatch else (1,)
        link_stages = (2,) if self.duplex or not self.dispatch else (2, 4)
        self.cpu_gate = {c: StageGate(env, f"client{c}.cpu", cpu_stages, m) for c in self.sampled}
        self.link_gate = {c: StageGate(env, f"client{c}.link", link_stages, m) for c in self.sampled}
        self.down_gate = (
            {c: StageGate(env, f"client{c}.downlink", (4,), m) for c in self.sampled} if self.duplex else self.link_gate
        )
        """Gate of the dispatch (stage 4): the client's link, or its downlink when ``pipeline.links`` is duplex."""
        self.server_gate = StageGate(env, "server.cpu", (3,), m)
        self.server_inbox = [simpy.Store(env) for _ in range(m)]
        self.chunk_inbox = {(c, j): simpy.Store(env) for c in self.sampled for j in range(m)}
        self.chunk_machines: dict[tuple[int, int], ClientMachine] = {}
        self.chunk_procs: dict[int, dict[int, simpy.Process]] = {c: {} for c in self.sampled}
        self.decoded: dict[tuple[int, int], simpy.Event] = {}
        """(client, chunk) -> fires when the client has decoded the chunk's sum or left the round."""
        self.results: dict[int, Aggregate] = {}
        self.failed = env.event()
        self.left: set[int] = set()
        """Clients out of the round (left, went offline, aborted); one that only missed a chunk's deadline
        is not."""
        self.excluded: set[tuple[int, int]] = set()
        """(client, chunk) pairs whose chunk went on without the client."""
        self.encode_spans: list[tuple[float, float]] = []
        self.update_span: tuple[float, float] | None = None
        self.chunk_steps: list[tuple[str, float, float]] = []
        self.after_upload = setup.aggregation.after_upload()
        """Steps before which a planned dropout has uploaded every chunk's masked input (a pipelined client
        reaches the first chunk's unmasking while later chunks may still be uploading)."""
        self.unsent = {c: set(range(m)) for c in self.sampled}
        """Client -> chunks whose masked input has not reached the server yet (nor been given up)."""
        self.all_sent = {c: env.event() for c in self.sampled}
        """Client -> fires when ``unsent[c]`` is empty."""

    def _machines(self) -> tuple[ServerMachine, ClientFactory]:
        self.instances = inst = self._instances(self.m)
        self.signing = inst.signing
        self.slots, self.servers, self.factories = inst.slots, inst.servers, inst.factories
        return self.servers[0], self.factories[0]

    # -- server -----------------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, Any]:
        env, rec = self.env, self.record
        if self.machine is None:
            rec.t_end, rec.outcome = env.now, f"aborted: {self.setup_error}"
            rec.clients = [self.clients[c] for c in self.sampled]
            return rec
        yield from self._server_compute([Work("wire.encode", _frame_size(self._model_message()))])
        for c in self.sampled:
            self.client_procs[c] = proc = env.process(self._client(c))
            self.procs.append(proc)
        for c, at in self.offline.items():
            self.procs.append(env.process(self._offline_watch(c, at)))
        servers = [env.process(self._serve_chunk(j)) for j in range(self.m)]
        self.procs.extend(servers)
        yield env.any_of([env.all_of(servers), self.failed])
        aggregate: Aggregate | None = None
        if self.failed.triggered:
            rec.outcome = f"aborted: {self.failed.value}"
        else:
            rec.aggregate_start = env.now
            update = env.process(self._update())
            self.procs.append(update)
            yield env.all_of([update, *self.decoded.values()])
            aggregate = update.value
            rec.outcome = "ok"
        self._stop_clients()
        rec.t_end = env.now
        rec.aggregate = aggregate
        rec.exposures = [e for e in (revealed(server) for server in self.servers) if e is not None]
        rec.exposed = min(rec.exposures) if rec.exposures else None
        rec.steps = step_spans(self.chunk_steps)
        rec.spans = self._stage_spans()
        self._close_record(set(aggregate.survivors) if aggregate is not None else set())
        return rec

    def _serve_chunk(self, j: int) -> Generator[simpy.Event, Any, None]:
        """The server's side of chunk ``j``'s instance, then its dispatch."""
        env, machine = self.env, self.servers[j]
        try:
            priority = SIDE
            yield from self._server_react(machine.begin(), priority, machine)
            start = env.now
            first = True
            while machine.step not in ("done", "aborted"):
                step = machine.step
                # A later chunk's first step opens when its clients get to it, one chunk after another.
                lazy = first and j > 0
                yield from self._collect(machine, step, self.server_inbox[j], self.late, priority, lazy)
                first = False
                if step == "masked_input":
                    yield self.server_gate.admit(3, j)
                    priority = STAGED
                yield from self._server_react(self._close_step(machine), priority, machine)
                self.chunk_steps.append((step, start, env.now))
                start = env.now
            if machine.step == "aborted" or machine.aggregate is None:
                self.server_gate.abandon(j)
                if not self.failed.triggered:
                    self.failed.succeed(f"chunk {j}: {machine.outcome.removeprefix('aborted: ')}")
                return
            aggregate = self.results[j] = machine.aggregate
            survivors = set(aggregate.survivors)
            for c in self.sampled:
                if c not in survivors:
                    self._drop_chunk(c, j)
            if not self.dispatch:
                self.server_gate.release(3, j)
                return
            bits = self.s.aggregation.bits if self.private is None else self.private.bits
            message = AggregateChunk(self.number, j, ModVector(bits, aggregate.vector))
            yield from self._server_compute([Work("wire.encode", _frame_size(message))], STAGED)
            self.server_gate.release(3, j)
            for c in aggregate.survivors:
                if c not in self.left:
                    self.decoded[(c, j)] = env.event()
                    proc = env.process(self._dispatch(c, j, message))
                    self.procs.append(proc)
                    self.transfers.setdefault(c, []).append(proc)
        except simpy.Interrupt:
            return

    def _dispatch(self, c: int, j: int, message: AggregateChunk) -> Generator[simpy.Event, Any, None]:
        """Stage 4: chunk ``j``'s sum to client ``c``, over its link once the link may take it."""
        gate = self.down_gate[c]
        try:
            yield gate.admit(4, j)
            received = yield from self._transfer(SERVER, c, message, lambda: gate.release(4, j))
            self.chunk_inbox[(c, j)].put(received)
        except simpy.Interrupt:
            return

    def _update(self) -> Generator[simpy.Event, Any, Aggregate]:
        """The server decodes the concatenated sums (each chunk's mean over its own survivors) and updates
        the model."""
        start = self.env.now
        assert self.instances is not None
        yield from self._server_compute(self.instances.combine_work(), STAGED)
        aggregate = self.instances.combine([self.results[j] for j in range(self.m)])
        self.update_span = (start, self.env.now)
        return aggregate

    def _missed(self, c: int) -> None:
        # As in an unpipelined round, a client that missed a deadline is out of the round from then on:
        # the other chunks' instances stop waiting for it (a silent leaver costs one timeout, not one per
        # chunk); the sums it is already in keep it.
        self.gone.add(c)
        self._notify_gone(c)  # wake the instances waiting for it

    def _server_busy(self) -> float:
        return self.server_cpu.meter.total()

    def _chunk_of(self, machine: ServerMachine | None) -> int:
        return self.servers.index(machine) if machine is not None and machine in self.servers else 0

    def _server_box(self, chunk: int) -> simpy.Store:
        return self.server_inbox[chunk]

    def _client_box(self, c: int, chunk: int) -> simpy.Store:
        return self.chunk_inbox[(c, chunk)]

    def _server_compute(
        self, work: list[Work] | tuple[Work, ...], priority: int = STAGED
    ) -> Generator[simpy.Event, Any, None]:
        seconds = self.s.costs.work_seconds(work) / self.s.server_speed
        self.record.server_cpu_s += seconds
        if seconds > 0:
            host = self.s.host
            if host is not None:
                seconds += self.s.call_s
            hold = None if host is None else (lambda: host.compute(seconds))
            yield from self.server_cpu.run(seconds, priority, self._charge_server, hold)

    def _charge_server(self, seconds: float) -> None:
        self.record.server_compute_s += seconds

    # -- clients ----------------------------------------------------------------------------------
    def _client(self, c: int) -> Generator[simpy.Event, Any, None]:
        env = self.env
        try:
            trained = yield from self._download_and_train(c)
            if trained is None:
                return
            update, weight = trained
            if self.leave_before.get(c) == "advertise_keys":
                self._leave(c, self.drops[c])
                return
            encoded = self._encode(c, update)
            start = env.now
            yield from self._client_compute(c, self._encode_work())
            self.encode_spans.append((start, env.now))
            for slot in self.slots:
                if (c, slot.index) in self.excluded:
                    continue  # the chunk went on without it (it missed a deadline while training)
                piece = encoded if isinstance(encoded, Blank) else encoded[slot.start : slot.stop]
                proc = env.process(self._client_chunk(c, slot, piece, weight))
                self.chunk_procs[c][slot.index] = proc
                self.procs.append(proc)
        except simpy.Interrupt:
            return

    def _encode(self, c: int, update: Vector) -> Vector:
        """The client's whole update encoded (fixed point mod 2^bits, or DSkellam before noise)."""
        assert self.instances is not None
        return self.instances.encode(c, update)

    def _encode_work(self) -> list[Work]:
        if self.private is None:
            return [Work("encode.fixed_point", {"elements": self.s.dim})]
        return [Work("encode.dskellam", {"elements": self.private.length})]

    def _interference(self) -> float:
        """Reference seconds a compute stage of one chunk loses to the other chunks in the pipeline."""
        return self.s.costs.interference_s * (self.m - 1)

    def _client_chunk(self, c: int, slot: ChunkSlot, x: Vector, weight: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s instance of chunk ``slot``: stages 1 and 2, its answers in stage 3, then stage 5."""
        j = slot.index
        assert self.instances is not None
        machine = self.chunk_machines[(c, j)] = self.instances.client(c, j)
        cpu = self.cpu_gate[c]
        leave_before = self.leave_before.get(c)
        try:
            yield cpu.admit(1, j)
            reaction = machine.start(x, weight)
            yield from self._chunk_react(c, j, reaction, STAGED, self._interference())
            inbox = self.chunk_inbox[(c, j)]
            while True:
                message = yield inbox.get()
                if isinstance(message, AggregateChunk):
                    yield from self._decode_chunk(c, j, message)
                    return
                staged = (1, j) not in cpu.done
                priority = STAGED if staged else SIDE
                yield from self._client_compute(c, [Work("wire.decode", _frame_size(message))], priority)
                if leave_before and machine.stage_of(message) == leave_before:
                    if leave_before in self.after_upload:
                        # it drops after uploading: whatever the timing, all its masked inputs go out first
                        yield self.all_sent[c]
                    if c not in self.left:
                        self._leave(c, self.drops[c])
                    return
                try:
                    reaction = machine.receive(message)
                except RemoteProtocolError as exc:
                    self._leave(c, f"aborted: {exc.reason}", notify=True)
                    return
                yield from self._chunk_react(c, j, reaction, priority)
        except simpy.Interrupt:
            return

    def _chunk_react(
        self, c: int, j: int, reaction: Reaction, priority: int, extra: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        encode = [Work("wire.encode", _frame_size(send.message)) for send in reaction.sends]
        yield from self._client_compute(c, [*reaction.work, *encode], priority, extra)
        for send in reaction.sends:
            if isinstance(send.message, MaskedInput):
                self.cpu_gate[c].release(1, j)  # stage 1 ends with the masked input computed
                proc = self.env.process(self._upload(c, j, send.message))
                self.procs.append(proc)
                self.transfers.setdefault(c, []).append(proc)
            else:
                self._spawn_delivery(c, send.to, send.message, j)

    def _upload(self, c: int, j: int, message: Message) -> Generator[simpy.Event, Any, None]:
        """Stage 2: the masked input of chunk ``j`` over client ``c``'s link once the link may take it."""
        gate = self.link_gate[c]
        try:
            yield gate.admit(2, j)
            yield from self._deliver(c, SERVER, message, j, lambda: gate.release(2, j))
        except simpy.Interrupt:
            return
        self._sent(c, j)

    def _sent(self, c: int, j: int) -> None:
        """Chunk ``j``'s masked input of client ``c`` is at the server, or will never be sent."""
        self.unsent[c].discard(j)
        if not self.unsent[c] and not self.all_sent[c].triggered:
            self.all_sent[c].succeed()

    def _decode_chunk(self, c: int, j: int, message: AggregateChunk) -> Generator[simpy.Event, Any, None]:
        """Stage 5: client ``c`` decodes chunk ``j``'s sum."""
        gate = self.cpu_gate[c]
        yield gate.admit(5, j)
        op = "decode.fixed_point" if self.private is None else "decode.dskellam"
        work = [Work("wire.decode", _frame_size(message)), Work(op, {"elements": self.slots[j].length})]
        yield from self._client_compute(c, work, STAGED, self._interference())
        gate.release(5, j)
        self._settle(c, j)

    def _client_compute(
        self, c: int, work: list[Work] | tuple[Work, ...], priority: int = STAGED, extra: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        rec, host = self.clients[c], self.s.host
        reference = self.s.costs.work_seconds(work) + extra
        rec.cpu_s += reference
        if reference > 0 and host is not None:
            reference += self.s.call_s
        seconds = reference * rec.slowdown
        if seconds > 0:
            hold = None if host is None else (lambda: host.compute(reference, rec.slowdown))
            yield from self.cpu[c].run(seconds, priority, lambda worked: self._charge_client(rec, worked), hold)

    @staticmethod
    def _charge_client(rec: ClientRecord, seconds: float) -> None:
        rec.compute_s += seconds

    # -- leaving ----------------------------------------------------------------------------------
    def _drop_chunk(self, c: int, j: int) -> None:
        """Client ``c`` is not in chunk ``j``'s sum (late, rejected): its instance of that chunk ends (or,
        if it has not started, never starts)."""
        self.excluded.add((c, j))
        self._sent(c, j)
        proc = self.chunk_procs[c].get(j)
        if proc is not None and proc.is_alive and proc is not self.env.active_process:
            proc.interrupt("not in this chunk's sum")
        for gate in (self.cpu_gate[c], self.link_gate[c], self.down_gate[c]):
            gate.abandon(j)
        self._settle(c, j)

    def _settle(self, c: int, j: int) -> None:
        event = self.decoded.get((c, j))
        if event is not None and not event.triggered:
            event.succeed()

    def _leave(self, c: int, stage: str, notify: bool = False) -> None:
        """Client ``c`` leaves the round: every chunk instance of it ends and its transfers are cut."""
        self.left.add(c)
        super()._leave(c, stage)
        if notify and self.s.silent_dropout:
            self._notify_gone(c)  # a client refusing the server closes its connection, silent or not
        me = self.env.active_process
        for proc in [*self.chunk_procs[c].values(), *self.transfers.get(c, [])]:
            if proc.is_alive and proc is not me:
                proc.interrupt("left")
        for j in range(self.m):
            for gate in (self.cpu_gate[c], self.link_gate[c], self.down_gate[c]):
                gate.abandon(j)
            self._settle(c, j)

    def _notify_gone(self, c: int) -> None:
        for inbox in self.server_inbox:
            inbox.put(("gone", c, None, self.env.now))

    def _current_step(self) -> str:
        """The step of the earliest chunk still under way."""
        for server in self.servers:
            if server.step not in ("done", "aborted"):
                return server.step
        return "done"

    def _has_left(self, c: int) -> bool:
        return c in self.left

    def _client_alive(self, c: int) -> bool:
        return super()._client_alive(c) or any(p.is_alive for p in self.chunk_procs[c].values())

    def _interrupt_client(self, c: int, why: str) -> None:
        for proc in [self.client_procs[c], *self.chunk_procs[c].values()]:
            if proc.is_alive:
                proc.interrupt(why)

    def _has_finished(self, c: int) -> bool:
        machines = [self.chunk_machines.get((c, j)) for j in range(self.m)]
        protocol_done = all(m is not None and getattr(m, "finished", False) for m in machines)
        waiting = any(not e.triggered for (cc, _), e in self.decoded.items() if cc == c)
        return protocol_done and not waiting

    # -- records ----------------------------------------------------------------------------------
    def _resource(self, stage: int) -> str:
        if self.duplex and stage in (2, 4):
            return "client.uplink" if stage == 2 else "client.downlink"
        return STAGE_RESOURCES[stage]

    def _stage_spans(self) -> list[tuple[str, str, int | None, int | None, float, float, int]]:
        rows: list[tuple[str, str, int | None, int | None, float, float, int]] = []
        if self.encode_spans:
            rows.append(
                (
                    "encode",
                    "client.cpu",
                    None,
                    None,
                    min(a for a, _ in self.encode_spans),
                    max(b for _, b in self.encode_spans),
                    len(self.encode_spans),
                )
            )
        found: dict[tuple[int, int], list[tuple[float, float]]] = {}
        gates = [*self.cpu_gate.values(), *self.link_gate.values(), self.server_gate]
        if self.duplex:
            gates.extend(self.down_gate.values())
        for gate in gates:
            for stage, chunk, start, end in gate.spans:
                found.setdefault((chunk, stage), []).append((start, end))
                self.record.held.setdefault((stage, chunk), []).append((start, end))
        for (chunk, stage), spans in sorted(found.items()):
            rows.append(
                (
                    STAGE_NAMES[stage],
                    self._resource(stage),
                    chunk,
                    stage,
                    min(a for a, _ in spans),
                    max(b for _, b in spans),
                    len(spans),
                )
            )
        if self.update_span is not None:
            rows.append(("update", "server.cpu", None, None, *self.update_span, 1))
        return rows


def step_spans(chunk_steps: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Each server step of a pipelined round from its first chunk's start to its last chunk's end, given
    every chunk's ``(step, start, end)``."""
    spans: dict[str, tuple[float, float]] = {}
    for step, start, end in chunk_steps:
        a, b = spans.get(step, (start, end))
        spans[step] = (min(a, start), max(b, end))
    return [(step, a, b) for step, (a, b) in spans.items()]
