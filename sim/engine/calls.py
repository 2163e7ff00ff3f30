"""The clients' machine calls of a round: made in turn, or made ahead of virtual time on threads.

A client's calls of its machine (``start``, ``receive``) are made when the client reaches them in virtual
time (:class:`CallsInTurn`), or, in ``full`` fidelity with ``aggregation.threads`` > 1, ahead on threads and
taken there (:class:`CallsMadeAhead`, over :class:`sim.engine.ahead.CallsAhead`). Either way the round
(:class:`sim.engine.virtual_round.Round`) gets the same reactions and records the same times, and never asks which
one it has.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sim.engine.ahead import CallsAhead, Outcome
from sim.protocol import wire
from sim.protocol.machine import ClientMachine, Reaction
from sim.protocol.wire import Message, Vector


class CallsInTurn:
    """Each call made when its client reaches it. ``finished`` gets each (client, instance) whose machine has
    done its part, as of the calls made so far."""

    decodes_on_arrival = True
    """Whether a client's message from the server is decoded as it arrives (else where the call is made)."""

    def __init__(self, finished: set[tuple[int, int]]) -> None:
        self.finished = finished
        self.ahead: CallsAhead | None = None
        """The calls made ahead, if any."""

    def trained(
        self,
        c: int,
        machine: Callable[[], ClientMachine],
        leaves_first: Callable[[ClientMachine], bool],
        update: Vector,
        weight: float,
    ) -> None:
        """Client ``c`` (of a round of one instance) has trained ``update``: nothing to do in turn."""
        return None

    def early_machine(self, c: int) -> ClientMachine | None:
        """Client ``c``'s machine made when it trained (None: none was)."""
        return None

    def start_ahead(self, c: int, j: int, machine: ClientMachine, update: Vector, weight: float) -> None:
        """Client ``c``'s instance ``j`` has its input: nothing to do in turn."""
        return None

    def server_sent(self, to: int, chunk: int, message: Message) -> None:
        """The server sent ``message`` to client ``to``'s instance ``chunk``: nothing to do in turn."""
        return None

    def decoded_reply(self, message: Message) -> Message | None:
        """The message the server decodes from a client's ``message``, decoded ahead (None: decode it)."""
        return None

    def start(self, c: int, j: int, machine: ClientMachine, update: Vector, weight: float) -> Reaction:
        """``machine.start(update, weight)`` of client ``c`` (instance ``j``)."""
        return self._made(c, j, machine, None, lambda: machine.start(update, weight))

    def arrived(self, c: int, j: int, message: Message) -> tuple[Message, Outcome | None]:
        """What client ``c`` (instance ``j``) decodes of ``message`` from the server, with the receipt made
        ahead (None: it is made in turn). In turn the message came decoded already."""
        return message, None

    def receive(self, c: int, j: int, machine: ClientMachine, message: Message, ahead: Outcome | None) -> Reaction:
        """``machine.receive(message)`` of client ``c`` (instance ``j``), or that call made ahead
        (:meth:`arrived`); raises what it raised."""
        return self._made(c, j, machine, ahead, lambda: machine.receive(message))

    def _made(
        self, c: int, j: int, machine: ClientMachine, ahead: Outcome | None, call: Callable[[], Reaction]
    ) -> Reaction:
        if ahead is None:
            try:
                return call()
            finally:
                if machine.finished:
                    self.finished.add((c, j))
        if ahead.finished:
            self.finished.add((c, j))
        return ahead.result()

    def close(self) -> None:
        """The round is over."""
        return None


class CallsMadeAhead(CallsInTurn):
    """Calls made ahead on ``executor``'s threads (:mod:`sim.engine.ahead`) and taken in turn. ``leaves(c,
    machine, message)`` says whether client ``c`` leaves before handling ``message``; ``frames`` are the
    round's frames by message id; ``frame`` encodes a message once a round."""

    decodes_on_arrival = False
    ahead: CallsAhead

    def __init__(
        self,
        finished: set[tuple[int, int]],
        executor: ThreadPoolExecutor,
        leaves: Callable[[int, ClientMachine, Message], bool],
        frames: dict[int, tuple[Message, bytes]],
        frame: Callable[[Message], bytes],
    ) -> None:
        super().__init__(finished)
        self.ahead = CallsAhead(executor, leaves, frames)
        self.frame = frame
        self.early: dict[int, ClientMachine] = {}
        """Client -> its machine, made when its update was trained so that its start could be made ahead."""

    def trained(
        self,
        c: int,
        machine: Callable[[], ClientMachine],
        leaves_first: Callable[[ClientMachine], bool],
        update: Vector,
        weight: float,
    ) -> None:
        """Make client ``c``'s machine now and its start ahead, unless it leaves before its first step."""
        made = self.early[c] = machine()
        if not leaves_first(made):
            self.ahead.start(c, 0, made, update, weight)

    def early_machine(self, c: int) -> ClientMachine | None:
        return self.early.pop(c, None)

    def start_ahead(self, c: int, j: int, machine: ClientMachine, update: Vector, weight: float) -> None:
        self.ahead.start(c, j, machine, update, weight)

    def server_sent(self, to: int, chunk: int, message: Message) -> None:
        self.ahead.sent(to, chunk, message, self.frame(message))

    def decoded_reply(self, message: Message) -> Message | None:
        return self.ahead.for_server_of(message)

    def start(self, c: int, j: int, machine: ClientMachine, update: Vector, weight: float) -> Reaction:
        return self._made(c, j, machine, self.ahead.take_start(c, j), lambda: machine.start(update, weight))

    def arrived(self, c: int, j: int, message: Message) -> tuple[Message, Outcome | None]:
        """Without a call made ahead (its lane closed before it) the client decodes the frame now."""
        ahead = self.ahead.take(c, j, message)
        if ahead is None:
            return wire.decode(self.frame(message)), None
        if ahead.received is None:  # decoding the frame failed: raised here, as it would have been on arrival
            ahead.result()
        assert ahead.received is not None
        return ahead.received, ahead

    def close(self) -> None:
        """Calls made ahead and not taken are dropped or waited for."""
        self.ahead.close()
