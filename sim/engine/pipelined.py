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

Each of those resources is a :class:`~sim.round.gates.StageGate` (stages from :mod:`sim.round.stages`), so it
runs one chunk's stage at a time in the order of Hyades appendix F; a client's CPU is a
:class:`~sim.engine.processor.Processor`, one operation at a time, serving the small work that answers other
parties outside its gated stages first; the server's does that work (key routing, summing arriving inputs) on
a second lane beside its chunk aggregation. The server link is shared by concurrent transfers as in any round.
A client's compute stages of a pipeline m deep take ``costs.interference_s * (m - 1)`` more reference seconds
(Dordis eq. 3's beta_2 m: CPU spent on the other chunks' network IO), scaled by its slow-down. On a testbed
(:mod:`sim.engine.host`) each of those operations, and each operation of either server lane, is a job on the
host's shared cores.

The round ends when the server has decoded the concatenated sums (``update``) and every survivor has
decoded every chunk sent to it. If any chunk's instance aborts, the round aborts. Without noise the
concatenated aggregate is identical for every m; with distributed DP each chunk's noise comes from its
own seeds (a seed revealed to remove one chunk's excess noise must not unlock another's), so it differs
in its noise only.

:class:`ChunkedInstances` is a component of :class:`sim.engine.virtual_round.Round` (``plan.chunks`` set): it holds the
pipelined state (gates, processors, chunk processes) and runs the server's and each client's chunked
part of the round with the round's own services (transfers, leaving, collection steps, records).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import simpy

from sim.costs.model import frame_size
from sim.engine.charges import Hold
from sim.engine.processor import Processor
from sim.protocol.machine import SERVER, Aggregate, Reaction, RemoteProtocolError, Work
from sim.protocol.messages import AggregateChunk
from sim.protocol.spec import ChunkSlot
from sim.protocol.wire import Blank, Message, Vector
from sim.round.closing import step_spans
from sim.round.collector import OUT
from sim.round.gates import STAGED
from sim.round.pipelining import PipelineRules, Section
from sim.round.records import ClientRecord, RoundRecord
from sim.round.stages import AGGREGATE, DECODE, DISPATCH, MASK, STAGES, UPLOAD

if TYPE_CHECKING:
    from sim.engine.virtual_round import Round


