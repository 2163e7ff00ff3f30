"""The deployment's own messages, beside the protocol's: configuration, round start and end, reports.

They use the protocol's versioned binary encoding (:mod:`sim.protocol.wire`, types 40-49) and travel in
the same authenticated frames (:mod:`sim.deploy.framing`) on channel :data:`CONTROL`. A worker is a client
process that plays one sampled client per round: the server tells it which (:class:`RoundStart`), what the
testbed asks of it (leave before a step: a planned dropout), and when the round is over
(:class:`RoundEnd`); the worker answers with its timeline (:class:`ClientReport`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from sim.protocol.private import PrivateRound
from sim.protocol.wire import (
    BYTES,
    F64,
    U8,
    U32,
    U64,
    Items,
    Message,
    RoundLimits,
    WireError,
    decode,
    list_of,
    peek_header,
    tuple_of,
)

CONTROL = 0xFFFF
"""Frame channel of control messages (protocol instances use channels 0.., one per chunk)."""

NO_RATE = -1.0
"""``RoundStart.rate`` when the round is accounted at the scenario's planned sampling rate."""


@dataclass(frozen=True)
class Config(Message):
    """The resolved scenario (JSON), sent to a worker once it has authenticated: every party of the
    testbed runs the same configuration, as the parties of a real deployment share their protocol's
    parameters. Nothing in it is secret: the clients' secrets come from each worker's operating system.
    ``deployment`` is the deployment's random id, to which every protocol signature is bound (a worker with
    a lasting key refuses an id it has seen). ``seeded`` (1: ``--seeded-secrets``) asks the workers to derive
    their secrets from the scenario seed instead, as the simulator does, which keeps nothing secret from
    anyone who has the scenario (a validation mode): a worker agrees only if it was started with the flag."""

    TYPE: ClassVar[int] = 40
    FIELDS: ClassVar = (("scenario", BYTES), ("digest", BYTES), ("deployment", BYTES), ("seeded", U8))
    scenario: bytes
    digest: bytes
    deployment: bytes = b""
    seeded: int = 0


MAX_SAMPLED = 1 << 20
"""Most clients a round start may list (a deployment runs at most a few dozen workers)."""


@dataclass(frozen=True)
class RoundStart(Message):
    """Round ``round`` starts; the worker plays ``client``. ``drop`` is the dropout stage the testbed
    makes it leave before (empty: it stays); ``chunks`` the round's protocol instances; ``rate`` the
    sampling rate the round is accounted at (:data:`NO_RATE`: the planned one); ``keys`` (malicious
    variant, else empty) the verification keys of the workers playing ``sampled``, in its order (empty for
    a client no worker plays: no signature verifies under it)."""

    TYPE: ClassVar[int] = 41
    ITEMS: ClassVar[Items] = Items.OWN
    FIELDS: ClassVar = (
        ("round", U32),
        ("client", U64),
        ("sampled", list_of(U64, limit=MAX_SAMPLED)),
        ("drop", BYTES),
        ("chunks", U32),
        ("rate", F64),
        ("keys", list_of(BYTES, limit=MAX_SAMPLED)),
    )
    round: int
    client: int
    sampled: tuple[int, ...]
    drop: bytes
    chunks: int
    rate: float
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class RoundEnd(Message):
    """Round ``round`` is over (the worker stops whatever it still does for it)."""

    TYPE: ClassVar[int] = 42
    FIELDS: ClassVar = (("round", U32), ("outcome", BYTES))
    round: int
    outcome: bytes


