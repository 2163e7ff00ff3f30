"""Misbehaving clients and servers against the protocol machines: every value a peer sends is checked where
it enters and refused as a :class:`RemoteProtocolError` naming the peer, leaving the machine unchanged; a
share that contradicts the others is found while reconstructing and set aside, or, when the secret cannot be
determined, ends the round with :class:`RoundAbortedError` (never a ValueError or KeyError).

The faults come from a security review of the protocol layer: an UnmaskShares about a client outside the
round (KeyError), a tampered share (ValueError inside ``close_step``), a server listing a low-order X25519
key (ValueError in the client), and 82 uncaught exceptions in 400 randomised misbehaving-unmask rounds.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable

import numpy as np
import pytest
from test_secagg import setup

from sim.crypto import agreement, shamir, signatures
from sim.crypto.randomness import SeededRandom
from sim.loopback import run_loopback
from sim.protocol import wire
from sim.protocol.machine import SERVER, Reaction, RemoteProtocolError, RoundAbortedError, Send
from sim.protocol.messages import (
    SHARE_OF_KEY,
    SHARE_OF_SEED,
    AdvertiseKeys,
    ConsistencySignature,
    KeyList,
    SignedMaskedInput,
    UnmaskShares,
)
from sim.protocol.params import AggregationParams
from sim.protocol.registry import round_machines
from sim.protocol.secagg.client import State
from sim.protocol.secagg.config import BadKeyError
from sim.protocol.secagg.server import SecAggServer
from sim.protocol.suite import SHARE_BYTES, RealSuite
from sim.protocol.wire import Message

P = shamir.PRIME
CURVE_P = 2**255 - 19
LOW_ORDER = (
    0,
    1,
    CURVE_P - 1,
    CURVE_P,
    CURVE_P + 1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
)
"""X25519 u-coordinates of order 1, 2, 4 or 8 and their non-canonical encodings (RFC 7748, section 5 reduces
u mod p): X25519 with any of them gives the all-zero secret."""


# ------------------------------------------------------------------------------------------- helpers
def _round(protocol="secagg", n=5, malicious=False, neighbours=None, seed=0, dim=16):
    sampled, _, server, clients, updates = setup(protocol, n, dim, malicious, seed=seed, neighbours=neighbours)
    keys = {c: signatures.generate(SeededRandom(bytes([c % 256]) * 32)) for c in sampled}  # as setup's
    return sampled, server, clients, updates, keys


def _plain(sampled, updates, survivors, dim=16):
    server, factory = round_machines(AggregationParams("plain", 20, 1.0), 5, sampled, dim, RealSuite(), 0)
    clients = {c: factory(c, None, np.random.default_rng(c), None) for c in sampled}
    run_loopback(server, clients, updates, {c: "upload" for c in sampled if c not in survivors})
    assert server.outcome == "ok"
    return server.aggregate.vector


class Misbehaving:
    """A client machine whose outgoing messages pass through ``mutate`` (the honest machine underneath)."""

    def __init__(self, machine, mutate: Callable[[Message], Message]) -> None:
        self.machine = machine
        self.mutate = mutate
        self.first_step = machine.first_step

    def _out(self, reaction: Reaction) -> Reaction:
        return Reaction(tuple(Send(s.to, self.mutate(s.message)) for s in reaction.sends), reaction.work)

    def start(self, update, weight):
        return self._out(self.machine.start(update, weight))

    def stage_of(self, message):
        return self.machine.stage_of(message)

    def receive(self, message):
        return self._out(self.machine.receive(message))


def _state(server: SecAggServer) -> tuple:
    total = server.total
    return (
        server.step,
        server.outcome,
        sorted(server.expected()),
        sorted(server._received),
        sorted(server.u1),
        sorted(server.u2),
        sorted(server.u3),
        sorted(server.u4),
        sorted(server.upload_signatures),
        total.tobytes() if isinstance(total, np.ndarray) else total,
        dict(server.liars),
    )


class StateChecked:
    """A server machine that checks that every message it refuses leaves its state unchanged."""

    def __init__(self, machine: SecAggServer) -> None:
        self.machine = machine
        self.refused: dict[int, RemoteProtocolError] = {}

    def __getattr__(self, name):
        return getattr(self.machine, name)

    def receive(self, sender, message):
        before = _state(self.machine)
        try:
            return self.machine.receive(sender, message)
        except RemoteProtocolError as exc:
            assert _state(self.machine) == before, f"refusing {type(message).__name__} changed the server"
            self.refused[sender] = exc
            raise


def _only(kind: type[Message], change: Callable[[Message], Message]) -> Callable[[Message], Message]:
    return lambda m: change(m) if isinstance(m, kind) else m


def _nudge(share: bytes, element: int = 0, by: int = 1) -> bytes:
    """``share`` with one field element moved by ``by`` (still in the field: only the reconstruction sees it)."""
    values = np.frombuffer(share, "<u4").astype(np.int64)
    values[element] = (values[element] + by) % P
    return values.astype("<u4").tobytes()


def _tamper_share_about(about: int, kind: int) -> Callable[[Message], Message]:
    def change(m: UnmaskShares) -> UnmaskShares:
        shares = tuple((a, k, _nudge(s) if (a, k) == (about, kind) else s) for a, k, s in m.shares)
        assert shares != m.shares
        return dataclasses.replace(m, shares=shares)

    return _only(UnmaskShares, change)


# ---------------------------------------------------- fault 1: a share about a client outside the round
@pytest.mark.parametrize(("protocol", "about"), [("secagg", 999), ("secagg", -1), ("secagg+", None)])
def test_a_share_about_a_client_outside_the_senders_round_is_refused_naming_the_sender(protocol, about):
    n, neighbours = (5, None) if protocol == "secagg" else (10, 4)
    sampled, server, clients, updates, _ = _round(protocol, n, neighbours=neighbours)
    liar = sampled[1]
    if about is None:  # a sampled client outside the liar's neighbourhood
        about = next(c for c in sampled if c not in server.config.holders(liar))
    extra = (about if about >= 0 else 2**64 - 1, SHARE_OF_SEED, bytes(SHARE_BYTES))
    clients[liar] = Misbehaving(
        clients[liar], _only(UnmaskShares, lambda m: dataclasses.replace(m, shares=(*m.shares, extra)))
    )
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates)
    error = watched.refused[liar]
    assert error.peer == liar
    assert result.server_rejected == {liar: f"sent a share about client {extra[0]}, which it does not hold"}
    # Its masked input is in; its own mask seed comes from the other holders' shares.
    assert server.outcome == "ok"
    assert np.array_equal(server.aggregate.vector, _plain(sampled, updates, set(sampled)))


# ------------------------------------------------------------------------ fault 2: a tampered share
def test_a_tampered_share_of_a_mask_seed_is_set_aside_and_its_sender_named():
    sampled, server, clients, updates, _ = _round("secagg", 5)  # t = 3 of 5: one liar can be outvoted
    liar, victim = sampled[0], sampled[2]  # the liar is among the first t holders, whose shares go in first
    clients[liar] = Misbehaving(clients[liar], _tamper_share_about(victim, SHARE_OF_SEED))
    result = run_loopback(server, clients, updates)
    assert result.round_error is None
    assert server.outcome == "ok"
    assert set(server.liars) == {liar}
    assert f"client {victim}'s mask seed" in server.liars[liar]
    assert result.server_liars == server.liars  # told to the driver in close_step's Reaction
    assert np.array_equal(server.aggregate.vector, _plain(sampled, updates, set(sampled)))


def test_a_tampered_share_of_a_dropped_clients_key_is_found_by_its_public_key():
    sampled, server, clients, updates, _ = _round("secagg", 6)  # t = 4
    liar, dropped = sampled[0], sampled[5]
    clients[liar] = Misbehaving(clients[liar], _tamper_share_about(dropped, SHARE_OF_KEY))
    # 5 shares of the dropped client's key for t = 4: too few to outvote a liar, but the key's public key
    # tells which 4 of them are right.
    result = run_loopback(server, clients, updates, {dropped: "masked_input"})
    assert result.round_error is None and server.outcome == "ok"
    assert set(server.liars) == {liar} and f"client {dropped}'s mask key" in server.liars[liar]
    assert np.array_equal(server.aggregate.vector, _plain(sampled, updates, set(sampled) - {dropped}))


def test_a_tampered_share_of_a_key_without_a_spare_share_aborts_the_round():
    sampled, server, clients, updates, _ = _round("secagg", 6)  # t = 4
    liar, dropped, leaving = sampled[0], sampled[5], sampled[4]
    clients[liar] = Misbehaving(clients[liar], _tamper_share_about(dropped, SHARE_OF_KEY))
    result = run_loopback(server, clients, updates, {dropped: "masked_input", leaving: "unmasking"})
    assert isinstance(result.round_error, RoundAbortedError)
    assert f"client {dropped}'s mask key" in result.round_error.reason
    assert server.outcome == f"aborted: {result.round_error.reason}"


def test_reconstruction_errors_never_escape_as_value_error():
    # A share of other field elements: its reconstruction is no byte string (today's ValueError).
    sampled, server, clients, updates, _ = _round("secagg", 4)  # t = 3: 4 shares, one liar cannot be named
    liar, victim = sampled[0], sampled[1]

    def garble(m: UnmaskShares) -> UnmaskShares:
        return dataclasses.replace(m, shares=tuple((a, k, bytes(4 * 11) if a == victim else s) for a, k, s in m.shares))

    clients[liar] = Misbehaving(clients[liar], _only(UnmaskShares, garble))
    result = run_loopback(server, clients, updates)
    assert isinstance(result.round_error, RoundAbortedError)
    assert server.outcome.startswith("aborted: unmasking: ")


def test_the_simulated_round_ends_when_close_step_raises_round_aborted_error():
    from types import SimpleNamespace

    from sim.engine.virtual_round import Round
    from sim.round.collector import Roster
    from sim.round.records import ClientRecord

    class Contradicted:
        step, outcome = "unmasking", ""

        def close_step(self):
            self.step, self.outcome = "aborted", "aborted: unmasking: shares contradict each other"
            raise RoundAbortedError("unmasking: shares contradict each other", (3,))

    machine = Contradicted()
    woken: list[list[int]] = []
    record = ClientRecord(client=3, slowdown=1.0, bandwidth_mbps=1.0, samples=1)
    rnd = SimpleNamespace(roster=Roster({3: record}), _out=woken.append)
    assert Round.close_step(rnd, machine) == Reaction()  # type: ignore[arg-type]  # the loop then sees "aborted"
    assert machine.step == "aborted"
    assert record.dropped_stage == "rejected: unmasking: shares contradict each other"  # the liar is refused
    assert woken == [[3]]  # and the round's other instances stop waiting for it


# ------------------------------------------------------------------- fault 3: low-order X25519 keys
def _key_list(sampled, clients, updates):
    adverts = {c: clients[c].start(updates[c], 1.0).sends[0].message for c in sampled}
    return KeyList(5, tuple((c, a.c_pk, a.s_pk, a.signature) for c, a in sorted(adverts.items())))


@pytest.mark.parametrize("field", ["c_pk", "s_pk"])
@pytest.mark.parametrize(
    "u",
    [*LOW_ORDER, LOW_ORDER[0] | 1 << 255, LOW_ORDER[-1] | 1 << 255],
    ids=["0", "1", "p-1", "p", "p+1", "order-8a", "order-8b", "0+2^255", "order-8b+2^255"],
)
def test_a_low_order_key_listed_by_the_server_is_refused_by_the_client(field, u):
    sampled, _server, clients, updates, _ = _round("secagg", 4)
    honest = _key_list(sampled, clients, updates)
    me, other = sampled[0], sampled[2]
    weak = u.to_bytes(32, "little")
    column = 1 if field == "c_pk" else 2
    entries = tuple(e[:column] + (weak,) + e[column + 1 :] if e[0] == other else e for e in honest.entries)
    client = clients[me]
    with pytest.raises(RemoteProtocolError) as info:
        client.receive(KeyList(5, entries))
    assert isinstance(info.value, BadKeyError)
    assert info.value.peer == SERVER
    assert f"client {other}'s" in str(info.value)
    assert (client.state, client.b, client.peers) == (State.KEYS, b"", {})  # unchanged: no secret drawn yet
    client.receive(honest)  # the honest list still goes through
    assert client.state is State.CIPHERTEXTS


def test_the_low_order_check_matches_x25519():
    for u in LOW_ORDER:
        for encoded in (u, u | 1 << 255):
            key = encoded.to_bytes(32, "little")
            assert agreement.low_order(key)
            with pytest.raises(ValueError):
                agreement.agree(bytes(range(32)), key, b"info")
    for i in range(64):
        _, public = agreement.generate(SeededRandom(bytes([i]) * 32))
        assert not agreement.low_order(public)
    assert not agreement.low_order((2).to_bytes(32, "little"))


def test_a_client_advertising_a_low_order_key_is_refused_by_the_server():
    sampled, server, clients, updates, _ = _round("secagg", 5)
    bad = sampled[3]
    clients[bad] = Misbehaving(clients[bad], _only(AdvertiseKeys, lambda m: dataclasses.replace(m, s_pk=bytes(32))))
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates)
    assert isinstance(watched.refused[bad], BadKeyError) and watched.refused[bad].peer == bad
    assert result.aborted == {}
    assert server.outcome == "ok" and bad not in server.aggregate.survivors


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: dataclasses.replace(m, c_pk=m.s_pk), "advertised the same key twice"),
        (lambda m: dataclasses.replace(m, c_pk=b"\x01" * 31), "a c_pk of 31 bytes"),
        (lambda m: dataclasses.replace(m, signature=b"\x00" * 10**6), "a signature of 1000000 bytes"),
    ],
)
def test_malformed_advertised_keys_are_refused_at_the_server(change, reason):
    sampled, server, clients, updates, _ = _round("secagg", 5)
    bad = sampled[0]
    clients[bad] = Misbehaving(clients[bad], _only(AdvertiseKeys, change))
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates, encode=False)
    assert reason in watched.refused[bad].reason
    assert result.aborted == {} and server.outcome == "ok"


def test_a_client_copying_another_clients_keys_is_refused():
    sampled, server, clients, updates, _ = _round("secagg", 5)
    victim, copier = sampled[0], sampled[1]  # the victim starts, and is delivered, first
    adverts: dict[int, AdvertiseKeys] = {}

    def observe(sender, message):
        if isinstance(message, AdvertiseKeys):
            adverts[sender] = message

    def copy(m: AdvertiseKeys) -> AdvertiseKeys:
        return dataclasses.replace(m, c_pk=adverts[victim].c_pk, s_pk=adverts[victim].s_pk)

    clients[copier] = Misbehaving(clients[copier], _only(AdvertiseKeys, copy))
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates, observe=observe)
    assert watched.refused[copier].reason == f"advertised keys that client {victim} advertised"
    assert result.aborted == {} and server.outcome == "ok"


# ------------------------------------------------------------------- the malicious variant's messages
def _flip(data: bytes, index: int = 5) -> bytes:
    return data[:index] + bytes([data[index] ^ 1]) + data[index + 1 :]


@pytest.mark.parametrize(
    ("kind", "field"),
    [(AdvertiseKeys, "signature"), (ConsistencySignature, "signature")],
)
def test_a_bad_signature_is_refused_by_the_server_before_it_reaches_other_clients(kind, field):
    # Relayed, the bad signature would make every honest client abort (BadSignatureError, blaming the server).
    sampled, server, clients, updates, _ = _round("secagg", 6, malicious=True)
    bad = sampled[2]
    clients[bad] = Misbehaving(
        clients[bad], _only(kind, lambda m: dataclasses.replace(m, **{field: _flip(getattr(m, field))}))
    )
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates)
    assert watched.refused[bad].peer == bad and "signature" in watched.refused[bad].reason
    assert result.aborted == {}
    assert server.outcome == "ok"


def test_a_bad_upload_signature_is_refused_by_the_server():
    from sim.dp.dskellam import DSkellamEncoding
    from sim.dp.strategies import RoundNoise
    from sim.protocol.private import PrivateRound

    sampled = tuple(range(3, 3 + 2 * 6, 2))
    params = AggregationParams("secagg", 20, 1.0, 0.5, None, True, strategy="xnoise")
    plan = RoundNoise("xnoise", 0.5, 6, 2)
    private = PrivateRound(DSkellamEncoding(16, 20, 1.0, 300.0), bytes(range(32)), "skellam", plan, bytes(32))
    keys = {c: signatures.generate(SeededRandom(bytes([c]) * 32)) for c in sampled}
    server, factory = round_machines(
        params, 7, sampled, 16, RealSuite(), 0, {c: k[1] for c, k in keys.items()}, private=private
    )
    clients = {c: factory(c, SeededRandom(bytes([c + 1]) * 32), np.random.default_rng(c), keys[c][0]) for c in sampled}
    updates = {c: np.random.default_rng(11 + c).normal(0, 0.05, 16).astype(np.float32) for c in sampled}
    bad = sampled[1]
    clients[bad] = Misbehaving(
        clients[bad], _only(SignedMaskedInput, lambda m: dataclasses.replace(m, signature=_flip(m.signature)))
    )
    watched = StateChecked(server)
    result = run_loopback(watched, clients, updates)
    assert watched.refused[bad].peer == bad and "upload signature" in watched.refused[bad].reason
    assert result.aborted == {} and server.outcome == "ok"
    assert bad not in server.aggregate.survivors


# ------------------------------------------------ fault 4: randomised misbehaving unmasking, bounded
def _mutations(cfg, liar: int, rng: np.random.Generator) -> list[Callable[[UnmaskShares], UnmaskShares]]:
    outside = [c for c in cfg.sampled if c not in cfg.holders(liar)]

    def pick(m):
        return int(rng.integers(len(m.shares)))

    def on_share(m, f):
        if not m.shares:
            return m
        i = pick(m)
        shares = list(m.shares)
        shares[i] = f(*shares[i])
        return dataclasses.replace(m, shares=tuple(shares))

    def nudge(a, k, s):
        return a, k, _nudge(s, int(rng.integers(len(s) // 4)), int(rng.integers(1, P)))

    def flip(a, k, s):
        i = int(rng.integers(len(s)))
        return a, k, s[:i] + bytes([s[i] ^ (1 << int(rng.integers(8)))]) + s[i + 1 :]

    def resize(a, k, s):
        return a, k, s[: int(rng.integers(len(s)))] if rng.random() < 0.5 else s + bytes(int(rng.integers(1, 9)))

    def out_of_field(a, k, s):
        return a, k, b"\xff\xff\xff\xff" + s[4:]

    def other_kind(a, k, s):
        return a, 1 - k if rng.random() < 0.8 else int(rng.integers(2, 256)), s

    def unknown(a, k, s):
        choices = [999, 2**64 - 1, *outside, liar]
        return int(choices[int(rng.integers(len(choices)))]), k, s

    def swap(m):
        if len(m.shares) < 2:
            return m
        i, j = rng.choice(len(m.shares), 2, replace=False)
        shares = list(m.shares)
        (a, k, s), (b, q, r) = shares[i], shares[j]
        shares[i], shares[j] = (a, k, r), (b, q, s)
        return dataclasses.replace(m, shares=tuple(shares))

    def duplicate(m):
        return dataclasses.replace(m, shares=(*m.shares, m.shares[pick(m)])) if m.shares else m

    def withhold(m):
        keep = rng.random(len(m.shares)) < 0.5
        return dataclasses.replace(m, shares=tuple(s for s, k in zip(m.shares, keep, strict=True) if k))

    def impersonate(m):
        return dataclasses.replace(m, client=int(cfg.sampled[int(rng.integers(len(cfg.sampled)))]))

    def other_round(m):
        return dataclasses.replace(m, round=m.round + 1)

    def random_share(m):
        return on_share(m, lambda a, k, s: (a, k, (rng.integers(0, P, len(s) // 4)).astype("<u4").tobytes()))

    return [
        lambda m: on_share(m, nudge),
        lambda m: on_share(m, nudge),
        lambda m: on_share(m, flip),
        lambda m: on_share(m, resize),
        lambda m: on_share(m, out_of_field),
        lambda m: on_share(m, other_kind),
        lambda m: on_share(m, unknown),
        swap,
        duplicate,
        withhold,
        impersonate,
        other_round,
        random_share,
    ]


class _Recorder:
    """A server machine that copies itself as the unmasking step starts and keeps that step's frames."""

    def __init__(self, machine: SecAggServer) -> None:
        self.machine = machine
        self.at_unmasking: SecAggServer | None = None
        self.frames: dict[int, bytes] = {}

    def __getattr__(self, name):
        return getattr(self.machine, name)

    def receive(self, sender, message):
        if self.machine.step == "unmasking":
            if self.at_unmasking is None:
                self.at_unmasking = copy.deepcopy(self.machine)
            self.frames[sender] = message.encode()
        return self.machine.receive(sender, message)


