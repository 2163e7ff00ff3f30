"""SecAgg and SecAgg+ against ``plain``: exact sums under dropout, aborts below threshold, and clients
that catch a misbehaving server (tampered ciphertexts, forged signatures, inconsistent survivor sets)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.crypto import signatures
from sim.crypto.randomness import SeededRandom
from sim.loopback import run_loopback
from sim.protocol import graph
from sim.protocol.encoding import FixedPoint
from sim.protocol.machine import LocalProtocolError, RemoteProtocolError, RoundSetupError
from sim.protocol.messages import (
    SHARE_OF_KEY,
    SHARE_OF_SEED,
    Ciphertexts,
    KeyList,
    MaskedInput,
    SignedSurvivors,
    Survivors,
    UnmaskShares,
)
from sim.protocol.params import AggregationParams
from sim.protocol.registry import round_machines
from sim.protocol.secagg.client import SecAggClient, State
from sim.protocol.secagg.config import (
    BadCiphertextError,
    BadSignatureError,
    InconsistentViewError,
    TooFewClientsError,
    share_threshold,
)
from sim.protocol.secagg.server import ENDED, SecAggServer, Step
from sim.protocol.suite import RealSuite
from sim.protocol.wire import ModVector

STAGES = ("advertise_keys", "share_keys", "masked_input", "unmasking")


def setup(protocol, n, dim=64, malicious=False, threshold=0.5, seed=0, bits=20, neighbours=None):
    sampled = tuple(range(10, 10 + 3 * n, 3))  # population indices need not be contiguous
    params = AggregationParams(protocol, bits, 1.0, threshold, neighbours, malicious)
    keys = {c: signatures.generate(SeededRandom(bytes([c % 256]) * 32)) for c in sampled}
    server, factory = round_machines(params, 5, sampled, dim, RealSuite(), seed, {c: k[1] for c, k in keys.items()})
    clients = {
        c: factory(
            c, SeededRandom(seed.to_bytes(8, "little") + bytes([c % 256]) * 24), np.random.default_rng(c), keys[c][0]
        )
        for c in sampled
    }
    rng = np.random.default_rng(seed)
    updates = {c: rng.normal(0, 0.2, dim).astype(np.float32) for c in sampled}
    return sampled, params, server, clients, updates


def plain_aggregate(sampled, updates, survivors, dim=64, bits=20):
    server, factory = round_machines(AggregationParams("plain", bits, 1.0), 5, sampled, dim, RealSuite(), 0)
    clients = {c: factory(c, None, np.random.default_rng(c), None) for c in sampled}
    leave = {c: "upload" for c in sampled if c not in survivors}
    run_loopback(server, clients, updates, leave)
    assert server.outcome == "ok"
    return server.aggregate.vector


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    protocol=st.sampled_from(["secagg", "secagg+"]),
    n=st.integers(3, 40),
    threshold=st.sampled_from([0.3, 0.5, 0.66]),
    malicious=st.booleans(),
    data=st.data(),
)
def test_unmasked_sum_equals_plain_sum_under_dropout(protocol, n, threshold, malicious, data):
    threshold = max(threshold, 0.5) if malicious else threshold
    if n * threshold < 1:  # t would be 1: refused (see test_a_threshold_of_one_is_refused)
        threshold = 0.5
    sampled, _params, server, clients, updates = setup(protocol, n, malicious=malicious, threshold=threshold, seed=n)
    cfg = server.config
    # Dropouts within tolerance: every client's secrets stay reconstructable (each neighbourhood keeps
    # t_u of its holders) and every step keeps the server's minimum.
    leave: dict[int, str] = {}
    for c in data.draw(st.permutations(sampled)):
        stage = data.draw(st.sampled_from(STAGES))
        trial = {**leave, c: stage}
        alive = [v for v in sampled if v not in trial]
        if len(alive) < cfg.minimum:
            continue
        masked = {v for v in sampled if trial.get(v) not in ("advertise_keys", "share_keys", "masked_input")}
        if all(
            len([h for h in cfg.holders(u) if h not in trial]) >= cfg.threshold(u) for u in sampled
        ) and cfg.connected(masked):
            leave = trial
    result = run_loopback(server, clients, updates, leave)
    assert result.aborted == {}
    assert server.outcome == "ok", server.outcome
    survivors = [c for c in sampled if leave.get(c) not in ("advertise_keys", "share_keys", "masked_input")]
    assert list(server.aggregate.survivors) == survivors
    expected = plain_aggregate(sampled, updates, set(survivors))
    assert np.array_equal(server.aggregate.vector, expected)


def test_the_sum_is_the_mean_of_the_encodings_exactly():
    sampled, _, server, clients, updates = setup("secagg", 6)
    run_loopback(server, clients, updates)
    enc = FixedPoint.for_clients(20, 1.0, 6)
    total = sum(enc.encode(updates[c], np.random.default_rng(c)).astype(np.int64) for c in sampled) % (1 << 20)
    assert np.array_equal(server.aggregate.vector, enc.decode_mean(total.astype(np.uint64), 6))
    clipped = [updates[c] * min(1.0, 1.0 / np.linalg.norm(updates[c])) for c in sampled]
    assert np.linalg.norm(updates[sampled[0]]) > 1  # the encoding clipped these updates to norm 1
    assert np.abs(server.aggregate.vector - np.mean(clipped, axis=0)).max() < 1 / enc.scale


def test_the_server_walks_its_states_and_names_each_by_its_step():
    """States are :class:`Step` members; ``step`` gives their names as plain strings (what timeouts, tables and
    drivers know), and every state that collects has its row in the transition table, the round's end none."""
    assert set(SecAggServer._STEPS) == set(Step) - ENDED
    _, _, server, clients, updates = setup("secagg", 5, malicious=True)
    assert (server.state, server.step) == (Step.ADVERTISE_KEYS, "advertise_keys")
    run_loopback(server, clients, updates)
    assert server.state is Step.DONE and type(server.step) is str and server.step == "done"
    assert all(client.state is State.DONE for client in clients.values())


