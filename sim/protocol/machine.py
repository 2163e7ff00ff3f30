"""The contract between aggregation protocol machines and the drivers that run them.

A machine is a pure state machine in the manner of h11: the driver hands it a message (or tells it that a
collection step is over) and gets back a :class:`Reaction`: the messages to send and the :class:`Work` it
did, which the SimPy driver turns into virtual time through the cost model and the socket driver simply
performs. Machines never touch a clock, a socket, simpy, asyncio or torch (the ``sans-io`` and ``clock``
contracts of ``.importlinter``); randomness and inputs come in as arguments. A message that is illegal
in the current state raises :class:`RemoteProtocolError` (the peer broke the protocol) and leaves the
machine's state unchanged; a driver calling a machine out of turn gets :class:`LocalProtocolError`.

Server machines collect one *step* at a time (Dordis section 4.1: a round-trip step starts with the
server's request and ends with the clients' responses). The driver delivers responses with
:meth:`ServerMachine.receive` and, when every client the step still expects has answered, has
disconnected, or the step's timeout has passed, calls :meth:`ServerMachine.close_step`.

What a driver gets, and does, when a peer misbehaves:

- ``receive`` raises :class:`RemoteProtocolError` naming the sender (its ``peer``): *reject this client*. The
  message was checked where it entered (ids in the round and the sender's neighbourhood, lengths, indices,
  keys, vector sizes, duplicates, a sender speaking for another id) and refused; the machine is unchanged,
  and the driver drops that client from the round (it ignores what it sends from then on).
- A client machine's ``receive`` raises :class:`RemoteProtocolError` with ``peer == SERVER``: the client
  refuses the server's message and leaves the round.
- ``close_step`` returns a :class:`Reaction` with ``liars``: *report these clients*. Their shares contradicted
  the other holders' and were outvoted; the step went on without them (what they sent before, such as a
  masked input, stays in the sum). A driver reports them as it reports a refused message.
- ``close_step`` raises :class:`RoundAbortedError`: *abort the round*. What the clients sent cannot be
  put together (the shares of a secret contradict each other and the liar cannot be outvoted); the
  machine has already moved to step ``"aborted"`` with ``outcome`` giving the reason (as h11 moves a
  connection to ERROR), and ``suspects`` names the clients found lying, if any. A driver ends the round
  as for any other abort. Running short of clients (dropout) is no error: ``close_step`` returns and the
  machine is ``"aborted"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sim.errors import RoundSetupError  # noqa: F401  (re-exported: raised by machines, imported from here)
from sim.protocol.wire import Message, Vector

SERVER = -1
"""Address of the server in :class:`Send`; clients are addressed by their population index (>= 0)."""


class ProtocolError(Exception):
    """A protocol step that cannot go on."""


class RoundAbortedError(ProtocolError):
    """The round cannot complete with what the clients sent; the server machine is now ``"aborted"``.

    ``suspects`` are the clients whose messages were found inconsistent with the others' (possibly none:
    a contradiction among n shares with fewer than t + 2 of them cannot say who lied)."""

    def __init__(self, reason: str, suspects: tuple[int, ...] = ()) -> None:
        self.reason = reason
        self.suspects = suspects
        super().__init__(reason)


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
    """What a machine asks of its driver after one input: messages to send, work done, liars found."""

    sends: tuple[Send, ...] = ()
    work: tuple[Work, ...] = ()
    liars: tuple[tuple[int, str], ...] = ()
    """``(client, what it sent)`` for clients whose contributions a server machine set aside while closing a
    step (shares that contradicted the other holders'); the step went on without them."""


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
    @property
    def step(self) -> str:
        """Name of the step being collected, or ``"done"`` / ``"aborted"`` (read only: a machine may keep its
        states as an enum and give their names here)."""
        ...

    outcome: str
    """``"ok"`` once done, ``"aborted: <reason>"`` when the round cannot complete, ``""`` before."""
    aggregate: Aggregate | None
    """The round's aggregate once done (None before, or when it aborted)."""
    exposed: int | None
    """How many clients' sum the machine has unmasked, even if the round then aborted (XNoise unmasks
    before it removes the excess noise); None while nothing is revealed. Privacy accounting charges it."""

    def begin(self) -> Reaction:
        """Start the first step; returns the server's requests."""
        ...

    def expected(self) -> frozenset[int]:
        """Clients whose message the current step still waits for."""
        ...

    def awaits(self, client: int) -> bool:
        """Whether ``client`` is in :meth:`expected`, in O(1) (asked once per message)."""
        ...

    def receive(self, sender: int, message: Message) -> Reaction: ...

    def close_step(self) -> Reaction:
        """End the current step with whoever answered; go to the next step, finish, or abort. Raises
        :class:`RoundAbortedError`, already aborted, when what the clients sent contradicts itself."""
        ...


class ClientMachine(Protocol):
    first_step: str
    """The step :meth:`start` performs (for dropout before it)."""
    finished: bool
    """Whether the client has done its whole part of the round (nothing more is asked of it)."""

    def start(self, update: Vector, weight: float) -> Reaction:
        """Enter the protocol with this round's local update and its weight (sample count)."""
        ...

    def stage_of(self, message: Message) -> str:
        """The step that handling ``message`` would perform (for dropout before it)."""
        ...

    def receive(self, message: Message) -> Reaction: ...
