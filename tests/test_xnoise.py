"""Distributed DP inside SecAgg/SecAgg+ (Dordis Figure 5): the noise left after removal, computed
independently from the clients' own seeds, is exactly the plan's; seeds are recovered from shares when
survivors drop during removal; rebasing aborts rather than expose an under-noised sum; a misbehaving
party is caught; and what each strategy costs on the wire."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from sim.crypto import signatures
from sim.crypto.randomness import SeededRandom
from sim.dp.dskellam import DSkellamEncoding
from sim.dp.strategies import RoundNoise
from sim.loopback import run_loopback
from sim.protocol.messages import (
    RemovalRequest,
    SeedShares,
    SignedUploads,
    Survivors,
    UnmaskShares,
    UnmaskSharesAndSeeds,
)
from sim.protocol.params import AggregationParams
from sim.protocol.private import PrivateRound
from sim.protocol.registry import round_machines
from sim.protocol.suite import RealSuite, SizedSuite
from sim.protocol.wire import Blank

ROTATION = bytes(range(32))


def setup(
    strategy,
    n=8,
    dim=40,
    tolerance=4,
    protocol="secagg",
    mechanism="skellam",
    scale=300.0,
    target=0.5,
    malicious=False,
    suite=None,
    collusion=0,
    threshold=0,
):
    sampled = tuple(range(3, 3 + 2 * n, 2))
    params = AggregationParams(protocol, 20, 1.0, 0.5, None, malicious, strategy=strategy)
    plan = RoundNoise(strategy, target, n, tolerance, threshold=threshold, collusion=collusion)
    private = PrivateRound(DSkellamEncoding(dim, 20, 1.0, scale), ROTATION, mechanism, plan, server_seed=bytes(32))
    keys = {c: signatures.generate(SeededRandom(bytes([c]) * 32)) for c in sampled}
    suite = suite or RealSuite()
    server, factory = round_machines(
        params, 7, sampled, dim, suite, 0, {c: k[1] for c, k in keys.items()}, private=private
    )
    clients = {c: factory(c, SeededRandom(bytes([c + 1]) * 32), np.random.default_rng(c), keys[c][0]) for c in sampled}
    rng = np.random.default_rng(11)
    updates = {c: rng.normal(0, 0.05, dim).astype(np.float32) for c in sampled}
    if not suite.full:
        updates = {c: Blank(dim, np.float32) for c in sampled}
    return sampled, server, clients, updates, private


def expected_mean(private, clients, updates, survivors, removed):
    """The aggregate recomputed independently: each survivor's encoding (same rounding randomness) plus
    its noise components that were not removed, expanded from the client's own seeds."""
    total = np.zeros(private.length, dtype=np.int64)
    for c in survivors:
        total += private.encoding.encode(updates[c], ROTATION, np.random.default_rng(c))
        for k, seed in enumerate(clients[c].noise_seeds):
            if k not in removed and private.plan.components[k]:
                total += private.component(seed, k)
    return private.decode_mean(private.wrap(total), len(survivors))


CASES = [
    ({}, ()),
    ({5: "masked_input"}, (5,)),
    ({5: "masked_input", 7: "share_keys"}, (5, 7)),
    ({5: "masked_input", 9: "unmasking"}, (5,)),  # 9 survives but drops during noise removal (stage 5)
    ({9: "unmasking", 11: "unmasking"}, ()),
    ({c: "masked_input" for c in (3, 5, 7, 9, 11)}, (3, 5, 7, 9, 11)),  # |D| = 5 > T = 4: nothing removed
]