@dataclasses.dataclass(frozen=True)
class Base:
    """An honest round up to its unmasking step, and how it ends."""

    server: SecAggServer
    frames: dict[int, bytes]
    """Each survivor's UnmaskShares frame."""
    vector: np.ndarray
    survivors: tuple[int, ...]


BASES = [
    (protocol, malicious, dropped)
    for protocol in ("secagg-5", "secagg-7", "secagg+-10")
    for malicious in (False, True)
    for dropped in (False, True)
]
"""SecAgg of 5 and 7 clients (t = 3, 4), SecAgg+ of 10 of degree 4 (t = 3 of 5 holders); semi-honest and
malicious; with and without a client dropping before its masked input (so that a mask key is rebuilt)."""


@functools.cache
def _base(protocol: str, malicious: bool, dropped: bool) -> Base:
    name, n = protocol.split("-")
    neighbours = 4 if name == "secagg+" else None
    sampled, server, clients, updates, _ = _round(name, int(n), malicious, neighbours, seed=int(n))
    recorder = _Recorder(server)
    run_loopback(recorder, clients, updates, {sampled[-2]: "masked_input"} if dropped else {})
    assert server.outcome == "ok" and recorder.at_unmasking is not None
    assert np.array_equal(server.aggregate.vector, _plain(sampled, updates, set(server.aggregate.survivors)))
    return Base(recorder.at_unmasking, recorder.frames, server.aggregate.vector, server.aggregate.survivors)


