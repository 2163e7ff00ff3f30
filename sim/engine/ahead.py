"""Clients' protocol calls made ahead of virtual time, on threads (scenario ``aggregation.threads``).

In virtual time each client handles each message at its own moment, one client after another on the
simulator's one thread. But what a client machine's call returns does not depend on when it is made: the
machine's state changes only through its own calls, made in the order its client makes them, and its
random sources are its own (:mod:`sim.protocol.instances`). So each call can be made as soon as its
inputs exist, on a thread, while the simulator goes on:

- a client's ``start`` once its update is trained;
- its ``receive`` of a server message as soon as the server sends it, together with decoding the frame,
  encoding the replies, and decoding those as the server will.

When the client reaches the call in virtual time, the simulator takes the result made ahead (waiting for it
if need be) and charges its work as it would have: every virtual time, record and table is the same
whatever the number of threads (``tests/test_ahead.py``). Numpy and AES-CTR, the bulk of a call at large
dimensions, release Python's lock, so the calls of a broadcast's clients, the server's work and the next
clients' training overlap (docs/performance.md, section 6).

Each client (and chunk, in a pipelined round) has a :class:`Lane`: its calls run one after another, in the
order the client will make them. A message the client will never handle (it leaves before that step) closes
its lane. A client handles its messages in the order the server sent them: the server sends a client a
step's message only once it has its answer to the step before, and a client's messages share its links
with equal rates. A message taken out of that order is an error, never a wrong result.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sim.dp.noise import usable_cores
from sim.protocol import wire
from sim.protocol.machine import ClientMachine, Reaction
from sim.protocol.wire import Message, Vector

__all__ = ["CallsAhead", "Outcome", "ahead_threads"]

THREAD_NAME = "dropsim-ahead"


def ahead_threads(threads: int | None) -> ThreadPoolExecutor | None:
    """The threads that make a run's calls ahead (``aggregation.threads``; None: as many as the cores this
    process may use; 1, or one core: none, every call in turn)."""
    count = usable_cores() if threads is None else threads
    return ThreadPoolExecutor(count, thread_name_prefix=THREAD_NAME) if count > 1 else None


@dataclass(frozen=True)
class Outcome:
    """One call made ahead: the message as the client decoded it (None for the start), what the call
    returned or raised, and each reply's frame with the message the server decodes from it."""

    received: Message | None
    reaction: Reaction | None = None
    error: Exception | None = None
    replies: tuple[tuple[bytes, Message], ...] = ()
    finished: bool = False
    """The machine's ``finished`` after the call."""
    skipped: bool = False
    """Not made: an earlier call of its lane raised (the client stops there, as it does in turn)."""
    thread: str = ""
    """The thread it was made on."""

    def result(self) -> Reaction:
        """What the call returned; raises what it raised."""
        if self.error is not None:
            raise self.error
        assert self.reaction is not None, "a call skipped after an error is never taken"
        return self.reaction


@dataclass
class Lane:
    """One client's (or one chunk's) calls: made ahead in order, taken in the same order."""

    machine: ClientMachine | None = None
    """Set when the client's start is made ahead (the lane opens)."""
    pending: list[tuple[Message, bytes]] = field(default_factory=list)
    """Messages sent before the lane opened, with their frames."""
    calls: deque[tuple[Message | None, Future[Outcome]]] = field(default_factory=deque)
    """Calls made ahead and not yet taken, in order: the message each handles (None: the start)."""
    last: Future[Outcome] | None = None
    closed: bool = False
    """The client leaves before handling some message: nothing after it is made ahead."""


