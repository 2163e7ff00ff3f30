"""The contract between aggregation protocol machines and the drivers that run them.

A machine is a pure state machine in the manner of h11: the driver hands it a message (or tells it that a
collection step is over) and gets back a :class:`Reaction`: the messages to send and the :class:`Work` it
did, which the SimPy driver turns into virtual time through the cost model and the socket driver simply
performs. Machines never touch a clock, a socket, simpy, asyncio or torch; randomness and inputs come in
as arguments. A message that is illegal in the current state raises :class:`RemoteProtocolError` (the
peer broke the protocol) and leaves the machine's state unchanged; a driver calling a machine out of
turn gets :class:`LocalProtocolError`.

Server machines collect one *step* at a time (Dordis section 4.1: a round-trip step starts with the
server's request and ends with the clients' responses). The driver delivers responses with
:meth:`ServerMachine.receive` and, when every client the step still expects has answered, has
disconnected, or the step's timeout has passed, calls :meth:`ServerMachine.close_step`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sim.protocol.wire import Message, Vector

SERVER = -1
"""Address of the server in :class:`Send`; clients are addressed by their population index (>= 0)."""


class ProtocolError(Exception):
    """A protocol step that cannot go on."""


class RoundSetupError(ValueError):
    """Parameters with which a round cannot be run safely or at all; the round aborts with this reason."""


class LocalProtocolError(ProtocolError):
    """The driver used a machine out of turn (a bug in the caller, not the peer)."""


class RemoteProtocolError(ProtocolError):
    """A peer sent a message that is not legal now; ``peer`` names it (``SERVER`` or a client index)."""

    def __init__(self, peer: int, reason: str) -> None:
        self.peer = peer
        self.reason = reason
        who = "server" if peer == SERVER else f"client {peer}"
        super().__init__(f"{who}: {reason}")


@dataclass(frozen=True)
class Send:
    """A message for ``to`` (``SERVER`` or a client index)."""

    to: int
    message: Message


@dataclass(frozen=True)
class Work:
    """One operation a machine performed, to be charged in virtual time.

    ``op`` names an operation of the cost model (e.g. ``fedavg.accumulate``); ``size`` gives the
    features its cost is linear in (e.g. ``{"elements": 1e6}``).
    """

    op: str
    size: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Reaction:
    """What a machine asks of its driver after one input: messages to send, work done."""

    sends: tuple[Send, ...] = ()
    work: tuple[Work, ...] = ()


@dataclass(frozen=True)
class Aggregate:
    """A finished aggregation: the aggregated vector and who contributed to it.

    ``vector`` is the weighted mean of the survivors' updates (a :class:`~sim.protocol.wire.Blank` in
    timing fidelity); ``weight`` the sum of their weights (sample counts).
    """

    vector: Vector
    survivors: tuple[int, ...]
    weight: float


class ServerMachine(Protocol):
    step: str
    """Name of the step being collected, or ``"done"`` / ``"aborted"``."""
    outcome: str
    """``"ok"`` once done, ``"aborted: <reason>"`` when the round cannot complete, ``""`` before."""
    aggregate: Aggregate | None

    def begin(self) -> Reaction:
        """Start the first step; returns the server's requests."""
        ...

    def expected(self) -> frozenset[int]:
        """Clients whose message the current step still waits for."""
        ...

    def receive(self, sender: int, message: Message) -> Reaction: ...

    def close_step(self) -> Reaction:
        """End the current step with whoever answered; go to the next step, finish, or abort."""
        ...


class ClientMachine(Protocol):
    first_step: str
    """The step :meth:`start` performs (for dropout before it)."""

    def start(self, update: Vector, weight: float) -> Reaction:
        """Enter the protocol with this round's local update and its weight (sample count)."""
        ...

    def stage_of(self, message: Message) -> str:
        """The step that handling ``message`` would perform (for dropout before it)."""
        ...

    def receive(self, message: Message) -> Reaction: ...
