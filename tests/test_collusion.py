"""The malicious variant's consistency check against colluders (sim/protocol/collusion.py).

A server with T_C colluding clients can show two disjoint camps of honest holders two survivor sets, each
confirmed by the colluders too, and collect one camp's shares of a client's seed and the other's of its
key. Scenarios and round configurations whose threshold lets that happen are refused; the tests check the
refusal against an independent brute force over camp sizes, and the bound against the real machines.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.crypto import signatures
from sim.crypto.randomness import SeededRandom
from sim.loopback import run_loopback
from sim.protocol.collusion import smallest_safe_fraction, split_view_possible
from sim.protocol.machine import RoundSetupError
from sim.protocol.messages import (
    SHARE_OF_KEY,
    SHARE_OF_SEED,
    ConsistencySignature,
    SignedSurvivors,
    Survivors,
    UnmaskShares,
)
from sim.protocol.params import AggregationParams
from sim.protocol.registry import neighbourhoods, round_machines
from sim.protocol.secagg.config import TooFewClientsError, share_threshold
from sim.protocol.suite import RealSuite, survivors_bytes
from sim.runner import run_scenario
from sim.scenario import ScenarioError, load
from sim.scenario.parser import parse
from sim.scenario.source import parse_text

PRIVACY = Path(__file__).resolve().parent.parent / "scenarios" / "privacy.yaml"


def split_attack_possible(t: int, holders: int, collusion: int) -> bool:
    """By brute force over the attack itself: some c <= T_C of the victim's holders collude (never the victim),
    and two disjoint camps of the n - c honest holders, of sizes a (may hold the victim) and b (may not: a
    client refuses a survivor set without itself), each reach t confirmations with the colluders' help."""
    for c in range(min(collusion, holders - 1) + 1):
        honest = holders - c
        for a in range(honest + 1):
            for b in range(min(honest - a, honest - 1) + 1):
                if a + c >= t and b + c >= t:
                    return True
    return False


def holders_of(protocol: str, clients: int, neighbours: int | None) -> int:
    """|H(u)| in the round's actual graph: the client and its neighbours (the same for every client)."""
    graph = neighbourhoods(AggregationParams(protocol, neighbours=neighbours), tuple(range(clients)), 0)
    return len(graph[0]) + 1


def scenario(protocol: str, clients: int, threshold: float, collusion: int, neighbours: int | None = None) -> str:
    degree = f", neighbours: {neighbours}" if neighbours is not None else ""
    return (
        f"name: c\nrounds: 1\npopulation: {clients}\nsampling: {{clients_per_round: {clients}}}\n"
        "data: {dataset: synthetic}\nfidelity: timing\n"
        f"aggregation: {{protocol: {protocol}, threshold: {threshold!r}, adversary: malicious{degree}}}\n"
        f"privacy: {{collusion: {collusion}}}\n"
    )


def problem_keys(text: str) -> set[str]:
    """The keys the scenario check reports problems at (empty: accepted)."""
    try:
        parse(parse_text(text, "s.yaml"))
    except ScenarioError as exc:
        return {p.key for p in exc.problems}
    return set()


def refused(text: str) -> bool:
    return bool(problem_keys(text))


# -- the scenario check -----------------------------------------------------------------------------------
def test_the_reviewed_command_is_refused_with_the_keys_and_the_smallest_safe_threshold(capsys):
    # privacy.yaml: SecAgg, 10 sampled clients, threshold 0.5: t = floor(0.5 * 10) + 1 = 6 of 10 holders, and
    # 2t = 12 <= 10 + 4, so camps of 2 honest holders each reach t with the 4 colluders. The smallest safe t
    # is floor((10 + 4) / 2) + 1 = 8, i.e. floor(threshold * 10) >= 7: threshold 0.7; t = 6 withstands at
    # most 2 * 6 - 10 - 1 = 1 colluder.
    argv = ["check", str(PRIVACY), "--set", "aggregation.adversary=malicious", "--set", "privacy.collusion=4"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "dropsim: --set privacy.collusion=4: privacy.collusion: is 4 with aggregation.adversary: malicious and "
        "aggregation.threshold: 0.5, whose t = 6 of the 10 holders of each secret (secagg, 10 sampled clients) "
        "is too low: a server with 4 colluding clients could show two camps of honest holders different "
        "survivor sets, each confirmed by t holders, and recover a client's input from one camp's shares of its "
        "seed and the other's of its key (the consistency check needs 2t > holders + colluding holders, "
        "docs/protocols.md); raise aggregation.threshold to at least 0.7 (t = 8), or lower privacy.collusion "
        "to at most 1\n"
    )
    assert main([*argv, "--set", "aggregation.threshold=0.7"]) == 0  # every point of the sweep passes
    assert main([*argv, "--set", "aggregation.threshold=0.69"]) == 2  # t = 7: 14 <= 14


