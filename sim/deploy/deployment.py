"""The deployment: the driver that plays round plans over real sockets, in wall-clock time.

:class:`Deployment` implements :class:`sim.round.driver.Driver`: its rounds are played by a
:class:`~sim.deploy.server.DeployServer` here and client worker processes instead of SimPy processes.
The sampling, the dropout plan, the privacy plan and accounting, the model update and the evaluation are
the runner's (:class:`sim.runner.experiment.Experiment`, :class:`sim.runner.Deployed`) whichever driver
plays the rounds, so the two differ only in how a round is carried out and timed (wall-clock seconds
since the deployment started, here). ``dropsim deploy`` runs it through :func:`sim.runner.run_scenario`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from sim.clients.population import MBPS
from sim.deploy.compute import ONE_THREAD_ENV, interleave_threads, one_thread_math
from sim.deploy.identity import (
    SERVER_KEY_ENV,
    Identity,
    IdentityError,
    new_deployment_id,
    new_identity,
    parse_announcement,
    worker_directory,
)
from sim.deploy.kernel import KernelEmulation
from sim.deploy.operations import OperationsLog, ThrottleLog
from sim.deploy.policy import scenario_policy
from sim.deploy.server import DeployServer
from sim.deploy.worker import config_message
from sim.errors import InputError
from sim.round.plan import RoundPlan
from sim.round.records import ClientRecord, RoundRecord
from sim.scenario.types import Scenario
from sim.testbed import is_kernel
from sim.world import World

log = logging.getLogger("sim.deploy")

SEEDED_SECRETS = "seeded from the scenario (--seeded-secrets): NO SECRECY, anyone with the scenario can unmask"
"""The manifest's and the output's words for a deployment whose secrets come from the scenario seed."""

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
    identity: Identity | None = None
    """The server's long-term key pair (None: a new one from the operating system)."""
    directory: dict[int, bytes] | None = None
    """Workers started elsewhere: each one's verification key, by index (None: from ``keys``)."""
    keys: Path | None = None
    """Workers started elsewhere: the folder holding every ``worker-J.pub`` (``--keys DIR``)."""
    seeded_secrets: bool = False
    """Derive every client's secrets from the scenario seed, as the simulator does, so that a deployed model
    equals the simulated one with DP too: no secrecy at all (``dropsim validate --seeded-secrets``)."""
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
        problems.append(f"fidelity is {scenario.fidelity!r}: the deployment runs the real protocol, set fidelity: full")
    if scenario.model.params is not None:
        problems.append("model.params names no real model: the deployment trains one (model.name)")
    if scenario.trace is not None:
        problems.append("trace replay runs in virtual time only: remove the trace section to deploy")
    if scenario.testbed is not None and scenario.testbed.emulation == "engine":
        problems.append(
            "testbed.emulation engine is the cost profile's own simulation engine, which only the simulator "
            "models (Flower's own rounds: benchmarks/flower_peer.py); deploy with process or kernel"
        )
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


