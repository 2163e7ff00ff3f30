"""Collection steps: what a server does with each answer, departure and deadline, and the labels it gives.

A server machine collects one step at a time (docs/protocols.md, "Steps"). A step ends when every client
the machine still expects has answered or is out of the round, or when the step's timeout passes. Both
drivers feed a :class:`StepCollector` the events of a step in the order they reach the server: a
message (``MESSAGE``) or a closed connection (``GONE``), each with the time it arrived, or the news that
the deadline passed with nothing left to read. The collector decides:

- an event that arrived after the deadline closes the step (:data:`CLOSE`): the clients still awaited are
  late, ``timeout:<step>``, and whatever they send afterwards is discarded. A message that arrived by the
  deadline counts even when the busy server reads it later;
- a departure takes the client out of every instance of the round (:data:`SKIP`); a message that arrived
  before it and is read still counts (a client that uploads and leaves is in the sum). News that another
  instance put a client out (``OUT``) only wakes the step (:data:`SKIP`);
- a message from a late or refused client is :data:`DISCARD`-ed, and so is one the step did not ask for
  from a client that has left (it was on its way as the step went on without it);
- a message the step did not ask a client still in the round for is :data:`UNASKED`: the driver refuses
  it (:meth:`Roster.reject`), which puts the client out of the round;
- anything else is :data:`ACCEPT`-ed: the driver decodes it and hands it to the machine; a message that
  does not decode or that the machine refuses is rejected the same way.

With ``lazy`` the timeout counts from the step's first message, not from its start: a pipelined round's
later chunks, whose clients reach them one chunk after another.

Two consequences of these rules, kept as they are because the simulator's results depend on them (both
drivers apply them alike; changing them is a change of results, not of structure):

- a departure counts for every instance from the moment any instance reads it. Another instance whose
  inbox still holds an earlier message of that client reads it only while it waits for somebody else;
  if that client was the last one it waited for, its step ends without the message;
- the event that closes a step is consumed by it: a departure that arrives after the deadline closes the
  step and is not seen by the later steps, which wait for that client until their own timeouts.

A :class:`Roster` holds who is out of a round and why, for all the round's instances (one per chunk):
its labels are the ``dropped_stage`` of the clients table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from sim.protocol.machine import RoundAbortedError, ServerMachine
from sim.round.records import ClientRecord

MESSAGE, GONE, OUT = "msg", "gone", "out"
"""Kinds of event a server's inbox holds: a client's message, its connection closing (it left), and news
that another instance of the round put the client out (late or refused), which wakes a step waiting for it."""


class Decision(Enum):
    """What the driver does with an event (see the module's docstring)."""

    ACCEPT = "accept"
    SKIP = "skip"
    DISCARD = "discard"
    UNASKED = "unasked"
    CLOSE = "close"


ACCEPT, SKIP, DISCARD, UNASKED, CLOSE = Decision


@dataclass
class Roster:
    """The sampled clients of one round, who of them is out, and why (their records' ``dropped_stage``)."""

    records: Mapping[int, ClientRecord]
    gone: set[int] = field(default_factory=set)
    """Out of the round as far as the server knows: left (the server saw their connection close), late, or
    refused. It grows only through :meth:`miss`, :meth:`depart` and :meth:`reject`."""
    late: set[int] = field(default_factory=set)
    """Missed a step's deadline."""
    refused: set[int] = field(default_factory=set)
    """Sent a message the server refused."""
    answered: dict[tuple[int, str], set[int]] = field(default_factory=dict)
    """(instance, step) -> the clients whose answer the step's machine took: the round's step decisions,
    the same whichever driver played it."""
    departed: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Client -> the step during which the server first saw it leave, and when (a deployment labels a
    connection that closed without a word ``offline:<step>``)."""
    gone_order: list[int] = field(default_factory=list)
    """:attr:`gone` in the order its members joined it (a collector tells who left since it last looked)."""

    def _leave(self, c: int) -> None:
        if c not in self.gone:
            self.gone.add(c)
            self.gone_order.append(c)

    def label(self, c: int, stage: str) -> None:
        """Give client ``c`` the outcome ``stage`` unless it has one already."""
        if not self.records[c].dropped_stage:
            self.records[c].dropped_stage = stage

    def miss(self, c: int, step: str) -> None:
        """Client ``c`` missed the deadline of ``step``: it is out from now on."""
        self.late.add(c)
        self._leave(c)
        self.label(c, f"timeout:{step}")

    def depart(self, c: int, step: str, at: float, reason: str = "") -> None:
        """The server saw client ``c`` leave during ``step`` at ``at`` (``reason``: why its connection was
        closed, when the server closed it)."""
        self._leave(c)
        self.departed.setdefault(c, (step, at))
        if reason:
            self.label(c, f"rejected: {reason}")

    def reject(self, c: int, reason: str) -> None:
        """The server refused client ``c``'s message: it is out of the round, whatever it did before."""
        self.refused.add(c)
        self._leave(c)
        self.records[c].dropped_stage = f"rejected: {reason}"

    def excluded(self, c: int) -> bool:
        """Whether what ``c`` sends is discarded (late or refused)."""
        return c in self.late or c in self.refused

    def blame(self, error: RoundAbortedError) -> list[int]:
        """A step could not close (what the clients sent contradicts itself): the clients found lying are
        refused. Returns those newly refused."""
        blamed = [c for c in error.suspects if c in self.records and c not in self.refused]
        for c in blamed:
            self.reject(c, error.reason)
        return blamed

    def timed_out(self) -> int:
        return sum(1 for r in self.records.values() if r.dropped_stage.startswith("timeout:"))


class StepCollector:
    """One collection step of one server machine (one instance of the round)."""

    def __init__(
        self,
        machine: ServerMachine,
        roster: Roster,
        timeout: float | None,
        now: float,
        lazy: bool = False,
        instance: int = 0,
    ) -> None:
        self.machine = machine
        self.instance = instance
        self.roster = roster
        self.step = machine.step
        self.timeout = timeout
        self.deadline: float | None = None if timeout is None or lazy else now + timeout
        """When the step's deadline passes (None: not yet known, or none)."""
        self.missed: list[int] = []
        """The clients found late when the step closed, in order."""
        self._candidates: set[int] | None = None
        """A superset of the clients still awaited (those found not awaited are dropped as they are met)."""
        self._probe: int | None = None
        """One client found awaited when :meth:`waiting` last looked (kept out of ``_candidates``)."""
        self._mark = 0
        """How many had left the round (``roster.gone_order``) when :meth:`waiting` last looked."""

    def _awaits(self, c: int) -> bool:
        return self.machine.awaits(c) and c not in self.roster.gone

    def waiting(self) -> bool:
        """Whether the step still waits for someone: a client expected by the machine and not out of the
        round. A driver asks before it waits for the next event; if the deadline then passes, the clients
        awaited at that moment are the late ones (even one that left meanwhile: it missed the deadline too).

        Amortised O(1): within a step a client only ever stops being awaited (the machine took its answer, or
        it left), so each is dropped from the candidates at most once."""
        self._mark = len(self.roster.gone_order)
        if self._candidates is None:
            self._candidates = set(self.machine.expected() - self.roster.gone)
        if self._probe is not None and self._awaits(self._probe):
            return True
        self._probe = None
        while self._candidates:
            c = self._candidates.pop()
            if self._awaits(c):
                self._probe = c
                return True
        return False

    def awaited(self) -> list[int]:
        """The clients awaited when :meth:`waiting` last looked, sorted."""
        if self._candidates is None:
            self.waiting()
        assert self._candidates is not None
        since = set(self.roster.gone_order[self._mark :])  # left after the look: still awaited then
        found = self._candidates if self._probe is None else self._candidates | {self._probe}
        return sorted(c for c in found if self.machine.awaits(c) and (c not in self.roster.gone or c in since))

    def arrival(self, kind: str, sender: int, arrived: float, reason: str = "") -> Decision:
        """Decide on an event of ``kind`` from ``sender`` that reached the server at ``arrived`` (``reason``:
        why a connection was closed by the server)."""
        if self.deadline is not None and arrived > self.deadline:
            self.expire()
            return CLOSE
        if kind == GONE:
            self.roster.depart(sender, self.step, arrived, reason)
            return SKIP
        if kind == OUT:
            return SKIP
        if self.deadline is None and self.timeout is not None:
            self.deadline = arrived + self.timeout
        if self.roster.excluded(sender):
            return DISCARD
        if not self.machine.awaits(sender):
            # one that has left may still have had a message on its way: the step went on without it
            return DISCARD if sender in self.roster.gone else UNASKED
        return ACCEPT

    def took(self, sender: int) -> None:
        """The machine took ``sender``'s answer (it was accepted and the machine did not refuse it)."""
        self.roster.answered.setdefault((self.instance, self.step), set()).add(sender)

    def expire(self) -> list[int]:
        """The deadline passed: every client still awaited is late. Returns them (also :attr:`missed`)."""
        self.missed = self.awaited()
        for c in self.missed:
            self.roster.miss(c, self.step)
        return self.missed

    def unasked(self, what: str) -> str:
        """Why a message ``what`` is refused (:data:`UNASKED`)."""
        return f"a message it was not asked for in step {self.step} ({what})"