def test_secagg_plus_degree_and_graph():
    assert graph.auto_degree(100) == 14 and graph.auto_degree(16) == 8 and graph.auto_degree(3) == 2
    g = graph.harary(list(range(40)), 8, seed=3)
    assert all(len(v) == 8 for v in g.values())
    assert all(u in g[v] for u in g for v in g[u])  # symmetric
    assert g == graph.harary(list(range(40)), 8, seed=3) and g != graph.harary(list(range(40)), 8, seed=4)
    sampled, _, server, clients, updates = setup("secagg+", 40)
    assert all(len(server.config.neighbours[c]) == 12 for c in sampled)  # 2 * ceil(log2 40)
    assert server.config.threshold(sampled[0]) == share_threshold(0.5, 13) == 7
    result = run_loopback(server, clients, updates)
    # Each client receives only its neighbours' keys and ciphertexts: far fewer bytes than SecAgg.
    _, _, s2, c2, u2 = setup("secagg", 40)
    full = run_loopback(s2, c2, u2)
    assert sum(result.bytes_down.values()) < sum(full.bytes_down.values()) / 2
    assert np.array_equal(server.aggregate.vector, s2.aggregate.vector)


@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
def test_below_threshold_the_round_aborts(protocol):
    sampled, _, server, clients, updates = setup(protocol, 10)
    t = server.config.minimum
    leave = {c: "masked_input" for c in sampled[: len(sampled) - t + 1]}
    run_loopback(server, clients, updates, leave)
    assert server.outcome == f"aborted: masked_input: {t - 1} of 10 clients answered, threshold {t}"
    assert server.aggregate is None


def test_dropout_during_unmasking_beyond_tolerance_aborts():
    sampled, _, server, clients, updates = setup("secagg", 10)  # t = 6
    leave = {c: "unmasking" for c in sampled[:5]}
    run_loopback(server, clients, updates, leave)
    assert server.outcome == "aborted: unmasking: 5 of 10 clients answered, threshold 6"


def _flip_byte(data: bytes, index: int = 30) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x40]) + data[index + 1 :]


def test_a_tampered_ciphertext_makes_its_recipient_abort():
    sampled, _, server, clients, updates = setup("secagg", 5)
    victim, sender = sampled[2], sampled[0]

    def tamper(to, message):
        if to == victim and isinstance(message, Ciphertexts):
            cts = tuple((v, _flip_byte(ct) if v == sender else ct) for v, ct in message.ciphertexts)
            return dataclasses.replace(message, ciphertexts=cts)
        return message

    result = run_loopback(server, clients, updates, tamper=tamper)
    assert isinstance(result.aborted[victim], BadCiphertextError)
    assert f"the ciphertext from client {sender}: ciphertext does not authenticate" in str(result.aborted[victim])
    assert server.outcome == "ok"  # the others still reach the threshold (t = 3 of 5)