@pytest.mark.parametrize("strategy", ["xnoise", "xnoise-appr"])
@pytest.mark.parametrize(("leave", "dropped"), CASES)
@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
def test_the_noise_left_is_exactly_the_plans(strategy, leave, dropped, protocol):
    n = 8 if len(dropped) < 5 else 12
    sampled, server, clients, updates, private = setup(strategy, n=n, protocol=protocol)
    run_loopback(server, clients, updates, leave)
    survivors = tuple(c for c in sampled if c not in dropped)
    if protocol == "secagg+" and server.outcome != "ok":
        pytest.skip(f"this dropout pattern leaves the sparse graph short: {server.outcome}")
    assert server.outcome == "ok", server.outcome
    assert server.aggregate.survivors == survivors
    removed = private.plan.removed(n - len(survivors))
    assert server.removed == removed
    stage5 = any(s == "unmasking" and c not in dropped for c, s in leave.items()) and removed
    assert (server.u3 - server.u5 != set()) == bool(stage5)
    np.testing.assert_array_equal(server.aggregate.vector, expected_mean(private, clients, updates, survivors, removed))
    if len(dropped) <= private.plan.tolerance:
        if strategy == "xnoise":
            assert private.plan.residual(len(dropped)) == Fraction(0.5)
        else:
            assert Fraction(0.5) <= private.plan.residual(len(dropped)) <= Fraction(0.5) * (1 + Fraction(1, n - 4))


@pytest.mark.parametrize("strategy", ["orig", "con", "committee", "central", "local"])
def test_strategies_without_removal_add_their_noise_and_keep_it(strategy):
    sampled, server, clients, updates, private = setup(strategy, protocol="secagg")
    run_loopback(server, clients, updates, {5: "masked_input"})
    survivors = tuple(c for c in sampled if c != 5)
    assert server.outcome == "ok"
    np.testing.assert_array_equal(server.aggregate.vector, expected_mean(private, clients, updates, survivors, ()))


def test_stage5_aborts_with_too_few_holders_of_a_missing_seed():
    _sampled, server, clients, updates, _private = setup("xnoise", n=8)
    # 3 survivors drop during removal; in stage 5 another 2 leave: 3 answers < threshold 5.
    leave = {c: "unmasking" for c in (3, 5, 7)} | {c: "noise_removal" for c in (9, 11)}
    run_loopback(server, clients, updates, leave)
    assert server.outcome.startswith("aborted: noise_removal")
    assert server.aggregate is None


def test_rebasing_replaces_the_first_noise_and_aborts_if_a_survivor_drops_while_rebasing():
    _sampled, server, clients, updates, private = setup("rebasing", n=8)
    run_loopback(server, clients, updates, {5: "masked_input"})
    assert server.outcome == "ok"
    assert private.plan.residual(1) == Fraction(0.5)
    _sampled, server, clients, updates, private = setup("rebasing", n=8)
    run_loopback(server, clients, updates, {5: "masked_input", 9: "unmasking"})
    assert server.outcome.startswith("aborted: unmasking: survivors [9] dropped before rebasing")


def test_rebasing_leaves_exactly_the_fresh_noise():
    """y + z = x + n' + PRG(b) + pairwise masks: the aggregate is the encodings plus every survivor's fresh
    noise, whose variance is sigma*^2 / m (the fresh seed is the client's next key-stream draw)."""
    sampled, server, clients, updates, private = setup("rebasing", n=6, dim=2048, scale=40.0, target=2.0)
    run_loopback(server, clients, updates, {})
    assert server.outcome == "ok"
    clean = sum(private.encoding.encode(updates[c], ROTATION, np.random.default_rng(c)) for c in sampled)
    left = private.encoding.decode_sum(private.wrap(clean), ROTATION)
    noise = server.aggregate.vector.astype(np.float64) * 6 - left
    # rotation is orthonormal, so the noise's variance per coordinate stays residual (model units)
    var = float(np.var(noise))
    assert abs(var / 2.0 - 1) < 6 * np.sqrt(2 / 2048) + 0.02


def test_monte_carlo_variance_after_removal_matches_the_target():
    dim, scale, target = 4096, 30.0, 2.0
    _sampled, server, clients, updates, private = setup("xnoise", n=8, dim=dim, scale=scale, target=target)
    run_loopback(server, clients, updates, {5: "masked_input", 9: "unmasking"})
    assert server.outcome == "ok"
    survivors = server.aggregate.survivors
    clean = sum(private.encoding.encode(updates[c], ROTATION, np.random.default_rng(c)) for c in survivors)
    decoded_clean = private.encoding.decode_sum(private.wrap(clean), ROTATION)
    noise = server.aggregate.vector.astype(np.float64) * len(survivors) - decoded_clean
    assert float(private.plan.residual(1)) == target
    # sample variance of 4096 coordinates: relative standard error sqrt(2 / 4096) ~ 2.2%
    assert abs(float(np.var(noise)) / target - 1) < 6 * np.sqrt(2 / dim)