def misbehaving_unmasking(seed: int) -> tuple[SecAggServer, dict[int, RemoteProtocolError], object, Base, int]:
    """The unmasking step of one base round, seeded: one survivor (the liar) mutates its UnmaskShares with
    one or two of :func:`_mutations`, and perhaps one honest survivor does not answer; every other survivor
    answers honestly, so each secret keeps more than t holders (with exactly t, a lie about a mask seed could
    not be seen: t shares fit any secret). Returns the server after close_step, the refusals, the error
    close_step raised (or None), the base and the liar. Every refusal is checked to leave the server as it was.
    """
    rng = np.random.default_rng(seed)
    base = _base(*BASES[int(rng.integers(len(BASES)))])
    server = copy.deepcopy(base.server)
    survivors = sorted(base.frames)
    liar = survivors[int(rng.integers(len(survivors)))]
    mutations = _mutations(server.config, liar, rng)
    chosen = [mutations[int(i)] for i in rng.integers(len(mutations), size=int(rng.integers(1, 3)))]
    honest = [c for c in survivors if c != liar]
    silent = honest[int(rng.integers(len(honest)))] if rng.random() < 0.4 else None
    refused: dict[int, RemoteProtocolError] = {}
    for sender in survivors:
        if sender == silent or sender not in server.expected():
            continue
        message = wire.decode(base.frames[sender])
        if sender == liar:
            for f in chosen:
                message = f(message)
            message = wire.decode(message.encode())  # what a socket would deliver
        before = _state(server)
        try:
            server.receive(sender, message)
        except RemoteProtocolError as exc:
            assert _state(server) == before, (seed, exc)
            refused[sender] = exc
    error = None
    try:
        reaction = server.close_step()
    except RoundAbortedError as exc:
        error = exc
    else:
        assert dict(reaction.liars) == server.liars, seed  # the driver is told whom the server outvoted
    return server, refused, error, base, liar


