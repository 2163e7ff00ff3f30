"""What each deployed party computed in a round, for ``dropsim calibrate``: ``operations.csv``.

Every computation a party runs on its compute thread is a :class:`~sim.deploy.compute.Call`: the CPU
seconds it took in that thread and the operations the simulator charges for it (``wire.decode`` of the
frame, the machine's reported work, ``wire.encode`` of each message it sends, the training's
``train.*``, and ``deploy.call``, which the simulator adds to every computation on a testbed:
:data:`sim.world.CALL_OP`). Each party adds one entry per round for its event loop (thread ``loop``): the
rest of its process's CPU seconds in the round (framing, reading and writing its sockets), with the
operations the simulator charges for those (``deploy.send`` and ``deploy.receive`` per frame:
:data:`sim.world.TRANSPORT_OPS`).

Workers send theirs to the server (:class:`sim.deploy.control.Operations`, checked here as hostile
input); the deployment appends every party's to ``operations.csv`` in the run's folder, one write per
round: ``round, party, thread, call, cpu_s, work`` with ``work`` a JSON list of ``[op, {feature: value}]``,
then a computation's instants (:data:`~sim.deploy.compute.CALL_TIMES`: asked for the processor, held it,
began in the compute thread, returned, back on the event loop), in seconds since the deployment began on
the server's clock (empty for a loop's row; files written before these columns have none).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.deploy.compute import CALL_TIMES, NO_TIMES, Call
from sim.deploy.control import Operations
from sim.protocol.machine import Work
from sim.results.writer import csv_bytes, write_atomic
from sim.world import CALL_OP, TRANSPORT_OPS

FILE = "operations.csv"
BASE_COLUMNS = ("round", "party", "thread", "call", "cpu_s", "work")
"""The columns of files written before a computation's instants were kept (read as well)."""
COLUMNS = (*BASE_COLUMNS, *CALL_TIMES)
COMPUTE, LOOP = "compute", "loop"
THREADS = (COMPUTE, LOOP)
MAX_NAME = 64
"""Longest operation or feature name accepted from a worker (the profile's are under 40 characters)."""


@dataclass(frozen=True)
class Entry:
    """One computation of a party (``thread`` :data:`COMPUTE`), or its event loop's round (:data:`LOOP`);
    ``times`` are the computation's instants (:attr:`sim.deploy.compute.Call.times`), NaN for a loop."""

    thread: str
    cpu_s: float
    work: tuple[Work, ...]
    times: tuple[float, ...] = NO_TIMES

    def shifted(self, by: float) -> Entry:
        """This entry with its instants moved by ``by`` seconds (from a party's clock to the run's)."""
        return Entry(self.thread, self.cpu_s, self.work, _shift(self.times, by))


def _shift(times: tuple[float, ...], by: float) -> tuple[float, ...]:
    return times if times is NO_TIMES else tuple(t + by for t in times)


def loop_work(sent: Iterable[int], received: Iterable[int]) -> tuple[Work, ...]:
    """The operations the simulator charges a party's event loop for the frames of ``sent`` and
    ``received`` bytes."""
    send, receive = TRANSPORT_OPS
    return (*(Work(send, {"bytes": float(n)}) for n in sent), *(Work(receive, {"bytes": float(n)}) for n in received))


def entries(calls: Sequence[Call], process_cpu_s: float, sent: Iterable[int], received: Iterable[int]) -> list[Entry]:
    """A party's round: its compute thread's ``calls``, and its loop's share of ``process_cpu_s`` (the
    process's CPU seconds in the round, less the calls')."""
    compute = sum(c.cpu_s for c in calls)
    loop = Entry(LOOP, max(0.0, process_cpu_s - compute), loop_work(sent, received))
    return [*(Entry(COMPUTE, c.cpu_s, (*c.work, Work(CALL_OP, {})), c.times) for c in calls), loop]


def to_message(round: int, party: list[Entry]) -> Operations:
    """A worker's round as a control message."""
    return Operations(
        round,
        tuple(
            (
                e.thread.encode(),
                e.cpu_s,
                e.times,
                tuple((w.op.encode(), tuple((k.encode(), float(v)) for k, v in w.size.items())) for w in e.work),
            )
            for e in party
        ),
    )


def _name(raw: bytes, what: str) -> str:
    text = raw.decode("ascii", errors="replace")
    if not 0 < len(raw) <= MAX_NAME or not all(ch.isalnum() or ch in "._-" for ch in text):
        raise ValueError(f"{what} {text[:MAX_NAME]!r}: 1 to {MAX_NAME} letters, digits, '.', '_' or '-'")
    return text