def test_the_decoded_aggregate_is_the_clipped_sum_up_to_the_noise():
    dim, target = 1024, 0.01
    sampled, server, clients, updates, private = setup("xnoise", n=8, dim=dim, scale=2000.0, target=target)
    run_loopback(server, clients, updates, {})
    clipped = sum(private.encoding.clipped(updates[c]).astype(np.float64) for c in sampled)
    error = server.aggregate.vector.astype(np.float64) * 8 - clipped
    # noise of variance target plus rounding (at most 8/4 per coordinate in integer units)
    bound = target + 8 / 4 / 2000.0**2
    assert abs(float(np.mean(error))) < 6 * np.sqrt(bound / dim)
    assert float(np.var(error)) < bound * (1 + 6 * np.sqrt(2 / dim))
    assert float(np.var(error)) > target * (1 - 6 * np.sqrt(2 / dim))


def test_a_client_sending_the_wrong_seeds_is_rejected():
    _sampled, server, clients, updates, _private = setup("xnoise", n=8)
    honest = clients[3].receive

    def receive(message):
        reaction = honest(message)
        sends = []
        for send in reaction.sends:
            m = send.message
            if isinstance(m, UnmaskSharesAndSeeds):  # withhold one seed: more noise would stay... or less
                m = UnmaskSharesAndSeeds(m.round, m.client, m.shares, m.seeds[1:])
            sends.append(dataclasses.replace(send, message=m))
        return dataclasses.replace(reaction, sends=tuple(sends))

    clients[3].receive = receive
    result = run_loopback(server, clients, updates, {})
    assert "sent seeds of components" in result.server_rejected[3]
    # the round goes on without client 3's answer: its seeds come from shares in stage 5
    assert server.outcome == "ok" and server.u3 - server.u5 == {3}


def test_a_client_releases_seed_shares_only_for_survivors_outside_u5():
    _sampled, server, clients, updates, _private = setup("xnoise", n=8)
    sent = []
    run_loopback(server, clients, updates, {9: "unmasking"}, observe=lambda s, m: sent.append((s, m)))
    shares = [m for _, m in sent if isinstance(m, SeedShares)]
    assert shares and all({about for about, _, _ in m.shares} == {9} for m in shares)
    assert all({k for _, k, _ in m.shares} == set(server.removed) for m in shares)


def test_a_server_asking_for_seed_shares_of_a_non_survivor_is_refused():
    _sampled, server, clients, updates, _private = setup("xnoise", n=8)

    def tamper(to, message):
        if isinstance(message, RemovalRequest):
            return RemovalRequest(message.round, (*message.clients, 99))
        return message

    result = run_loopback(server, clients, updates, {9: "unmasking"}, tamper=tamper)
    assert any("noise-removal set" in str(why) for why in result.aborted.values())


def test_malicious_xnoise_runs_and_sends_seeds_only_after_the_signed_check():
    _sampled, server, clients, updates, _private = setup("xnoise", n=8, malicious=True)
    sent = []
    run_loopback(server, clients, updates, {5: "masked_input"}, observe=lambda s, m: sent.append(type(m).__name__))
    assert server.outcome == "ok"
    first_seeds = sent.index("UnmaskSharesAndSeeds")
    assert "ConsistencySignature" in sent[:first_seeds]


def test_collusion_inflates_the_noise_and_accounts_the_honest_part():
    plan = RoundNoise("xnoise", 1.0, 10, 4, threshold=6, collusion=1)
    assert plan.residual(0) == Fraction(6, 5)
    assert plan.accounted(0) == Fraction(6, 5) * Fraction(9, 10)
    assert plan.accounted(4) >= 1  # m = t: exactly the target left to the honest survivors
    assert plan.accounted(4) == Fraction(6, 5) * Fraction(5, 6)


def test_timing_fidelity_sends_the_same_sizes():
    sizes = []
    for suite in (RealSuite(), SizedSuite()):
        _sampled, server, clients, updates, _private = setup("xnoise", n=8, suite=suite)
        result = run_loopback(server, clients, updates, {5: "masked_input", 9: "unmasking"}, encode=False)
        assert server.outcome == "ok"
        sizes.append((result.bytes_up, result.bytes_down))
    assert sizes[0] == sizes[1]