def test_the_semi_honest_variant_is_unchanged(capsys):
    # No consistency check to defeat: collusion only has to stay below t (privacy.md), 4 < 6.
    assert main(["check", str(PRIVACY), "--set", "privacy.collusion=4"]) == 0
    assert (
        main(["check", str(PRIVACY), "--set", "aggregation.adversary=malicious", "--set", "privacy.collusion=1"]) == 0
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data(), protocol=st.sampled_from(["secagg", "secagg+"]), clients=st.integers(1, 40))
def test_the_scenario_check_refuses_exactly_when_the_split_attack_is_possible(data, protocol, clients):
    neighbours = data.draw(st.integers(2, max(2, clients)), label="neighbours") if protocol == "secagg+" else None
    holders = holders_of(protocol, clients, neighbours)
    t = data.draw(st.integers(1, holders), label="t")
    collusion = data.draw(st.integers(1, holders + 2), label="collusion")
    threshold = (t - 0.5) / holders  # floor(threshold * holders) + 1 = t
    assert share_threshold(threshold, holders) == t
    keys = problem_keys(scenario(protocol, clients, threshold, collusion, neighbours))
    assert ("privacy.collusion" in keys) == split_attack_possible(t, holders, collusion)
    # threshold < 0.5 and t = 1 are refused on their own (at aggregation.threshold); with collusion >= 1
    # they are attackable too, so the scenario is accepted exactly when no split is possible
    assert keys <= {"privacy.collusion", "aggregation.threshold"}


@settings(max_examples=300, deadline=None)
@given(holders=st.integers(1, 5000), data=st.data())
def test_the_suggested_threshold_is_the_smallest_safe_one_at_its_precision(holders, data):
    collusion = data.draw(st.integers(0, holders + 1), label="collusion")
    fraction = smallest_safe_fraction(holders, collusion)
    step = 10.0 ** -max(3, len(repr(fraction).split(".")[1]))
    assert 0 <= fraction < 1
    # (split_view_possible agrees with the brute force: the tests above)
    assert not split_view_possible(share_threshold(fraction, holders), holders, collusion)
    if fraction >= step:  # one step lower, as a user would type it, is attackable
        assert split_view_possible(share_threshold(round(fraction - step, 12), holders), holders, collusion)


POISSON = """\
name: p
seed: 2
rounds: 12
population: 20
sampling: {rate: 0.2}
dropout: {rate: 0.0}
data: {dataset: synthetic}
model: {params: 1000}
fidelity: timing
aggregation: {protocol: secagg, threshold: 0.6, adversary: malicious}
privacy: {collusion: 1}
"""


def test_poisson_rounds_are_checked_at_the_nominal_size_and_again_as_they_are_built(tmp_path):
    # Nominal round: round(0.2 * 20) = 4 clients, t = floor(2.4) + 1 = 3, 6 > 4 + 1: accepted. At rate 0.25
    # it is 5 clients, t = 4, 8 > 6, and at 0.15 it is 3 clients, t = 2, 4 <= 3 + 1: refused.
    assert not refused(POISSON)
    assert not refused(POISSON.replace("rate: 0.2}", "rate: 0.25}"))
    with pytest.raises(ScenarioError) as info:
        parse(parse_text(POISSON.replace("rate: 0.2}", "rate: 0.15}"), "p.yaml"))
    assert "whose t = 2 of the 3 holders of each secret (secagg, a nominal 3 sampled clients at Poisson rate " in (
        str(info.value)
    )
    # Seed 2 draws a round of 3 (round 3): it aborts before anything is sent; the others run.
    path = tmp_path / "p.yaml"
    path.write_text(POISSON)
    run_scenario(load(path, output=str(tmp_path / "out")).base(), tmp_path / "out", progress=False)
    table = pd.read_csv(tmp_path / "out" / "rounds.csv")
    small = table[table["sampled"] == 3]
    assert list(small["outcome"]) == [
        "aborted: threshold 0.6 gives client 7's 3 holders t = 2, which a server with 1 colluding client can reach "
        "in two camps shown different survivor sets (2t <= holders + colluding holders): the malicious variant "
        "needs t >= 3 (threshold >= 0.667)"
    ]
    assert set(table[table["sampled"] != 3]["outcome"]) == {"ok"}


