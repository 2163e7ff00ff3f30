"""Faults in the socket deployment: killed workers, bad frames, stalled connections, a run that loses its workers.

The deployment must treat faults as the simulator's protocol does (:mod:`sim.deploy.server`): a worker
process killed mid-round is a dropout at the server's step, and the round completes or aborts as SecAgg
says; an unauthenticated, replayed, reordered, oversized or malformed frame or message is refused with a
logged reason and puts only its sender out; a connection that stalls times out; and rows already written
stay written. Each round's aggregate is checked bit for bit against the simulator playing the same round
with the faulty client dropping at the equivalent ``dropout.stage`` (a reference :class:`Simulation` kept
in lockstep, so that both start every round from the same model).

Three deployments serve the module (worker start-up dominates: torch and the data, ~20 s for nine workers on
two cores; a round takes about a second):
``killing`` (9 spawned workers, one killed per round), ``rogue`` (4 real workers started here plus a rogue
worker 4 in a thread of this process, which holds worker 4's key) and a ``run_scenario`` run whose
workers all die after round 1. The server's asyncio loop runs only inside ``dep.step()``/``dep.close()``;
helper threads (a killer, the rogue) act while it does. Everything talks to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim.clients.sampling import sample_clients
from sim.deploy import control
from sim.deploy import identity as ids
from sim.deploy.deployment import DeployOptions
from sim.deploy.framing import Closed, FrameError, Session, client_handshake, read_frame
from sim.protocol import wire
from sim.protocol.instances import RoundInstances
from sim.protocol.machine import ClientMachine
from sim.protocol.messages import Ciphertexts, KeyList, MaskedInput, ShareKeys, Survivors
from sim.protocol.registry import spec_of
from sim.protocol.wire import ModVector
from sim.results.read import read_manifest, read_run_table
from sim.round.records import RoundResult
from sim.runner import Deployed, Simulation, run_scenario
from sim.scenario import load
from sim.scenario.types import Scenario

pytestmark = pytest.mark.slow

POLL_S = 0.001
"""How often the killer looks at the server's round."""
KILL_DEADLINE_S = 60.0
"""The killer gives up (and kills at once, so no round waits forever) after this long."""
ROGUE_WAIT_S = 30.0
"""Longest the rogue waits for any one thing the server sends."""

FAULTS = """
name: faults
seed: 5
rounds: 20
population: 10
sampling: {clients_per_round: 5}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 40.0], ranks: 2}
dropout: {rate: 0}
data: {dataset: digits, partition: iid}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10, clients_at_once: 1}  # as deployed clients train
aggregation: {protocol: secagg, bits: 20}
"""
"""Five of ten clients per round, SecAgg with threshold 3 of 5: a round survives two losses. ``ranks: 2``
makes half the population 40 times slower than the other half (training ~0.5 s instead of ~15 ms, a
masked input ~0.15 s), so every sample mixes slow and fast clients."""


def _scenario(tmp_path: Path, text: str, *overrides: str) -> Scenario:
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    return load(path, list(overrides), output=str(tmp_path / "out")).base()


class ScriptedDropout:
    """A dropout model that drops exactly the clients it is told (the reference run's)."""

    def __init__(self) -> None:
        self.next: dict[int, str] = {}

    def plan(self, round: int, sampled: np.ndarray) -> dict[int, str]:
        drops, self.next = self.next, {}
        assert set(drops) <= {int(c) for c in sampled}, f"round {round}: {drops} not among {sampled}"
        return drops


class Reference:
    """The simulator playing the deployment's rounds in lockstep, each with the drops it is told."""

    def __init__(self, scenario: Scenario) -> None:
        self.sim = Simulation(scenario)
        self.dropout = ScriptedDropout()
        self.sim.world.dropout = self.dropout  # type: ignore[assignment]

    def step(self, drops: dict[int, str]) -> RoundResult:
        self.dropout.next = dict(drops)
        return self.sim.step()


def _same_round(deployed: RoundResult, simulated: RoundResult) -> None:
    """The deployed round's aggregate is the simulated one's, bit for bit, and so is the model after it."""
    dep, ref = deployed.record, simulated.record
    assert dep.round == ref.round
    assert dep.aggregate is not None and ref.aggregate is not None
    assert dep.aggregate.survivors == ref.aggregate.survivors
    assert np.array_equal(np.asarray(dep.aggregate.vector), np.asarray(ref.aggregate.vector))
    assert deployed.model_sha256 == simulated.model_sha256


def _sampled(scenario: Scenario, round: int) -> list[int]:
    return [int(c) for c in sample_clients(np.arange(scenario.population), scenario.sampling, scenario.seed, round)]


def _new_refusals(dep: Deployed, before: int) -> list[str]:
    return dep.driver.server.rejected[before:]


# ------------------------------------------------------------------------------------------ killed workers
@dataclass(frozen=True)
class Kill:
    """How to kill the worker playing a client so that the kill lands in one server step, reliably.

    A step lasts as long as its slowest answer, which is short for fast clients. So the killer freezes
    the worker (SIGSTOP) as soon as the server holds its answer to the step before (``freeze_after``;
    None: at the round's start) and kills it (SIGKILL) once the server is in ``step``: a frozen worker
    cannot answer ``step``, however long the server takes to get there. The freeze itself must land
    before the worker sends its answer to ``step``: that window is the wait for the others' answers to
    the step before plus its own computation of ``step``. The client is chosen to make it long: slow
    (40 times) where its own computation is long (training ~0.5 s, a masked input ~0.15 s), fast where
    it waits for slow others (their training before share_keys, their masked inputs before unmasking).
    The killer sees the server's state within a few milliseconds.
    """

    step: str
    """The server step the kill lands in."""
    slow: bool
    freeze_after: str | None = None
    freeze: bool = True
    """False: kill at the round's start, without freezing (the worker is downloading or training)."""
    alone: bool = False
    """Kill only once every other client has answered ``step`` (the straggler the step waits for)."""
    equivalent: str = "after_sampling"
    """The simulator's ``dropout.stage`` at which a client leaves at the same point of the protocol."""
    uploaded: bool = False
    """Whether the killed client had uploaded its masked input (then SecAgg recovers its self-mask and
    its update is in the sum)."""


