"""An in-memory driver for the protocol machines: no virtual time, no network, every frame really encoded.

The third driver of the sans-IO machines, beside the SimPy engine and the socket mode: the reference for
tests and benchmarks (in the manner of h11's tests, which drive a pair of connections through an
in-memory link). It delivers each step's messages in ascending client order,
encoding every message to bytes and decoding it on the other side, lets clients leave before a chosen
step, and records per party the wall-clock seconds spent inside machine calls, the work they reported
and the bytes sent. The clients' calls of a step may run on several threads (``workers``), with the same
results as in turn.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from sim.protocol import wire
from sim.protocol.machine import ClientMachine, Reaction, RemoteProtocolError, RoundAbortedError, ServerMachine, Work
from sim.protocol.wire import Message, Vector

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
