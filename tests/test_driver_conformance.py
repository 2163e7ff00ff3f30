"""Driver conformance: the same scenario and seed through the simulator and the socket deployment give the
same step decisions (which clients' answers each step of each instance took), the same outcome labels,
survivors and outcome, and the same model, for every dropout stage and pipelined with both link models.

The deployment is timed by the wall clock and the simulator by its cost model, so only what the protocol
decides is compared; no step deadline is set (a deadline would make the decisions depend on time). With
distributed DP the deployment's secrets are derived from the scenario seed (``seeded_secrets``), as the
simulator's, so that the noise, and so the model, are the same bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sim.deploy.deployment import DeployOptions
from sim.engine.virtual_round import Round
from sim.loopback import LoopbackDriver, _LoopbackRound
from sim.round.collector import Roster
from sim.round.plan import RoundPlan
from sim.round.records import RoundRecord, RoundResult
from sim.runner import Deployed, Simulation
from sim.runner.experiment import Experiment
from sim.scenario import load
from sim.scenario.types import Scenario

pytestmark = pytest.mark.slow

SCENARIO = """
name: conformance
seed: 11
rounds: 1
population: 8
sampling: {clients_per_round: 5}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 2.0]}
  bandwidth_mbps: {zipf_a: 1.2, range: [50, 200]}
dropout: {rate: 0.2, stage: before_upload}
data: {dataset: digits, partition: {dirichlet: 1.0}}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 20, clients_at_once: 1}  # as deployed clients train
aggregation: {protocol: secagg, bits: 20, threshold: 0.5}
"""

XNOISE = "privacy={strategy: xnoise, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.4}"

CASES: dict[str, tuple[str, ...]] = {
    "after_sampling": ("dropout.stage=after_sampling",),
    "before_share_keys": ("dropout.stage=before_share_keys",),
    "before_upload": ("dropout.stage=before_upload",),
    "during_unmasking": ("dropout.stage=during_unmasking",),
    "during_noise_removal": ("dropout.stage=during_noise_removal", XNOISE),
    "secagg+ malicious": ("aggregation={protocol: secagg+, adversary: malicious}", "dropout.stage=before_upload"),
    "fedavg": ("aggregation={protocol: fedavg}", "dropout.stage=before_upload"),
    "pipelined shared": ("pipeline={chunks: 3, links: shared}", "dropout.stage=during_unmasking"),
    "pipelined duplex": ("pipeline={chunks: 3, links: duplex}", "dropout.stage=before_upload", XNOISE),
}


def _scenario(tmp_path: Path, *overrides: str) -> Scenario:
    path = tmp_path / "conformance.yaml"
    path.write_text(SCENARIO)
    return load(path, list(overrides), output=str(tmp_path / "out")).base()


def _decisions(roster: Roster) -> dict[str, Any]:
    return {
        "answered": {key: sorted(clients) for key, clients in roster.answered.items()},
        "labels": {c: record.dropped_stage for c, record in roster.records.items()},
        "late": sorted(roster.late),
        "refused": sorted(roster.refused),
    }


def _simulated(scenario: Scenario) -> tuple[RoundResult, Roster]:
    rounds: list[Round] = []
    sim = Simulation(scenario, rounds.append)
    try:
        result = sim.step()
    finally:
        sim.close()
    return result, rounds[0].roster


def _deployed(scenario: Scenario, tmp_path: Path) -> tuple[RoundResult, Roster]:
    dep = Deployed(scenario, DeployOptions(log_dir=tmp_path / "logs", seeded_secrets=True, step_timeout_s=60.0))
    try:
        result = dep.step()
        state = dep.driver.server.last
        assert state is not None
    finally:
        dep.close()
    return result, state.roster


@pytest.mark.parametrize("case", list(CASES))
def test_both_drivers_decide_alike(tmp_path: Path, case: str) -> None:
    scenario = _scenario(tmp_path, *CASES[case])
    simulated, sim_roster = _simulated(scenario)
    deployed, dep_roster = _deployed(scenario, tmp_path)
    sim, dep = simulated.record, deployed.record
    assert sim.outcome == "ok", sim.outcome  # the case exercises a round that completes
    assert (dep.outcome, dep.survivors, dep.sampled) == (sim.outcome, sim.survivors, sim.sampled)
    assert _decisions(dep_roster) == _decisions(sim_roster)
    assert [c.dropped_stage for c in dep.clients] == [c.dropped_stage for c in sim.clients]
    assert dep.chunks == sim.chunks
    assert deployed.model_sha256 == simulated.model_sha256
    assert dep.exposed == sim.exposed and dep.exposures == sim.exposures
    if simulated.privacy is not None:
        assert deployed.privacy is not None and deployed.privacy.epsilon == simulated.privacy.epsilon
    # every dropout stage the case names is exercised: somebody dropped there (or the round has no drop)
    stage = next((o.split("=", 1)[1] for o in CASES[case] if o.startswith("dropout.stage=")), "")
    assert any(c.dropped_stage == stage for c in sim.clients), [c.dropped_stage for c in sim.clients]


def _in_memory(scenario: Scenario) -> tuple[RoundResult, Roster]:
    rosters: list[Roster] = []

    class Watched(LoopbackDriver):
        def play(self, plan: RoundPlan) -> RoundRecord:
            played = _LoopbackRound(self.world, plan)
            rosters.append(played.roster)
            return played.play()

    run = Experiment(scenario, Watched)
    try:
        result = run.step()
    finally:
        run.close()
    return result, rosters[0]


@pytest.mark.parametrize("case", list(CASES))
def test_the_in_memory_driver_decides_as_the_simulator(tmp_path: Path, case: str) -> None:
    """The same comparison with the in-memory driver (no clock, no sockets) in place of the deployment."""
    scenario = _scenario(tmp_path, *CASES[case])
    simulated, sim_roster = _simulated(scenario)
    in_memory, mem_roster = _in_memory(scenario)
    sim, mem = simulated.record, in_memory.record
    assert (mem.outcome, mem.survivors, mem.sampled, mem.chunks) == (
        sim.outcome,
        sim.survivors,
        sim.sampled,
        sim.chunks,
    )
    assert _decisions(mem_roster) == _decisions(sim_roster)
    assert [c.dropped_stage for c in mem.clients] == [c.dropped_stage for c in sim.clients]
    assert in_memory.model_sha256 == simulated.model_sha256
    assert mem.exposed == sim.exposed and mem.exposures == sim.exposures
    if simulated.privacy is not None:
        assert in_memory.privacy is not None and in_memory.privacy.epsilon == simulated.privacy.epsilon
    assert mem.t_end == mem.t_start == 0.0


def test_the_in_memory_driver_refuses_a_trace(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    world = SimpleNamespace(availability=object(), scenario=scenario)
    with pytest.raises(ValueError, match="no clock"):
        LoopbackDriver(world)  # type: ignore[arg-type]
