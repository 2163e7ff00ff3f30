"""An in-memory driver for the protocol machines: no virtual time, no network, every frame really encoded.

The third driver of the sans-IO machines, beside the SimPy engine and the socket mode: the reference for
tests and benchmarks (in the manner of h11's tests, which drive a pair of connections through an
in-memory link). It delivers each step's messages in ascending client order,
encoding every message to bytes and decoding it on the other side, lets clients leave before a chosen
step, and records per party the wall-clock seconds spent inside machine calls, the work they reported
and the bytes sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from sim.protocol import wire
from sim.protocol.machine import ClientMachine, Reaction, RemoteProtocolError, RoundAbortedError, ServerMachine, Work
from sim.protocol.wire import Message, Vector


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
) -> LoopbackResult:
    """Run one round to its end. ``leave_before[c]`` is the step before which client c leaves;
    ``tamper(to, message)`` may replace any server-to-client message (to test a misbehaving server);
    ``observe(sender, message)`` sees every client-to-server message."""
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

    def client_call(c: int, call: Callable[[], Reaction]) -> None:
        start = time.perf_counter()
        try:
            reaction = call()
        except RemoteProtocolError as exc:
            result.aborted[c] = exc
            return
        finally:
            result.client_seconds[c] += time.perf_counter() - start
        result.client_work[c].extend(reaction.work)
        for send in reaction.sends:
            message, n = carry(send.message)
            result.bytes_up[c] += n
            if observe is not None:
                observe(c, message)
            to_server.append((c, message))

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

    server_call(server.begin)
    for c in sorted(clients):
        machine = clients[c]
        if leave.get(c) == machine.first_step:
            result.left.add(c)
            continue
        client_call(c, partial(machine.start, updates[c], 1.0))
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
        deliveries = sorted(to_clients, key=lambda item: item[0])
        to_clients.clear()
        for c, message in deliveries:
            if not active(c):
                continue
            if leave.get(c) and clients[c].stage_of(message) == leave[c]:
                result.left.add(c)
                continue
            client_call(c, partial(clients[c].receive, message))
    return result