# -- the protocol configuration ---------------------------------------------------------------------------
def machines(protocol="secagg", n=10, threshold=0.5, collusion=0, neighbours=None, malicious=True, seed=0):
    sampled = tuple(range(100, 100 + n))
    params = dataclasses.replace(
        AggregationParams(protocol, 20, 1.0, threshold, neighbours, malicious), collusion=collusion
    )
    keys = {c: signatures.generate(SeededRandom(bytes([c % 256]) * 32)) for c in sampled}
    server, factory = round_machines(params, 5, sampled, 8, RealSuite(), seed, {c: k[1] for c, k in keys.items()})
    clients = {
        c: factory(
            c, SeededRandom(seed.to_bytes(8, "little") + bytes([c % 256]) * 24), np.random.default_rng(c), keys[c][0]
        )
        for c in sampled
    }
    rng = np.random.default_rng(seed)
    updates = {c: rng.normal(0, 0.2, 8).astype(np.float32) for c in sampled}
    return sampled, server, clients, updates, {c: k[0] for c, k in keys.items()}


def test_the_protocol_configuration_refuses_an_unsafe_malicious_round():
    with pytest.raises(RoundSetupError) as info:
        machines(threshold=0.5, collusion=4)
    assert str(info.value) == (
        "threshold 0.5 gives client 100's 10 holders t = 6, which a server with 4 colluding clients can reach in "
        "two camps shown different survivor sets (2t <= holders + colluding holders): the malicious variant "
        "needs t >= 8 (threshold >= 0.7)"
    )
    machines(threshold=0.7, collusion=4)  # t = 8: 16 > 14
    machines(threshold=0.5, collusion=4, malicious=False)  # semi-honest: no consistency check, unchanged


def test_a_safe_malicious_round_with_colluders_declared_still_runs():
    # 10 holders, T_C = 2: t >= floor(12 / 2) + 1 = 7, threshold 0.6. Two clients drop before uploading.
    sampled, server, clients, updates, _ = machines(threshold=0.6, collusion=2)
    assert server.config.threshold(sampled[0]) == 7
    run_loopback(server, clients, updates, {sampled[3]: "masked_input", sampled[8]: "masked_input"})
    assert server.outcome == "ok"
    _, plain, plain_clients, _, _ = machines(malicious=False)
    run_loopback(plain, plain_clients, updates, {sampled[3]: "masked_input", sampled[8]: "masked_input"})
    assert np.array_equal(server.aggregate.vector, plain.aggregate.vector)  # the same sum as semi-honest


def test_secagg_plus_is_checked_per_neighbourhood():
    # 20 clients, T_C = 1. SecAgg: t = 11 of 20, 22 > 21, safe. SecAgg+ of degree 4: each secret has 5
    # holders, t = floor(2.5) + 1 = 3, and 6 <= 5 + 1: unsafe; it needs t >= floor(6 / 2) + 1 = 4, i.e.
    # floor(threshold * 5) >= 3: threshold 0.6.
    machines("secagg", 20, threshold=0.5, collusion=1)
    with pytest.raises(RoundSetupError, match=r"client 100's 5 holders t = 3, .* needs t >= 4 \(threshold >= 0.6\)"):
        machines("secagg+", 20, threshold=0.5, collusion=1, neighbours=4)
    machines("secagg+", 20, threshold=0.6, collusion=1, neighbours=4)
    with pytest.raises(ScenarioError) as info:
        parse(parse_text(scenario("secagg+", 20, 0.5, 1, neighbours=4), "s.yaml"))
    (problem,) = info.value.problems
    assert problem.key == "privacy.collusion"
    assert "whose t = 3 of the 5 holders of each secret (secagg+, 5 per neighbourhood of 20 sampled clients)" in (
        problem.message
    )
    assert problem.message.endswith(
        "raise aggregation.threshold to at least 0.6 (t = 4), or lower privacy.collusion to at most 0"
    )
    assert not refused(scenario("secagg", 20, 0.5, 1))
    assert not refused(scenario("secagg+", 20, 0.6, 1, neighbours=4))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), protocol=st.sampled_from(["secagg", "secagg+"]), n=st.integers(2, 24))
def test_the_configuration_refuses_exactly_when_the_split_attack_is_possible(data, protocol, n):
    neighbours = data.draw(st.integers(2, n), label="neighbours") if protocol == "secagg+" else None
    holders = holders_of(protocol, n, neighbours)
    t = data.draw(st.integers(2, holders), label="t") if holders > 1 else 1  # t = 1 is refused on its own
    collusion = data.draw(st.integers(0, holders + 2), label="collusion")
    try:
        machines(protocol, n, (t - 0.5) / holders, collusion, neighbours)
    except RoundSetupError:
        assert split_attack_possible(t, holders, collusion)
    else:
        assert not split_attack_possible(t, holders, collusion)


