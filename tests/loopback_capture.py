"""Capture the loopback traffic of a ``dropsim deploy`` run, in a private network namespace of its own.

    unshare -n bash -c 'ip link set lo up && python tests/loopback_capture.py SCENARIO OUT'

Run by ``tests/test_deploy_secrecy.py``. A packet socket on ``lo`` (root) records every TCP segment while a
deployment of SCENARIO runs; each connection's bytes, in the order captured, go to ``OUT/flow-N.bin``. Then
the simulator plays the same rounds (bit-identical without DP) and records every client's update as float32
bytes in ``OUT/updates.npy``; ``OUT/config.bin`` is the scenario text the server sends its workers. The test
looks for those bytes in the flows. The namespace holds only this process and its workers, and it ends with
them: nothing to clean up.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
from functools import partial
from pathlib import Path

import numpy as np

from sim.deploy.deployment import DeployOptions
from sim.deploy.worker import config_message
from sim.runner import Deployed, Simulation, run_scenario
from sim.scenario import load

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
"""A packet socket sees each loopback packet twice, outgoing and incoming: keep the incoming copy."""


class Sniffer(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.flows: dict[tuple[int, int], list[bytes]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                frame, address = self.sock.recvfrom(1 << 17)
            except TimeoutError:
                continue
            if address[2] == PACKET_OUTGOING or len(frame) < 14 + 20:
                continue
            if struct.unpack("!H", frame[12:14])[0] != 0x0800:
                continue
            ip = frame[14:]
            ihl = (ip[0] & 0x0F) * 4
            if ip[9] != 6:  # TCP
                continue
            tcp = ip[ihl:]
            sport, dport = struct.unpack("!HH", tcp[:4])
            offset = (tcp[12] >> 4) * 4
            total = struct.unpack("!H", ip[2:4])[0]
            payload = ip[ihl + offset : total]
            if payload:
                self.flows.setdefault((sport, dport), []).append(bytes(payload))


def main(scenario_file: str, out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    scenario = load(scenario_file, [], output=str(folder / "deploy")).base()
    sniffer = Sniffer()
    sniffer.start()
    options = DeployOptions(log_dir=folder / "deploy")
    run_scenario(
        scenario, folder / "deploy", progress=False, engine=partial(Deployed, options=options), driver="deploy"
    )
    sniffer.stop.set()
    sniffer.join()
    for n, (_, pieces) in enumerate(sorted(sniffer.flows.items())):
        (folder / f"flow-{n}.bin").write_bytes(b"".join(pieces))
    (folder / "config.bin").write_bytes(config_message(scenario, bytes(16)).scenario)

    simulation = Simulation(scenario)
    assert simulation.learner is not None
    learner = simulation.learner
    updates: list[np.ndarray] = []
    train = learner.local_update

    def recording(client: int, round: int) -> tuple[np.ndarray, float]:
        update, weight = train(client, round)
        updates.append(np.asarray(update, dtype="<f4").copy())
        return update, weight

    learner.local_update = recording  # type: ignore[method-assign]
    try:
        for _ in range(scenario.rounds):
            simulation.step()
    finally:
        simulation.close()
    np.save(folder / "updates.npy", np.stack(updates), allow_pickle=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
