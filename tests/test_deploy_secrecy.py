"""What ``dropsim deploy`` keeps secret: clients' secrets that nobody can derive, and links that carry
nothing in clear (docs/security.md).

- Each worker draws its key pairs, self-mask seed and noise seeds from its operating system: the keys a
  deployed client advertises are not those the scenario seed derives (the simulator's), and its
  malicious-variant identity is its worker's own key, not the seed's.
- The bytes on the loopback interface during a deployment (captured by a packet socket in a private
  network namespace, ``tests/loopback_capture.py``) hold neither the scenario's text nor any client's
  update: with ``fedavg`` an update travels unmasked inside the encrypted frames.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.crypto import signatures
from sim.crypto.randomness import SeededRandom
from sim.deploy.deployment import DeployOptions
from sim.protocol.instances import RoundInstances
from sim.protocol.messages import AdvertiseKeys
from sim.runner import Deployed
from sim.scenario import load
from sim.seeds import Stream, seed_bytes

pytestmark = pytest.mark.slow

SCENARIO = """
name: secrecy
seed: 11
rounds: {rounds}
population: 6
sampling: {{clients_per_round: 4}}
dropout: {{rate: 0}}
data: {{dataset: digits, partition: iid}}
model: {{name: mlp}}
training: {{local_epochs: 1, batch_size: 10, clients_at_once: 1}}  # as deployed clients train
aggregation: {{protocol: {protocol}, bits: 20, adversary: {adversary}}}
"""


def _scenario(tmp_path: Path, protocol: str = "secagg", adversary: str = "semi-honest", rounds: int = 1) -> Path:
    path = tmp_path / "secrecy.yaml"
    path.write_text(SCENARIO.format(protocol=protocol, adversary=adversary, rounds=rounds))
    return path


@pytest.mark.parametrize("adversary", ["semi-honest", "malicious"])
def test_deployed_clients_hold_secrets_the_scenario_seed_does_not_derive(tmp_path: Path, adversary: str) -> None:
    scenario = load(_scenario(tmp_path, adversary=adversary), [], output=str(tmp_path / "out")).base()
    dep = Deployed(scenario, DeployOptions(log_dir=tmp_path))
    try:
        result = dep.step()
        state = dep.driver.server.last
        assert state is not None and result.record.outcome == "ok"
        machine = state.machines[0]
        sampled = state.sampled
        seeded = RoundInstances(scenario.aggregation, scenario.seed, 1, sampled, dep.dim)
        for c in sampled:
            (send,) = seeded.client(c).start(np.zeros(dep.dim, dtype=np.float32), 1.0).sends
            derived = send.message
            assert isinstance(derived, AdvertiseKeys)
            advertised = machine.u1[c]  # type: ignore[attr-defined]
            assert advertised.c_pk != derived.c_pk and advertised.s_pk != derived.s_pk
            if adversary == "malicious":
                _, seed_identity = signatures.generate(SeededRandom(seed_bytes(scenario.seed, Stream.IDENTITY, c)))
                key = machine.config.verification_keys[c]  # type: ignore[attr-defined]
                assert key == dep.driver.directory[state.peers[c].index] != seed_identity
        # two clients never share a key pair
        assert len({machine.u1[c].s_pk for c in sampled}) == len(sampled)  # type: ignore[attr-defined]
    finally:
        dep.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_loopback_carries_neither_the_scenario_nor_an_update_in_clear(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, protocol="fedavg", rounds=2)
    out = tmp_path / "capture"
    harness = Path(__file__).with_name("loopback_capture.py")
    command = f"ip link set lo up && {sys.executable} {harness} {scenario} {out}"
    done = subprocess.run(["unshare", "-n", "bash", "-c", command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    flows = [p.read_bytes() for p in sorted(out.glob("flow-*.bin"))]
    updates = np.load(out / "updates.npy", allow_pickle=False)
    config = (out / "config.bin").read_bytes()
    # the capture saw the deployment: its connections, their handshakes (in clear by design) and more
    # bytes than every update's, so that anything sent in clear would be in it
    assert len(flows) >= 2 * 4
    assert any(b"dropsim-deploy-1" in flow for flow in flows)
    assert sum(map(len, flows)) > updates.nbytes
    assert len(updates) == 2 * 4 and np.all(np.any(updates != 0, axis=1))
    windows = [config[i : i + 24] for i in range(0, len(config) - 24, 97)] + [b"secrecy", b"digits"]
    rng = np.random.default_rng(0)
    for update in updates:
        raw = update.tobytes()
        windows += [raw[i : i + 32] for i in rng.integers(0, len(raw) - 32, size=16)]
    found = [w for w in windows if any(w in flow for flow in flows)]
    assert found == []