class ChunkedInstances:
    """The chunked part of round ``r``: its server serves every chunk, its clients run one instance each."""

    chunked = True
    """Whether the round runs an instance per chunk."""
    model_with_upload = False
    """Whether the model travels with the upload request: never in a pipelined round."""

    def __init__(self, r: Round, section: Section | None) -> None:
        self.r = r
        env, m = r.env, r.m
        self.m = m
        self.slots: tuple[ChunkSlot, ...] = r.instances.slots if r.instances is not None else ()
        self.cpu = {c: Processor(env) for c in r.sampled}
        self.server_cpu = Processor(env, lanes=2)
        self.rules = rules = PipelineRules.for_section(r.spec, m, section)
        """The decisions both drivers take from the round's pipeline (:mod:`sim.round.pipelining`)."""
        self.cpu_gate = {c: rules.gate(env, "client.cpu", f"client{c}.cpu") for c in r.sampled}
        self.link_gate = {c: rules.gate(env, rules.upload_resource, f"client{c}.link") for c in r.sampled}
        self.down_gate = (
            {c: rules.gate(env, "client.downlink", f"client{c}.downlink") for c in r.sampled}
            if rules.duplex
            else self.link_gate
        )
        """Gate of the dispatch (stage 4): the client's link, or its downlink when ``pipeline.links`` is duplex."""
        self.server_gate = rules.gate(env, "server.cpu", "server.cpu")
        self.procs: dict[int, dict[int, simpy.Process]] = {c: {} for c in r.sampled}
        """Client -> chunk -> the process of its instance of that chunk."""
        self.decoded: dict[tuple[int, int], simpy.Event] = {}
        self.summed: dict[int, int] = {}
        """Chunk sums each client has received and decoded so far."""
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
        self.unsent = {c: set(range(m)) for c in r.sampled}
        """Client -> chunks whose masked input has not reached the server yet (nor been given up)."""
        self.all_sent = {c: env.event() for c in r.sampled}
        """Client -> fires when ``unsent[c]`` is empty."""

    # -- server -----------------------------------------------------------------------------------
    def serve(self) -> Generator[simpy.Event, Any, Aggregate | None]:
        """The server's part: every chunk's instance, then the update; returns the round's aggregate."""
        r = self.r
        env, rec = r.env, r.record
        servers = [env.process(self._serve_chunk(j)) for j in range(self.m)]
        r.procs.extend(servers)
        yield env.any_of([env.all_of(servers), self.failed])
        if self.failed.triggered:
            rec.outcome = f"aborted: {self.failed.value}"
            return None
        rec.aggregate_start = env.now
        update = env.process(self._update())
        r.procs.append(update)
        yield env.all_of([update, *self.decoded.values()])
        rec.outcome = "ok"
        aggregate = update.value
        assert isinstance(aggregate, Aggregate)
        return aggregate

    def server_busy(self) -> float:
        """Seconds of the round during which the server computed (on either lane)."""
        return self.server_cpu.meter.total()

    def compute_server(self, seconds: float, priority: int, hold: Hold | None) -> Generator[simpy.Event, Any, None]:
        """The server computes ``seconds`` (``hold``: on the testbed's CPUs) on the lane of ``priority``."""
        yield from self.server_cpu.run(seconds, priority, self.r.charge_server, hold)

    def out(self, clients: list[int]) -> None:
        """Clients put out of the round (late, refused): the other chunks' instances stop waiting for them."""
        r = self.r
        for c in clients:
            for inbox in r.inboxes:
                inbox.put((OUT, c, None, r.env.now))

    def close(self, rec: RoundRecord) -> None:
        """The pipelined round's step spans and stages-table rows."""
        rec.steps = step_spans(self.chunk_steps)
        rec.spans = self._stage_spans(rec)

    def _serve_chunk(self, j: int) -> Generator[simpy.Event, Any, None]:
        """The server's side of chunk ``j``'s instance, then its dispatch."""
        r = self.r
        env, machine = r.env, r.servers[j]
        rules = self.rules
        try:
            priority = rules.priority(aggregating=False)
            yield from r.server_react(machine.begin(), priority, machine)
            start = env.now
            first = True
            while machine.step not in ("done", "aborted"):
                step = machine.step
                yield from r.collect(machine, j, priority, rules.lazy(j, first))
                first = False
                if rules.opens_aggregation(step):
                    yield self.server_gate.admit(AGGREGATE, j)
                    priority = rules.priority(aggregating=True)
                yield from r.server_react(r.close_step(machine), priority, machine)
                self.chunk_steps.append((step, start, env.now))
                start = env.now
            failure = rules.failure(j, machine)
            if failure is not None:
                self.server_gate.abandon(j)
                if not self.failed.triggered:
                    self.failed.succeed(failure)
                return
            aggregate = machine.aggregate
            assert aggregate is not None
            self.results[j] = aggregate
            for c in rules.left_out(r.sampled, aggregate):
                self._drop_chunk(c, j)
            if not rules.dispatch:
                self.server_gate.release(AGGREGATE, j)
                return
            bits = r.s.aggregation.bits if r.private is None else r.private.bits
            message = rules.sum_message(r.number, j, aggregate, bits)
            yield from r.server_compute([Work("wire.encode", frame_size(message))], STAGED)
            self.server_gate.release(AGGREGATE, j)
            for c in aggregate.survivors:
                if c not in self.left:
                    self.decoded[(c, j)] = env.event()
                    proc = env.process(self._dispatch(c, j, message))
                    r.procs.append(proc)
                    r.transfers.setdefault(c, []).append(proc)
        except simpy.Interrupt:
            return

    def _dispatch(self, c: int, j: int, message: AggregateChunk) -> Generator[simpy.Event, Any, None]:
        """Stage 4: chunk ``j``'s sum to client ``c``, over its link once the link may take it."""
        gate = self.down_gate[c]
        try:
            yield gate.admit(DISPATCH, j)
            received = yield from self.r.transfer(SERVER, c, message, lambda: gate.release(DISPATCH, j))
            self.r.client_inbox[(c, j)].put(received)
        except simpy.Interrupt:
            return

    def _update(self) -> Generator[simpy.Event, Any, Aggregate]:
        """The server decodes the concatenated sums (each chunk's mean over its own survivors) and updates
        the model."""
        r = self.r
        start = r.env.now
        assert r.instances is not None
        yield from r.server_compute(r.instances.combine_work(), STAGED)
        aggregate = r.instances.combine([self.results[j] for j in range(self.m)])
        self.update_span = (start, r.env.now)
        return aggregate

    # -- clients ----------------------------------------------------------------------------------
    def trained(self, c: int, update: Vector, weight: float) -> None:
        """Client ``c`` has trained: each chunk's start is made (ahead or not) once its update is encoded."""
        return None

    def compute_client(
        self, c: int, rec: ClientRecord, seconds: float, priority: int, hold: Hold | None
    ) -> Generator[simpy.Event, Any, None]:
        """Client ``c`` computes ``seconds`` (``hold``: on the testbed's CPUs) on its processor, at ``priority``."""

        def charge(worked: float) -> None:
            rec.compute_s += worked

        yield from self.cpu[c].run(seconds, priority, charge, hold)

    def client(self, c: int, update: Vector, weight: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s part once trained: it encodes its whole update, then starts one instance per chunk."""
        r = self.r
        env = r.env
        departure = r.departure(c)
        if self.rules.leaves_before_encoding(departure):
            r.leave(c, departure.stage)
            return
        encoded = self._encode(c, update)
        start = env.now
        yield from r.client_compute(c, self._encode_work())
        self.encode_spans.append((start, env.now))
        for slot in self.slots:
            if (c, slot.index) in self.excluded:
                continue  # the chunk went on without it (it missed a deadline while training)
            piece = encoded if isinstance(encoded, Blank) else encoded[slot.start : slot.stop]
            proc = env.process(self._client_chunk(c, slot, piece, weight))
            self.procs[c][slot.index] = proc
            r.procs.append(proc)

    def _encode(self, c: int, update: Vector) -> Vector:
        """The client's whole update encoded (fixed point mod 2^bits, or DSkellam before noise)."""
        assert self.r.instances is not None
        return self.r.instances.encode(c, update)

    def _encode_work(self) -> list[Work]:
        r = self.r
        if r.private is None:
            return [Work("encode.fixed_point", {"elements": r.s.dim})]
        return [Work("encode.dskellam", {"elements": r.private.length})]

    def _interference(self) -> float:
        """Reference seconds a compute stage of one chunk loses to the other chunks in the pipeline."""
        return self.r.s.costs.interference_s * (self.m - 1)

    def _client_chunk(self, c: int, slot: ChunkSlot, x: Vector, weight: float) -> Generator[simpy.Event, Any, None]:
        """Client ``c``'s instance of chunk ``slot``: stages 1 and 2, its answers in stage 3, then stage 5."""
        r = self.r
        j = slot.index
        machine = r.client_machines[(c, j)] = r.client_machine(c, j)
        r.calls.start_ahead(c, j, machine, x, weight)
        cpu = self.cpu_gate[c]
        departure = r.departure(c)
        try:
            yield cpu.admit(MASK, j)
            reaction = r.calls.start(c, j, machine, x, weight)
            yield from self._chunk_react(c, j, reaction, STAGED, self._interference())
            inbox = r.client_inbox[(c, j)]
            while True:
                message = yield inbox.get()
                if isinstance(message, AggregateChunk):
                    yield from self._decode_chunk(c, j, message)
                    return
                message, ahead = r.calls.arrived(c, j, message)
                priority = self.rules.answer_priority(cpu, j)
                yield from r.client_compute(c, [Work("wire.decode", frame_size(message))], priority)
                if r.leaves_before(c, machine, message):
                    if departure.waits_for_uploads:
                        # it drops after uploading: whatever the timing, all its masked inputs go out first
                        yield self.all_sent[c]
                    if c not in self.left:
                        r.leave(c, departure.stage)
                    return
                try:
                    reaction = r.calls.receive(c, j, machine, message, ahead)
                except RemoteProtocolError as exc:
                    r.leave(c, f"aborted: {exc.reason}", notify=True)
                    return
                yield from self._chunk_react(c, j, reaction, priority)
        except simpy.Interrupt:
            return

    def _chunk_react(
        self, c: int, j: int, reaction: Reaction, priority: int, extra: float = 0.0
    ) -> Generator[simpy.Event, Any, None]:
        r = self.r
        encode = [Work("wire.encode", frame_size(send.message)) for send in reaction.sends]
        yield from r.client_compute(c, [*reaction.work, *encode], priority, extra)
        for send in reaction.sends:
            if self.rules.is_upload(send.message):
                self.cpu_gate[c].release(MASK, j)  # stage 1 ends with the masked input computed
                proc = r.env.process(self._upload(c, j, send.message))
                r.procs.append(proc)
                r.transfers.setdefault(c, []).append(proc)
            else:
                r.spawn_delivery(c, send.to, send.message, j)

    def _upload(self, c: int, j: int, message: Message) -> Generator[simpy.Event, Any, None]:
        """Stage 2: the masked input of chunk ``j`` over client ``c``'s link once the link may take it."""
        gate = self.link_gate[c]
        try:
            yield gate.admit(UPLOAD, j)
            yield from self.r.deliver(c, SERVER, message, j, lambda: gate.release(UPLOAD, j))
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
        r = self.r
        gate = self.cpu_gate[c]
        yield gate.admit(DECODE, j)
        work = [Work("wire.decode", frame_size(message))]
        self.summed[c] = self.summed.get(c, 0) + 1
        if r.private is None:
            work.append(Work("decode.fixed_point", {"elements": self.slots[j].length}))
        elif self.summed[c] == self.m:
            # DSkellam's inverse rotation mixes every value of the sum: a client decodes once it has every
            # chunk's sum, the whole vector at once (as a deployed client does), and never with one missing
            work.append(Work("decode.dskellam", {"elements": r.private.length}))
        yield from r.client_compute(c, work, STAGED, self._interference())
        gate.release(DECODE, j)
        self._settle(c, j)

    def has_left(self, c: int) -> bool:
        """Whether client ``c`` has left the round (one late in one chunk is still in the others)."""
        return c in self.left

    def current_step(self) -> str:
        """The earliest unfinished chunk's server step (for ``offline:<step>``)."""
        for server in self.r.servers:
            if server.step not in ("done", "aborted"):
                return server.step
        return "done"

    def procs_of(self, c: int) -> list[simpy.Process]:
        """Client ``c``'s chunk processes."""
        return list(self.procs[c].values())

    def decoding(self, c: int) -> bool:
        """Whether a chunk's sum is still on its way to client ``c`` or being decoded."""
        return any(not e.triggered for (cc, _), e in self.decoded.items() if cc == c)

    # -- leaving ----------------------------------------------------------------------------------
    def _drop_chunk(self, c: int, j: int) -> None:
        """Client ``c`` is not in chunk ``j``'s sum (late, rejected): its instance of that chunk ends (or,
        if it has not started, never starts)."""
        self.excluded.add((c, j))
        self._sent(c, j)
        proc = self.procs[c].get(j)
        if proc is not None and proc.is_alive and proc is not self.r.env.active_process:
            proc.interrupt("not in this chunk's sum")
        for gate in (self.cpu_gate[c], self.link_gate[c], self.down_gate[c]):
            gate.abandon(j)
        self._settle(c, j)

    def _settle(self, c: int, j: int) -> None:
        event = self.decoded.get((c, j))
        if event is not None and not event.triggered:
            event.succeed()

    def leave(self, c: int, notify: bool) -> None:
        """Client ``c`` has left the round: every chunk instance of it ends and its transfers are cut; with
        ``notify`` the server learns it even under ``dropout.silent`` (a client refusing the server closes
        its connection)."""
        if notify and self.r.s.silent_dropout:
            self.r.notify_gone(c)
        self.left.add(c)
        me = self.r.env.active_process
        for proc in [*self.procs[c].values(), *self.r.transfers.get(c, [])]:
            if proc.is_alive and proc is not me:
                proc.interrupt("left")
        for j in range(self.m):
            for gate in (self.cpu_gate[c], self.link_gate[c], self.down_gate[c]):
                gate.abandon(j)
            self._settle(c, j)

    # -- records ----------------------------------------------------------------------------------
    def _stage_spans(self, rec: RoundRecord) -> list[tuple[str, str, int | None, int | None, float, float, int]]:
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
        if self.rules.duplex:
            gates.extend(self.down_gate.values())
        links = self.rules.links
        for gate in gates:
            for stage, chunk, start, end in gate.spans:
                found.setdefault((chunk, stage), []).append((start, end))
                rec.held.setdefault((stage, chunk), []).append((start, end))
        for (chunk, stage), spans in sorted(found.items()):
            rows.append(
                (
                    STAGES[stage].name,
                    STAGES[stage].on(links),
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