def unmask_upload(strategy, dim):
    _sampled, server, clients, updates, _private = setup(strategy, n=8, dim=dim, suite=SizedSuite())
    sent = []
    run_loopback(server, clients, updates, {}, encode=False, observe=lambda s, m: sent.append(m))
    return max(m.wire_size() for m in sent if isinstance(m, UnmaskShares))


def test_rebasing_upload_grows_with_the_model_xnoise_does_not():
    small, large = 1_000, 100_000
    orig = unmask_upload("orig", small)
    assert unmask_upload("orig", large) == orig
    xnoise = unmask_upload("xnoise", small)
    assert unmask_upload("xnoise", large) == xnoise  # seeds: independent of the model size
    assert xnoise - orig == 4 + 4 * (4 + 4 + 32)  # list length + 4 seeds of (u32 index, length, 32 bytes)
    rebasing_small, rebasing_large = unmask_upload("rebasing", small), unmask_upload("rebasing", large)
    # z: d' values of 20 bits packed (d' = 1024 and 131072)
    assert rebasing_large - rebasing_small == (131072 - 1024) * 20 // 8


def _no_seeds_released(sent):
    return not any(isinstance(m, UnmaskSharesAndSeeds) for _, m in sent)


@pytest.mark.parametrize("fake", [(1000, 1002), (5,)])
def test_a_server_overstating_the_survivors_gets_no_seed(fake):
    """Clients 5 left before sharing keys; the server claims it (or clients never sampled) survived, to make
    clients remove more noise. Every client refuses before releasing a seed."""
    _, server, clients, updates, _ = setup("xnoise", n=8)

    def tamper(to, message):
        if isinstance(message, Survivors):
            return Survivors(message.round, tuple(sorted((*message.clients, *fake))))
        return message

    sent = []
    result = run_loopback(
        server, clients, updates, {5: "share_keys"}, tamper=tamper, observe=lambda s, m: sent.append((s, m))
    )
    assert len(result.aborted) == 7
    assert all("survivor set names" in str(e) for e in result.aborted.values())
    assert _no_seeds_released(sent)


@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
def test_malicious_variant_needs_every_survivors_upload_signature(protocol):
    """Client 5 shared its keys but never uploaded: in the malicious variant the server cannot add it to U3,
    because it holds no upload signature of client 5 (Dordis 3.3), even where clients cannot tell otherwise
    (SecAgg+ non-neighbours)."""
    _, server, clients, updates, _ = setup("xnoise", n=8, malicious=True, protocol=protocol)
    forged = bytes(64)

    def tamper(to, message):
        if isinstance(message, SignedUploads):
            pairs = sorted((*zip(message.clients, message.signatures, strict=True), (5, forged)))
            return SignedUploads(message.round, tuple(c for c, _ in pairs), tuple(s for _, s in pairs))
        return message

    sent = []
    result = run_loopback(
        server, clients, updates, {5: "masked_input"}, tamper=tamper, observe=lambda s, m: sent.append((s, m))
    )
    assert result.aborted
    assert all("upload signature does not verify" in str(e) for e in result.aborted.values())
    assert _no_seeds_released(sent)


def test_malicious_variant_rejects_a_survivor_set_without_upload_signatures():
    _, server, clients, updates, _ = setup("xnoise", n=8, malicious=True)

    def tamper(to, message):
        return Survivors(message.round, message.clients) if isinstance(message, SignedUploads) else message

    result = run_loopback(server, clients, updates, {}, tamper=tamper)
    assert len(result.aborted) == 8
    assert all("without every member's upload signature" in str(e) for e in result.aborted.values())


def test_a_sum_unmasked_before_a_noise_removal_abort_is_marked_exposed():
    _, server, clients, updates, _ = setup("xnoise", n=8)
    leave = {c: "unmasking" for c in (3, 5, 7)} | {c: "noise_removal" for c in (9, 11)}
    run_loopback(server, clients, updates, leave)
    assert server.outcome.startswith("aborted: noise_removal") and server.aggregate is None
    assert server.exposed == 8  # every survivor's masks were removed: the engine accounts this round
