"""A simulation engine's actor pool in virtual time (``testbed: {emulation: engine}``).

Flower's ``run_simulation`` plays every client of a round on one host through a pool of Ray actors
(docs/profiles.md, "Flower's simulation engine"); the cost profile declares what that engine costs
(:class:`sim.costs.engine.EngineCosts`). The round (:mod:`sim.engine.virtual_round`) charges it here:

- a message the server sends waits for the engine's next sweep (:meth:`ActorEngine.next_sweep`) and needs
  no link: every party is on the host. The sweeps run every ``delivery_interval_s`` for the whole run,
  in step with the server's polls when the run starts: a sweep passes at the instant of the run's
  start, so the first round's first messages wait the interval less the server's work before it sends
  them. As the server polls every ``pull_interval_s`` from each send, each later send waits the last
  wait less the server's time in between (modulo the interval), as 13 of 24 probed Flower rounds of
  10 to 20 clients did (in the others the sweep came just after the sends; docs/profiles.md, "Flower's
  simulation engine");
- a client handles each message it receives, whole, on one of :attr:`ActorEngine.workers` workers (first
  come, first served): decoding it, its protocol work and encoding its replies, plus the engine's own
  cost of the message and of its replies (:class:`~sim.costs.engine.EngineCosts`), as jobs on the
  host's shared cores (:class:`sim.engine.host.SharedHost`, which the server's work shares too);
- a reply reaches the server machine at the server's first poll after it was stored: the server polls
  every ``pull_interval_s`` from the moment it sent the step's messages (:meth:`ActorEngine.next_poll`).
"""

from __future__ import annotations

import math

import simpy

from sim.costs.engine import EngineCosts


class ActorEngine:
    """The worker pool and the polling clock of one run (one per simulator: the actors outlive rounds)."""

    def __init__(self, env: simpy.Environment, costs: EngineCosts, cores: int) -> None:
        self.env = env
        self.costs = costs
        self.workers = simpy.Resource(env, capacity=costs.workers(cores))
        """One per actor: a client holds one while it handles a message."""
        self.poll_origin = 0.0
        """Virtual time the server last sent a step's messages: its polls for the replies count from there."""

    def next_sweep(self, at: float) -> float:
        """The engine's first sweep after ``at`` (virtual seconds), when a message the server sends then
        reaches the actors' queue: sweeps are at ``j * interval`` from the run's start, and one at ``at``
        itself (to round-off) has passed; ``at`` itself with no sweep interval."""
        interval = self.costs.delivery_interval_s
        if interval <= 0:
            return at
        sweeps = at / interval  # one less than a whole number by round-off is on that sweep
        return (math.floor(sweeps + 1e-9 * max(1.0, sweeps)) + 1) * interval

    def sent(self) -> None:
        """The server sent messages now: its polling for their replies starts over."""
        self.poll_origin = float(self.env.now)

    def next_poll(self, at: float) -> float:
        """The first of the server's polls at or after ``at`` (virtual seconds): ``origin + j * interval``;
        ``at`` itself with no polling interval."""
        interval = self.costs.pull_interval_s
        if interval <= 0 or at <= self.poll_origin:
            return max(at, self.poll_origin)
        polls = math.ceil((at - self.poll_origin) / interval - 1e-9)  # a reply stored on a poll counts then
        return max(at, self.poll_origin + polls * interval)

    def received_seconds(self, nbytes: float) -> float:
        """Reference seconds of a worker for handing a client a message of ``nbytes`` bytes."""
        return self.costs.message_seconds(nbytes)

    def replies_seconds(self, sizes: list[int]) -> float:
        """Reference seconds of a worker for taking back a client's replies of ``sizes`` bytes."""
        return sum(self.costs.payload_seconds(n) for n in sizes)