class Deployment:
    """The scenario's server here, its clients in worker processes; :meth:`play` plays a round."""

    name = "deploy"

    def __init__(self, world: World, options: DeployOptions | None = None) -> None:
        self.world = world
        self.scenario = scenario = world.scenario
        check_deployable(scenario)
        self.options = opts = options or DeployOptions()
        self.n_workers = worker_count(scenario, opts)
        self.directory: dict[int, bytes] = {}
        if not opts.spawn:
            self.directory = opts.directory if opts.directory is not None else self._remote_keys()
        assert world.learner is not None
        self.learner = world.learner
        self.identity = opts.identity or new_identity()
        self.deployment_id = new_deployment_id()
        """This deployment's random id: every protocol signature is bound to it."""
        self.policy = scenario_policy(scenario, opts.seeded_secrets)
        """The policy the workers started here are given: exactly what the scenario asks."""
        self.processes: list[subprocess.Popen[bytes]] = []
        self._log: IO[bytes] | None = None
        self._switch = sys.getswitchinterval()
        interleave_threads()  # the server's loop and compute threads, as the workers'
        self._math = one_thread_math()  # the server's computations are one thread each, as the workers'
        self.operations = OperationsLog(opts.log_dir) if opts.log_dir is not None else None
        """``operations.csv``: what each party computed, round by round (``dropsim calibrate``)."""
        self.kernel: KernelEmulation | None = None
        """The kernel testbed's cgroups and shaped links (``testbed.emulation: kernel``), or None."""
        self.throttles: ThrottleLog | None = None
        """``throttles.csv`` on a kernel testbed: how often each party's quota held it back, round by round."""
        self.loop = asyncio.new_event_loop()
        self.server = DeployServer(
            scenario,
            self.learner,
            self.identity,
            self.directory,
            config_message(scenario, self.deployment_id, opts.seeded_secrets),
            opts.host,
            opts.port,
            int(opts.max_frame_mb * 2**20),
            opts.handshake_timeout_s,
            opts.step_timeout_s,
        )
        try:
            if is_kernel(scenario):
                self.kernel = self._kernel()
                self.server.on_assign = self.kernel.assign
                if opts.log_dir is not None:
                    self.throttles = ThrottleLog(opts.log_dir)
            self.loop.run_until_complete(self.server.start())
            if opts.spawn:
                self._spawn()
        except BaseException:  # nothing is left behind: workers, sockets, the loop (the runner closes the model)
            self._stop_workers(kill=True)
            self.close()
            raise

    def _kernel(self) -> KernelEmulation:
        """The kernel testbed: this process's cgroup, and each worker's cgroup and shaped address."""
        if not self.options.spawn:
            raise DeployError(
                "a kernel testbed runs every party on this host (its cgroups and namespace): drop --no-spawn"
            )
        sc, pop = self.scenario, self.world.population
        return KernelEmulation(
            f=self.world.dilation,
            server_speed=sc.server.speed,
            server_bps=sc.server.bandwidth_mbps * MBPS,
            workers=self.n_workers,
            slowdown=pop.slowdown.values(),
            bandwidth_bps=pop.bandwidth_mbps.values() * MBPS,
            latency_s=sc.server.latency_ms / 1000,
        )

    def _remote_keys(self) -> dict[int, bytes]:
        if self.options.keys is None:
            raise DeployError("workers started elsewhere need their verification keys (--keys DIR)")
        try:
            return worker_directory(self.options.keys, self.n_workers)
        except IdentityError as exc:
            raise DeployError(str(exc)) from None

    def manifest_entries(self) -> dict[str, object]:
        """Where the clients' secrets came from and what the workers accept, for the manifest: the policy
        the workers started here were given (``worker_policy``; workers started elsewhere have their own), and
        each worker's as it said on connecting (``worker_policies``, by index; filled as they connect)."""
        entries: dict[str, object] = {
            "worker_policy": self.policy.as_dict() if self.options.spawn else "each worker's own (--no-spawn)",
            "worker_policies": {str(j): policy for j, policy in sorted(self.server.policies.items())},
        }
        if self.kernel is not None:
            entries["testbed"] = self.testbed_entry()
        if self.options.seeded_secrets:
            return {**entries, "secrets": SEEDED_SECRETS}
        return {
            **entries,
            "secrets": "os-csprng: each worker draws its keys, mask and noise seeds from its operating system",
        }

    def testbed_entry(self) -> dict[str, object]:
        """The kernel testbed as the manifest states it: the time dilation and the cgroup version."""
        assert self.kernel is not None
        groups = self.kernel.groups
        return {
            "emulation": "kernel",
            "time_dilation": self.world.dilation,
            "cgroup": f"v{groups.version}",
        }

    @property
    def address(self) -> tuple[str, int]:
        return self.server.host, self.server.port

    def _spawn(self) -> None:
        """Start the workers; each draws its own key pair and announces its verification key through a pipe
        of its own (the launcher's provisioning: the server never holds a worker's signing key)."""
        env = {k: v for k, v in os.environ.items() if k != SERVER_KEY_ENV}
        env.update(ONE_THREAD_ENV)
        env[SERVER_KEY_ENV] = self.identity.verification.hex()
        out: IO[bytes] | None = None
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            out = self._log = (self.options.log_dir / "workers.log").open("ab")
        host, port = self.address
        pipes: dict[int, int] = {}
        try:
            for j in range(self.n_workers):
                read_end, write_end = os.pipe()
                pipes[j] = read_end
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
                    "--announce-fd",
                    str(write_end),
                    *self.policy.arguments(),  # what the scenario asks: this host's user chose it, code included
                    *(["--bind", self.kernel.address(j)] if self.kernel is not None else []),
                ]
                try:
                    process = subprocess.Popen(command, env=env, stdout=out, stderr=out, pass_fds=(write_end,))
                finally:
                    os.close(write_end)
                self.processes.append(process)
                if self.kernel is not None:
                    self.kernel.attach(j, process.pid)
            self.loop.run_until_complete(self._announcements(pipes))
        finally:
            for fd in pipes.values():
                os.close(fd)

    async def _announcements(self, pipes: dict[int, int]) -> None:
        """Each spawned worker's verification key, read from its pipe into the server's directory as it comes
        (the server accepts connections meanwhile: a worker may connect as soon as it has announced)."""
        loop = asyncio.get_running_loop()
        lines = {j: b"" for j in pipes}
        announced: set[int] = set()
        errors: list[str] = []
        done = asyncio.Event()
        where = f" (see {self.options.log_dir / 'workers.log'})" if self.options.log_dir is not None else ""

        def readable(j: int, fd: int) -> None:
            chunk = os.read(fd, 256)
            lines[j] += chunk
            if chunk and b"\n" not in lines[j] and len(lines[j]) < 256:
                return
            loop.remove_reader(fd)
            if not lines[j]:
                errors.append(f"worker {j} exited before announcing its key{where}")
            else:
                try:
                    self.directory[j] = parse_announcement(lines[j].split(b"\n")[0])
                    announced.add(j)
                except IdentityError as exc:
                    errors.append(f"worker {j}: {exc}")
            if errors or len(announced) == len(pipes):
                done.set()

        for j, fd in pipes.items():
            loop.add_reader(fd, readable, j, fd)
        try:
            await asyncio.wait_for(done.wait(), self.options.connect_timeout_s)
        except asyncio.TimeoutError:
            missing = sorted(set(pipes) - announced)
            raise DeployError(
                f"workers {missing} announced no key within {self.options.connect_timeout_s:g} s{where}"
            ) from None
        finally:
            for fd in pipes.values():
                loop.remove_reader(fd)
        if errors:
            raise DeployError(errors[0])

    def _stop_workers(self, kill: bool = False) -> None:
        """Wait for the worker processes (10 s each unless ``kill``), then kill any left."""
        for process in self.processes:
            try:
                process.wait(timeout=0 if kill else 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def live_workers(self) -> int:
        """Worker processes still running (or, for workers started elsewhere, the number expected), less
        those that said they cannot run the scenario."""
        failed = self.server.failed
        if not self.options.spawn:
            return self.n_workers - len(failed)
        return sum(1 for j, p in enumerate(self.processes) if p.poll() is None and j not in failed)

    @property
    def now(self) -> float:
        """Seconds since the deployment started."""
        return self.server.now()

    def wait_until(self, t: float) -> None:
        """Sleep until ``t`` (a deployment replays no trace: nothing asks it to wait)."""
        time.sleep(max(0.0, t - self.now))

    def play(self, plan: RoundPlan) -> RoundRecord:
        """Play ``plan`` over the sockets (its ``offline`` is empty: trace replay is not deployed)."""
        pop, data = self.world.population, self.world.data
        records = {
            c: ClientRecord(
                client=c,
                slowdown=float(pop.slowdown[c]),
                bandwidth_mbps=float(pop.bandwidth_mbps[c]),
                samples=int(data.num_samples(c)),
            )
            for c in plan.sampled
        }
        private = plan.private
        if private is not None and not self.options.seeded_secrets:
            private = replace(private, server_seed=os.urandom(32))  # central noise: the server's own secret
        throttled: dict[str, tuple[int, float]] = {}
        try:
            record = self.loop.run_until_complete(
                self.server.play(plan, private, records, self.live_workers, self.options.connect_timeout_s)
            )
        finally:
            if self.kernel is not None:
                try:
                    throttled = self.kernel.throttles()
                except (OSError, ValueError) as exc:  # a diagnostic: the round stands without it
                    log.warning("round %d: its throttles could not be read: %s", plan.number, exc)
                finally:
                    self.kernel.release()
        played = self.server.last
        if self.operations is not None and played is not None and played.number == plan.number:
            self.operations.append(plan.number, played.operations)
        if self.throttles is not None and throttled:
            self.throttles.append(plan.number, throttled)
        return record

    def _finish_tasks(self) -> None:
        """Let the tasks still on the loop (connections' readers and writers just cancelled) end before it
        closes, so that none is left pending."""
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def close(self) -> None:
        """Tell the workers to exit and wait for them (killing any that do not within 10 s)."""
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self.server.close())
        finally:
            self._stop_workers()
            if self.kernel is not None:
                self.kernel.close()
            self._finish_tasks()
            self.loop.close()
            sys.setswitchinterval(self._switch)
            self._math.restore_original_limits()
            if self._log is not None:
                self._log.close()
