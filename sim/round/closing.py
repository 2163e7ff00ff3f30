"""Closing a round's record: its outcome counts, client labels, what the server revealed, its step spans
and how busy its resources were. Every driver closes its records here, so that the tables mean the same
whatever played the round."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from sim.protocol.machine import ServerMachine
from sim.round.collector import Roster
from sim.round.records import ClientRecord, RoundRecord


def revealed(server: ServerMachine) -> int | None:
    """Survivors whose sum the server unmasked, even if the round then aborted (XNoise's noise removal);
    None if nothing was revealed."""
    if server.aggregate is not None:
        return len(server.aggregate.survivors)
    return server.exposed


def expose(record: RoundRecord, servers: Sequence[ServerMachine], pipelined: bool) -> None:
    """What the round's server machines revealed: ``exposed`` (the fewest survivors of any unmasked sum)
    and, pipelined, every chunk's ``exposures``."""
    exposures = [e for e in (revealed(server) for server in servers) if e is not None]
    record.exposed = min(exposures) if exposures else None
    record.exposures = exposures if pipelined else []


def close_record(
    record: RoundRecord, roster: Roster, sampled: Iterable[int], survivors: set[int], planned_drops: int
) -> None:
    """Final counts and client outcomes: every client outside the sum without another outcome is ``not
    aggregated``; the records go to ``record.clients`` in sample order."""
    record.survivors = len(survivors)
    record.dropped_planned = planned_drops
    record.timed_out = roster.timed_out()
    for c in sampled:
        if c not in survivors:
            roster.label(c, "not aggregated")
        record.clients.append(roster.records[c])


def step_spans(chunk_steps: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Each server step of a pipelined round from its first chunk's start to its last chunk's end, given
    every chunk's ``(step, start, end)``."""
    spans: dict[str, tuple[float, float]] = {}
    for step, start, end in chunk_steps:
        a, b = spans.get(step, (start, end))
        spans[step] = (min(a, start), max(b, end))
    return [(step, a, b) for step, (a, b) in spans.items()]


def client_cpu_share(records: list[ClientRecord], length: float) -> float:
    """Mean fraction of a round of ``length`` seconds the clients' CPUs were busy (training and protocol
    compute); NaN without clients."""
    cpu = [(r.compute_s + _finite(r.train_end - r.train_start)) / length for r in records]
    return sum(cpu) / len(cpu) if cpu else math.nan


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0