def _times(times: tuple[float, ...], thread: str) -> tuple[float, ...]:
    """A computation's instants as a worker sent them: five non-decreasing finite seconds for a computation,
    five NaNs for a loop (or a computation whose instants were not kept)."""
    if len(times) != len(CALL_TIMES):
        raise ValueError(f"{len(times)} instants: {len(CALL_TIMES)} expected ({', '.join(CALL_TIMES)})")
    if all(math.isnan(t) for t in times):
        return NO_TIMES
    if thread == LOOP:
        raise ValueError("a loop's entry has no instants (NaN expected)")
    if not all(math.isfinite(t) and abs(t) < 1e12 for t in times) or list(times) != sorted(times):
        raise ValueError(f"instants {times!r}: finite and non-decreasing expected")
    return tuple(times)


def from_message(
    message: Operations, shift: float = 0.0, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> list[Entry]:
    """A worker's round from its control message, its instants moved by ``shift`` seconds (from the worker's
    clock to the run's), each then within ``bounds``; :class:`ValueError` saying what is wrong with it."""
    out = []
    for thread, cpu, times, work in message.calls:
        name = _name(thread, "thread")
        if name not in THREADS:
            raise ValueError(f"thread {name!r}: {' or '.join(THREADS)} expected")
        if not (math.isfinite(cpu) and 0 <= cpu < 1e6):
            raise ValueError(f"CPU seconds {cpu!r}: a finite number >= 0 expected")
        instants = _shift(_times(times, name), shift)
        if instants is not NO_TIMES and not all(bounds[0] <= t <= bounds[1] for t in instants):
            lo, hi = bounds
            raise ValueError(f"instants {instants!r} on the run's clock: between {lo:g} and {hi:g} s expected")
        items = []
        for op, features in work:
            size = {}
            for key, value in features:
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{op[:MAX_NAME]!r} feature value {value!r}: a finite number >= 0 expected")
                size[_name(key, "feature")] = value
            items.append(Work(_name(op, "operation"), size))
        out.append(Entry(name, cpu, tuple(items), instants))
    return out


def work_json(work: Sequence[Work]) -> str:
    return json.dumps([[w.op, dict(w.size)] for w in work], separators=(",", ":"))


def work_from_json(text: str) -> tuple[Work, ...]:
    """The operations of a ``work`` cell (a file may be anyone's: checked)."""
    doc = json.loads(text)
    if not isinstance(doc, list):
        raise ValueError("a list of [op, {feature: value}] expected")
    out = []
    for item in doc:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise ValueError(f"{str(item)[:80]}: [op, {{feature: value}}] expected")
        size = {}
        for key, value in item[1].items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{item[0]}.{key} = {value!r}: a finite number expected")
            size[str(key)] = float(value)
        out.append(Work(item[0], size))
    return tuple(out)


class OperationsLog:
    """``operations.csv`` in ``folder``, a round's rows appended at once."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILE
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, csv_bytes([], COLUMNS, header=True))

    def append(self, round: int, parties: dict[str, list[Entry]]) -> None:
        rows = [
            {
                "round": round,
                "party": party,
                "thread": e.thread,
                "call": i,
                "cpu_s": e.cpu_s,
                "work": work_json(e.work),
                **dict(zip(CALL_TIMES, e.times, strict=True)),  # NaN (a loop's) written empty
            }
            for party, party_entries in parties.items()
            for i, e in enumerate(party_entries)
        ]
        with self.path.open("ab", buffering=0) as f:
            f.write(csv_bytes(rows, COLUMNS))


THROTTLES_FILE = "throttles.csv"
THROTTLES_COLUMNS = ("round", "party", "throttled_periods", "throttled_s")


class ThrottleLog:
    """``throttles.csv`` in ``folder``, on a kernel testbed: per round and party (``server``, or a client's
    number), the CFS periods in which its cgroup's quota held it back, and the seconds it was held back
    (its ``cpu.stat``: :meth:`sim.deploy.kernel.KernelEmulation.throttles`). A round's rows appended at
    once."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / THROTTLES_FILE
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, csv_bytes([], THROTTLES_COLUMNS, header=True))

    def append(self, round: int, parties: dict[str, tuple[int, float]]) -> None:
        rows = [
            {"round": round, "party": party, "throttled_periods": periods, "throttled_s": seconds}
            for party, (periods, seconds) in parties.items()
        ]
        with self.path.open("ab", buffering=0) as f:
            f.write(csv_bytes(rows, THROTTLES_COLUMNS))