KILLS = {
    "training": Kill("advertise_keys", slow=True, freeze=False),
    "advertise_keys": Kill("advertise_keys", slow=True, alone=True),
    "share_keys": Kill("share_keys", slow=False, freeze_after="advertise_keys", equivalent="before_share_keys"),
    "masked_input": Kill("masked_input", slow=True, freeze_after="share_keys", equivalent="before_upload"),
    "unmasking": Kill(
        "unmasking", slow=False, freeze_after="masked_input", equivalent="during_unmasking", uploaded=True
    ),
}


class Killer(threading.Thread):
    """Watches round ``number`` of ``dep`` (every millisecond) and kills the worker playing ``client`` as
    ``kill`` says; ``signals`` logs ``(signal, the server's step when it was sent)``."""

    def __init__(self, dep: Deployed, number: int, client: int, kill: Kill) -> None:
        super().__init__(name="killer", daemon=True)
        self.dep, self.number, self.client, self.kill = dep, number, client, kill
        aggregation = dep.scenario.aggregation
        self.order = (*spec_of(aggregation).steps_for(aggregation), "done", "aborted")
        self.signals: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.worker = -1

    def run(self) -> None:
        deadline = time.monotonic() + KILL_DEADLINE_S
        st = self.dep.driver.server.current
        while st is None or st.number != self.number or self.client not in st.peers:
            if time.monotonic() > deadline:
                self.errors.append(f"round {self.number} with client {self.client} never started")
                return
            time.sleep(POLL_S)
            st = self.dep.driver.server.current
        machine = st.machines[0]
        self.worker = st.peers[self.client].index
        process = self.dep.driver.processes[self.worker]
        k = self.kill

        def step() -> str:
            return machine.step

        def awaited() -> frozenset[int]:
            for _ in range(100):  # the loop thread may change the sets under us: read again
                with contextlib.suppress(RuntimeError):
                    return machine.expected()
            return frozenset()

        def answered(s: str) -> bool:
            now = step()
            return self.order.index(now) > self.order.index(s) or (now == s and self.client not in awaited())

        def wait(until: Callable[[], bool], what: str) -> None:
            while not until():
                if time.monotonic() > deadline:
                    self.errors.append(f"timed out waiting for {what} (server step {step()})")
                    return
                time.sleep(POLL_S)

        if k.freeze:
            if k.freeze_after is not None:
                wait(lambda: answered(k.freeze_after or ""), f"client {self.client}'s {k.freeze_after}")
            self.signals.append(("SIGSTOP", step()))
            os.kill(process.pid, signal.SIGSTOP)

            def ready() -> bool:
                if self.order.index(step()) > self.order.index(k.step):
                    self.errors.append(f"the server left {k.step} before the kill")
                    return True
                return step() == k.step and (not k.alone or awaited() == {self.client})

            wait(ready, f"step {k.step}")
        self.signals.append(("SIGKILL", step()))
        os.kill(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def killing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployed, Reference]]:
    """Nine workers for five-client rounds: one can be killed in each of five rounds, and a sixth has four."""
    tmp = tmp_path_factory.mktemp("killing")
    scenario = _scenario(tmp, FAULTS)
    dep = Deployed(scenario, DeployOptions(workers=9, step_timeout_s=60.0, log_dir=tmp))
    try:
        ready = dep.driver.loop.run_until_complete(
            dep.driver.server.wait_for_workers(9, dep.driver.live_workers, 120.0)
        )
        assert len(ready) == 9
        yield dep, Reference(scenario)
    finally:
        dep.close()


@pytest.mark.parametrize("stage", list(KILLS))
def test_a_killed_worker_is_a_dropout_at_its_step(killing: tuple[Deployed, Reference], stage: str) -> None:
    """SIGKILL the worker playing a client during ``stage``: it is ``offline:<server step>``, the round
    completes over the others (over it too if it had uploaded its masked input: SecAgg recovers its
    self-mask in unmasking) and the aggregate is the simulator's with that client dropping there."""
    dep, ref = killing
    kill = KILLS[stage]
    number = dep.round + 1
    sampled = _sampled(dep.scenario, number)
    slow = [c for c in sampled if dep.population.slowdown[c] > 1]
    fast = [c for c in sampled if dep.population.slowdown[c] == 1]
    candidates = slow if kill.slow else fast
    assert candidates and slow, f"round {number} samples {sampled}: no {'slow' if kill.slow else 'fast'} client"
    chosen = candidates[0]
    assert dep.driver.live_workers() >= len(sampled), "the round needs a worker for every sampled client"

    killer = Killer(dep, number, chosen, kill)
    killer.start()
    result = dep.step()
    killer.join(KILL_DEADLINE_S)
    assert not killer.is_alive() and killer.errors == []
    assert killer.signals[-1] == ("SIGKILL", kill.step)
    assert dep.driver.processes[killer.worker].wait(10) == -signal.SIGKILL

    rec = result.record
    assert rec.outcome == "ok"
    stages = {r.client: r.dropped_stage for r in rec.clients}
    assert stages == {c: (f"offline:{kill.step}" if c == chosen else "") for c in sampled}
    survivors = set(sampled) if kill.uploaded else set(sampled) - {chosen}
    assert rec.aggregate is not None and set(rec.aggregate.survivors) == survivors
    assert rec.survivors == len(survivors)
    _same_round(result, ref.step({chosen: kill.equivalent}))