def test_a_forged_key_signature_is_caught_in_the_malicious_variant():
    sampled, _, server, clients, updates = setup("secagg", 5, malicious=True)
    victim, forged = sampled[1], sampled[3]

    def tamper(to, message):
        if to == victim and isinstance(message, KeyList):
            entries = tuple((v, c, s, _flip_byte(sig, 5) if v == forged else sig) for v, c, s, sig in message.entries)
            return dataclasses.replace(message, entries=entries)
        return message

    result = run_loopback(server, clients, updates, tamper=tamper)
    assert isinstance(result.aborted[victim], BadSignatureError)
    assert f"client {forged}'s advertised keys carry an invalid signature" in str(result.aborted[victim])


class _Unchecking(RealSuite):
    """A malicious server's crypto: it relays signatures without checking them (an honest server refuses a
    consistency signature over another survivor set than the one it sent)."""

    def verify(self, public, message, signature):
        return True


def test_a_server_lying_about_survivors_is_caught_in_the_malicious_variant():
    # The server tells one client that another client dropped (to obtain that client's mask key shares
    # while holding its masked input). The consistency signatures expose the two different views.
    sampled, _, server, clients, updates = setup("secagg", 6, malicious=True)
    server.suite = _Unchecking()
    target, victim = sampled[0], sampled[1]

    def tamper(to, message):
        if to == victim and isinstance(message, Survivors):
            return dataclasses.replace(message, clients=tuple(c for c in message.clients if c != target))
        return message

    result = run_loopback(server, clients, updates, tamper=tamper)
    errors = dict(result.aborted)
    assert set(errors) == set(sampled)  # every view disagrees with some signature, the victim's included
    assert all(isinstance(e, BadSignatureError) for c, e in errors.items() if c != victim)
    assert f"client {victim}'s signature does not match this client's survivor set" in str(errors[target])
    # The victim sees a signature from the client it was told had dropped.
    assert isinstance(errors[victim], InconsistentViewError)
    assert server.outcome.startswith("aborted: unmasking")  # no shares were released


def test_a_client_never_reveals_both_secrets_of_a_peer():
    sampled, _, server, clients, updates = setup("secagg", 5)
    dropped = sampled[4]
    kinds: dict[int, set[int]] = {}

    def observe(sender, message):
        if isinstance(message, UnmaskShares):
            for about, kind, _share in message.shares:
                kinds.setdefault(about, set()).add(kind)

    run_loopback(server, clients, updates, {dropped: "masked_input"}, observe=observe)
    assert server.outcome == "ok"
    assert kinds[dropped] == {SHARE_OF_KEY}
    assert all(kinds[c] == {SHARE_OF_SEED} for c in sampled[:4])


def test_illegal_messages_leave_the_server_unchanged():
    sampled, _, server, clients, updates = setup("secagg", 4)
    reaction = clients[sampled[0]].start(updates[sampled[0]], 1.0)
    advert = reaction.sends[0].message
    server.receive(sampled[0], advert)
    before = (server.step, set(server.expected()))
    for sender, message in [
        (sampled[0], advert),  # a second AdvertiseKeys
        (sampled[1], advert),  # claiming to be another client
        (sampled[1], MaskedInput(5, sampled[1], ModVector(20, np.zeros(64, np.uint64)))),  # out of turn
        (99, advert),  # not sampled
        (sampled[2], dataclasses.replace(advert, round=6, client=sampled[2])),  # wrong round
    ]:
        with pytest.raises(RemoteProtocolError):
            server.receive(sender, message)
        assert (server.step, set(server.expected())) == before
    with pytest.raises(LocalProtocolError):
        clients[sampled[0]].start(updates[sampled[0]], 1.0)