# -- the bound on the real machines -----------------------------------------------------------------------
def split_view(threshold: float, camp_b: int) -> tuple[int, set[int], set[int]]:
    """Play the attack on 10 clients, 2 of them colluding (declared 0, so the round is built): the server
    tells ``camp_b`` honest clients that client u dropped and the rest that it survived, and hands each camp
    its own camp's consistency signatures plus the colluders', signed for that camp's survivor set. Returns
    t and the holders that released a share of u's seed, and of u's mask key."""
    sampled, server, clients, updates, signing = machines(threshold=threshold)
    cfg = server.config
    u, colluders = sampled[0], set(sampled[-2:])
    told_dropped = set(sampled[1 : 1 + camp_b])
    view_b = tuple(c for c in sampled if c != u)
    forged = {c: signatures.sign(signing[c], survivors_bytes(cfg.session, cfg.round, view_b)) for c in colluders}
    signed: dict[int, bytes] = {}  # each honest client's consistency signature, on the set it was shown
    shown: set[int] = set()

    def camp_view(to: int) -> SignedSurvivors:
        shown.add(to)
        camp = told_dropped if to in told_dropped else set(sampled) - told_dropped
        sigs = {c: g for c, g in signed.items() if c in camp}
        if to in told_dropped:
            sigs.update(forged)
        return SignedSurvivors(cfg.round, tuple(sorted(sigs.items())))

    def tamper(to, message):
        if isinstance(message, Survivors) and to in told_dropped:
            return dataclasses.replace(message, clients=view_b)
        return camp_view(to) if isinstance(message, SignedSurvivors) else message

    released: dict[int, set[int]] = {SHARE_OF_SEED: set(), SHARE_OF_KEY: set()}

    def observe(sender, message):
        if isinstance(message, ConsistencySignature):
            signed[sender] = message.signature
        if isinstance(message, UnmaskShares):
            for about, kind, _share in message.shares:
                if about == u:
                    released[kind].add(sender)

    result = run_loopback(server, clients, updates, tamper=tamper, observe=observe)
    # The server machine plays it honestly from its own view (a machine that checks the signatures leaves
    # camp B out, and aborts when too few remain): the attacker writes to whoever it did not reach itself.
    for c in sorted(set(sampled) - shown - set(result.aborted)):
        try:
            reaction = clients[c].receive(camp_view(c))
        except TooFewClientsError as exc:
            result.aborted[c] = exc
            continue
        for send in reaction.sends:
            observe(c, send.message)
    refusing = {c for c, e in result.aborted.items() if isinstance(e, TooFewClientsError)}
    assert refusing | released[SHARE_OF_SEED] | released[SHARE_OF_KEY] == set(sampled)  # every client decided
    assert not refusing & (released[SHARE_OF_SEED] | released[SHARE_OF_KEY])
    return cfg.threshold(u), released[SHARE_OF_SEED] | colluders, released[SHARE_OF_KEY] | colluders


@pytest.mark.parametrize(("threshold", "t"), [(0.5, 6), (0.6, 7)])
def test_the_split_succeeds_exactly_below_the_bound(threshold, t):
    # 10 holders of which 2 collude: the attack needs 2t <= 12, so it works at t = 6 (camps of 4 and 4)
    # and at t = 7 no split of the 8 honest holders gives both camps 5. Colluders hold their own shares
    # of both of u's secrets, so the server reconstructs a secret when the camp plus colluders reach t.
    outcomes = {}
    for camp_b in range(1, 8):
        got_t, seed_shares, key_shares = split_view(threshold, camp_b)
        assert got_t == t
        outcomes[camp_b] = (len(seed_shares) >= t, len(key_shares) >= t)
    if t == 6:
        assert outcomes[4] == (True, True)  # u's seed and key: its input is exposed
        assert [b for b, both in outcomes.items() if all(both)] == [4]
    else:
        assert not any(all(both) for both in outcomes.values())


MALICIOUS = """
name: malicious
rounds: 1
population: 10
sampling: {clients_per_round: 5}
data: {dataset: digits}
model: {name: mlp}
aggregation: {protocol: secagg, adversary: malicious, threshold: 0.8}
"""


@pytest.mark.parametrize(
    ("extra", "warned"),
    [("", True), ("privacy: {collusion: 0}\n", True), ("privacy: {collusion: 1}\n", False)],
    ids=["unset", "zero", "one"],
)
def test_check_warns_that_a_malicious_scenario_without_collusion_assumes_no_colluders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, warned: bool
) -> None:
    path = tmp_path / "malicious.yaml"
    path.write_text(MALICIOUS + extra)
    assert main(["check", str(path)]) == 0  # a warning, not an error
    out = capsys.readouterr().out
    line = f"warning: {path}{':9' if extra else ''}: privacy.collusion: is 0: no colluders are assumed;"
    assert (line in out) == warned, out
    semi_honest = tmp_path / "semi.yaml"
    semi_honest.write_text(MALICIOUS.replace("adversary: malicious, ", ""))
    assert main(["check", str(semi_honest)]) == 0
    assert "warning" not in capsys.readouterr().out