@dataclass(frozen=True)
class ClientReport(Message):
    """A worker's timeline of a round, in seconds of its monotonic clock (NaN for what it did not do),
    the protocol compute it did (busy seconds, slow-down included) and the CPU seconds of all its
    computations, training included (its compute thread's, without the slow-down)."""

    TYPE: ClassVar[int] = 43
    FIELDS: ClassVar = (
        ("round", U32),
        ("download_start", F64),
        ("download_end", F64),
        ("train_start", F64),
        ("train_end", F64),
        ("compute_s", F64),
        ("cpu_s", F64),
        ("upload_s", F64),
        ("last_upload_end", F64),
        ("left_at", F64),
        ("left", BYTES),
    )
    round: int
    download_start: float
    download_end: float
    train_start: float
    train_end: float
    compute_s: float
    cpu_s: float
    upload_s: float
    """Seconds its uploads took, first byte to last, summed."""
    last_upload_end: float
    left_at: float
    left: bytes


@dataclass(frozen=True)
class Leaving(Message):
    """A worker leaves the round before closing its connection: ``reason`` is its planned dropout stage
    or ``aborted: <why>`` (its machine refused a server message)."""

    TYPE: ClassVar[int] = 46
    FIELDS: ClassVar = (("round", U32), ("reason", BYTES))
    round: int
    reason: bytes


@dataclass(frozen=True)
class Clock(Message):
    """A worker's monotonic clock reading (seconds), sent right after the handshake so the server can
    place the worker's timeline on its own clock."""

    TYPE: ClassVar[int] = 44
    FIELDS: ClassVar = (("now", F64),)
    now: float


@dataclass(frozen=True)
class Decoded(Message):
    """A pipelined round's client has decoded every chunk's sum (Dordis Table 1, stage 5): its part of the
    round is over. The round ends when every survivor has said so."""

    TYPE: ClassVar[int] = 47
    FIELDS: ClassVar = (("round", U32),)
    round: int


@dataclass(frozen=True)
class Shutdown(Message):
    """The deployment is over: the worker exits."""

    TYPE: ClassVar[int] = 45
    FIELDS: ClassVar = (("reason", BYTES),)
    reason: bytes


FEATURES = list_of(tuple_of(BYTES, F64), limit=16)
WORK = list_of(tuple_of(BYTES, FEATURES), limit=4096)


@dataclass(frozen=True)
class Operations(Message):
    """A worker's computations in round ``round``, for ``dropsim calibrate``: one entry per computation of
    its compute thread, and one for its event loop (thread ``loop``: its process's other CPU seconds, with
    the frames it sent and received), each ``(thread, cpu_s, times, work)``: ``times`` the computation's
    five instants on the worker's clock (:data:`sim.deploy.compute.CALL_TIMES`; NaN for the loop), ``work``
    the operations the simulator charges for it as ``(op, ((feature, value), ...))``. Sent just before its
    :class:`ClientReport`."""

    TYPE: ClassVar[int] = 48
    ITEMS: ClassVar[Items] = Items.OWN
    FIELDS: ClassVar = (
        ("round", U32),
        ("calls", list_of(tuple_of(BYTES, F64, list_of(F64, limit=8), WORK), limit=4096)),
    )
    round: int
    calls: tuple[tuple[bytes, float, tuple[float, ...], tuple[tuple[bytes, tuple[tuple[bytes, float], ...]], ...]], ...]


@dataclass(frozen=True)
class Accepts(Message):
    """What a worker accepts (:mod:`sim.deploy.policy`), as one line of JSON: sent first on every connection,
    for the server's manifest. The worker checks its policy itself; this only tells the server."""

    TYPE: ClassVar[int] = 49
    FIELDS: ClassVar = (("policy", BYTES),)
    policy: bytes


ACCEPTS_BYTES = 4096
"""Largest :class:`Accepts` a worker may send (its policy is a few hundred bytes)."""

FROM_WORKER: frozenset[type[Message]] = frozenset(
    {Accepts, Clock, Shutdown, Decoded, Leaving, ClientReport, Operations}
)
"""What a worker may send on the control channel."""
FROM_SERVER: frozenset[type[Message]] = frozenset({Config, RoundStart, RoundEnd, Shutdown})
"""What the server may send on the control channel."""
WORKER_CONTROL_BYTES = 1 << 20
"""Largest control message a worker may send (reports and reasons: a few hundred bytes; a round's
operations: a few kilobytes)."""
SERVER_CONTROL_BYTES = 16 << 20
"""Largest control message the server may send (the scenario document, a round's client and key lists)."""