def test_clients_reject_messages_out_of_turn():
    sampled, _, _server, clients, updates = setup("secagg", 4)
    client: SecAggClient = clients[sampled[0]]
    client.start(updates[sampled[0]], 1.0)
    with pytest.raises(RemoteProtocolError, match="expected KeyList"):
        client.receive(Survivors(5, sampled))
    assert client.state is State.KEYS
    with pytest.raises(InconsistentViewError, match="not a set of this client's holders"):
        client.receive(KeyList(5, ((sampled[1], bytes(32), bytes(32), b""),)))
    with pytest.raises(TooFewClientsError, match="key list of 1 clients, threshold 3"):
        client.receive(KeyList(5, ((sampled[0], bytes(32), bytes(32), b""),)))
    assert client.state is State.KEYS
    with pytest.raises(RemoteProtocolError, match="expected KeyList"):
        client.receive(SignedSurvivors(5, ()))


def _ring(server, seed_order):
    return [int(c) for c in np.random.default_rng(seed_order).permutation(sorted(server.config.sampled))]


def test_secagg_plus_never_unmasks_a_partial_sum():
    # Two dropouts opposite each other on a ring of degree 2 split the survivors into two arcs, each of
    # whose masks would cancel on its own: the server must not go on, and clients must refuse if it does.
    sampled, _, server, clients, updates = setup("secagg+", 10, neighbours=2, seed=7)
    ring = _ring(server, 7)
    run_loopback(server, clients, updates, {ring[0]: "masked_input", ring[5]: "masked_input"})
    assert server.outcome == (
        "aborted: masked_input: the survivors are not connected in the graph (partial sums would be exposed)"
    )
    # A server that claims a split survivor set anyway meets clients that check the graph themselves.
    sampled, _, server, clients, updates = setup("secagg+", 10, neighbours=2, seed=7)
    ring = _ring(server, 7)

    def split(to, message):
        if isinstance(message, Survivors):
            return dataclasses.replace(
                message, clients=tuple(c for c in message.clients if c not in (ring[0], ring[5]))
            )
        return message

    result = run_loopback(server, clients, updates, tamper=split)
    refusing = {c: e for c, e in result.aborted.items() if isinstance(e, InconsistentViewError)}
    assert set(refusing) == set(sampled)  # the two left out see themselves missing; the rest see the split
    assert "the survivors are not connected" in str(refusing[ring[2]])


def test_a_split_view_releases_no_secret_twice_in_secagg_plus():
    # A malicious server tells four clients that client v dropped and everyone else that it survived, and
    # hands each camp only its own camp's consistency signatures.
    sampled, _, server, clients, updates = setup("secagg+", 20, malicious=True, neighbours=4, seed=11)
    server.suite = _Unchecking()
    cfg = server.config
    v = sampled[0]
    near = [c for c in cfg.neighbours[v]][:2]
    far = [c for c in sampled if c not in cfg.holders(v)][:2]
    told_dropped = set(near) | set(far)

    def tamper(to, message):
        if isinstance(message, Survivors) and to in told_dropped:
            return dataclasses.replace(message, clients=tuple(c for c in message.clients if c != v))
        if isinstance(message, SignedSurvivors):
            camp = told_dropped if to in told_dropped else set(sampled) - told_dropped
            return dataclasses.replace(message, signatures=tuple((s, g) for s, g in message.signatures if s in camp))
        return message

    kinds: dict[int, set[int]] = {}

    def observe(sender, message):
        if isinstance(message, UnmaskShares):
            for about, kind, _share in message.shares:
                kinds.setdefault(about, set()).add(kind)

    result = run_loopback(server, clients, updates, tamper=tamper, observe=observe)
    assert all(len(k) == 1 for k in kinds.values())  # nobody's key and seed are both exposed
    assert kinds[v] == {SHARE_OF_SEED}
    assert told_dropped <= set(result.aborted)
    assert all(isinstance(result.aborted[c], TooFewClientsError) for c in told_dropped)


def test_a_client_rejects_a_key_list_with_other_keys_for_itself():
    sampled, _, _server, clients, updates = setup("secagg", 4)
    me = sampled[0]
    advert = clients[me].start(updates[me], 1.0).sends[0].message
    entries = tuple((c, bytes([c]) * 32, bytes([c + 1]) * 32, b"") for c in sampled)
    entries = ((me, bytes(32), advert.s_pk, b""), *entries[1:])
    with pytest.raises(InconsistentViewError, match="shows other keys for this client"):
        clients[me].receive(KeyList(5, entries))


def test_a_threshold_of_one_is_refused():
    with pytest.raises(RoundSetupError, match="reconstruction threshold of 1"):
        setup("secagg", 3, threshold=0.3)