class CallsAhead:
    """One round's clients' calls made ahead on ``executor``'s threads. ``leaves(c, machine, message)`` says
    whether client ``c`` leaves before handling ``message`` (its planned dropout). The frames of the replies
    taken go into ``frames`` (the round's frames by message id, each with its message); ``decode`` makes a
    message of a frame."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        leaves: Callable[[int, ClientMachine, Message], bool],
        frames: dict[int, tuple[Message, bytes]],
        decode: Callable[[bytes], Message] = wire.decode,
    ) -> None:
        self.executor = executor
        self.leaves = leaves
        self.frames = frames
        self.decode = decode
        self.lanes: dict[tuple[int, int], Lane] = {}
        self.taken = 0
        """Calls made ahead and taken so far."""
        self.thread_names: set[str] = set()
        """The threads the calls taken were made on."""
        self.for_server: dict[int, tuple[Message, Message]] = {}
        """A reply's id -> (the reply, the message the server decodes from its frame)."""

    def start(self, c: int, j: int, machine: ClientMachine, update: Vector, weight: float) -> None:
        """Make client ``c``'s ``machine.start(update, weight)`` (instance ``j``) ahead, then its receipt of
        the messages sent to it meanwhile."""
        lane = self.lanes.setdefault((c, j), Lane())
        assert lane.machine is None, f"client {c} (instance {j}) started twice"
        lane.machine = machine
        self._submit(lane, None, None, lambda _: machine.start(update, weight))
        pending, lane.pending = lane.pending, []
        for message, frame in pending:
            self._receive(c, lane, message, frame)

    def sent(self, c: int, j: int, message: Message, frame: bytes) -> None:
        """The server sent ``message`` (encoded as ``frame``) to client ``c``'s instance ``j``: make its
        receipt ahead (once the client has started)."""
        lane = self.lanes.setdefault((c, j), Lane())
        if lane.machine is None:
            lane.pending.append((message, frame))
        else:
            self._receive(c, lane, message, frame)

    def _receive(self, c: int, lane: Lane, message: Message, frame: bytes) -> None:
        machine = lane.machine
        assert machine is not None
        if lane.closed or self.leaves(c, machine, message):
            lane.closed = True
            return
        self._submit(lane, message, frame, machine.receive)

    def _submit(
        self, lane: Lane, message: Message | None, frame: bytes | None, call: Callable[[Any], Reaction]
    ) -> None:
        """Make ``call`` (of the message decoded from ``frame``; None: the start) after the lane's last call."""
        assert lane.machine is not None
        lane.last = self.executor.submit(_made, lane.last, lane.machine, frame, call, self.decode)
        lane.calls.append((message, lane.last))

    def take_start(self, c: int, j: int) -> Outcome | None:
        """Client ``c``'s start made ahead (waiting for it), or None if it was not."""
        return self._take(c, j, None)

    def take(self, c: int, j: int, message: Message) -> Outcome | None:
        """Client ``c``'s receipt of ``message`` made ahead (waiting for it), or None if it was not (its lane
        closed before it): then the client decodes and handles it in turn."""
        return self._take(c, j, message)

    def _take(self, c: int, j: int, message: Message | None) -> Outcome | None:
        lane = self.lanes.get((c, j))
        if lane is None or not lane.calls:
            return None
        made, future = lane.calls[0]
        if made is not message:
            # Not made ahead (its lane closed before it) can only follow every call that was: one still
            # waiting means the client would handle its messages in another order than the calls were made.
            raise RuntimeError(
                f"client {c} (instance {j}) handles a {type(message).__name__ if message is not None else 'start'} "
                f"before the {type(made).__name__ if made is not None else 'start'} sent to it earlier: its calls "
                "were made ahead in the order sent; run with aggregation.threads: 1"
            )
        lane.calls.popleft()
        outcome = future.result()
        self.taken += 1
        self.thread_names.add(outcome.thread)
        sends = outcome.reaction.sends if outcome.reaction is not None else ()
        for reply, (frame, decoded) in zip(sends, outcome.replies, strict=True):
            self.frames[id(reply.message)] = (reply.message, frame)
            self.for_server[id(reply.message)] = (reply.message, decoded)
        return outcome

    def for_server_of(self, message: Message) -> Message | None:
        """The message the server decodes from reply ``message``'s frame, decoded ahead (None if it was not)."""
        found = self.for_server.pop(id(message), None)
        return found[1] if found is not None and found[0] is message else None

    def close(self) -> None:
        """The round is over: calls not begun are dropped, those under way waited for (their clients have
        left or finished; nothing is taken from them)."""
        futures = [future for lane in self.lanes.values() for _, future in lane.calls]
        for future in futures:
            future.cancel()
        for future in futures:
            if not future.cancelled():
                future.exception()
        self.lanes.clear()
        self.for_server.clear()


def _made(
    before: Future[Outcome] | None,
    machine: ClientMachine,
    frame: bytes | None,
    call: Callable[[Any], Reaction],
    decode: Callable[[bytes], Message],
) -> Outcome:
    """``call`` of the message decoded from ``frame`` (None: of None), once the call before it in its lane has
    been made (on a thread: the executor's queue is first in, first out, so the one before has begun).
    Errors are carried, not raised: the client decoded the message (``received``) even if handling it
    raised."""
    if before is not None:
        try:
            earlier = before.result()
        except CancelledError:  # the round ended before it began
            return Outcome(None, skipped=True)
        if earlier.error is not None or earlier.skipped:
            return Outcome(None, skipped=True)
    received: Message | None = None
    thread = threading.current_thread().name
    try:
        if frame is not None:
            received = decode(frame)
        reaction = call(received)
        replies = tuple((frame, decode(frame)) for frame in (send.message.encode() for send in reaction.sends))
    except Exception as exc:  # raised where the client makes the call, in virtual time
        return Outcome(received, error=exc, finished=machine.finished, thread=thread)
    return Outcome(received, reaction, replies=replies, finished=machine.finished, thread=thread)
