"""A worker's own security policy (sim/deploy/policy.py): what it accepts of the server's scenario and rounds.

The server sends the scenario, so a worker without a policy ran whatever it was told: FedAvg (its update in
the clear), ``plain``, a threshold a server can split, no noise. These tests pin what the default policy
refuses and accepts, each rule against an independent statement of it (the split-view rule by brute force
over camp sizes, epsilon by the accountant's own curve at the dropout count that costs most), the forms a
policy is given in (flags, a file, the manifest's record), and a worker refusing a round before it downloads
or sends anything of it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_collusion import split_attack_possible  # its brute force over the attack's camps

import sim
from sim.cli import main
from sim.deploy import control
from sim.deploy import identity as ids
from sim.deploy.policy import (
    SAFE_POLICY,
    PolicyError,
    WorkerPolicy,
    policy_from_mapping,
    read_policy,
    scenario_policy,
)
from sim.deploy.spending import MAX_EVALUATED_CLIENTS, Spending, WorstCase
from sim.dp.accounting import epsilon
from sim.protocol.registry import reconstruction_threshold, secret_holders
from sim.protocol.secagg.config import share_threshold
from sim.round.privacy import PrivacyLedger, nominal_sampling
from sim.scenario.types import Scenario

ROOT = Path(__file__).resolve().parent.parent

BASE = {
    "name": "policy",
    "seed": 1,
    "rounds": 30,
    "population": 100,
    "sampling": {"clients_per_round": 10},
    "data": {"dataset": "digits", "partition": "iid"},
    "model": {"name": "mlp"},
    "aggregation": {"protocol": "secagg", "bits": 20, "threshold": 0.5},
}


def scenario(*overrides: str) -> Scenario:
    return sim.load_scenario(BASE, list(overrides)).base()


def ledger(sc: Scenario, dim: int = 10_000) -> PrivacyLedger:
    q, n = nominal_sampling(sc)
    return PrivacyLedger(sc.privacy, sc.aggregation, sc.rounds, q, n, dim, sc.seed)


# -- the default policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["fedavg", "plain"])
def test_the_default_policy_refuses_a_protocol_that_leaves_the_update_readable(protocol: str) -> None:
    sc = scenario(f"aggregation.protocol={protocol}")
    (refusal,) = SAFE_POLICY.scenario_refusals(sc)
    assert refusal == (f"aggregation.protocol {protocol}: this worker accepts secagg, secagg+ (policy: protocols)")
    assert replace(SAFE_POLICY, protocols=(protocol,)).scenario_refusals(sc) == []


@pytest.mark.parametrize("protocol", ["secagg", "secagg+"])
def test_the_default_policy_accepts_secagg_at_a_safe_threshold(protocol: str) -> None:
    assert SAFE_POLICY.scenario_refusals(scenario(f"aggregation.protocol={protocol}")) == []


def test_the_default_policy_refuses_a_semi_honest_threshold_a_server_can_split() -> None:
    """The review's case: the semi-honest variant, a threshold of 2 of 4 holders. Without signatures a server
    that deviates shows one camp of two a survivor set with the victim and the other one without it."""
    sc = scenario("sampling.clients_per_round=4", "aggregation.threshold=0.25")
    (refusal,) = SAFE_POLICY.scenario_refusals(sc)
    assert refusal == (
        "aggregation.threshold 0.25: a planned round of 4 clients shares this worker's secrets 2 of 4, which a "
        "server with 0 colluding holders can split into two camps and so recover them; at least 3 of 4 defeats "
        "that (policy: collusion, privacy.collusion)"
    )
    assert replace(SAFE_POLICY, collusion=None).scenario_refusals(sc) == []


def test_the_collusion_rule_takes_the_larger_of_the_policys_and_the_scenarios() -> None:
    sc = scenario("sampling.clients_per_round=4")  # t = 3 of 4: safe against one colluder, not two
    assert split_attack_possible(3, 4, 2) and not split_attack_possible(3, 4, 1)
    assert SAFE_POLICY.scenario_refusals(sc) == []
    assert replace(SAFE_POLICY, collusion=1).scenario_refusals(sc) == []
    assert any("2 colluding holders" in r for r in replace(SAFE_POLICY, collusion=2).scenario_refusals(sc))
    declared = scenario("sampling.clients_per_round=4", "privacy={strategy: xnoise, collusion: 2}")
    assert any("2 colluding holders" in r for r in SAFE_POLICY.scenario_refusals(declared))


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 40),
    fraction=st.sampled_from([0.0, 0.2, 0.25, 0.34, 0.5, 0.6, 0.67, 0.75, 0.9]),
    declared=st.integers(0, 5),
    own=st.one_of(st.none(), st.integers(0, 6)),
    least=st.sampled_from([0.0, 0.3, 0.5, 0.7]),
    protocol=st.sampled_from(["secagg", "secagg+"]),
)
def test_a_round_is_refused_exactly_when_its_threshold_breaks_a_rule(
    n: int, fraction: float, declared: int, own: int | None, least: float, protocol: str
) -> None:
    """Each rule stated on its own: t below the policy's fraction of the holders; a split view by the
    colluders (by brute force); and a smallest revealed sum (t inputs) that the worker and the colluders
    could make up alone (t < c + 2)."""
    sc = scenario(f"aggregation.protocol={protocol}")
    sc = replace(
        sc,
        aggregation=replace(sc.aggregation, threshold=fraction),
        privacy=replace(sc.privacy, collusion=declared),
    )
    policy = WorkerPolicy(protocols=("secagg", "secagg+"), threshold=least, collusion=own)
    t = reconstruction_threshold(sc.aggregation, n)
    c = max(own or 0, declared)
    few = own is not None and t < c + 2
    below = split = False
    if n >= 2:
        holders = secret_holders(sc.aggregation, n)
        below = least > 0 and t < share_threshold(least, holders)
        split = own is not None and split_attack_possible(t, holders, c)
    refusals = policy.round_refusals(sc, n)
    assert len(refusals) == below + split + few, refusals
    assert sum("could all be" in r for r in refusals) == few


def test_a_round_of_one_client_or_of_the_worker_and_colluders_alone_is_refused() -> None:
    """The review's cases: one client (its sum is its update), and 3 clients at threshold 0.9 with 2
    colluders (t = 3: the worker and both colluders make a sum)."""
    sc = scenario()
    (refusal,) = SAFE_POLICY.round_refusals(sc, 1)
    assert refusal == (
        "sampling: a round of 1 clients can reveal a sum of 1 inputs, this worker's and 0 more, which 0 colluding "
        "clients could all be: at least 2 (policy: collusion, privacy.collusion)"
    )
    sc = scenario("aggregation.threshold=0.9")
    assert reconstruction_threshold(sc.aggregation, 3) == 3
    (refusal,) = replace(SAFE_POLICY, collusion=2).round_refusals(sc, 3)
    assert "a sum of 3 inputs, this worker's and 2 more, which 2 colluding clients could all be" in refusal
    assert replace(SAFE_POLICY, collusion=1).round_refusals(sc, 3) == []
    assert replace(SAFE_POLICY, collusion=None).round_refusals(sc, 1) == []  # what a deployment's own accept


def test_secagg_plus_is_judged_by_the_holders_of_this_workers_secrets() -> None:
    sc = scenario("aggregation.protocol=secagg+", "sampling.clients_per_round=60", "aggregation.threshold=0.3")
    holders, t = secret_holders(sc.aggregation, 60), reconstruction_threshold(sc.aggregation, 60)
    assert holders < 60 and split_attack_possible(t, holders, 0)
    (refusal,) = SAFE_POLICY.scenario_refusals(sc)
    assert f"{t} of {holders}, which" in refusal


def test_a_malicious_policy_requires_the_malicious_variant() -> None:
    policy = replace(SAFE_POLICY, adversary="malicious")
    assert policy.scenario_refusals(scenario()) == [
        "aggregation.adversary semi-honest: this worker requires the malicious variant (policy: adversary)"
    ]
    assert policy.scenario_refusals(scenario("aggregation.adversary=malicious", "aggregation.threshold=0.6")) == []


@pytest.mark.parametrize(
    ("strategy", "refused"),
    [("none", "adds no noise"), ("central", "has the server add the noise"), ("xnoise", ""), ("orig", "")],
)
def test_a_policy_requiring_dp_refuses_noise_the_clients_do_not_add(strategy: str, refused: str) -> None:
    sc = scenario(f"privacy={{strategy: {strategy}}}")
    refusals = replace(SAFE_POLICY, dp_required=True).scenario_refusals(sc)
    assert [r for r in refusals if refused in r] == refusals
    assert len(refusals) == (1 if refused else 0)
    if refused:
        assert refusals[0].startswith(f"privacy.strategy {strategy} {refused}")
        assert refusals[0].endswith("(policy: dp)")


# -- epsilon at the worst case ---------------------------------------------------------------------------

XNOISE = "privacy={strategy: xnoise, epsilon: 6, delta: 0.001}"
ORIG = "privacy={strategy: orig, epsilon: 6, delta: 0.001}"


def planned_round(book: PrivacyLedger, n: int = 10) -> tuple[object, float]:
    plan = book.plan(n)
    return plan, book.scale(n, plan.largest_residual, book.largest_component(plan))


def test_xnoise_at_its_worst_case_costs_what_was_planned() -> None:
    """XNoise-Prec leaves exactly sigma*^2 while at most T clients drop, and a round that reveals a sum has lost
    at most n - t <= T: with the server's sampling trusted, every round at its worst case is the plan, whose
    budget is privacy.epsilon."""
    sc = scenario(XNOISE)
    book = ledger(sc)
    _, scale = planned_round(book)
    q = book.rate
    planned = book.accountant.round_rdp(float(book.target), 10, scale, q)
    worst = WorstCase(sc, book, 0)
    np.testing.assert_array_equal(worst.curve(10, q), planned)
    total = epsilon(planned * 30, book.accountant.orders, 0.001)[0]
    assert worst.epsilon(planned * 30) == total
    assert total == pytest.approx(6.0, rel=1e-6)  # plan_variance's budget, met from below
    trusted = Spending(replace(SAFE_POLICY, max_epsilon_total=6.0 + 1e-6, trust_sampling=True), sc, book)
    assert trusted.scenario_refusals() == []


def test_orig_at_its_worst_case_costs_its_fewest_survivors() -> None:
    """Orig's noise shrinks with every dropout: its worst round is the one that still reveals a sum with t
    survivors, n - t = 4 of 10 dropped, accounted at (n - d) / n sigma*^2."""
    sc = scenario(ORIG)
    book = ledger(sc)
    plan, scale = planned_round(book)
    assert book.threshold(10) == 6 and float(plan.accounted(4)) == pytest.approx(0.6 * float(book.target))
    worst = book.accountant.round_rdp(float(plan.accounted(4)), 6, scale, book.rate)
    np.testing.assert_array_equal(WorstCase(sc, book, 0).curve(10, book.rate), worst)
    total = epsilon(30 * worst, book.accountant.orders, 0.001)[0]
    assert total > 6
    trusted = replace(SAFE_POLICY, max_epsilon_total=6.0, trust_sampling=True)
    assert Spending(trusted, sc, book).scenario_refusals() == [
        f"privacy: 30 rounds of 10 clients can cost epsilon {total:.4g}, every round at its worst case at sampling "
        f"rate 0.1 (the planned budget is 6): this worker spends at most 6 (policy: max_epsilon_total)"
    ]
    assert Spending(replace(trusted, max_epsilon_total=math.ceil(total)), sc, book).scenario_refusals() == []


def test_the_worst_case_counts_the_colluders_the_policy_assumes() -> None:
    """With c colluders among the m survivors the server knows their share of the noise: XNoise's worst round
    (m = t = 6, sigma*^2 left) is accounted at sigma*^2 (6 - c) / 6 (the review's case: a policy assuming 2
    colluders where the scenario declares none)."""
    sc = scenario(XNOISE)
    book = ledger(sc)
    _, scale = planned_round(book)
    for c in (0, 2, 4):
        expected = book.accountant.round_rdp(float(book.target) * (6 - c) / 6, 6, scale, 1.0)
        np.testing.assert_allclose(WorstCase(sc, book, c).curve(10, 1.0), expected, rtol=1e-12)
    alone, two = (WorstCase(sc, book, c).epsilon(WorstCase(sc, book, c).curve(10, 1.0)) for c in (0, 2))
    assert two > alone
    limit = (alone + two) / 2
    assert Spending(replace(SAFE_POLICY, max_epsilon_round=limit), sc, book).round_refusals(1, 10, None) == []
    assert Spending(replace(SAFE_POLICY, max_epsilon_round=limit, collusion=2), sc, book).round_refusals(1, 10, None)


def test_untrusted_sampling_counts_each_round_as_if_everyone_took_part() -> None:
    """The subsampling is the server's: by default a round is accounted at q = 1, and a server that claims a
    smaller rate than planned lowers nothing even when its sampling is trusted."""
    sc = scenario(XNOISE)
    book = ledger(sc)
    untrusted = Spending(replace(SAFE_POLICY, max_epsilon_round=100.0), sc, book)
    trusted = Spending(replace(SAFE_POLICY, max_epsilon_round=100.0, trust_sampling=True), sc, book)
    assert untrusted.rate(None) == untrusted.rate(1e-9) == 1.0
    assert trusted.rate(None) == trusted.rate(1e-9) == book.rate == 0.1
    assert trusted.rate(0.5) == 0.5
    worst = WorstCase(sc, book, 0)
    assert worst.epsilon(worst.curve(10, 1.0)) > 2 * worst.epsilon(worst.curve(10, 0.1))


def test_the_total_is_what_the_rounds_played_can_have_cost() -> None:
    """Without trusted sampling each round played costs its worst case at q = 1, and a round that would pass
    the total is refused: exactly as many are played as compose within it."""
    sc = scenario(XNOISE, "rounds=50")
    book = ledger(sc)
    worst = WorstCase(sc, book, 0)
    one = worst.curve(10, 1.0)
    limit = 4.0 * worst.epsilon(one)
    fits = max(k for k in range(1, 50) if worst.epsilon(k * one) <= limit)
    spending = Spending(replace(SAFE_POLICY, max_epsilon_total=limit), sc, book)
    assert spending.scenario_refusals() == []
    played = 0
    for number in range(1, 51):
        if spending.round_refusals(number, 10, None):
            break
        spending.record(number, 10, None)
        played += 1
    assert played == fits > 4
    (refusal,) = spending.round_refusals(played + 1, 10, None)
    assert refusal.endswith(f"more than its {limit:g} (policy: max_epsilon_total)")
    single = Spending(replace(SAFE_POLICY, max_epsilon_total=worst.epsilon(one) / 2), sc, book)
    assert "a single planned round of 10 clients can cost" in single.scenario_refusals()[0]


def test_a_round_number_is_one_of_the_scenarios_and_played_once() -> None:
    spending = Spending(SAFE_POLICY, scenario("rounds=3"), None)
    assert spending.round_problem(0) == "round 0 is not one of the scenario's rounds 1..3"
    assert spending.round_problem(4) == "round 4 is not one of the scenario's rounds 1..3"
    assert spending.round_problem(2) == ""
    spending.record(2, 10, None)
    assert spending.round_problem(2) == "this worker played round 2 already"


def test_rounds_too_large_to_evaluate_or_to_plan_are_refused_not_raised() -> None:
    sc = scenario(XNOISE, "population=5000")
    spending = Spending(replace(SAFE_POLICY, max_epsilon_round=100.0), sc, ledger(sc))
    (refusal,) = spending.round_refusals(1, MAX_EVALUATED_CLIENTS + 1, None)
    assert f"this worker evaluates rounds of at most {MAX_EVALUATED_CLIENTS} clients" in refusal
    colluding = scenario("privacy={strategy: xnoise, collusion: 2}")
    spending = Spending(replace(SAFE_POLICY, max_epsilon_round=100.0), colluding, ledger(colluding))
    (refusal,) = spending.round_refusals(1, 3, None)  # t = 2 of 3, not above the 2 colluders
    assert "its noise cannot be planned: privacy.collusion 2 is not below the threshold" in refusal


def test_an_epsilon_limit_refuses_a_scenario_whose_clients_add_no_noise() -> None:
    for strategy in ("none", "central"):
        sc = scenario(f"privacy={{strategy: {strategy}}}")
        (refusal,) = replace(SAFE_POLICY, max_epsilon_total=10.0).scenario_refusals(sc)
        assert "requires DP noise from the clients" in refusal
        assert refusal.endswith("(policy: max_epsilon_round, max_epsilon_total)")


# -- plug-ins, seeded secrets ------------------------------------------------------------------------------


def test_plugins_and_seeded_secrets_only_where_allowed() -> None:
    document = {"model": {"factory": "os:system", "args": {"command": "true"}}}
    assert "names plug-ins (model.factory: 'os:system')" in SAFE_POLICY.plugin_refusals(document)[0]
    assert replace(SAFE_POLICY, plugins=True).plugin_refusals(document) == []
    assert "--seeded-secrets" in SAFE_POLICY.secrets_refusals(True)[0]
    assert SAFE_POLICY.secrets_refusals(False) == []
    assert replace(SAFE_POLICY, seeded_secrets=True).secrets_refusals(True) == []


# -- the forms a policy is given in ------------------------------------------------------------------------

PROTOCOL_NAMES = ["fedavg", "plain", "secagg", "secagg+"]
POLICIES = st.builds(
    WorkerPolicy,
    protocols=st.lists(
        st.sampled_from(["fedavg", "plain", "secagg", "secagg+"]), min_size=1, max_size=4, unique=True
    ).map(tuple),
    adversary=st.sampled_from(["semi-honest", "malicious"]),
    threshold=st.sampled_from([0.0, 0.5, 0.6666, 0.9]),
    collusion=st.one_of(st.none(), st.integers(0, 50)),
    dp_required=st.booleans(),
    max_epsilon_round=st.sampled_from([math.inf, 0.5, 2.25]),
    max_epsilon_total=st.sampled_from([math.inf, 1.0, 8.0]),
    trust_sampling=st.booleans(),
    plugins=st.booleans(),
    seeded_secrets=st.booleans(),
)


@settings(max_examples=30, deadline=None)
@given(policy=POLICIES)
def test_a_policy_survives_its_plain_form_and_its_flags(policy: WorkerPolicy) -> None:
    from sim.cli.deploy import worker_policy
    from sim.cli.main import build_parser

    assert policy_from_mapping(policy.as_dict()) == policy
    args = build_parser().parse_args(["worker", "--connect", "127.0.0.1:1", "--index", "0", *policy.arguments()])
    assert worker_policy(args) == policy


def test_the_policy_a_deployment_gives_its_own_workers_accepts_every_shipped_scenario() -> None:
    paper = [p for p in sorted((ROOT / "scenarios" / "paper").glob("*.yaml")) if p.name != "reproductions.yaml"]
    files = sorted((ROOT / "scenarios").glob("*.yaml")) + paper
    assert len(files) > 10
    for path in files:
        for sc in sim.load_scenario(path).points():
            policy = scenario_policy(sc)
            assert policy.protocols == (sc.aggregation.protocol,) and policy.plugins
            assert math.isinf(policy.max_epsilon_total) and math.isinf(policy.max_epsilon_round)
            assert policy.scenario_refusals(sc) == [], path


def test_a_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "protocols: [secagg+]\nadversary: malicious\nthreshold: 0.6\ncollusion: 3\ndp: required\n"
        "max_epsilon_round: 1.5\nmax_epsilon_total: null\nplugins: false\n"
    )
    assert read_policy(path) == WorkerPolicy(
        protocols=("secagg+",),
        adversary="malicious",
        threshold=0.6,
        collusion=3,
        dp_required=True,
        max_epsilon_round=1.5,
    )
    path.write_text("protocols: secagg\ncollusion: none\n")
    assert read_policy(path) == WorkerPolicy(protocols=("secagg",), collusion=None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("protocol: [secagg]\n", "policy.yaml:1: unknown policy key 'protocol'"),
        ("adversary: curious\n", "policy.yaml:1: adversary: 'curious'; one of semi-honest, malicious"),
        ("threshold: 1.5\n", "threshold: 1.5; a fraction in [0, 1)"),
        ("\n\ncollusion: -1\n", "policy.yaml:3: collusion: -1; an integer >= 0"),
        ("protocols: [secagg, magic]\n", "protocols: 'magic' unknown"),
        ("max_epsilon_total: .nan\n", "max_epsilon_total: nan; a number > 0"),
        ("plugins: yes please\n", "plugins: 'yes please'; true or false"),
        ("- a list\n", "must be a mapping"),
        ("dp: [required\n", "is not valid YAML"),
    ],
)
def test_a_bad_policy_file_names_the_key_and_what_is_accepted(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as error:
        read_policy(path)
    assert message in str(error.value)


def test_a_policy_file_that_is_too_large_or_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"# " + b"x" * (64 << 10) + b"\n")
    with pytest.raises(PolicyError, match="larger than 65536 bytes"):
        read_policy(path)
    path.write_bytes(b"protocols: [\xff]\n")
    with pytest.raises(PolicyError, match="not UTF-8"):
        read_policy(path)
    with pytest.raises(PolicyError, match="cannot be read"):
        read_policy(tmp_path / "missing.yaml")


def test_the_worker_command_refuses_a_bad_policy_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["worker", "--connect", "127.0.0.1:1", "--index", "0"]
    assert main([*base, "--adversary", "curious"]) == 2
    assert "--adversary: adversary: 'curious'; one of semi-honest, malicious" in capsys.readouterr().err
    assert main([*base, "--collusion", "many"]) == 2
    assert "--collusion: collusion: 'many'" in capsys.readouterr().err
    assert main([*base, "--policy", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err


# -- a round refused before the worker downloads, trains or sends anything of it ------------------------


class _Link:
    """The worker's end of a connection, in memory: what it sent, and whether it closed."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []
        self.closed = False

    def send(self, channel: int, payload: bytes) -> asyncio.Future[None]:
        self.sent.append((channel, payload))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def drain_and_close(self, timeout: float = 5.0) -> None:
        self.closed = True


