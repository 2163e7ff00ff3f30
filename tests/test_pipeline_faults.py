"""Pipelined rounds under faults: clients cut from a chunk, aborts after a reveal, accounting across chunks
with different survivors, offline clients, utilisation bounds, and the planner when the first round
aborts. Found by an adversarial review; each test failed before its fix."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_harness import Capture
from pipeline_harness import scenario as harness_scenario

from sim.clients.population import Population, zipf_bandwidths, zipf_latencies
from sim.runner import Simulation
from sim.scenario import load
from sim.scenario.types import Scenario
from sim.seeds import Stream, generator

XNOISE = "privacy={strategy: xnoise, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.5}"


def scenario(tmp_path: Path, *overrides: str) -> Scenario:
    return harness_scenario(tmp_path, "fidelity=timing", *overrides)


def listed_profiles(sc: Scenario) -> Population:
    """The profiles the population had when it was listed (before issue 24): the Zipf values permuted by
    numpy's ``permutation`` of the ``PROFILES`` streams. The timings some of these regression tests were
    found under depend on which client had which profile."""
    n, clients, seed = sc.population, sc.clients, sc.seed
    slow = zipf_latencies(n, clients.compute)[generator(seed, Stream.PROFILES, 0).permutation(n)]
    mbps = zipf_bandwidths(n, clients.bandwidth)[generator(seed, Stream.PROFILES, 1).permutation(n)]
    base, ids = Population.build(n, clients, seed), np.arange(n)
    return Population(base.slowdown.replaced(ids, slow), base.bandwidth_mbps.replaced(ids, mbps))


def steps(tmp_path: Path, *overrides: str, rounds: int | None = None, observe=None, listed: bool = False):  # type: ignore[no-untyped-def]
    sim = Simulation(scenario(tmp_path, *overrides), observe)
    if listed:
        sim.world.population = sim.setup.population = listed_profiles(sim.scenario)
    return [sim.step() for _ in range(rounds or sim.scenario.rounds)]


# --- 1. liveness: a client cut from a chunk before it has even encoded crashes the simulation ---------


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_slow_client_cut_from_chunk_0_before_it_encodes_does_not_crash(tmp_path: Path, chunks: int) -> None:
    # Client 12 (slow-down 4) trains past the advertise_keys deadline; chunk 0 goes on without it and
    # completes, _drop_chunk(12, 0) abandons its gates, and when client 12 finally spawns its chunk-0
    # instance StageGate.admit(1, 0) raises "stage 1 of chunk 0 already ran" out of env.run.
    base = ["sampling.clients_per_round=5", "dropout.rate=0", "timeouts={advertise_keys: 0.05}"]
    unpiped = steps(tmp_path, *base)
    assert [r.record.outcome for r in unpiped] == ["ok", "ok"]  # the same round without a pipeline is fine
    piped = steps(tmp_path, *base, f"pipeline={{chunks: {chunks}}}")  # ValueError here
    assert all(r.record.outcome == "ok" or r.record.outcome.startswith("aborted") for r in piped)


# --- 2. privacy accounting: a sum unmasked by one chunk is lost when the round aborts meanwhile ------


@pytest.mark.parametrize(
    "overrides",
    [
        # any version up to 6675f21: a 5-ms share_keys deadline cuts one of 5 clients from chunk 1 (threshold 5)
        # while chunk 0's server is doing its unmasking work (under the listed profiles: listed_profiles).
        (
            "seed=960",
            "aggregation.protocol=secagg+",
            "pipeline={chunks: 4, dispatch: false}",
            "sampling.clients_per_round=5",
            "aggregation.threshold=0.9",
            "dropout.rate=0",
            "timeouts={share_keys: 0.0051, masked_input: 0.0396}",
        ),
    ],
)
def test_natural_abort_loses_the_exposure_of_an_unmasked_chunk(tmp_path: Path, overrides) -> None:
    # Another chunk aborts while chunk 0's server process is inside _server_react(machine.close_step()) of
    # its unmasking: close_step has set exposed (and the aggregate), the process is interrupted by
    # _stop_clients before it reaches "self.exposures.append(...)", record.exposed is None and the ledger
    # accounts nothing although the server holds an unmasked sum.
    Capture.rounds = []
    (result,) = steps(tmp_path, *overrides, XNOISE, rounds=1, observe=Capture.observe, listed=True)
    rnd = Capture.rounds[0]
    revealed = [s.exposed for s in rnd.servers if s.exposed is not None]
    assert result.record.outcome.startswith("aborted") and revealed  # the precondition
    assert result.record.exposed == min(revealed), (result.record.outcome, revealed)
    assert result.privacy is not None and result.privacy.epsilon > 0


def test_any_abort_during_a_chunks_unmasking_work_loses_its_exposure(tmp_path: Path) -> None:
    # White box: the moment chunk 0's server machine has unmasked its sum (close_step of unmasking sets
    # exposed and the aggregate, then the driver charges the unmasking work), another chunk fails (any
    # chunk's abort at advertise_keys/share_keys does this; here it is forced). The chunk-0 server process
    # is interrupted inside _server_react, so lines "exposed = ...; self.exposures.append(...)" never run.
    Capture.rounds = []

    def forced(rnd) -> None:  # type: ignore[no-untyped-def]
        Capture.observe(rnd)
        server, original, failed = rnd.servers[0], rnd.servers[0].close_step, rnd.shape.failed

        def close_step():  # type: ignore[no-untyped-def]
            reaction = original()
            if server.exposed is not None and not failed.triggered:
                failed.succeed("chunk 2: advertise_keys: forced abort")
            return reaction

        server.close_step = close_step

    (result,) = steps(tmp_path, "pipeline={chunks: 3}", "dropout.rate=0", XNOISE, rounds=1, observe=forced)
    rnd = Capture.rounds[0]
    assert result.record.outcome.startswith("aborted: chunk 2")
    assert rnd.servers[0].exposed == 8  # the server holds chunk 0's unmasked sum of 8 clients
    assert result.record.exposed == 8, "the revealed chunk is not accounted"
    assert result.privacy is not None and result.privacy.epsilon > 0


# --- 3. results: utilisation columns are documented as fractions of the round ----------------------


def test_server_cpu_utilisation_is_at_most_one(tmp_path: Path) -> None:
    # The server Processor has two lanes; server_compute_s adds both, so a busy server exceeds 1.
    for result in steps(tmp_path, "pipeline={chunks: 4}", "dropout.rate=0", "server={speed: 0.02}", XNOISE):
        assert result.record.utilisation["server_cpu"] <= 1.0, result.record.utilisation


def test_client_cpu_utilisation_is_at_most_one_in_an_aborted_round(tmp_path: Path) -> None:
    # compute_s is charged before the operation runs (round.py/pipelined.py _client_compute), so work cut
    # short by the end of the round, or still queued, counts in full.
    for result in steps(
        tmp_path,
        "pipeline={chunks: 1}",
        "sampling.clients_per_round=12",
        "dropout.rate=0",
        "timeouts={advertise_keys: 0.031}",
        XNOISE,
    ):
        rec = result.record
        assert rec.outcome.startswith("aborted")
        assert rec.utilisation["client_cpu"] <= 1.0, rec.utilisation
        for c in rec.clients:
            busy = c.compute_s + (0.0 if math.isnan(c.train_end) else c.train_end - c.train_start)
            assert busy <= rec.t_end - rec.t_start + 1e-12, (c.client, busy, rec.t_end - rec.t_start)


# --- 4. scenario schema --------------------------------------------------------------------------


def test_pipeline_null_reads_as_absent(tmp_path: Path) -> None:
    assert scenario(tmp_path, "pipeline=null").pipeline is None


def test_a_fixed_chunk_count_above_max_chunks_is_refused(tmp_path: Path) -> None:
    from sim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="max_chunks"):
        scenario(tmp_path, "pipeline={chunks: 5, max_chunks: 3}")


# --- 5. liveness model: a client timed out in one chunk ignores its trace offline time in the others ---


def test_a_client_going_offline_after_missing_one_chunks_deadline_stops_sending(tmp_path: Path) -> None:
    # masked_input timeout 4 ms: client 3 misses chunk 1's deadline (dropped_stage "timeout:masked_input")
    # but stays in chunks 0 and 2 ("out of that chunk only"). Its availability ends at 0.044 s, after
    # chunk 1's deadline and before its chunk-2 upload (0.0447-0.0472 s). Round._offline_watch returns
    # early because dropped_stage is set, so the offline client uploads chunk 2 and chunk 3, is in chunk
    # 2's sum, and never gets left_at.
    def offline(rnd) -> None:  # type: ignore[no-untyped-def]
        rnd.offline = {3: 0.044}
        Capture.observe(rnd)

    Capture.rounds = []
    overrides = ("pipeline={chunks: 4}", "dropout.rate=0", "timeouts={masked_input: 0.004}")
    steps(tmp_path, *overrides, rounds=1, observe=offline, listed=True)
    rnd = Capture.rounds[0]
    client = rnd.clients[3]
    assert 3 in rnd.late and 3 in rnd.results[0].survivors  # late in chunk 1, in chunk 0's sum (precondition)
    assert client.dropped_stage == "offline:unmasking" and client.left_at == 0.044
    assert not client.last_upload_end > 0.044, f"client 3 sent until {client.last_upload_end}"
    assert all(3 not in rnd.results[j].survivors for j in (2, 3))


# --- 6. privacy accounting: "the fewest survivors" is not the least noise under XNoise-Appr ------------


def going_offline(at: dict[int, float]) -> Any:
    """An observer that makes chosen clients go offline at chosen times (and captures the round)."""

    def observe(rnd: Any) -> None:
        rnd.offline = dict(at)
        Capture.observe(rnd)

    return observe


def test_a_round_is_accounted_at_its_least_noisy_chunk(tmp_path: Path) -> None:
    # Two clients go offline between their first and their last chunk's upload, so chunk 0 sums 8 clients
    # and chunk 2 sums 6. XNoise-Appr's residual is not monotone in the dropouts (n = 8, T = 4: accounted
    # variance 1.0, 1.094, 1.125, 1.094, 1.0 sigma*^2 for 0..4 dropped): chunk 0 is released with 1.0
    # sigma*^2, but accounting min(survivors) = 6 would take 1.125 sigma*^2 -- more noise than chunk 0
    # had, so the ledger's epsilon would be too small.
    overrides = (
        "pipeline={chunks: 3}",
        "dropout.rate=0",
        "privacy={strategy: xnoise-appr, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.5}",
    )
    Capture.rounds = []
    steps(tmp_path, *overrides, rounds=1, observe=Capture.observe)
    sent = Capture.rounds[0].sent_at
    # the round replays identically up to the first offline time: pick two clients and a moment for each
    # between its first and its last chunk's upload
    spread = sorted({c for c, _ in sent}, key=lambda c: sent[(c, 0)] - sent[(c, 2)])[:2]
    at = {c: (sent[(c, 0)] + sent[(c, 2)]) / 2 for c in spread}
    Capture.rounds = []
    (result,) = steps(tmp_path, *overrides, rounds=1, observe=going_offline(at))
    rnd = Capture.rounds[0]
    plan = rnd.private.plan
    counts = [len(rnd.results[j].survivors) for j in range(3)]
    assert counts[0] != counts[-1], counts  # chunks with different survivors (precondition)
    per_chunk = [float(plan.accounted(plan.sampled - k)) for k in counts]
    assert result.privacy is not None
    assert result.privacy.accounted_variance <= min(per_chunk) * (1 + 1e-12), (
        counts,
        [v / plan.target for v in per_chunk],
        result.privacy.accounted_variance / plan.target,
    )


def test_auto_profiles_without_dropout_when_the_first_round_aborts(tmp_path: Path) -> None:
    from sim.learning.models import model_dimension
    from sim.runner.chunks import plan_chunks

    sc = scenario(tmp_path, "pipeline={chunks: auto, max_chunks: 4}", "dropout.rate=0.5", "aggregation.threshold=0.8")
    notes: list[str] = []
    plan = plan_chunks(sc, model_dimension(sc), notes.append)
    assert "the scenario's first round aborts: profiling it without dropout" in notes
    assert 1 <= plan.chunks <= 4
    results = steps(tmp_path, "pipeline={chunks: auto, max_chunks: 4}", "dropout.rate=0.5", "aggregation.threshold=0.8")
    assert all(r.record.outcome.startswith("aborted") for r in results)  # the run goes on, like unpipelined


def test_silent_dropout_with_a_trace_needs_every_timeout(tmp_path: Path) -> None:
    from sim.scenario import ScenarioError

    root = Path(__file__).resolve().parents[1]
    with pytest.raises(ScenarioError, match="timeouts.advertise_keys, timeouts.share_keys, timeouts.masked_input"):
        load(root / "scenarios" / "trace_replay.yaml", ["dropout={rate: 0, silent: true}"]).base()