SMALLER: dict[int, int] = {Accepts.TYPE: ACCEPTS_BYTES}
"""Control message types with a smaller size limit than their sender's."""


def _decode(payload: bytes, allowed: frozenset[type[Message]], limit: int, sender: str) -> Message:
    """A control message of one of the ``allowed`` types, its type and size checked from the header before
    anything is decoded (decoding runs in the event loop: it must stay small)."""
    if len(payload) > limit:
        raise WireError(f"a control message of {len(payload)} bytes; the {sender} sends at most {limit}")
    mtype, _ = peek_header(payload)
    if mtype not in {cls.TYPE for cls in allowed}:
        raise WireError(f"message type {mtype} is no control message the {sender} sends")
    if len(payload) > SMALLER.get(mtype, limit):
        raise WireError(f"a control message of type {mtype} of {len(payload)} bytes; at most {SMALLER[mtype]}")
    return decode(payload)


def decode_from_worker(payload: bytes) -> Message:
    return _decode(payload, FROM_WORKER, WORKER_CONTROL_BYTES, "worker")


def decode_from_server(payload: bytes) -> Message:
    return _decode(payload, FROM_SERVER, SERVER_CONTROL_BYTES, "server")


def max_elements(dim: int, private: PrivateRound | None) -> int:
    """Most values a vector of a round's protocol messages holds: the model's, or the DP encoding's padded
    length; a receiver checks a frame's counts against it before decoding allocates anything."""
    return max(dim, private.encoding.padded if private is not None else 0)


def round_limits(dim: int, clients: int, private: PrivateRound | None) -> RoundLimits:
    """What a legal protocol message of a round of ``clients`` sampled clients holds at most: values in a
    vector (:func:`max_elements`) and, per message type, items in a list (one per client, or per client and
    noise component); a receiver checks a frame's counts against them before decoding allocates anything."""
    components = len(private.plan.components) if private is not None else 0
    return RoundLimits(max_elements(dim, private), clients, components)


MAX_REASON = 500
"""Most characters of a reason a worker gives (a dropout's label in the clients table) that are kept."""


def worker_text(raw: bytes) -> str:
    """Text a worker sent (why it left or quit), as the results keep it: UTF-8 (bad bytes replaced), control
    characters as ``?``, at most :data:`MAX_REASON` characters."""
    text = "".join(ch if ch.isprintable() else "?" for ch in raw[: 4 * MAX_REASON].decode(errors="replace"))
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


REPORT_TIMES = ("download_start", "download_end", "train_start", "train_end", "last_upload_end", "left_at")
"""A :class:`ClientReport`'s readings of the worker's clock (NaN: it did not get there)."""
REPORT_SECONDS = ("compute_s", "cpu_s", "upload_s")
"""A :class:`ClientReport`'s durations."""


def report_problem(report: ClientReport, place: Callable[[float], float], start: float, end: float) -> str:
    """What is wrong with a worker's ``report`` of a round that ran from ``start`` to ``end`` (seconds of the
    server's clock, ``end`` with the time its reports may take), ``place`` mapping the worker's clock onto
    the server's; empty if nothing. Each time is NaN or, placed, within the round; each duration finite,
    at least 0 and at most the round's length."""
    for name in REPORT_TIMES:
        value = getattr(report, name)
        if math.isnan(value):
            continue
        placed = place(value)
        if not (math.isfinite(placed) and start <= placed <= end):
            return f"{name} {value!r} is not a time within the round ({placed:.6g} s; it ran {start:.6g}-{end:.6g} s)"
    for name in REPORT_SECONDS:
        value = getattr(report, name)
        if not (math.isfinite(value) and 0 <= value <= end - start):
            return f"{name} {value!r} is not a number of seconds in [0, {end - start:.6g}] (the round's length)"
    return ""
