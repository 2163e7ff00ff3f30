"""The clients' calls of a step on several threads (``run_loopback(..., workers=k)``) against one worker:
the same frames in the same order, the same aggregate and the same records, whatever the worker count,
for SecAgg and SecAgg+ (semi-honest and malicious), XNoise, dropouts at every step, a client aborting on a
tampered message and a round that aborts."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import numpy as np
import pytest
import test_secagg
import test_xnoise
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.crypto import prg
from sim.loopback import ClientSteps, run_loopback
from sim.protocol.machine import SERVER, Reaction, Send
from sim.protocol.messages import AdvertiseKeys, Ciphertexts, KeyList

STEPS = ("advertise_keys", "share_keys", "masked_input", "unmasking")


def _round(make, workers, leave, tamper=None):
    """One round of fresh machines from ``make()`` on ``workers`` threads; what it observably did."""
    server, clients, updates = make()
    frames: list[tuple[int, bytes]] = []
    result = run_loopback(
        server,
        clients,
        updates,
        leave,
        tamper=tamper,
        observe=lambda c, m: frames.append((c, hashlib.sha256(m.encode()).digest())),
        workers=workers,
    )
    aggregate = server.aggregate
    return {
        "frames": frames,
        "outcome": server.outcome,
        "vector": None if aggregate is None else np.asarray(aggregate.vector).tobytes(),
        "survivors": None if aggregate is None else aggregate.survivors,
        "aborted": {c: repr(e) for c, e in result.aborted.items()},
        "left": sorted(result.left),
        "rejected": result.server_rejected,
        "bytes": (result.bytes_up, result.bytes_down),
        "client_work": result.client_work,
        "server_work": result.server_work,
        "round_error": repr(result.round_error),
    }


def _secagg(protocol, n, malicious=False, dim=300):
    def make():
        _sampled, _params, server, clients, updates = test_secagg.setup(protocol, n, dim=dim, malicious=malicious)
        return server, clients, updates

    return make


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    protocol=st.sampled_from(["secagg", "secagg+"]),
    n=st.integers(3, 24),
    malicious=st.booleans(),
    workers=st.integers(2, 4),
    data=st.data(),
)
def test_any_worker_count_gives_the_same_round(protocol, n, malicious, workers, data):
    make = _secagg(protocol, n, malicious)
    sampled = tuple(range(10, 10 + 3 * n, 3))
    leave = {c: data.draw(st.sampled_from(STEPS)) for c in data.draw(st.lists(st.sampled_from(sampled), max_size=n))}
    one = _round(make, 1, leave)
    assert _round(make, workers, leave) == one


@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
@pytest.mark.parametrize(("leave", "_dropped"), test_xnoise.CASES[:4])
def test_xnoise_rounds_are_the_same_on_threads(protocol, leave, _dropped):
    def make():
        _sampled, server, clients, updates, _private = test_xnoise.setup("xnoise", n=8, protocol=protocol)
        return server, clients, updates

    one = _round(make, 1, leave)
    assert _round(make, 3, leave) == one


def test_a_tampered_ciphertext_aborts_its_recipient_on_threads():
    def tamper(to, message):
        if isinstance(message, Ciphertexts) and to == 13:
            (v, data), *rest = message.ciphertexts
            return dataclasses.replace(message, ciphertexts=((v, data[:30] + bytes([data[30] ^ 1]) + data[31:]), *rest))
        return message

    make = _secagg("secagg", 8)
    one = _round(make, 1, {}, tamper)
    assert one["aborted"] and 13 in one["aborted"]
    assert _round(make, 2, {}, tamper) == one


def test_an_aborted_round_is_the_same_on_threads():
    make = _secagg("secagg", 6)
    leave = {c: "masked_input" for c in (10, 13, 16, 19)}  # below the threshold: the server aborts
    one = _round(make, 1, leave)
    assert one["outcome"] != "ok"
    assert _round(make, 2, leave) == one


def test_a_million_value_round_is_the_same_on_threads():
    make = _secagg("secagg+", 6, dim=1_000_000)
    one = _round(make, 1, {13: "masked_input"})
    assert one["outcome"] == "ok"
    assert _round(make, 2, {13: "masked_input"}) == one


def test_client_steps_keep_client_order_and_raise_the_first_error():
    names: set[str] = set()

    def turn(c, x):
        names.add(threading.current_thread().name)
        if x < 0:
            raise ValueError(f"client {c}")
        return c * x

    taken: list[int] = []
    with ClientSteps(3) as steps:
        steps.run(turn, {5: 2, 1: 3, 9: 1, 2: 2}, taken.append)
        assert taken == [3, 4, 10, 9]
        with pytest.raises(ValueError, match="client 4"):
            steps.run(turn, {7: -1, 4: -1, 8: 1}, taken.append)
        assert taken == [3, 4, 10, 9]  # none of a failed step's turns is taken
    assert any(name.startswith("dropsim-client") for name in names)
    with pytest.raises(ValueError, match="at least 1"):
        ClientSteps(0)


def test_keystream_buffers_are_safe_on_threads(monkeypatch):
    """A thread slices the zero plaintext it read or made, whatever another thread stores meanwhile (here,
    every read after a store sees a shorter buffer, as when a thread that needed less stores after this one);
    and masks expanded at once on threads, the plaintext growing from nothing, are the masks expanded in turn."""

    class Meanwhile(list):
        stored = False

        def __setitem__(self, i, value):
            super().__setitem__(i, value)
            self.stored = True

        def __getitem__(self, i):
            return b"" if self.stored else super().__getitem__(i)

    seeds = [bytes([i]) * 32 for i in range(24)]
    lengths = [1000 * (i + 1) ** 2 if i % 2 else 500 for i in range(24)]
    expected = [prg.expand(s, n, 20).tobytes() for s, n in zip(seeds, lengths, strict=True)]
    monkeypatch.setattr(prg, "_ZEROS", Meanwhile([b""]))
    assert [prg.expand(s, n, 20).tobytes() for s, n in zip(seeds[:3], lengths[:3], strict=True)] == expected[:3]
    monkeypatch.setattr(prg, "_ZEROS", [b""])
    got: list[bytes] = []
    with ClientSteps(4) as steps:
        steps.run(lambda i, _: prg.expand(seeds[i], lengths[i], 20).tobytes(), dict.fromkeys(range(24)), got.append)
    assert got == expected


class _Echo:
    """A client that answers each KeyList with an AdvertiseKeys (fake machines: two messages in one step)."""

    first_step = "advertise"
    finished = False

    def __init__(self, c, calls):
        self.c, self.calls = c, calls

    def start(self, update, weight):
        return Reaction()

    def stage_of(self, message):
        return "echo"

    def receive(self, message):
        self.calls.append(("call", self.c, message.round))
        if message.round == 3 and self.c == 2:
            raise RuntimeError("client 2 fails on its second message")
        return Reaction(sends=(Send(SERVER, AdvertiseKeys(message.round, self.c, bytes(32), bytes(32), b"")),))


class _TwoMessages:
    """A server that sends every client two messages in its one step, and then is done."""

    def __init__(self, clients):
        self.clients, self.step, self.outcome = clients, "echo", ""

    def begin(self):
        return Reaction()

    def awaits(self, c):
        return True

    def receive(self, sender, message):
        return Reaction()

    def close_step(self):
        if self.outcome:
            self.step = "done"
            return Reaction()
        self.outcome = "sent"
        return Reaction(sends=tuple(Send(c, KeyList(r, ())) for c in self.clients for r in (2, 3)))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_client_with_two_messages_in_a_step(workers):
    """In turn, each reply is observed before the client's next call, as a driver without threads does; on
    threads, after every turn of the step; a failure is raised after what was taken before it."""
    calls: list[tuple] = []
    clients = {c: _Echo(c, calls) for c in (1, 2, 3)}
    with pytest.raises(RuntimeError, match="client 2"):
        run_loopback(
            _TwoMessages(sorted(clients)),
            clients,
            dict.fromkeys(clients),
            observe=lambda c, m: calls.append(("seen", c, m.round)),
            encode=False,
            workers=workers,
        )
    if workers == 1:
        assert calls == [
            ("call", 1, 2),
            ("seen", 1, 2),
            ("call", 1, 3),
            ("seen", 1, 3),
            ("call", 2, 2),
            ("seen", 2, 2),
            ("call", 2, 3),
        ]
    else:  # every turn ran, none was taken
        assert sorted(calls) == sorted([("call", c, r) for c in (1, 2, 3) for r in (2, 3)])
