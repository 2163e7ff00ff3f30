"""A client worker: one OS process that plays one sampled client per round over its own TCP connection.

The worker connects to the server, authenticates (:func:`sim.deploy.framing.client_handshake`), sends its
clock and receives the resolved scenario (:class:`~sim.deploy.control.Config`), from which it builds
what every client of the scenario shares: the population's device profiles, the federated data, the
model and the privacy plan. Then, round after round, the server tells it which client to play
(:class:`~sim.deploy.control.RoundStart`). It fetches the model, trains it for real (torch, one thread),
and runs that client's protocol machines (:class:`sim.protocol.instances.RoundInstances`, built as the
simulator builds them, but with secrets from the operating system and the worker's own long-term key),
sending the machines' messages in frames, through token buckets at the client's bandwidth, and computing
on one processor slowed down by the client's Zipf factor (:mod:`sim.deploy.compute`). A pipelined round
runs one machine per chunk, with the client's CPU and link taking one chunk's stage at a time
(:class:`sim.round.gates.StageGate`, Hyades appendix F).

A planned dropout leaves before its step: the worker closes its connection (the server sees the close at
once) and connects again for the next round; with ``dropout.silent`` it just stops answering. A server
message its machine refuses makes it abort and close the connection. Then it reports its timeline
(:class:`~sim.deploy.control.ClientReport`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sim.clients.population import MBPS, Population
from sim.costs.model import frame_size
from sim.crypto.randomness import RandomSource, SystemRandom
from sim.deploy import control
from sim.deploy.compute import STAGED, ComputeThread, interleave_threads, one_thread_math
from sim.deploy.connection import Connection
from sim.deploy.framing import Closed, FrameError, client_handshake
from sim.deploy.identity import DEPLOYMENT_ID_BYTES, Identity, remember_deployment
from sim.deploy.loopclock import LoopClock, LoopEvent
from sim.deploy.operations import entries, to_message
from sim.deploy.policy import POLICY_REFUSAL, SAFE_POLICY, WorkerPolicy, policy_text
from sim.deploy.shaping import UNSHAPED_BPS, TokenBucket
from sim.deploy.spending import Spending
from sim.learning.federated import FederatedData, load_federated
from sim.learning.models import model_train_op
from sim.learning.trainer import Learner, local_batches
from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import ClientMachine, Reaction, RemoteProtocolError, Work
from sim.protocol.messages import AggregateChunk, ModelDownload
from sim.protocol.private import PrivateRound
from sim.protocol.registry import spec_of
from sim.protocol.spec import fixed_point
from sim.round.departure import Departure
from sim.round.gates import StageGate
from sim.round.pipelining import PipelineRules
from sim.round.privacy import PrivacyLedger, nominal_sampling
from sim.round.stages import DECODE, MASK, UPLOAD
from sim.scenario.grid import Grid
from sim.scenario.source import as_plain, parse_text
from sim.scenario.types import Scenario, scenario_digest
from sim.testbed import is_kernel

log = logging.getLogger("sim.deploy.worker")


class Ending(enum.Enum):
    """How a round or a connection ended for the worker."""

    STAY = enum.auto()
    """The round ended and the connection stays."""
    LEFT = enum.auto()
    """The client left a round on purpose (a planned dropout, or it refused or aborted the round): it
    connects again at once for the next."""
    CLOSED = enum.auto()
    """The connection closed otherwise, or its handshake failed: it connects again after a back-off."""
    SHUTDOWN = enum.auto()
    """The server said the deployment is over."""


RECONNECT_FIRST_S = 0.05
"""Seconds of back-off after one failed connection (:func:`backoff`)."""
RECONNECT_CAP_S = 2.0
"""Longest back-off between two connections, in seconds (the seventh failure in a row reaches it)."""
MAX_FAILED_SESSIONS = 8
"""Connections in a row that may fail before a worker gives up (exit 2)."""


class LeftError(Exception):
    """The client left the round: a planned dropout (``planned``, the testbed's), or it aborted or refused
    the round (the message says which)."""

    def __init__(self, why: str, planned: bool = False) -> None:
        super().__init__(why)
        self.planned = planned


@dataclass
class Timeline:
    """What the worker did in a round, in seconds of its monotonic clock."""

    download_start: float = math.nan
    download_end: float = math.nan
    train_start: float = math.nan
    train_end: float = math.nan
    upload_s: float = 0.0
    last_upload_end: float = math.nan
    left: str = ""
    left_at: float = math.nan

    def report(self, round: int, compute_s: float, cpu_s: float) -> control.ClientReport:
        return control.ClientReport(
            round,
            self.download_start,
            self.download_end,
            self.train_start,
            self.train_end,
            compute_s,
            cpu_s,
            self.upload_s,
            self.last_upload_end,
            self.left_at,
            self.left.encode(),
        )

    def sent(self, future: asyncio.Future[tuple[float, float]]) -> None:
        """Count an upload once written."""
        if future.cancelled() or future.exception() is not None:
            return
        start, end = future.result()
        self.upload_s += end - start
        self.last_upload_end = end


LOCAL_DATA_BYTES = 128 << 20
"""Up to this much, a worker materialises every client's local data before the first round."""


class LocalData(FederatedData):
    """Every client's data held in memory, as a device holds its own before a round: procedural data
    (``synthetic``) is otherwise drawn at each call, which the simulator's training cost does not include."""

    def __init__(self, data: FederatedData, population: int) -> None:
        self.data = data
        self.input_shape, self.num_classes = data.input_shape, data.num_classes
        self.held = {c: data.client_data(c) for c in range(population)}

    def num_samples(self, client: int) -> int:
        return self.data.num_samples(client)

    def client_data(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        return self.held[client]

    def test_data(self) -> tuple[np.ndarray, np.ndarray]:
        return self.data.test_data()


class Shared:
    """What every client of the scenario shares, built once per configuration."""

    def __init__(self, scenario: Scenario) -> None:
        sc = self.scenario = scenario
        self.population = Population.build(sc.population, sc.clients, sc.seed)
        data = load_federated(sc.data, sc.population, sc.seed)
        size = sum(data.num_samples(c) for c in range(sc.population)) * 4 * int(np.prod(data.input_shape))
        self.data = LocalData(data, sc.population) if size <= LOCAL_DATA_BYTES else data
        assert sc.model.params is None  # the deployment needs a real model (checked by the server)
        # a deployed client trains on its own emulated CPU share, one client at a time, whatever the scenario says
        alone = dataclasses.replace(sc.training, device="cpu", clients_at_once=1)
        self.learner = Learner(sc.model, self.data, alone, sc.seed)
        self.train_op = model_train_op(sc.model, data.input_shape, data.num_classes)
        self.privacy: PrivacyLedger | None = None
        if sc.privacy.enabled:
            q, nominal = nominal_sampling(sc)
            self.privacy = PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, nominal, self.learner.dim, sc.seed)

    def warm_up(self) -> None:
        """Train once and throw the result away: torch's first backward pass allocates and dispatches for
        far longer than later ones, a start-up cost no round should carry."""
        params = self.learner.params.copy()
        self.learner.local_update(0, 0)
        self.learner.params = params

    def training(self, c: int) -> Work:
        """What the simulator charges for client ``c``'s local training (:meth:`sim.engine.virtual_round.Round`)."""
        samples, t = self.data.num_samples(c), self.scenario.training
        return Work(
            self.train_op,
            {"samples": samples * t.local_epochs, "batches": local_batches(samples, t.batch_size, t.local_epochs)},
        )

    def private(self, start: control.RoundStart) -> PrivateRound | None:
        if self.privacy is None:
            return None
        rate = None if start.rate == control.NO_RATE else start.rate
        return self.privacy.round(start.round, len(start.sampled), rate)[1]


@dataclass
class Play:
    """One round as one client: its connection, machines and resources."""

    start: control.RoundStart
    shared: Shared
    conn: Connection
    inbox: dict[int, asyncio.Queue[bytes]]
    cpu: ComputeThread
    up: TokenBucket
    timeline: Timeline = field(default_factory=Timeline)
    machines: dict[int, ClientMachine] = field(default_factory=dict)
    trained_busy: float = 0.0
    """Busy seconds of the processor up to the end of training (not protocol compute)."""
    decoded: dict[int, np.ndarray] = field(default_factory=dict)
    """Pipelined: each chunk's sum, centred (stage 5)."""
    unsent: set[int] = field(default_factory=set)
    """Pipelined: chunks whose masked input is not written yet."""
    all_sent: asyncio.Event = field(default_factory=asyncio.Event)
    limits: wire.RoundLimits = field(default_factory=lambda: wire.RoundLimits(0, 0))
    """What a message from the server may hold this round, per type (checked before decoding allocates)."""
    uploads: list[asyncio.Task[None]] = field(default_factory=list)
    """Pipelined: the uploads waiting for the link or being written."""
    process_cpu: float = field(default_factory=time.process_time)
    """The process's CPU seconds when the round started."""
    frames_out: list[int] = field(default_factory=list)
    """Bytes of each protocol frame sent this round."""
    frames_in: list[int] = field(default_factory=list)
    """Bytes of each protocol frame received this round."""

    def sent(self, j: int) -> None:
        self.unsent.discard(j)
        if not self.unsent:
            self.all_sent.set()


class Worker:
    """Worker ``index`` of a deployment whose server listens at ``host:port``."""

    def __init__(
        self,
        host: str,
        port: int,
        index: int,
        identity: Identity,
        server_key: bytes,
        max_frame: int,
        connect_timeout: float = 30.0,
        sessions: Path | None = None,
        directory: frozenset[bytes] = frozenset(),
        bind: str | None = None,
        policy: WorkerPolicy = SAFE_POLICY,
        rng: random.Random | None = None,
    ) -> None:
        self.host, self.port, self.index = host, port, index
        self.bind = bind
        """The local address its connections come from (a kernel testbed gives each worker its own, whose
        traffic it shapes); None: the system's choice."""
        self.policy = policy
        """What this worker accepts of the server's scenario and rounds (:mod:`sim.deploy.policy`): plug-ins
        and seeded secrets among them."""
        self.rng = rng or random.Random()
        """The jitter of its reconnections' back-off (not a secret)."""
        self.sessions = sessions
        """A lasting key's record of the deployment ids it has signed for (None: a key of this process's)."""
        self.directory = frozenset(directory)
        """The deployment's verification keys, where this worker knows them (its key folder's .pub files)."""
        self.deployment = b""
        self.identity = identity
        """This worker's own long-term key pair (drawn by itself: :mod:`sim.deploy.identity`)."""
        self.server_key = server_key
        self.max_frame = max_frame
        self.connect_timeout = connect_timeout
        self.shared: Shared | None = None
        self.digest = b""
        self.seeded = False
        """Whether the server asked for secrets derived from the scenario seed (``--seeded-secrets``)."""
        self.spending: Spending | None = None
        """What this worker has spent of its policy's epsilon, and the rounds it played (once configured)."""
        self.rounds_started = 0
        """Rounds the server started this worker in (a connection that saw one made progress)."""
        self.closed_why = ""
        """Why the last connection closed, as its :class:`~sim.deploy.connection.Connection` said."""

    async def run(self) -> None:
        """Serve the deployment until the server says it is over; exit 2 when it cannot be reached, or after
        :data:`MAX_FAILED_SESSIONS` connections in a row that failed (a handshake that did not complete, or
        a connection that closed before the server started a round in it), each tried again after a back-off
        (:func:`backoff`). A client that left a round on purpose connects again at once."""
        failures, why = 0, ""
        while True:
            try:
                reader, writer = await self._connect()
            except (OSError, asyncio.TimeoutError) as exc:
                log.error("worker %d: cannot reach the server at %s:%d: %s", self.index, self.host, self.port, exc)
                raise SystemExit(2) from exc
            started = self.rounds_started
            try:
                outcome = await self._session(reader, writer)
            except (FrameError, ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                writer.close()
                outcome, why = Ending.CLOSED, f"the handshake failed: {_reason(exc)}"
            if outcome is Ending.SHUTDOWN:
                return
            if outcome is Ending.LEFT or self.rounds_started > started:
                failures = 0
                continue
            failures += 1
            why = why or self.closed_why or "the connection closed"
            if failures >= MAX_FAILED_SESSIONS:
                log.error(
                    "worker %d: gave up after %d failed connections in a row to the server at %s:%d; the last: %s",
                    self.index,
                    failures,
                    self.host,
                    self.port,
                    why,
                )
                raise SystemExit(2)
            delay = backoff(failures, self.rng)
            log.warning("worker %d: %s; connecting again in %.2f s", self.index, why, delay)
            why = ""
            await asyncio.sleep(delay)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.05
        while True:
            try:
                local = (self.bind, 0) if self.bind is not None else None
                return await asyncio.open_connection(self.host, self.port, local_addr=local)
            except OSError:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Ending:
        """One connection: handshake, configuration, rounds; how it ended (never :attr:`Ending.STAY`). A
        handshake that fails raises (:class:`FrameError`, :class:`Closed`)."""
        session = await client_handshake(reader, writer, self.index, self.identity.signing, self.server_key)
        self.closed_why = ""
        controls: asyncio.Queue[wire.Message | None] = asyncio.Queue()
        inbox: dict[int, asyncio.Queue[bytes]] = {}
        # the links' rates are the client's of each round, set as its start is read (before the frames after it)
        up, down = TokenBucket(UNSHAPED_BPS), TokenBucket(UNSHAPED_BPS)

        def on_frame(channel: int, payload: bytes, _arrived: float) -> None:
            if channel != control.CONTROL:
                inbox.setdefault(channel, asyncio.Queue()).put_nowait(payload)
                return
            try:
                message = control.decode_from_server(payload)
            except wire.WireError as exc:
                conn.close(f"malformed control message from the server: {exc}")
                return
            if isinstance(message, control.RoundStart) and self.shared is not None:
                if not 0 <= message.client < self.shared.scenario.population:
                    conn.close(f"the server's round start names client {message.client}, not of the population")
                    return
                inbox.clear()  # in order with the frames: the round's own frames go to a fresh inbox
                if is_kernel(self.shared.scenario):
                    controls.put_nowait(message)  # the kernel shapes this worker's address: no buckets
                    return
                mbps = float(self.shared.population.bandwidth_mbps[message.client])
                up.retune(mbps * MBPS)
                down.retune(mbps * MBPS)
            controls.put_nowait(message)

        def on_close(reason: str) -> None:
            self.closed_why = reason
            controls.put_nowait(None)

        conn = Connection(reader, writer, session, self.max_frame, on_frame, on_close)
        conn.send_buckets, conn.recv_bucket = (up,), down
        conn.start()
        conn.send(control.CONTROL, control.Accepts(policy_text(self.policy).encode()).encode())
        while True:
            message = await controls.get()
            if message is None:
                return Ending.CLOSED
            if isinstance(message, control.Config):
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self._configure, message)
                except Exception as exc:
                    if isinstance(exc, PolicyRefusedError):
                        reason = str(exc)
                    else:
                        reason = f"cannot run the server's scenario: {type(exc).__name__}: {exc}"
                    log.error("worker %d: %s", self.index, reason)
                    conn.send(control.CONTROL, control.Shutdown(reason.encode()).encode())
                    await conn.drain_and_close()
                    raise SystemExit(2) from exc
                conn.send(control.CONTROL, control.Clock(time.monotonic()).encode())  # configured: ready
            elif isinstance(message, control.Shutdown):
                await conn.drain_and_close()
                return Ending.SHUTDOWN
            elif isinstance(message, control.RoundStart):
                outcome = await self._round(message, conn, controls, inbox, up)
                if outcome is not Ending.STAY:
                    return outcome

    def _configure(self, config: control.Config) -> None:
        """Take the server's configuration, or refuse it (:class:`PolicyRefusedError`) before training anything."""
        refused = self.policy.secrets_refusals(bool(config.seeded))
        if refused:
            raise PolicyRefusedError(POLICY_REFUSAL + "; ".join(refused))
        if config.seeded:
            log.warning("worker %d: secrets derived from the scenario seed (--seeded-secrets): NO SECRECY", self.index)
        if len(config.deployment) != DEPLOYMENT_ID_BYTES:
            raise ValueError(f"the server's deployment id is {len(config.deployment)} bytes, not {DEPLOYMENT_ID_BYTES}")
        if config.deployment != self.deployment:
            if self.sessions is not None:
                remember_deployment(self.sessions, config.deployment)
            self.deployment = config.deployment
        self.seeded = bool(config.seeded)
        if self.shared is not None:
            if config.digest != self.digest:  # what it spent and the rounds it played are this scenario's
                raise ValueError("the server sends another scenario than the one this worker took; it takes one")
            return  # the configuration this worker took already (it connected again)
        scenario = read_config(config, self.policy)
        torch.set_num_threads(1)
        shared = Shared(scenario)
        spending = Spending(self.policy, scenario, shared.privacy)
        refused = self.policy.scenario_refusals(scenario) + spending.scenario_refusals()
        if refused:
            raise PolicyRefusedError(POLICY_REFUSAL + "; ".join(refused))
        shared.warm_up()
        self.shared, self.digest, self.spending = shared, config.digest, spending

    async def _round(
        self,
        start: control.RoundStart,
        conn: Connection,
        controls: asyncio.Queue[wire.Message | None],
        inbox: dict[int, asyncio.Queue[bytes]],
        up: TokenBucket,
    ) -> Ending:
        """Play ``start.client`` until the server ends the round (:attr:`Ending.STAY`), or the connection
        closes: :attr:`Ending.LEFT` if the client closed it on purpose, else :attr:`Ending.CLOSED`."""
        assert self.shared is not None, "a round before the configuration"
        shared, c = self.shared, start.client
        # on a kernel testbed the client's slow-down is its cgroup's quota: no sleeps here
        slowdown = 1.0 if is_kernel(shared.scenario) else float(shared.population.slowdown[c])
        cpu = ComputeThread(f"client{c}", slowdown)
        play = Play(start, shared, conn, inbox, cpu, up)
        self.rounds_started += 1
        task = asyncio.create_task(self._play(play))
        outcome = Ending.STAY
        while True:
            message = await controls.get()
            if message is None:
                outcome = Ending.CLOSED
                break
            if isinstance(message, control.RoundEnd) and message.round == start.round:
                break
        if not task.done():
            task.cancel()
        try:
            await task
        except LeftError:
            outcome = Ending.LEFT if outcome is Ending.CLOSED else outcome
        except (asyncio.CancelledError, Closed):
            pass
        except Exception:
            log.exception("worker %d: round %d as client %d failed", self.index, start.round, c)
        cpu.shutdown()
        if outcome is Ending.STAY:
            done = entries(cpu.calls, time.process_time() - play.process_cpu, play.frames_out, play.frames_in)
            conn.send(control.CONTROL, to_message(start.round, done).encode())
            report = play.timeline.report(start.round, cpu.busy_s - play.trained_busy, cpu.cpu_s)
            conn.send(control.CONTROL, report.encode())
        return outcome

    # -- the client's part of a round ----------------------------------------------------------------
    async def _play(self, p: Play) -> None:
        sc, start, spending = p.shared.scenario, p.start, self.spending
        assert spending is not None, "a round before the configuration"
        c = start.client
        try:
            try:
                departure = Departure.plan(spec_of(sc.aggregation), sc.aggregation, start.drop.decode(errors="replace"))
            except ValueError as exc:
                raise LeftError(f"aborted: the server's round start: {exc}") from None
            wrong = round_start_problem(start, sc) or spending.round_problem(start.round)
            if wrong:
                raise LeftError(f"aborted: the server's round start: {wrong}")
            rate = None if start.rate == control.NO_RATE else start.rate
            n = len(start.sampled)

            def refusals() -> list[str]:  # the epsilon limits' worst case takes a while: off the event loop
                return self.policy.round_refusals(sc, n) + spending.round_refusals(start.round, n, rate)

            refused = await asyncio.get_running_loop().run_in_executor(None, refusals)
            if refused:  # before it downloads, trains or sends anything of this round
                raise LeftError("refused: " + POLICY_REFUSAL + "; ".join(refused))
            spending.record(start.round, n, rate)
            if departure.before_download:
                self._leave(p, departure.stage)
            private = p.shared.private(start)
            p.limits = control.round_limits(p.shared.learner.dim, len(start.sampled), private)
            p.timeline.download_start = time.monotonic()
            payload = await self._receive(p, 0)
            model = await p.cpu.run(lambda: wire.decode(payload, round=p.limits), work=decoding)
            if not isinstance(model, ModelDownload) or model.round != start.round:
                raise LeftError(f"aborted: expected the round's model, got {type(model).__name__}")
            p.timeline.download_end = p.timeline.train_start = time.monotonic()
            learner = p.shared.learner
            params = np.asarray(model.params, dtype=np.float32)

            def train() -> tuple[np.ndarray, float]:
                learner.params = params
                return learner.local_update(c, start.round)

            update, weight = await p.cpu.run(train, work=lambda _: (p.shared.training(c),))
            p.timeline.train_end = time.monotonic()
            p.trained_busy = p.cpu.busy_s
            instances = RoundInstances(
                sc.aggregation,
                sc.seed,
                start.round,
                tuple(int(x) for x in start.sampled),
                learner.dim,
                private,
                chunks=start.chunks if start.chunks > 0 else None,
                identities=self._roster(start) if sc.aggregation.malicious else None,
                context=self.deployment,
            )
            if instances.pipelined:
                await self._pipelined(p, instances, update, weight, departure)
            else:
                await self._single(p, instances, update, weight, departure)
        except LeftError as exc:
            p.timeline.left, p.timeline.left_at = str(exc), time.monotonic()
            if not sc.dropout.silent or not exc.planned:
                # say why, then close: the server sees the close at once
                p.conn.send(control.CONTROL, control.Leaving(start.round, str(exc).encode()).encode())
                await p.conn.drain_and_close()
            raise

    def _leave(self, p: Play, why: str) -> None:
        raise LeftError(why, planned=True)

    @staticmethod
    def _decode(p: Play, payload: bytes) -> wire.Message:
        """A protocol message from the server; one that does not decode makes the client abort."""
        try:
            return wire.decode(payload, round=p.limits)
        except wire.WireError as exc:
            raise LeftError(f"aborted: malformed message from the server: {exc}") from None

    def _roster(self, start: control.RoundStart) -> dict[int, bytes]:
        """The malicious variant's verification keys of the round's clients, from the server's
        :class:`~sim.deploy.control.RoundStart` (else it aborts): this worker's own at its client and nowhere
        else (a server that gave its key to another client could replay its signatures), no key twice, and,
        where this worker knows the deployment's keys (``worker-*.pub`` in its key folder), none other. An
        empty key is a client no worker plays: no signature verifies under it."""
        keys, sampled = tuple(start.keys), tuple(int(x) for x in start.sampled)
        if len(keys) != len(sampled):
            raise LeftError(f"aborted: the round lists {len(keys)} verification keys for {len(sampled)} clients")
        roster = dict(zip(sampled, keys, strict=True))
        own = self.identity.verification
        if roster.get(start.client) != own:
            raise LeftError(f"aborted: the round does not list this worker's key at client {start.client}")
        given = [k for k in keys if k]
        if len(set(given)) != len(given) or any(len(k) != len(own) for k in given):
            raise LeftError("aborted: the round lists a verification key twice, or one of the wrong length")
        if self.directory and not set(given) <= self.directory:
            raise LeftError("aborted: the round lists a verification key that is not in this worker's key folder")
        return roster

    def _keys(self) -> RandomSource | None:
        """The randomness of a client machine's secrets: the operating system's, or (``--seeded-secrets``)
        None, for the scenario seed's, as the simulator's."""
        return None if self.seeded else SystemRandom()

    async def _receive(self, p: Play, channel: int) -> bytes:
        payload = await p.inbox.setdefault(channel, asyncio.Queue()).get()
        p.frames_in.append(len(payload))
        return payload

    @staticmethod
    async def _compute(p: Play, call: Any, priority: int) -> tuple[Reaction, list[bytes]]:
        """Run a machine call and encode its messages on the client's processor; a server message the
        machine refuses makes the client abort (:class:`LeftError`)."""

        def work() -> tuple[Reaction, list[bytes]]:
            reaction = call()
            return reaction, [send.message.encode() for send in reaction.sends]

        try:
            return await p.cpu.run(work, priority, lambda done: reacting(done[0]))
        except RemoteProtocolError as exc:
            raise LeftError(f"aborted: {exc.reason}") from exc

    async def _react(self, p: Play, channel: int, call: Any, priority: int = STAGED) -> Reaction:
        """Run a machine call, then send its messages on ``channel``; returns the reaction."""
        reaction, frames = await self._compute(p, call, priority)
        for frame in frames:
            p.frames_out.append(len(frame))
            p.conn.send(channel, frame).add_done_callback(p.timeline.sent)
        return reaction

    async def _single(
        self, p: Play, inst: RoundInstances, update: np.ndarray, weight: float, departure: Departure
    ) -> None:
        c = p.start.client
        machine = p.machines[0] = inst.client(c, keys=self._keys(), signing=self.identity.signing)
        if departure.before(machine.first_step):
            self._leave(p, departure.stage)
        await self._react(p, 0, lambda: machine.start(update, weight))
        while True:
            payload = await self._receive(p, 0)
            message = await p.cpu.run(partial(self._decode, p, payload), work=decoding)
            if departure.before(machine.stage_of(message)):
                self._leave(p, departure.stage)
            await self._react(p, 0, lambda message=message: machine.receive(message))

    async def _pipelined(
        self, p: Play, inst: RoundInstances, update: np.ndarray, weight: float, departure: Departure
    ) -> None:
        c, m = p.start.client, len(inst.slots)
        sc = p.shared.scenario
        rules = PipelineRules.for_section(spec_of(sc.aggregation), m, sc.pipeline)
        if rules.leaves_before_encoding(departure):  # before its instances' first step: before encoding
            self._leave(p, departure.stage)
        encoded = await p.cpu.run(lambda: inst.encode(c, update), work=lambda _: encoding(inst))
        assert isinstance(encoded, np.ndarray)
        p.unsent = set(range(m))
        clock = LoopClock()
        cpu_gate = rules.gate(clock, "client.cpu", f"client{c}.cpu")
        link_gate = rules.uploads_gate(clock, f"client{c}.uplink")
        """The client's link for its uploads; the server gates the dispatches to it (stage 4)."""
        tasks = [
            asyncio.create_task(
                self._chunk(p, inst, j, encoded[slot.start : slot.stop], weight, departure, cpu_gate, link_gate, rules)
            )
            for j, slot in enumerate(inst.slots)
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
            if rules.dispatch:
                await p.cpu.run(lambda: self._finish_decode(p, inst), work=lambda _: finishing(p, inst))
                p.conn.send(control.CONTROL, control.Decoded(p.start.round).encode())
        finally:
            for task in [*tasks, *p.uploads]:
                task.cancel()

    async def _chunk(
        self,
        p: Play,
        inst: RoundInstances,
        j: int,
        piece: np.ndarray,
        weight: float,
        departure: Departure,
        cpu_gate: StageGate[LoopEvent],
        link_gate: StageGate[LoopEvent],
        rules: PipelineRules,
    ) -> None:
        """Chunk ``j``'s instance: stages 1 (mask) and 2 (upload), its answers in stage 3, then 5 (decode)."""
        c = p.start.client
        machine = p.machines[j] = inst.client(c, j, keys=self._keys(), signing=self.identity.signing)
        await cpu_gate.admit(MASK, j)
        await self._chunk_react(p, j, lambda: machine.start(piece, weight), STAGED, cpu_gate, link_gate, rules)
        while True:
            payload = await self._receive(p, j)
            priority = rules.answer_priority(cpu_gate, j)
            message = await p.cpu.run(partial(self._decode, p, payload), priority, decoding)
            if isinstance(message, AggregateChunk):
                await cpu_gate.admit(DECODE, j)
                await p.cpu.run(partial(self._decode_chunk, p, inst, j, message), work=lambda _: summing(inst, j))
                cpu_gate.release(DECODE, j)
                return
            if departure.before(machine.stage_of(message)):
                if departure.waits_for_uploads:
                    await p.all_sent.wait()  # as the simulator: every masked input goes out before it leaves
                self._leave(p, departure.stage)
            call = lambda message=message: machine.receive(message)  # noqa: E731
            await self._chunk_react(p, j, call, priority, cpu_gate, link_gate, rules)

    async def _chunk_react(
        self,
        p: Play,
        j: int,
        call: Any,
        priority: int,
        cpu_gate: StageGate[LoopEvent],
        link_gate: StageGate[LoopEvent],
        rules: PipelineRules,
    ) -> None:
        reaction, frames = await self._compute(p, call, priority)
        for send, frame in zip(reaction.sends, frames, strict=True):
            if rules.is_upload(send.message):
                cpu_gate.release(MASK, j)  # stage 1 ends with the masked input computed
                # stage 2 waits for the link, not the chunk's instance (as the engine's upload process)
                p.uploads.append(asyncio.create_task(self._upload(p, j, frame, link_gate)))
            else:
                p.frames_out.append(len(frame))
                p.conn.send(j, frame).add_done_callback(p.timeline.sent)

    @staticmethod
    async def _upload(p: Play, j: int, frame: bytes, link_gate: StageGate[LoopEvent]) -> None:
        """Stage 2: chunk ``j``'s masked input over the client's link once the link may take it."""
        await link_gate.admit(UPLOAD, j)
        p.frames_out.append(len(frame))
        sent = p.conn.send(j, frame)
        sent.add_done_callback(lambda _f: link_gate.release(UPLOAD, j))
        sent.add_done_callback(lambda _f: p.sent(j))
        sent.add_done_callback(p.timeline.sent)

    @staticmethod
    def _decode_chunk(p: Play, inst: RoundInstances, j: int, message: AggregateChunk) -> None:
        """Stage 5: the client decodes chunk ``j``'s sum as far as one chunk allows: the fixed-point mean,
        or (DSkellam) the centred integers, whose inverse rotation needs every chunk (:meth:`_finish_decode`)."""
        values = np.asarray(message.total.values)
        if inst.private is None:
            p.decoded[j] = fixed_point(inst.aggregation, len(inst.sampled)).decode_mean(values, 1)
            return
        total = values.astype(np.int64)
        half = np.int64(1) << np.int64(message.total.bits - 1)
        p.decoded[j] = (total + half) % (half * 2) - half

    @staticmethod
    def _finish_decode(p: Play, inst: RoundInstances) -> None:
        """DSkellam: the inverse rotation of the whole sum once every chunk's is in."""
        if inst.private is None or len(p.decoded) != len(inst.slots):
            return
        total = np.concatenate([p.decoded[j] for j in range(len(inst.slots))])
        inst.private.encoding.decode_sum(inst.private.wrap(total), inst.private.rotation_seed)


ROUND_GROWTH = 4
"""A round may sample up to this many times the clients the scenario plans (and 16 more): a Poisson round
of that many is all but impossible, and every client's work grows with the round's size."""


def round_start_problem(start: control.RoundStart, scenario: Scenario) -> str:
    """What is wrong with a server's round start for ``scenario`` (empty: nothing): its client among the
    sampled, each once and of the population, not many more than planned, and a sampling rate in (0, 1]."""
    sampled, population = start.sampled, scenario.population
    most = ROUND_GROWTH * nominal_sampling(scenario)[1] + 16
    if len(sampled) > most:
        return f"{len(sampled)} clients sampled, more than this scenario's rounds can have ({most})"
    if start.client not in sampled:
        return f"client {start.client} is not among the {len(sampled)} sampled"
    if len(set(sampled)) != len(sampled) or max(sampled) >= population:
        return f"the sampled clients repeat, or are not all of the population of {population}"
    if start.rate != control.NO_RATE and not 0 < start.rate <= 1:
        return f"sampling rate {start.rate!r} is not in (0, 1]"
    return ""


def decoding(message: wire.Message) -> tuple[Work, ...]:
    """What the simulator charges for decoding ``message`` from its frame."""
    return (Work("wire.decode", frame_size(message)),)


def reacting(reaction: Reaction) -> tuple[Work, ...]:
    """What the simulator charges for a machine's ``reaction``: its work, and encoding each message it sends."""
    return (*reaction.work, *(Work("wire.encode", frame_size(send.message)) for send in reaction.sends))


def encoding(inst: RoundInstances) -> tuple[Work, ...]:
    """What the simulator charges for a pipelined client's encoding of its whole update."""
    if inst.private is None:
        return (Work("encode.fixed_point", {"elements": inst.dim}),)
    return (Work("encode.dskellam", {"elements": inst.private.length}),)


def summing(inst: RoundInstances, j: int) -> tuple[Work, ...]:
    """What the simulator charges for decoding chunk ``j``'s sum (less its frame's decoding): the fixed-point
    decoding of its values; nothing for DSkellam's centring (its decoding is :func:`finishing`'s)."""
    if inst.private is None:
        return (Work("decode.fixed_point", {"elements": inst.slots[j].length}),)
    return ()


def finishing(p: Play, inst: RoundInstances) -> tuple[Work, ...]:
    """What the simulator charges once a client has every chunk's sum: DSkellam's decoding of the whole
    vector (its inverse rotation mixes every value); nothing otherwise."""
    if inst.private is None or len(p.decoded) != len(inst.slots):
        return ()
    return (Work("decode.dskellam", {"elements": inst.private.length}),)


def worker_main(
    host: str,
    port: int,
    index: int,
    identity: Identity,
    server_key: bytes,
    max_frame: int,
    policy: WorkerPolicy,
    sessions: Path | None = None,
    directory: frozenset[bytes] = frozenset(),
    bind: str | None = None,
) -> None:
    """Entry point of a worker process (``dropsim worker``)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log.info("worker %d: policy %s", index, policy_text(policy))
    interleave_threads()
    one_thread_math()
    asyncio.run(
        Worker(
            host,
            port,
            index,
            identity,
            server_key,
            max_frame,
            sessions=sessions,
            directory=directory,
            bind=bind,
            policy=policy,
        ).run()
    )


def config_message(scenario: Scenario, deployment: bytes, seeded: bool = False) -> control.Config:
    """The configuration a worker receives: the scenario document as written (sweep values and ``--set``
    overrides applied), as JSON, the digest of the resolved scenario it must read back to, the deployment's
    id, and whether its secrets come from the scenario seed (``seeded``: no secrecy)."""
    assert scenario.document is not None, "a scenario read from a document"
    text = json.dumps({"file": scenario.document.name, "scenario": as_plain(scenario.document.data)}, default=str)
    return control.Config(text.encode(), scenario_digest(scenario).encode(), deployment, int(seeded))


def read_config(config: control.Config, policy: WorkerPolicy) -> Scenario:
    """The scenario of a :class:`~sim.deploy.control.Config`; it must resolve to the server's digest. A document
    that names plug-ins (code: docs/plugins.md) is refused before it is read (:class:`PolicyRefusedError`),
    unless the ``policy`` allows them."""
    try:
        sent = json.loads(config.scenario)
        name, data = str(sent["file"]), sent["scenario"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        raise ValueError(f"the server's configuration is not a scenario: {type(exc).__name__}: {exc}") from None
    refused = policy.plugin_refusals(data)
    if refused:
        raise PolicyRefusedError(POLICY_REFUSAL + "; ".join(refused))
    scenario = Grid.from_document(parse_text(json.dumps(data), name)).base()
    if scenario_digest(scenario).encode() != config.digest:
        raise ValueError("the scenario read from the server's configuration differs from the server's (versions?)")
    return scenario


class PolicyRefusedError(Exception):
    """The worker's policy refuses the server's configuration or round (:mod:`sim.deploy.policy`)."""


def backoff(failures: int, rng: random.Random) -> float:
    """Seconds to wait before connecting again after ``failures`` failed connections in a row: doubling from
    :data:`RECONNECT_FIRST_S`, at most :data:`RECONNECT_CAP_S`, drawn uniformly from its upper half (jitter,
    so that workers cut off together do not come back together)."""
    ceiling = min(RECONNECT_CAP_S, RECONNECT_FIRST_S * 2.0 ** min(failures - 1, 30))
    return ceiling * rng.uniform(0.5, 1.0)


def _reason(exc: BaseException) -> str:
    """What a connection's failure says (a :class:`FrameError`'s reason, else the exception)."""
    if isinstance(exc, FrameError):
        return exc.reason
    if isinstance(exc, asyncio.IncompleteReadError | Closed):
        return "the server closed the connection"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
