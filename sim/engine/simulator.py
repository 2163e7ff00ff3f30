"""The simulator: the driver that plays round plans in virtual time (SimPy).

The server's clock runs continuously across rounds: round r+1 starts the moment round r ends. With a
``testbed`` section every party's compute shares the host's cores (:mod:`sim.engine.host`), one pool for
the whole run; under ``testbed: {emulation: engine}`` the cost profile's simulation engine's workers and
polling too (:mod:`sim.engine.actors`). ``full``, ``learning`` (which skips the cryptography) and
``timing`` fidelity (which skips training and all payload arithmetic) give identical virtual times.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import simpy

from sim.clients.population import MBPS
from sim.costs.model import CLIENT_ROLE, SERVER_ROLE, CostModelError
from sim.engine.actors import ActorEngine
from sim.engine.ahead import ahead_threads
from sim.engine.host import PartyQuotas, SharedHost
from sim.engine.network import Link, Network
from sim.engine.virtual_round import Round, RoundSetup
from sim.round.plan import RoundPlan
from sim.round.records import RoundRecord
from sim.testbed import ENGINE, MIN_QUOTA_US, PAYLOAD_FRACTION, is_kernel
from sim.world import CALL_OP, RESTART_OP, TRANSPORT_OPS, World


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a round, then restored as it was.

    A round makes hundreds of thousands of objects that live until it ends (events, processes, messages,
    records). Each of the collector's passes walks them all, and they trigger many. Reference counting
    still frees everything outside cycles at once; what a round leaves in cycles is collected after it, at
    the cost of a higher peak memory (both measured in docs/performance.md, section 3)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Simulator:
    """Plays the rounds of one run in virtual time (:class:`sim.round.driver.Driver`).

    ``observe`` is called with each :class:`~sim.engine.virtual_round.Round` before it runs (tests and tools that
    look inside a round)."""

    name = "simulate"

    def __init__(self, world: World, observe: Callable[[Round], None] | None = None) -> None:
        sc = world.scenario
        self.world = world
        self.observe = observe
        self.env = simpy.Environment()
        self.network = Network(self.env)
        kernel = is_kernel(sc)
        payload = PAYLOAD_FRACTION if kernel else 1.0  # a kernel testbed's links carry frames with headers
        bps = sc.server.bandwidth_mbps * MBPS * payload
        self.setup = RoundSetup(
            env=self.env,
            network=self.network,
            server_up=Link("server.up", bps, shared=True),
            server_down=Link("server.down", bps, shared=True),
            population=world.population,
            costs=world.costs,
            server_speed=sc.server.speed,
            timeouts=sc.timeouts,
            silent_dropout=sc.dropout.silent,
            dim=world.dim,
            train_op=world.train_op,
            local_epochs=sc.training.local_epochs,
            batch_size=sc.training.batch_size,
            samples=world.data.num_samples,
            learner=world.learner,
            fidelity=sc.fidelity,
            aggregation=sc.aggregation,
            seed=sc.seed,
            latency_s=sc.server.latency_ms / 1000,
            host=self._host(world),
            payload_fraction=payload,
            ahead=ahead_threads(sc.protocol_threads) if sc.fidelity == "full" else None,
        )
        if sc.testbed is not None and sc.testbed.emulation == ENGINE:
            engine = world.costs.engine
            if engine is None:
                raise CostModelError(
                    f"{sc.origin('testbed', 'emulation')}: testbed.emulation is engine, but cost profile "
                    f"{world.costs.source} declares no simulation engine ('engine'; the flower profile has one)"
                )
            self.setup.engine = ActorEngine(self.env, engine, sc.testbed.cores)
        elif sc.testbed is not None:  # the testbed's own costs: fail now, not mid-run, if the profile lacks them
            for op in TRANSPORT_OPS:
                world.costs.seconds(op, {"bytes": 1.0})
            self.setup.call_s = world.costs.seconds(CALL_OP, {}, CLIENT_ROLE)
            self.setup.server_call_s = world.costs.seconds(CALL_OP, {}, SERVER_ROLE)
        if sc.pipeline is not None:
            if sc.pipeline.chunks is None:
                raise ValueError("pipeline.chunks: auto is resolved before a driver is built (sim.runner)")
            self.setup.pipeline = sc.pipeline

    def _host(self, world: World) -> SharedHost | PartyQuotas | None:
        """The testbed's CPUs: the host's shared cores, each party's own quota (a kernel testbed), or none."""
        testbed = world.scenario.testbed
        if testbed is None:
            return None
        if is_kernel(world.scenario):
            sc = world.scenario
            slowdown = world.population.slowdown
            costs, restart = world.costs, {}  # a calibrated profile's CPU of a throttled period (deploy.restart)
            for r in (CLIENT_ROLE, SERVER_ROLE):
                if costs.has(RESTART_OP) or costs.has(f"{RESTART_OP}@{r}"):
                    restart[r] = costs.seconds(RESTART_OP, {"count": 1.0}, r)
                    if restart[r] >= MIN_QUOTA_US / 1e6:  # a period's least quota would never see a job end
                        raise CostModelError(
                            f"cost profile {costs.source}: {RESTART_OP} at the {r} charges {restart[r]:g} s of "
                            f"CPU a throttled period, not less than the least quota a period holds "
                            f"({MIN_QUOTA_US / 1e6:g} s): calibrate again, or leave it out"
                        )
            return PartyQuotas(self.env, world.dilation, sc.server.speed, slowdown, testbed.cores, sc.seed, restart)
        return SharedHost(self.env, testbed.cores)

    @property
    def now(self) -> float:
        return float(self.env.now)

    def wait_until(self, t: float) -> None:
        self.env.run(until=t)

    def play(self, plan: RoundPlan) -> RoundRecord:
        """Run ``plan`` in virtual time (with the cyclic garbage collector paused: :func:`collector_paused`).

        The round is let go of before the collector resumes, so that its first pass finds the round's
        objects unreachable and frees them, rather than walking them alive and leaving them to a later,
        full pass (docs/performance.md, section 3)."""
        with collector_paused():
            round = Round(self.setup, plan)
            try:
                if self.observe is not None:
                    self.observe(round)
                process = self.env.process(round.run())
                self.env.run(until=process)
            finally:
                round.release()
            record = process.value
            del round, process
        assert isinstance(record, RoundRecord)
        return record

    def manifest_entries(self) -> dict[str, object]:
        """Nothing: the simulator's runs are described by their scenario."""
        return {}

    def close(self) -> None:
        """End the threads that made clients' calls ahead, if any (the world's model is the run's)."""
        if self.setup.ahead is not None:
            self.setup.ahead.shutdown(wait=True, cancel_futures=True)