def test_the_next_round_runs_with_the_workers_left(killing: tuple[Deployed, Reference]) -> None:
    """After the kills (four workers left of nine), a round's sampled clients beyond the live workers are
    ``offline:connect``; it completes over the others."""
    dep, ref = killing
    live = dep.driver.live_workers()
    number = dep.round + 1
    sampled = _sampled(dep.scenario, number)
    assert live >= 3, "too few workers left for SecAgg's threshold"
    result = dep.step()
    rec = result.record
    assert rec.outcome == "ok"
    unplayed = sampled[live:]  # the server gives workers to the sampled clients in order
    assert {r.client: r.dropped_stage for r in rec.clients} == {
        c: ("offline:connect" if c in unplayed else "") for c in sampled
    }
    _same_round(result, ref.step(dict.fromkeys(unplayed, "after_sampling")))


# ------------------------------------------------------------------------------------- a rogue worker
GARBAGE_MESSAGE = b"this is not a protocol message"


class Stalled:
    """No message: waiting for it waits until the server closes the connection."""


@dataclass
class Link:
    """The rogue's end of an authenticated connection: the frames it reads, and raw writes."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    session: Session
    frames: asyncio.Queue[tuple[int, bytes] | None] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                body = await read_frame(self.reader, 64 << 20)
                self.frames.put_nowait(self.session.open(body))
        except (FrameError, Closed, ConnectionError, asyncio.IncompleteReadError):
            self.frames.put_nowait(None)

    async def receive(self, kind: type) -> wire.Message | None:
        """The next message of type ``kind`` (others are skipped), or None once the server closed the
        connection; TimeoutError after ``ROGUE_WAIT_S``."""
        deadline = time.monotonic() + ROGUE_WAIT_S
        while True:
            frame = await asyncio.wait_for(self.frames.get(), max(0.0, deadline - time.monotonic()))
            if frame is None:
                self.frames.put_nowait(None)
                return None
            message = wire.decode(frame[1])
            if isinstance(message, kind):
                return message

    async def write(self, *raw: bytes) -> bytes:
        """Write ``raw`` frames (or pieces) in one go; the bytes written."""
        data = b"".join(raw)
        self.writer.write(data)
        await self.writer.drain()
        return data

    def seal(self, channel: int, payload: bytes) -> bytes:
        return self.session.seal(channel, payload)

    async def send(self, channel: int, payload: bytes) -> bytes:
        """Seal and send ``payload``; the frame's bytes."""
        return await self.write(self.seal(channel, payload))


@dataclass
class Played:
    """What the rogue did in a round."""

    attack: str
    round: int = 0
    client: int = -1
    closed_by_server: bool = False
    error: str = ""


@dataclass
class Turn:
    """The rogue's part of a round once it knows its client: ``link``, ``machine`` (its client's SecAgg
    machine) and the update dimension."""

    rogue: Rogue
    link: Link
    start: control.RoundStart
    machine: ClientMachine

    def clock(self) -> bytes:
        return control.Clock(time.monotonic()).encode()

    def keys(self) -> bytes:
        """The client's honest first message (of a zero update)."""
        (send,) = self.machine.start(np.zeros(self.rogue.dim, dtype=np.float32), 1.0).sends
        return send.message.encode()

    async def answer(self, request: type[wire.Message]) -> bytes:
        """The client's honest answer to the server's next ``request``."""
        message = await self.link.receive(request)
        assert message is not None, f"the server closed the connection before sending {request.__name__}"
        (send,) = self.machine.receive(message).sends
        return send.message.encode()


async def _replay(t: Turn) -> None:
    await t.link.write(t.rogue.first_frame)  # its Clock, seq 0, byte for byte


async def _skip(t: Turn) -> None:
    t.link.session.sent += 1  # seq 1 never sent
    await t.link.send(control.CONTROL, t.clock())


async def _bad_tag(t: Turn) -> None:
    frame = bytearray(t.link.seal(control.CONTROL, t.clock()))
    frame[-1] ^= 1
    await t.link.write(bytes(frame))


async def _kind(t: Turn) -> None:
    frame = bytearray(t.link.seal(control.CONTROL, t.clock()))
    frame[4] = 2  # a HELLO's kind, after the handshake
    await t.link.write(bytes(frame))


async def _short(t: Turn) -> None:
    await t.link.write(struct.pack(">I", 5), bytes(5))


async def _giant(t: Turn) -> None:
    await t.link.write(struct.pack(">I", 2**32 - 1))


async def _control_garbage(t: Turn) -> None:
    # its keys right behind, in the same segment: nothing after the refused frame may count
    await t.link.write(t.link.seal(control.CONTROL, GARBAGE_MESSAGE), t.link.seal(0, t.keys()))


async def _unexpected_control(t: Turn) -> None:
    end = control.RoundEnd(t.start.round, b"ok").encode()
    await t.link.write(t.link.seal(control.CONTROL, end), t.link.seal(0, t.keys()))


async def _bad_channel(t: Turn) -> None:
    keys = t.keys()
    await t.link.write(t.link.seal(7, keys), t.link.seal(0, keys))


async def _garbage(t: Turn) -> None:
    await t.link.send(0, GARBAGE_MESSAGE)