def test_randomised_misbehaving_unmasking_only_raises_protocol_errors():
    """The review's experiment, seeded and bounded: 400 unmasking steps of SecAgg and SecAgg+ rounds (semi-honest
    and malicious), each with one client mutating its UnmaskShares at random (ids outside the round or the
    neighbourhood, tampered, resized and out-of-field shares, wrong kinds, duplicates, swaps, another sender
    or round). Only RemoteProtocolError (the sender refused, the server unchanged) or RoundAbortedError may come
    out of the machine; only the liar is ever refused or blamed; a completed round's aggregate is the honest one.
    """
    counts = {"ok": 0, "aborted": 0, "liar named": 0, "liar refused": 0}
    for seed in range(400):
        server, refused, error, base, liar = misbehaving_unmasking(seed)
        assert set(refused) <= {liar} and all(e.peer == liar for e in refused.values()), seed
        assert set(server.liars) <= {liar}, seed
        if error is not None:
            assert server.step == "aborted" and server.outcome == f"aborted: {error.reason}", seed
            assert set(error.suspects) <= {liar}, seed
        if server.step == "done":
            counts["ok"] += 1
            assert server.aggregate.survivors == base.survivors, seed
            assert np.array_equal(server.aggregate.vector, base.vector), seed
        else:
            assert server.outcome.startswith("aborted: unmasking: "), (seed, server.outcome)
            counts["aborted"] += 1
        counts["liar named"] += bool(server.liars)
        counts["liar refused"] += bool(refused)
    # This seed range's mix (measured): most lies are refused where they enter (259) or outvoted (73); of the
    # 73 aborts, 43 are RoundAbortedError (a mask seed with exactly t + 1 shares, one of them a lie: it shows
    # but cannot be pinned on anyone) and 30 too few answers once the liar was refused and one client silent.
    assert counts == {"ok": 327, "aborted": 73, "liar named": 73, "liar refused": 259}, counts