def test_a_worker_refuses_a_round_its_policy_refuses_before_anything_of_it() -> None:
    """The configuration passes at the planned 10 clients (t = 6 of 10 >= floor(0.55 * 10) + 1 = 6), but a
    round of 20 shares the worker's secrets 11 of 20 where its policy asks for 12: the worker leaves, saying
    why, before it downloads the model, trains, or sends anything of the round."""
    from sim.deploy.compute import ComputeThread
    from sim.deploy.shaping import UNSHAPED_BPS, TokenBucket
    from sim.deploy.worker import LeftError, Play, Shared, Worker

    sc = scenario("rounds=2", "sampling.clients_per_round=10")
    policy = replace(SAFE_POLICY, threshold=0.55)
    shared = Shared(sc)
    assert policy.scenario_refusals(sc) == []
    worker = Worker("127.0.0.1", 1, 0, ids.new_identity(), ids.new_identity().verification, 1 << 20, policy=policy)
    worker.shared, worker.spending = shared, Spending(policy, sc, shared.privacy)
    sampled = tuple(range(0, 40, 2))

    async def play() -> tuple[Play, _Link]:
        link = _Link()
        start = control.RoundStart(1, sampled[3], sampled, b"", 0, control.NO_RATE)
        cpu = ComputeThread("client", 1.0)
        p = Play(start, shared, link, {}, cpu, TokenBucket(UNSHAPED_BPS))  # type: ignore[arg-type]
        try:
            with pytest.raises(LeftError) as error:
                await worker._play(p)
        finally:
            cpu.shutdown()
        assert str(error.value) == (
            "refused: policy: aggregation.threshold 0.5: a round of 20 clients shares this worker's secrets 11 of "
            "20; this worker requires at least 12 (policy: threshold 0.55)"
        )
        return p, link

    p, link = asyncio.run(play())
    ((channel, payload),) = link.sent  # one message: why it leaves
    assert channel == control.CONTROL and link.closed
    leaving = control.decode_from_worker(payload)
    assert isinstance(leaving, control.Leaving) and leaving.reason.decode().startswith("refused: policy: ")
    assert math.isnan(p.timeline.download_start) and math.isnan(p.timeline.train_start)
    assert p.cpu.calls == []