async def _replay_message(t: Turn) -> None:
    keys = t.keys()
    await t.link.write(t.link.seal(0, keys), t.link.seal(0, keys))


async def _stale_message(t: Turn) -> None:
    keys = t.keys()
    await t.link.send(0, keys)
    await t.link.receive(KeyList)
    await t.link.send(0, keys)  # its keys again, in share_keys


async def _mid_frame(t: Turn) -> None:
    await t.link.send(0, t.keys())
    frame = t.link.seal(0, await t.answer(KeyList))
    await t.link.write(frame[: len(frame) // 2])  # and nothing more, not even at the round's end


async def _silent(t: Turn) -> None:
    await t.link.send(0, t.keys())
    await t.link.send(0, await t.answer(KeyList))
    await t.link.receive(Ciphertexts)  # and never its masked input


async def _quit(t: Turn) -> None:
    await t.link.send(control.CONTROL, control.Shutdown(b"had enough").encode())


async def _leave(t: Turn) -> None:
    t.link.writer.close()


MANY = 1 << 20
"""Ciphertexts in the rogue's forged ShareKeys: a 12 MiB frame (each an id and an empty ciphertext) that the
server decoded item by item into a million tuples before it checked a single receiver."""


async def _many_items(t: Turn) -> None:
    await t.link.send(0, t.keys())
    await t.link.receive(KeyList)
    items = np.zeros(MANY, dtype=[("to", "<u8"), ("length", "<u4")]).tobytes()
    body = struct.pack("<IQI", t.start.round, t.start.client, MANY) + items
    await t.link.send(0, wire.HEADER.pack(wire.MAGIC, wire.VERSION, ShareKeys.TYPE, len(body)) + body)


def _report(t: Turn, **values: float) -> bytes:
    fields = dict.fromkeys(control.REPORT_TIMES, math.nan) | dict.fromkeys(control.REPORT_SECONDS, 0.0) | values
    return control.ClientReport(round=t.start.round, left=b"", **fields).encode()


BAD_REPORTS = {
    "report_infinite_time": {"download_end": math.inf},
    "report_negative_seconds": {"compute_s": -1.0},
    "report_huge_seconds": {"upload_s": 1e300},
    "report_time_before_the_round": {"train_start": -1e9},
}
"""A worker's report of its round with one value no round can have (its other times NaN, durations 0)."""


def _bad_report(name: str) -> Callable[[Turn], Awaitable[None]]:
    async def attack(t: Turn) -> None:  # and nothing more: it misses advertise_keys, the report long in by then
        await t.link.send(control.CONTROL, _report(t, **BAD_REPORTS[name]))

    return attack


# -- the adversarial worker: an authenticated client that sends each kind of wrong message at each step ---
FAR = 10**9
"""A client id outside every round."""


def _flip(data: bytes) -> bytes:
    return bytes([data[0] ^ 1]) + data[1:]


class Raw:
    """A payload the rogue sends as it is."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def encode(self) -> bytes:
        return self.payload


def _one_bit_giant(message: MaskedInput) -> Raw:
    """A masked input of 2^25 one-bit values: a 4 MiB frame that once cost the server 1.3 GB to decode
    (written directly: packing it would take the rogue longer than the step's deadline)."""
    count = 1 << 25
    body = struct.pack("<IQBQ", message.round, message.client, 1, count) + bytes(count // 8)
    return Raw(wire.HEADER.pack(wire.MAGIC, wire.VERSION, MaskedInput.TYPE, len(body)) + body)


MISBEHAVIOURS: dict[str, tuple[str, Callable[[Any, Turn], Any]]] = {
    "keys_for_another": (
        "advertise_keys",
        lambda m, t: replace(m, client=next(c for c in t.start.sampled if c != m.client)),
    ),
    "keys_of_another_round": ("advertise_keys", lambda m, t: replace(m, round=m.round + 1)),
    "keys_too_short": ("advertise_keys", lambda m, t: replace(m, signature=m.signature[:-1] if m.signature else b"x")),
    "shares_to_unknown_id": (
        "share_keys",
        lambda m, t: replace(m, ciphertexts=((FAR, m.ciphertexts[0][1]), *m.ciphertexts[1:])),
    ),
    "shares_twice_to_one": ("share_keys", lambda m, t: replace(m, ciphertexts=(m.ciphertexts[0], *m.ciphertexts[:-1]))),
    "masked_of_wrong_length": (
        "masked_input",
        lambda m, t: replace(m, y=ModVector(m.y.bits, np.zeros(m.y.length + 1, dtype=np.uint32))),
    ),
    "masked_of_wrong_width": (
        "masked_input",
        lambda m, t: replace(m, y=ModVector(m.y.bits - 1, np.zeros(m.y.length, dtype=np.uint32))),
    ),
    "masked_giant_one_bit": ("masked_input", lambda m, t: _one_bit_giant(m)),
    "masked_replayed": ("masked_input", lambda m, t: [m, m]),
    "unmask_about_unknown_id": (
        "unmasking",
        lambda m, t: replace(m, shares=((FAR, m.shares[0][1], m.shares[0][2]), *m.shares[1:])),
    ),
    "unmask_of_wrong_kind": (
        "unmasking",
        lambda m, t: replace(m, shares=((m.shares[0][0], 7, m.shares[0][2]), *m.shares[1:])),
    ),
    "unmask_share_too_short": (
        "unmasking",
        lambda m, t: replace(m, shares=((m.shares[0][0], m.shares[0][1], m.shares[0][2][:-1]), *m.shares[1:])),
    ),
    "unmask_tampered": ("unmasking", lambda m, t: replace(m, shares=tuple((a, k, _flip(v)) for a, k, v in m.shares))),
}
"""Each misbehaviour: the step in which the rogue sends it, and how it changes its honest answer (a list:
several messages)."""
STEP_REQUESTS: dict[str, type[wire.Message] | None] = {
    "advertise_keys": None,
    "share_keys": KeyList,
    "masked_input": Ciphertexts,
    "unmasking": Survivors,
}
"""What the server sends before each step (None: the round's start)."""


def _misbehave(name: str) -> Callable[[Turn], Awaitable[None]]:
    step, change = MISBEHAVIOURS[name]

    async def attack(t: Turn) -> None:
        steps = list(STEP_REQUESTS)
        for current in steps[: steps.index(step) + 1]:
            request = STEP_REQUESTS[current]
            if request is None:
                (send,) = t.machine.start(np.zeros(t.rogue.dim, dtype=np.float32), 1.0).sends
            else:
                message = await t.link.receive(request)
                assert message is not None, f"the server closed the connection before sending {request.__name__}"
                (send,) = t.machine.receive(message).sends
            if current != step:
                await t.link.send(0, send.message.encode())
                continue
            changed = change(send.message, t)
            for m in changed if isinstance(changed, list) else [changed]:
                await t.link.send(0, m.encode())

    return attack


ATTACKS: dict[str, tuple[Callable[[Turn], Awaitable[None]], type | None]] = {
    **{name: (_misbehave(name), control.RoundEnd) for name in MISBEHAVIOURS},
    "replay": (_replay, control.RoundEnd),
    "skip": (_skip, control.RoundEnd),
    "bad_tag": (_bad_tag, control.RoundEnd),
    "kind": (_kind, control.RoundEnd),
    "short": (_short, control.RoundEnd),
    "giant": (_giant, control.RoundEnd),
    "control_garbage": (_control_garbage, control.RoundEnd),
    "unexpected_control": (_unexpected_control, control.RoundEnd),
    "bad_channel": (_bad_channel, control.RoundEnd),
    "garbage": (_garbage, control.RoundEnd),
    "replay_message": (_replay_message, control.RoundEnd),
    "stale_message": (_stale_message, control.RoundEnd),
    "mid_frame": (_mid_frame, Stalled),
    "silent": (_silent, control.RoundEnd),
    "leave": (_leave, None),
    "quit": (_quit, control.RoundEnd),
    "many_items": (_many_items, control.RoundEnd),
    **{name: (_bad_report(name), control.RoundEnd) for name in BAD_REPORTS},
}
"""Each attack, and what the rogue waits for after it: the round's end (then it closes its connection), the
server closing the connection (``Stalled``), or nothing."""


class Rogue:
    """Worker ``index`` played from a thread of the test: for each attack queued, it connects, authenticates
    with its own key, reports ready, waits for its round, misbehaves, and closes its
    connection after the round (or once the server has)."""

    def __init__(self, address: tuple[str, int], index: int, keys: Path, scenario: Scenario, dim: int) -> None:
        self.address, self.index, self.scenario, self.dim = address, index, scenario, dim
        self.signing = ids.read_identity(ids.worker_key_file(keys, index)).signing
        self.server_key = ids.read_public(keys / "server.pub")
        self.attacks: queue.Queue[str | None] = queue.Queue()
        self.played: queue.Queue[Played] = queue.Queue()
        self.first_frame = b""
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="rogue", daemon=True)

    def play(self, attack: str) -> None:
        """Play ``attack`` in the next round."""
        self.attacks.put(attack)

    def stop(self) -> None:
        self.attacks.put(None)
        self.thread.join(ROGUE_WAIT_S)

    async def _serve(self) -> None:
        while True:  # one attack per connection, until told to stop or left without one for 5 minutes
            try:
                attack = await asyncio.to_thread(self.attacks.get, True, 300.0)
            except queue.Empty:
                return
            if attack is None:
                return
            played = Played(attack)
            try:
                await self._session(played)
            except Exception as exc:
                played.error = f"{type(exc).__name__}: {exc}"
            self.played.put(played)

    async def _session(self, played: Played) -> None:
        reader, writer = await asyncio.open_connection(*self.address)
        link: Link | None = None
        try:
            session = await client_handshake(reader, writer, self.index, self.signing, self.server_key)
            link = Link(reader, writer, session)
            link.start()
            assert await link.receive(control.Config) is not None
            self.first_frame = await link.send(control.CONTROL, control.Clock(time.monotonic()).encode())
            start = await link.receive(control.RoundStart)
            assert isinstance(start, control.RoundStart)
            played.round, played.client = start.round, start.client
            sc = self.scenario
            inst = RoundInstances(sc.aggregation, sc.seed, start.round, tuple(start.sampled), self.dim)
            attack, until = ATTACKS[played.attack]
            await attack(Turn(self, link, start, inst.client(start.client)))
            if until is not None:
                played.closed_by_server = await link.receive(until) is None
        finally:
            writer.close()
            if link is not None and link.task is not None:
                link.task.cancel()


@dataclass
class RogueDeployment:
    dep: Deployed
    rogue: Rogue
    ref: Reference

    def round(self, attack: str) -> tuple[RoundResult, Played, list[str]]:
        """Play a round with the rogue doing ``attack``: the result, what it did, the refusals logged."""
        before = len(self.dep.driver.server.rejected)
        self.rogue.play(attack)
        result = self.dep.step()
        played = self.rogue.played.get(timeout=ROGUE_WAIT_S)
        assert played.error == "" and played.round == result.record.round, played
        return result, played, _new_refusals(self.dep, before)

    def honest_round(self, result: RoundResult, played: Played) -> None:
        """The round went on without the rogue's client: ok, the others' aggregate, the simulator's."""
        rec = result.record
        assert rec.outcome == "ok"
        others = {r.client for r in rec.clients} - {played.client}
        assert rec.aggregate is not None and set(rec.aggregate.survivors) == others
        assert all(r.dropped_stage == "" for r in rec.clients if r.client != played.client)
        _same_round(result, self.ref.step({played.client: "after_sampling"}))


ROGUE_WORKERS = 5
ROGUE = ROGUE_WORKERS - 1
SHARE_KEYS_TIMEOUT_S = 0.5
STEP_TIMEOUT_S = 2.0
HANDSHAKE_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RogueDeployment]:
    """Five workers for five-client rounds: real workers 0-3 started here, the rogue worker 4. The rogue plays
    a client in every round (the server waits for all five), so each round tests one attack."""
    tmp = tmp_path_factory.mktemp("rogue")
    scenario = _scenario(
        tmp,
        FAULTS,
        "rounds=40",
        "clients.compute.slowdown=[1.0, 1.0]",
        f"timeouts={{share_keys: {SHARE_KEYS_TIMEOUT_S}}}",
    )
    keys = tmp / "keys"
    server = ids.create_identity(ids.server_key_file(keys))
    for j in range(ROGUE_WORKERS):
        ids.create_identity(ids.worker_key_file(keys, j))
    options = DeployOptions(
        identity=server,
        keys=keys,
        workers=ROGUE_WORKERS,
        spawn=False,
        connect_timeout_s=10.0,
        handshake_timeout_s=HANDSHAKE_TIMEOUT_S,
        step_timeout_s=STEP_TIMEOUT_S,
    )
    dep = Deployed(scenario, options)
    host, port = dep.driver.address
    processes: list[subprocess.Popen[bytes]] = []
    rogue = Rogue(dep.driver.address, ROGUE, keys, scenario, dep.dim)
    with (tmp / "workers.log").open("ab") as log:
        try:
            for j in range(ROGUE):
                command = [sys.executable, "-m", "sim", "worker", "--connect", f"{host}:{port}", "--index", str(j)]
                command += ["--keys", str(keys)]
                processes.append(subprocess.Popen(command, stdout=log, stderr=log))
            # the honest workers start (torch, the data) before the first round waits only for the rogue
            ready = dep.driver.loop.run_until_complete(dep.driver.server.wait_for_workers(ROGUE, lambda: ROGUE, 120.0))
            assert [p.index for p in ready] == list(range(ROGUE))
            rogue.thread.start()
            yield RogueDeployment(dep, rogue, Reference(scenario))
        finally:
            rogue.stop()
            dep.close()
            for process in processes:
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _wire_error(payload: bytes) -> str:
    with pytest.raises(wire.WireError) as error:
        wire.decode(payload)
    return str(error.value)


def _control_error(payload: bytes) -> str:
    with pytest.raises(wire.WireError) as error:
        control.decode_from_worker(payload)
    return str(error.value)


FRAME_FAULTS = {
    "replay": "replayed frame: seq 0, already received up to 0",
    "skip": "out-of-order frame: seq 2, expected 1",
    "bad_tag": "unauthenticated frame: bad tag on seq 1",
    "kind": "unexpected frame kind 2",
    "short": "frame of 5 bytes is shorter than the 27 bytes of header and tag",
    "giant": "frame of 4294967295 bytes exceeds the limit of 67108864 bytes",
    "control_garbage": f"malformed control message: {_control_error(GARBAGE_MESSAGE)}",
    "unexpected_control": "malformed control message: message type 42 is no control message the worker sends",
    "bad_channel": "frame on channel 7; the round has 1",
}
"""What the server says of each frame it cannot take from a worker (the rogue's Clock was frame 0)."""


@pytest.mark.parametrize("attack", list(FRAME_FAULTS))
def test_a_bad_frame_closes_its_connection_and_the_round_goes_on(rogue: RogueDeployment, attack: str) -> None:
    """A replayed, out-of-order, unauthenticated, mistyped, undersized or oversized frame, or one the server
    cannot take (a malformed or unexpected control message, a channel the round does not have), closes the
    rogue's connection with the reason logged once; nothing it sent after counts (its keys, right behind);
    its client is out (``rejected: <reason>``) and the honest four complete the round."""
    result, played, refusals = rogue.round(attack)
    assert refusals == [f"worker {ROGUE} (client {played.client}): {FRAME_FAULTS[attack]}; connection closed"]
    assert played.closed_by_server
    (record,) = [r for r in result.record.clients if r.client == played.client]
    assert record.dropped_stage == f"rejected: {FRAME_FAULTS[attack]}"
    assert record.bytes_up == 0
    rogue.honest_round(result, played)


MESSAGE_FAULTS = {
    "garbage": f"malformed message: {_wire_error(GARBAGE_MESSAGE)}",
    "many_items": f"malformed message: ShareKeys.ciphertexts: list of (u64, bytes) of {MANY} items exceeds the "
    f"limit of {ROGUE_WORKERS}",
    "replay_message": "a message it was not asked for in step advertise_keys (AdvertiseKeys)",
    "stale_message": "sent AdvertiseKeys in step share_keys, not ShareKeys",
}
"""Why the server refuses each bad protocol message (in a well-formed, authenticated frame)."""


@pytest.mark.parametrize("attack", list(MESSAGE_FAULTS))
def test_a_bad_message_puts_its_client_out(rogue: RogueDeployment, attack: str) -> None:
    """A message that does not decode, or one the protocol already has (the rogue's keys again, in the same
    step or the next), is refused with the reason logged; its client is out and the round goes on."""
    result, played, refusals = rogue.round(attack)
    reason = MESSAGE_FAULTS[attack]
    assert refusals == [f"round {played.round}: client {played.client}'s message refused: {reason}"]
    stages = {r.client: r.dropped_stage for r in result.record.clients}
    assert stages[played.client] == f"rejected: {reason}"
    rogue.honest_round(result, played)


@pytest.mark.parametrize("attack", list(MISBEHAVIOURS))
def test_an_adversarial_worker_is_refused_and_the_honest_clients_go_on(rogue: RogueDeployment, attack: str) -> None:
    """An authenticated worker sends a wrong message in one step (another's id, another round, unknown ids,
    wrong lengths or widths, a 4 MiB vector of one-bit values, a replay, tampered shares): the server logs
    why, naming its client, and the round completes for the honest four. Before unmasking the rogue is put
    out, and the round is the simulator's without it; once its masked input (of a zero update) is in the
    sum (a replayed masked input, or in unmasking), the honest clients' shares unmask it without the
    rogue's."""
    step, _ = MISBEHAVIOURS[attack]
    result, played, refusals = rogue.round(attack)
    rec = result.record
    assert refusals and all(f"client {played.client}" in r for r in refusals), refusals
    stages = {r.client: r.dropped_stage for r in rec.clients}
    if step != "unmasking" and attack != "masked_replayed":
        assert stages[played.client].startswith("rejected: ")
        rogue.honest_round(result, played)
        return
    # its (first) masked input is in the sum
    assert rec.outcome == "ok" and rec.aggregate is not None
    assert set(rec.aggregate.survivors) == set(stages)
    assert all(stage == "" for c, stage in stages.items() if c != played.client)
    rogue.ref.step({played.client: "after_sampling"})
    assert rogue.ref.sim.learner is not None and rogue.dep.learner is not None
    rogue.ref.sim.learner.params = rogue.dep.learner.params.copy()  # the rogue's zero update is in this model


def test_a_worker_that_quits_mid_deployment_is_a_dropout_not_the_end(rogue: RogueDeployment) -> None:
    """A ready worker that says it quits (a Shutdown) leaves its round as a dropout; the deployment goes on,
    and the worker may come back (before, one worker's Shutdown ended every deployment)."""
    result, played, refusals = rogue.round("quit")
    assert refusals == [f"worker {ROGUE} (client {played.client}): quit: had enough; connection closed"]
    assert played.closed_by_server
    rogue.honest_round(result, played)
    result, played, refusals = rogue.round("leave")  # it reconnects and the next round runs with it
    assert refusals == []
    rogue.honest_round(result, played)


@pytest.mark.parametrize("attack", list(BAD_REPORTS))
def test_a_report_no_round_can_have_is_refused_not_recorded(rogue: RogueDeployment, attack: str) -> None:
    """A worker's report of its round with an infinite or pre-round time, or a negative or astronomical
    duration, is refused with the reason logged, and none of its values reaches the clients table (before,
    each landed in clients.csv and rounds.csv of a run marked complete). The rogue sends it at the round's
    start and then nothing: the report is in long before its client misses advertise_keys' deadline."""
    result, played, refusals = rogue.round(attack)
    ((name, value),) = BAD_REPORTS[attack].items()
    (refusal,) = refusals
    assert refusal.startswith(f"round {played.round}: client {played.client}'s report refused: {name} {value!r} ")
    (record,) = [r for r in result.record.clients if r.client == played.client]
    assert record.dropped_stage == "timeout:advertise_keys"
    recorded = [getattr(record, f) for f in ("download_end", "train_start", "compute_s", "upload_s")]
    assert all(v != value for v in recorded), recorded
    rogue.honest_round(result, played)


STALLS = {
    "mid_frame": ("share_keys", SHARE_KEYS_TIMEOUT_S),
    "silent": ("masked_input", STEP_TIMEOUT_S),
}
"""Where each stall is caught: the scenario's timeout of share_keys, or the deployment's step timeout."""


@pytest.mark.parametrize("attack", list(STALLS))
def test_a_stalled_client_times_out(rogue: RogueDeployment, attack: str) -> None:
    """Half a frame and then nothing, not even at the round's end (share_keys has a 0.5 s timeout), or no
    masked input at all (masked_input has none: ``step_timeout_s`` bounds it): the client is
    ``timeout:<step>`` after the step's deadline, the round goes on without it, and the server closes the
    stalled connection after the round (having waited ``REPORT_WAIT_S`` for a report that never comes)."""
    step, timeout = STALLS[attack]
    result, played, refusals = rogue.round(attack)
    assert refusals == []
    rec = result.record
    assert {r.client: r.dropped_stage for r in rec.clients}[played.client] == f"timeout:{step}"
    assert rec.timed_out == 1
    (span,) = [(start, end) for name, start, end in rec.steps if name == step]
    assert timeout <= span[1] - span[0] < timeout + 1.0
    assert played.closed_by_server == (attack == "mid_frame")  # the silent one leaves at the round's end
    rogue.honest_round(result, played)


async def _impostor(address: tuple[str, int], party: int) -> tuple[str, tuple[str, int]]:
    """Authenticate as ``party`` with a key of its own making: what the client saw, and its address."""
    reader, writer = await asyncio.open_connection(*address)
    me = writer.get_extra_info("sockname")
    try:
        signing = ids.new_identity().signing
        server_key = ids.new_identity().verification
        await client_handshake(reader, writer, party, signing, server_key, timeout=ROGUE_WAIT_S)
    except (FrameError, Closed) as exc:
        return type(exc).__name__, me
    finally:
        writer.close()
    return "authenticated", me


def test_junk_connections_are_refused_and_closed(rogue: RogueDeployment) -> None:
    """Raw sockets that send random garbage, a length prefix of 2^32 - 1, nothing at all, or a partial
    handshake frame, and an impostor without the party's key: each is refused with the reason logged and
    closed (the silent ones after the 0.5 s handshake timeout), while a round goes on."""
    dep = rogue.dep
    before = len(dep.driver.server.rejected)
    garbage = np.random.default_rng(7).bytes(256)
    payloads = {
        "garbage": garbage,
        "giant": struct.pack(">I", 2**32 - 1),
        "silent": b"",
        "partial": struct.pack(">I", 200) + bytes(20),
    }
    sockets = {}
    for name, payload in payloads.items():
        s = socket.create_connection(dep.driver.address, timeout=5.0)
        s.sendall(payload)
        sockets[name] = s
    impostor: list[tuple[str, tuple[str, int]]] = []
    thread = threading.Thread(
        target=lambda: impostor.append(asyncio.run(_impostor(dep.driver.address, 2))), daemon=True
    )
    thread.start()

    result, played, _ = rogue.round("leave")  # the rogue leaves at once: an offline client, no fault
    thread.join(ROGUE_WAIT_S)
    deadline = time.monotonic() + 5.0
    while len(dep.driver.server.rejected) - before < len(payloads) + 1 and time.monotonic() < deadline:
        dep.driver.loop.run_until_complete(asyncio.sleep(0.05))  # the silent ones' handshake deadline, if not yet
    refusals = dep.driver.server.rejected[before:]
    ((seen, impostor_address),) = impostor
    assert seen == "Closed"  # the server closed the connection on it
    addresses = {name: s.getsockname() for name, s in sockets.items()} | {"impostor": impostor_address}
    assert len(refusals) == len(addresses)

    def refused(name: str) -> str:
        (entry,) = [r for r in refusals if r.startswith(f"connection from {addresses[name]!r} refused: ")]
        return entry.split(" refused: ", 1)[1]

    (length,) = struct.unpack(">I", garbage[:4])
    assert length > 4096  # (seeded) garbage whose length prefix is already too long
    assert refused("garbage") == f"frame of {length} bytes exceeds the limit of 4096 bytes"
    assert refused("giant") == "frame of 4294967295 bytes exceeds the limit of 4096 bytes"
    assert refused("silent") == refused("partial") == f"handshake timed out after {HANDSHAKE_TIMEOUT_S:g} s"
    assert refused("impostor") == "party 2 failed authentication"
    for s in sockets.values():
        with s:
            assert s.recv(100) == b""  # closed by the server

    assert {r.client: r.dropped_stage for r in result.record.clients}[played.client] == "offline:advertise_keys"
    rogue.honest_round(result, played)
    result, played, refusals = rogue.round("leave")  # and it goes on serving
    assert refusals == []
    rogue.honest_round(result, played)


# ------------------------------------------------------------------------------- a run losing its workers
def test_rows_written_survive_the_loss_of_every_worker(tmp_path: Path) -> None:
    """``run_scenario`` over a deployment whose workers are all killed once round 1 is written: the later
    rounds abort at once (no client answers, or none has a worker), the run completes (its manifest says
    so), and the rows of round 1 are intact, byte for byte."""
    # every client slow (training ~0.5 s): the kill lands before any answers round 2
    scenario = _scenario(
        tmp_path, FAULTS, "rounds=3", "sampling.clients_per_round=3", "clients.compute.slowdown=[40.0, 40.0]"
    )
    out = tmp_path / "run"
    deployments: list[Deployed] = []

    def engine(sc: Scenario) -> Deployed:
        deployments.append(Deployed(sc, DeployOptions(step_timeout_s=30.0, log_dir=out)))
        return deployments[0]

    tables = ("rounds", "clients", "stages")
    written: dict[str, bytes] = {}

    def kill_after_round_1() -> None:
        deadline = time.monotonic() + 120.0
        rounds = out / "rounds.csv"
        while time.monotonic() < deadline:
            if rounds.exists() and rounds.read_bytes().count(b"\n") >= 2:  # header and round 1
                written.update({t: (out / f"{t}.csv").read_bytes() for t in tables})
                for process in deployments[0].driver.processes:
                    process.kill()
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_after_round_1, daemon=True)
    killer.start()
    started = time.monotonic()
    run_scenario(scenario, out, progress=False, engine=engine, driver="deploy")
    wall = time.monotonic() - started  # bounded anyway: no client left to wait for, steps time out at 30 s
    killer.join(5)
    assert written, "round 1 was never written"
    assert [p.returncode for p in deployments[0].driver.processes] == [-signal.SIGKILL] * 3
    assert wall < 120.0

    for t in tables:
        assert (out / f"{t}.csv").read_bytes().startswith(written[t])
    manifest = read_manifest(out)
    assert manifest["status"] == "complete" and manifest["rounds_completed"] == 3
    rounds = read_run_table(out, "rounds")
    assert list(rounds["round"]) == [1, 2, 3]
    assert list(rounds["outcome"]) == ["ok"] + ["aborted: advertise_keys: 0 of 3 clients answered, threshold 2"] * 2
    assert rounds["model_sha256"].nunique() == 1  # aborted rounds leave the model as it was
    clients = read_run_table(out, "clients")
    later = clients[clients["round"] > 1]
    assert len(later) == 6 and later["dropped_stage"].str.startswith("offline:").all()
    assert set(later["in_aggregate"]) == {False}
