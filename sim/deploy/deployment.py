"""A deployment run: the scenario's rounds over real sockets, recorded in the simulator's tables.

:class:`Deployment` is a :class:`~sim.engine.simulation.Simulation` whose rounds are played by a
:class:`~sim.deploy.server.DeployServer` and client worker processes instead of SimPy processes: the
sampling, the dropout plan, the privacy plan and accounting, the model update and the evaluation are
the simulator's own code, so the two differ only in how a round is carried out and timed (wall-clock
seconds here). ``dropsim deploy`` runs it through :func:`sim.runner.run_scenario`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from sim.deploy.compute import ONE_THREAD_ENV, interleave_threads, one_thread_math
from sim.deploy.identity import SECRET_ENV, new_secret
from sim.deploy.server import DeployServer
from sim.deploy.worker import config_message
from sim.engine.round import ClientRecord, RoundRecord
from sim.engine.simulation import Simulation
from sim.errors import InputError
from sim.protocol.private import PrivateRound
from sim.scenario.schema import Scenario

log = logging.getLogger("sim.deploy")

MAX_WORKERS = 64
"""Client processes one deployment starts at most (each loads torch and the data: ~0.3 GB)."""


class DeployError(InputError):
    """A scenario or setting the deployment cannot run, with why."""


@dataclass(frozen=True)
class DeployOptions:
    """How to deploy: where the server listens, how many workers and whether to start them here."""

    host: str = "127.0.0.1"
    port: int = 0
    """TCP port (0: any free one)."""
    workers: int | None = None
    """Client processes (default: the clients sampled per round)."""
    spawn: bool = True
    """Start the workers here; False: wait for workers started elsewhere (``dropsim worker``)."""
    secret: bytes | None = None
    max_frame_mb: float = 64.0
    connect_timeout_s: float = 60.0
    """How long a round waits for its workers to connect."""
    handshake_timeout_s: float = 10.0
    step_timeout_s: float = 300.0
    """A step's deadline where the scenario sets no timeout (a stalled connection cannot hold the round)."""
    log_dir: Path | None = None
    """Where the workers' output goes (``workers.log``); None: this process's stderr."""


def check_deployable(scenario: Scenario) -> None:
    """Refuse what the testbed cannot run, saying why."""
    problems = []
    if scenario.fidelity != "full":
        problems.append("fidelity is 'timing': the deployment runs the real protocol, set fidelity: full")
    if scenario.model.name is None:
        problems.append("model.params names no real model: the deployment trains one (model.name)")
    if scenario.trace is not None:
        problems.append("trace replay runs in virtual time only: remove the trace section to deploy")
    if problems:
        raise DeployError(f"{scenario.name}: cannot deploy: " + "; ".join(problems))


def worker_count(scenario: Scenario, options: DeployOptions) -> int:
    if options.workers is not None:
        n = options.workers
    elif scenario.sampling.clients_per_round is not None:
        n = scenario.sampling.clients_per_round
    else:
        n = scenario.population
    if not 1 <= n <= MAX_WORKERS:
        raise DeployError(
            f"{scenario.name}: {n} client workers; a deployment runs 1 to {MAX_WORKERS} "
            "(set sampling.clients_per_round, or --workers)"
        )
    return n


class Deployment(Simulation):
    """The scenario's server here, its clients in worker processes; :meth:`step` plays the next round."""

    def __init__(self, scenario: Scenario, options: DeployOptions | None = None) -> None:
        check_deployable(scenario)
        self.options = opts = options or DeployOptions()
        self.n_workers = worker_count(scenario, opts)
        super().__init__(scenario)
        assert self.learner is not None
        self.secret = opts.secret or new_secret()
        self._switch = sys.getswitchinterval()
        interleave_threads()  # the server's loop and compute threads, as the workers'
        self._math = one_thread_math()  # the server's computations are one thread each, as the workers'
        self.loop = asyncio.new_event_loop()
        self.server = DeployServer(
            scenario,
            self.learner,
            self.secret,
            config_message(scenario),
            self.n_workers,
            opts.host,
            opts.port,
            int(opts.max_frame_mb * 2**20),
            opts.handshake_timeout_s,
            opts.step_timeout_s,
        )
        self.loop.run_until_complete(self.server.start())
        self.processes: list[subprocess.Popen[bytes]] = []
        self._log: IO[bytes] | None = None
        if opts.spawn:
            self._spawn()

    @property
    def address(self) -> tuple[str, int]:
        return self.server.host, self.server.port

    def _spawn(self) -> None:
        env = {**os.environ, **ONE_THREAD_ENV, SECRET_ENV: self.secret.hex()}
        out: IO[bytes] | None = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            out = self._log = (self.options.log_dir / "workers.log").open("ab")
        host, port = self.address
        for j in range(self.n_workers):
            command = [
                sys.executable,
                "-m",
                "sim",
                "worker",
                "--connect",
                f"{host}:{port}",
                "--index",
                str(j),
                "--max-frame-mb",
                str(self.options.max_frame_mb),
            ]
            self.processes.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))

    def live_workers(self) -> int:
        """Worker processes still running (or, for workers started elsewhere, the number expected)."""
        if not self.options.spawn:
            return self.n_workers
        return sum(1 for p in self.processes if p.poll() is None)

    def _play(
        self,
        r: int,
        sampled: np.ndarray,
        drops: dict[int, str],
        private: PrivateRound | None,
        refused: str,
        offline: dict[int, float],
    ) -> RoundRecord:
        """Play round ``r`` over the sockets (``offline`` is empty: trace replay is not deployed)."""
        pop = self.population
        chosen = tuple(int(c) for c in sampled)
        records = {
            c: ClientRecord(
                client=c,
                slowdown=float(pop.slowdown[c]),
                bandwidth_mbps=float(pop.bandwidth_mbps[c]),
                samples=int(self.data.num_samples(c)),
            )
            for c in chosen
        }
        chunks = self.setup.pipeline.chunks if self.setup.pipeline is not None else None
        return self.loop.run_until_complete(
            self.server.play(
                r,
                chosen,
                drops,
                private,
                refused,
                records,
                chunks,
                None,
                self.live_workers,
                self.options.connect_timeout_s,
            )
        )

    def close(self) -> None:
        """Tell the workers to exit and wait for them (killing any that do not within 10 s)."""
        super().close()
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self.server.close())
        finally:
            for process in self.processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            self.loop.close()
            sys.setswitchinterval(self._switch)
            self._math.restore_original_limits()
            if self._log is not None:
                self._log.close()