@pytest.mark.parametrize(
    ("start", "wrong"),
    [
        (control.RoundStart(1, 7, (1, 2, 3), b"", 0, control.NO_RATE), "client 7 is not among the 3 sampled"),
        (control.RoundStart(1, 1, (1, 1, 3), b"", 0, control.NO_RATE), "repeat"),
        (control.RoundStart(1, 1, (1, 500), b"", 0, control.NO_RATE), "not all of the population of 100"),
        (control.RoundStart(1, 1, (1, 2), b"", 0, 1.5), "sampling rate 1.5 is not in (0, 1]"),
        (control.RoundStart(1, 1, tuple(range(57)), b"", 0, control.NO_RATE), "57 clients sampled, more than"),
    ],
)
def test_a_worker_checks_the_servers_round_start(start: control.RoundStart, wrong: str) -> None:
    """Its client among the sampled, each once and of the population, at most 4 x 10 + 16 = 56 of them for a
    scenario planning 10 a round (the worker's work, and its policy's, grow with a round's size)."""
    from sim.deploy.worker import round_start_problem

    assert wrong in round_start_problem(start, scenario())
    assert round_start_problem(control.RoundStart(1, 1, tuple(range(56)), b"", 0, 0.1), scenario()) == ""


def test_a_malicious_policy_needs_the_other_workers_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    ids.create_identity(ids.worker_key_file(keys, 0))
    server = ids.create_identity(ids.server_key_file(tmp_path / "server"))
    (keys / "server.pub").write_bytes(ids.public_file(ids.server_key_file(tmp_path / "server")).read_bytes())
    assert server.verification == ids.read_public(keys / "server.pub")
    command = ["worker", "--connect", "127.0.0.1:1", "--index", "0", "--keys", str(keys), "--adversary", "malicious"]
    assert main(command) == 2
    assert "put every worker's worker-J.pub in --keys DIR" in capsys.readouterr().err


# -- a deployment whose workers hold their own policies ------------------------------------------------------

FEDAVG = """
name: policies
seed: 2
rounds: 2
population: 3
sampling: {clients_per_round: 3}
dropout: {rate: 0}
data: {dataset: digits, partition: iid}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10, clients_at_once: 1}  # as deployed clients train
aggregation: {protocol: fedavg}
"""


@pytest.mark.slow
def test_a_worker_refuses_a_server_that_names_fedavg_and_counts_as_a_dropout(tmp_path: Path) -> None:
    """Three workers started by hand for a server that names FedAvg (each update in the clear): two agreed to
    FedAvg (``--protocols fedavg``), the third holds the default policy. It refuses the configuration before
    it trains or sends anything, says why and exits 2; every round goes on with the two, the third's client
    counted as a dropout that says why, and the manifest records what each worker accepts."""
    import subprocess
    import sys

    from sim.deploy.deployment import DeployOptions
    from sim.results.read import read_manifest, read_run_table
    from sim.runner import Deployed, run_scenario
    from sim.scenario import load

    path = tmp_path / "policies.yaml"
    path.write_text(FEDAVG)
    sc = load(path, output=str(tmp_path / "out")).base()
    keys = tmp_path / "keys"
    server = ids.create_identity(ids.server_key_file(keys))
    for j in range(3):
        ids.create_identity(ids.worker_key_file(keys, j))
    options = DeployOptions(identity=server, keys=keys, workers=3, spawn=False, connect_timeout_s=60.0)
    workers: list[subprocess.Popen[str]] = []

    def engine(scenario: Scenario) -> Deployed:
        dep = Deployed(scenario, options)
        host, port = dep.driver.address
        for j in range(3):
            command = [sys.executable, "-m", "sim", "worker", "--connect", f"{host}:{port}", "--index", str(j)]
            command += ["--keys", str(keys), *(["--protocols", "fedavg"] if j < 2 else [])]
            workers.append(subprocess.Popen(command, stderr=subprocess.PIPE, text=True))
        return dep

    out = tmp_path / "out"
    try:
        run_scenario(sc, out, progress=False, engine=engine, driver="deploy")
        _, refused_err = workers[2].communicate(timeout=60)
        for process in workers[:2]:
            process.wait(timeout=60)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
    why = "policy: aggregation.protocol fedavg: this worker accepts secagg, secagg+ (policy: protocols)"
    assert workers[2].returncode == 2 and why in refused_err and "Traceback" not in refused_err
    assert [p.returncode for p in workers[:2]] == [0, 0]
    rounds = read_run_table(out, "rounds")
    assert list(rounds["outcome"]) == ["ok", "ok"] and list(rounds["survivors"]) == [2, 2]
    clients = read_run_table(out, "clients")
    labels = clients.groupby("round")["dropped_stage"].apply(lambda s: sorted(s.fillna("")))
    assert list(labels) == [["", "", f"refused: {why}"]] * 2
    manifest = read_manifest(out)
    assert manifest["worker_policy"] == "each worker's own (--no-spawn)"
    policies = manifest["worker_policies"]
    assert policies["2"] == SAFE_POLICY.as_dict()
    assert policies["0"] == policies["1"] == replace(SAFE_POLICY, protocols=("fedavg",)).as_dict()
