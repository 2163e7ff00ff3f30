"""One round of Flower's own SecAgg+ (flwr 1.42) on this machine, timed, with its simulation engine probed.

Used by ``benchmarks/flower_peer.py`` (Flower against ours), ``benchmarks/flower_validate.py`` (Flower
against the simulator under the flower profile) and ``dropsim profile --impl flower`` (the engine's costs:
:func:`engine_costs`).

Runs Flower's server workflow (``DefaultWorkflow`` with ``SecAggPlusWorkflow`` as the fit workflow, in a
``ServerApp``) against ``n`` simulated SuperNodes whose ``ClientApp`` carries ``secaggplus_mod``, through
``flwr.simulation.run_simulation`` on the Ray backend (one Ray actor per core). There is no training: each
client's fit returns a fixed float32 vector of ``d`` values (seeded by its partition id, about 1e-3 in
magnitude), so what is timed is the secure aggregation. Clients chosen to drop raise in their fit, that is
in SecAgg+'s masked-input stage, after sharing keys: the server then reconstructs their mask keys and
removes their pairwise masks.

Measured, all in wall-clock seconds:

* ``round_s``: the ``SecAggPlusWorkflow`` call inside the ServerApp (its four stages, from sending the
  setup to the unmasked mean), with warm Ray actors; ``stage_s_*``: each stage.
* ``client_s_mean`` / ``client_s_max``: per surviving client, time inside its ClientApp over the four
  stages (measured by a mod wrapped around ``secaggplus_mod``), less the fit that makes the vector
  (``fit_s_mean``, with Flower's legacy FitIns/FitRes conversion); ``server_s``: ``round_s`` less the time
  the ServerApp is blocked in ``send_and_receive`` (the server's own SecAgg+ work plus message building,
  sharing the GIL with the simulation engine's threads in the same process).
* ``max_abs_error``: largest difference between the aggregate and the true mean of the survivors'
  vectors (below ``quantisation_step`` when the round is right).
* ``warmup_s``: one tiny message to every node and back, before the round (spawns and warms the actors).
* ``ray_start_s``: ``ray.init`` alone; ``simulation_s``: ``run_simulation`` (simulation start-up,
  warm-up, round, Ray shutdown); ``invocation_s``: the whole child process, seen from the caller.
* ``peak_pss_mb``: peak of the summed proportional set size (MB) of every process of the run, sampled
  every 0.25 s; ``client_mb_up``: bytes of one client's masked vector (MB).
* ``engine``: the simulation engine, probed during the round (:class:`EngineProbe`): every message a
  worker thread handed to a ClientApp actor (when, its bytes each way, the ClientApp's own seconds) and
  every push and pull of the server's grid. :func:`engine_costs` reads Flower's own costs from it.

Ray binds sockets, so the run happens in a child process inside fresh network and PID namespaces
(``unshare -npf``, only the loopback interface up): everything talks to 127.0.0.1, nothing can reach
anything else, and when the child ends the kernel ends every process of the namespace, Ray's included.
Telemetry is off (``FLWR_TELEMETRY_ENABLED=0``, ``RAY_USAGE_STATS_ENABLED=0``).

SecAgg+ parameters, chosen to match ours (``secaggplus_parameters``): our graph has degree
k = 2 ceil(log2 n) (made even, at most n - 1, :mod:`sim.protocol.graph`) and each client's secrets are
shared among its k + 1 holders with threshold floor(0.5 (k + 1)) + 1. Flower's ``num_shares`` counts the
same holders (the client and its neighbours on a shuffled ring, k/2 either side), so
``num_shares = k + 1`` and ``reconstruction_threshold = floor(0.5 num_shares) + 1``. Our values are
20-bit (modulus 2^20, room for the sum of n clients' updates of L2 norm at most clip = 1), so
``modulus_range = 2^20``, ``clipping_range = 1.0`` (per coordinate, implied by the L2 bound) and
``quantization_range = (2^20 - 1) // n``, so that the sum of n quantised values and of n weights cannot
wrap; ``max_weight = 1`` with one example per client. Flower computes in int64 whatever the modulus,
so these choices do not change its cost, only its precision.

Needs ``pip install "flwr[simulation]==1.42.0"`` (the ``peer`` extra) and ``unshare`` (util-linux).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from sim.protocol.graph import auto_degree
from sim.protocol.params import AggregationParams
from sim.protocol.registry import reconstruction_threshold

OURS = AggregationParams(protocol="secagg+")
"""Our SecAgg+ at its defaults (20-bit values, clip 1, threshold 0.5, auto degree), which Flower's matches."""
UPDATE_SCALE = 1e-3
STAGES = ("setup_stage", "share_keys_stage", "collect_masked_vectors_stage", "unmask_stage")
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
}
CHILD_FLAG = "--child-out"


# ---------------------------------------------------------------- parameters and inputs (both sides)


def secaggplus_parameters(n: int, bits: int = OURS.bits, clip: float = OURS.clip) -> dict[str, int | float]:
    """Flower ``SecAggPlusWorkflow`` arguments matching our SecAgg+ for ``n`` clients (see module doc)."""
    degree = auto_degree(n)
    return {
        "num_shares": min(n, degree + degree % 2 + 1),  # the holders, as reconstruction_threshold counts them
        "reconstruction_threshold": reconstruction_threshold(OURS, n),
        "clipping_range": clip,
        "quantization_range": (2**bits - 1) // n,
        "modulus_range": 2**bits,
        "max_weight": 1.0,
    }


def client_update(partition: int, d: int) -> np.ndarray:
    """The fixed float32 vector that client ``partition`` submits."""
    rng = np.random.default_rng(partition)
    return rng.standard_normal(d, dtype=np.float32) * np.float32(UPDATE_SCALE)


def dropped_partitions(n: int, dropout: float) -> frozenset[int]:
    """Partitions that leave in the masked-input stage: the first ``round(dropout n)``."""
    return frozenset(range(math.floor(dropout * n + 0.5)))


# ---------------------------------------------------------------- client side (runs in Ray actors)


def _timing_mod(key: str) -> Callable[..., Any]:
    """A Flower mod that records the seconds spent in the rest of the chain in a ConfigRecord ``key``."""

    def mod(msg: Any, ctxt: Any, call_next: Callable[..., Any]) -> Any:
        from flwr.app import ConfigRecord  # deferred: optional (the peer extra)

        start = time.perf_counter()
        out = call_next(msg, ctxt)
        if out.has_content():
            out.content.config_records[key] = ConfigRecord({"s": time.perf_counter() - start})
        return out

    return mod


def make_client_app(d: int, dropped: frozenset[int]) -> Any:
    """ClientApp: ``secaggplus_mod`` around a NumPyClient whose fit returns the fixed vector."""
    from flwr.client import ClientApp, NumPyClient  # deferred: optional (the peer extra)
    from flwr.client.mod import secaggplus_mod  # deferred: optional (the peer extra)

    class FixedClient(NumPyClient):
        def __init__(self, partition: int) -> None:
            self.partition = partition

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            if self.partition in dropped:
                raise RuntimeError(f"client {self.partition} leaves before uploading its masked input")
            return [client_update(self.partition, d)], 1, {}

    def client_fn(context: Any) -> Any:
        return FixedClient(int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn, mods=[_timing_mod("bench"), secaggplus_mod, _timing_mod("bench_fit")])


# ---------------------------------------------------------------- server side (ServerApp thread of the child)


class _TimedGrid:
    """Delegates to a Flower Grid, timing ``send_and_receive`` and collecting the clients' timing records."""

    def __init__(self, grid: Any) -> None:
        self._grid = grid
        self.blocked_s = 0.0
        self.client_s: dict[int, float] = {}
        self.fit_s: dict[int, float] = {}
        self.masked_bytes: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        # deferred: optional (the peer extra)
        from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

        start = time.perf_counter()
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self.blocked_s += time.perf_counter() - start
        for msg in replies:
            if msg.has_error():
                continue
            node, records = msg.metadata.src_node_id, msg.content.config_records
            self.client_s[node] = self.client_s.get(node, 0.0) + float(records["bench"]["s"])
            if "bench_fit" in records:
                self.fit_s[node] = float(records["bench_fit"]["s"])
                masked = records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
                self.masked_bytes[node] = sum(len(b) for b in masked)
        return replies


def make_timed_workflow(params: dict[str, int | float], out: dict[str, Any]) -> Any:
    """A ``SecAggPlusWorkflow`` whose call and stages are timed into ``out``."""
    from flwr.server.workflow import SecAggPlusWorkflow  # deferred: optional (the peer extra)

    class TimedSecAggPlus(SecAggPlusWorkflow):
        def __init__(self) -> None:
            arguments: dict[str, Any] = dict(params)  # flwr types each argument; ours are of those types
            super().__init__(**arguments)
            self._grid: _TimedGrid | None = None
            for name in STAGES:
                setattr(self, name, self._timed(name, getattr(self, name)))

        def _timed(self, name: str, stage: Callable[..., bool]) -> Callable[..., bool]:
            def run(grid: Any, context: Any, state: Any) -> bool:
                start = time.perf_counter()
                ok = stage(grid, context, state)
                end = time.perf_counter()
                out[f"stage_s_{name.removesuffix('_stage')}"] = end - start
                out.setdefault("stage_spans", {})[name.removesuffix("_stage")] = [start, end]
                out["completed_stages"] = out.get("completed_stages", 0) + int(ok)
                return ok

            return run

        def __call__(self, grid: Any, context: Any) -> None:
            timed = _TimedGrid(grid)
            start = time.perf_counter()
            grid_like: Any = timed  # a Grid by delegation (every other attribute is the wrapped grid's)
            super().__call__(grid_like, context)
            out["round_s"] = time.perf_counter() - start
            out["round_span"] = [start, start + out["round_s"]]
            out["server_s"] = out["round_s"] - timed.blocked_s
            survivors = [c for c in timed.client_s if c in timed.fit_s]
            work = [timed.client_s[c] - timed.fit_s[c] for c in survivors]
            out["survivors"] = len(survivors)
            out["client_s_mean"] = float(np.mean(work)) if work else math.nan
            out["client_s_max"] = float(np.max(work)) if work else math.nan
            out["fit_s_mean"] = float(np.mean([timed.fit_s[c] for c in survivors])) if survivors else math.nan
            out["client_mb_up"] = float(np.mean(list(timed.masked_bytes.values()))) / 1e6 if survivors else math.nan

    return TimedSecAggPlus()


def _wait_for_nodes(grid: Any, n: int, timeout_s: float = 120.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(nodes := list(grid.get_node_ids())) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of {n} simulated nodes registered")
        time.sleep(0.02)
    return nodes


def _warm_up(grid: Any, nodes: list[int]) -> float:
    """One GetProperties message to every node and back: spawns the actors and imports the ClientApp."""
    from flwr.app import Message  # deferred: optional (the peer extra)
    from flwr.common import GetPropertiesIns  # deferred: optional (the peer extra)
    from flwr.common.constant import MessageTypeLegacy  # deferred: optional (the peer extra)
    from flwr.compat.common import recorddict_compat as compat  # deferred: optional (the peer extra)

    start = time.perf_counter()
    messages = [
        Message(
            content=compat.getpropertiesins_to_recorddict(GetPropertiesIns({})),
            dst_node_id=node,
            message_type=MessageTypeLegacy.GET_PROPERTIES,
            group_id="warm-up",
        )
        for node in nodes
    ]
    replies = list(grid.send_and_receive(messages))
    if any(r.has_error() for r in replies):
        raise RuntimeError("a ClientApp failed during the warm-up")
    return time.perf_counter() - start


def _check_mean(params_record: Any, n: int, d: int, dropped: frozenset[int]) -> float:
    """Largest |aggregated - true mean of the survivors| (compare with one quantisation step)."""
    from flwr.common import parameters_to_ndarrays  # deferred: optional (the peer extra)
    from flwr.compat.common import recorddict_compat as compat  # deferred: optional (the peer extra)

    got = parameters_to_ndarrays(compat.arrayrecord_to_parameters(params_record, keep_input=True))[0]
    survivors = [c for c in range(n) if c not in dropped]
    want = np.zeros(d)
    for c in survivors:
        want += client_update(c, d)
    want /= len(survivors)
    return float(np.max(np.abs(got.astype(np.float64) - want)))


def make_server_app(
    n: int, d: int, dropped: frozenset[int], out: dict[str, Any], probe: EngineProbe | None = None
) -> Any:
    """ServerApp: wait for the nodes, warm up, then ``DefaultWorkflow(fit_workflow=timed SecAgg+)``."""
    from flwr.common import ndarrays_to_parameters  # deferred: optional (the peer extra)
    from flwr.server import LegacyContext, ServerApp, ServerConfig  # deferred: optional (the peer extra)
    from flwr.server.strategy import FedAvg  # deferred: optional (the peer extra)
    from flwr.server.workflow import DefaultWorkflow  # deferred: optional (the peer extra)
    from flwr.server.workflow.constant import MAIN_PARAMS_RECORD  # deferred: optional (the peer extra)

    params = secaggplus_parameters(n)
    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        nodes = _wait_for_nodes(grid, n)
        out["warmup_s"] = _warm_up(grid, nodes)
        strategy = FedAvg(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=n,
            min_available_clients=n,
            initial_parameters=ndarrays_to_parameters([np.zeros(d, dtype=np.float32)]),
        )
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
        if probe is not None:
            probe.recording = True
        DefaultWorkflow(fit_workflow=make_timed_workflow(params, out))(grid, legacy)
        if probe is not None:
            probe.recording = False
        if out.get("completed_stages") == len(STAGES):
            step = 2 * params["clipping_range"] / params["quantization_range"]
            out["max_abs_error"] = _check_mean(legacy.state.array_records[MAIN_PARAMS_RECORD], n, d, dropped)
            out["quantisation_step"] = step

    return app


# ---------------------------------------------------------------- the simulation engine, probed


def content_bytes(records: Any) -> int:
    """Bytes of the values a Flower ``RecordDict`` carries: arrays' data, config bytes and strings, 8 a
    number (what Ray must serialise to move it; the records' own framing is left out)."""
    from flwr.app import ArrayRecord  # deferred: optional (the peer extra)

    total = 0
    for record in records.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(array.data) for array in record.values())
            continue
        for value in record.values():
            for item in value if isinstance(value, list) else [value]:
                total += len(item) if isinstance(item, bytes | str) else 8
    return total


class EngineProbe:
    """Timestamps (``time.perf_counter``, this process) of Flower's simulation engine during a round.

    ``messages``: per message the engine's worker threads gave an actor (``RayBackend.process_message``):
    the node, the SecAgg+ stage, ``start``/``end``, ``bytes_in``/``bytes_out`` (the message's and its
    reply's contents), ``context_bytes`` (the node's Context state, sent and returned with each message)
    and ``app_s`` (seconds inside the ClientApp's mods, from the reply). ``pushes``/``pulls``: the server
    grid's ``push_messages`` and ``pull_messages`` calls (start, end, count)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.pushes: list[tuple[float, float, int]] = []
        self.pulls: list[tuple[float, float, int]] = []
        self.recording = False

    def install(self) -> None:
        """Wrap the engine's methods (process-wide; the originals do the work)."""
        from flwr.server.superlink.fleet.vce.backend import raybackend  # deferred: optional (the peer extra)
        from flwr.superlink.grid.inmemory_grid import InMemoryGrid  # deferred: optional (the peer extra)

        probe = self
        process, push, pull = (
            raybackend.RayBackend.process_message,
            InMemoryGrid.push_messages,
            InMemoryGrid.pull_messages,
        )

        def process_message(backend: Any, message: Any, context: Any) -> Any:
            start = time.perf_counter()
            out, updated = process(backend, message, context)
            end = time.perf_counter()
            if probe.recording:
                probe.messages.append(probe._describe(message, out, context, start, end))
            return out, updated

        def timed(call: Callable[[Any, Any], Any], log: list[tuple[float, float, int]]) -> Callable[[Any, Any], Any]:
            """``call`` (a grid's push or pull), its start, end and count of messages logged to ``log``."""

            def run(grid: Any, messages: Any) -> list[Any]:
                start = time.perf_counter()
                out = list(call(grid, messages))
                if probe.recording:
                    log.append((start, time.perf_counter(), len(out)))
                return out

            return run

        setattr(raybackend.RayBackend, "process_message", process_message)  # noqa: B010 (typed methods, replaced)
        setattr(InMemoryGrid, "push_messages", timed(push, self.pushes))  # noqa: B010
        setattr(InMemoryGrid, "pull_messages", timed(pull, self.pulls))  # noqa: B010

    @staticmethod
    def _describe(message: Any, out: Any, context: Any, start: float, end: float) -> dict[str, Any]:
        # deferred: optional (the peer extra)
        from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

        configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
        stage = str(configs[Key.STAGE]) if configs is not None and Key.STAGE in configs else ""
        reply = out.content if out.has_content() else None
        bench = reply.config_records.get("bench") if reply is not None else None
        return {
            "node": int(message.metadata.dst_node_id),
            "stage": stage,
            "start": start,
            "end": end,
            "bytes_in": content_bytes(message.content),
            "bytes_out": content_bytes(reply) if reply is not None else 0,
            "context_bytes": content_bytes(context.state),
            "app_s": float(bench["s"]) if bench is not None else math.nan,
        }

    def record(self) -> dict[str, Any]:
        return {"messages": self.messages, "pushes": self.pushes, "pulls": self.pulls}


DELIVERY_INTERVAL_S = 0.1
"""flwr 1.42's engine moves pushed messages to its actors' queue on a sweep of every node every 0.1 s
(``add_messages_to_queue``: ``f_stop.wait(0.1)``, a literal of its code)."""
INLINE_LIMIT_BYTES = 100 * 1024
"""Ray's ``max_direct_call_object_size``: a task's argument or result above it goes through the object
store (Ray's documentation: "When passing a large argument (>100KB) by value to a task, Ray will implicitly
store the argument in the object store")."""
ENGINE_POINTS = ((15, 20_000, 0.0), (15, 300_000, 0.1), (15, 2_000_000, 0.0))
"""(clients, parameters, dropout) of the rounds :func:`measure_engine` probes (the first alone with
``quick``): apart from the grid ``benchmarks/flower_validate.py`` validates on (10, 20 and 50 clients, 10^5
and 10^6). At 2 x 10^4 parameters the model (80 kB) is passed inline and the masked vector (160 kB) is
stored; at the others both are stored: so the fit can tell a stored object from the bytes."""


def _nonnegative_fit(columns: dict[str, np.ndarray], y: np.ndarray) -> tuple[dict[str, float], float]:
    """Least squares of ``y`` on ``columns`` with every coefficient >= 0: the best fit over the subsets of
    features whose unconstrained fit has no negative coefficient (a handful of features: every subset)."""
    names = list(columns)
    best: tuple[float, dict[str, float]] | None = None
    for mask in range(1, 1 << len(names)):
        chosen = [name for k, name in enumerate(names) if mask >> k & 1]
        design = np.column_stack([columns[name] for name in chosen])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        if (coef < 0).any():
            continue
        residual = float(np.sum((y - design @ coef) ** 2))
        if best is None or residual < best[0]:
            best = (residual, {name: float(c) for name, c in zip(chosen, coef, strict=True)})
    assert best is not None, "one feature alone always has a nonnegative fit for nonnegative data"
    total = max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
    return {name: best[1].get(name, 0.0) for name in names}, 1.0 - best[0] / total


def engine_costs(rounds: list[dict[str, Any]], pull_interval_s: float | None = None) -> dict[str, Any]:
    """The ``engine`` section of the flower profile (:class:`sim.costs.engine.EngineCosts`) from probed
    rounds (:func:`flower_round` results): the worker's seconds per message besides the ClientApp's own,
    fitted by least squares (each coefficient at least 0) on a constant, the bytes of the message and its
    reply, and how many of the two exceed Ray's inline limit of :data:`INLINE_LIMIT_BYTES`; with the sweep
    and poll intervals of flwr's code, and the delivery waits measured (each stage's first message taken
    by a worker, after the server's push: for the record, the simulator derives them from the sweeps'
    and the polls' intervals, :class:`sim.engine.actors.ActorEngine`). ``pull_interval_s``: the server's
    polling interval (None: flwr's ``InMemoryGrid`` default)."""
    sizes, seconds, waits = [], [], []
    for result in rounds:
        engine = result["engine"]
        for m in engine["messages"]:
            if math.isfinite(m["app_s"]):
                sizes.append((m["bytes_in"], m["bytes_out"]))
                seconds.append(m["end"] - m["start"] - m["app_s"])
        for start, end in result.get("stage_spans", {}).values():
            pushes = [p for p in engine["pushes"] if start <= p[0] <= end]
            taken = [m["start"] for m in engine["messages"] if start <= m["start"] <= end]
            if pushes and taken:
                waits.append(min(taken) - pushes[0][1])
    if len(seconds) < 3:
        raise RuntimeError("the probed rounds recorded fewer than three messages: nothing to fit")
    size = np.array(sizes, dtype=float)
    y = np.array(seconds, dtype=float)
    columns = {
        "const": np.ones(len(y)),
        "bytes": size.sum(axis=1),
        "stored": (size > INLINE_LIMIT_BYTES).sum(axis=1).astype(float),
    }
    coef, r2 = _nonnegative_fit(columns, y)
    if pull_interval_s is None:
        from flwr.superlink.grid.inmemory_grid import InMemoryGrid  # deferred: optional (the peer extra)

        pull_interval_s = inspect.signature(InMemoryGrid.__init__).parameters["pull_interval"].default
    return {
        "name": "flower-simulation",
        "description": (
            "flwr.simulation.run_simulation on Ray: one actor per cpus_per_client cores, one message at a "
            "time each; pushed messages reach the actors on a sweep every delivery_interval_s; the server "
            "polls for replies every pull_interval_s; per message, the worker's seconds besides the "
            "ClientApp's own (Ray's task, the message and the node's Context to the actor and back; a "
            "message or reply above inline_limit_bytes through the object store)"
        ),
        "measured_by": "dropsim profile --impl flower (sim/profiling/flower_rounds.py: EngineProbe)",
        "cpus_per_client": 1,
        "delivery_interval_s": DELIVERY_INTERVAL_S,
        "pull_interval_s": float(pull_interval_s),
        "inline_limit_bytes": INLINE_LIMIT_BYTES,
        "model_with_upload": True,  # SecAggPlusWorkflow sends the model with the collect-masked-vectors request
        "message": {"coef": coef, "r2": r2, "points": len(y), "median_s": float(np.median(y))},
        "delivery_wait_measured_s": {
            "mean": float(np.mean(waits)) if waits else math.nan,
            "stages": len(waits),
        },
        "rounds": [
            {"clients": r["clients"], "dim": r["dim"], "dropout": r["dropout"], "round_s": r["round_s"]} for r in rounds
        ],
    }


def engine_scenario(n: int, d: int, dropout: float, profile: str, cores: int) -> dict[str, Any]:
    """The scenario of a Flower round of ``n`` clients and ``d`` parameters as the simulator plays it
    (``scenarios/flower.yaml`` has the same): SecAgg+ at our defaults with 20-bit values, no training,
    homogeneous clients, ``profile`` on the engine testbed of ``cores`` cores."""
    return {
        "name": f"flower-n{n}-d{d}",
        "seed": 1,
        "rounds": 1,
        "population": n,
        "sampling": {"clients_per_round": n},
        "clients": {"compute": {"slowdown": [1.0, 1.0]}},
        "dropout": {"rate": dropout, "stage": "before_upload"},
        "data": {"dataset": "synthetic"},
        "model": {"params": d},
        "aggregation": {"protocol": "secagg+", "bits": OURS.bits},
        "fidelity": "timing",
        "costs": {"profile": profile},
        "testbed": {"cores": cores, "emulation": "engine"},
    }


SPLIT_SPREAD = 0.05
"""The least spread (largest minus smallest) of the rounds' shares of work on values in what the
simulator charges a role, below which the rounds cannot tell its two scales apart: one scale is fitted."""


def _scales(measured: list[float], on_values: list[float], rest: list[float]) -> tuple[float, float | None]:
    """(scale of the rest, scale of the work on the model's values) that best turn the seconds charged for
    each round (``rest`` and ``on_values``) into its ``measured`` seconds, in relative terms: each round's
    error over its measured seconds, so that rounds 100 times apart in size count alike; each scale at
    least 0. The second is None, and the first one scale for all the work fitted the same way, where the
    rounds cannot tell the two apart: fewer than two rounds, a round measured or charged nothing, shares
    of work on values that differ by less than :data:`SPLIT_SPREAD` between rounds, or a fit whose best
    nonnegative scales zero one kind of work."""
    charged = [v + r for v, r in zip(on_values, rest, strict=True)]
    if min(measured, default=0.0) <= 0 or min(charged, default=0.0) <= 0:
        return sum(measured) / max(sum(charged), 1e-300), None
    # one scale s for all the work: the least squares of sum((s c / m - 1)^2)
    single = sum(c / m for c, m in zip(charged, measured, strict=True)) / sum(
        (c / m) ** 2 for c, m in zip(charged, measured, strict=True)
    )
    shares = [v / c for v, c in zip(on_values, charged, strict=True)]
    if len(measured) < 2 or max(shares) - min(shares) < SPLIT_SPREAD:
        return single, None
    weight = np.array([1.0 / m for m in measured])
    coef, _ = _nonnegative_fit(
        {"rest": np.array(rest) * weight, "values": np.array(on_values) * weight}, np.ones(len(measured))
    )
    if min(coef.values()) <= 1e-6 * max(coef.values()):  # one kind of work alone explains the rounds best
        return single, None
    return coef["rest"], coef["values"]


def work_scales(doc: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's work scales (:class:`sim.costs.engine.EngineCosts`) from the probed ``rounds``
    (:func:`flower_round` results, some of one point maybe): per role, the seconds measured against what
    the simulator charges for the same rounds (:func:`fit_work_scales`), each point's measured seconds
    the median over its rounds (each role's apart; ``benchmarks/flower_validate.py`` likewise takes a
    median of Flower's rounds). Measured: the
    clients' ClientApp seconds (every message's, the engine's own costs aside) and the ServerApp's own
    seconds (``server_s``: the round less its waits in ``send_and_receive``)."""
    points: dict[tuple[int, int, float], list[dict[str, Any]]] = {}
    for r in rounds:
        points.setdefault((r["clients"], r["dim"], r["dropout"]), []).append(r)
    measured = [
        {
            "clients": n,
            "dim": d,
            "dropout": dropout,
            "rounds": len(group),
            "client_measured_s": statistics.median(
                sum(m["app_s"] for m in r["engine"]["messages"] if math.isfinite(m["app_s"])) for r in group
            ),
            "server_measured_s": statistics.median(r["server_s"] for r in group),
        }
        for (n, d, dropout), group in points.items()
    ]
    return fit_work_scales(doc, measured)


def fit_work_scales(doc: dict[str, Any], measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's work scales for profile ``doc`` from rounds measured inside the engine (``clients``,
    ``dim``, ``dropout``, ``client_measured_s``, ``server_measured_s``: the rows of an engine section's
    ``scale_rounds``). The simulator plays each round with ``doc`` (its engine's own costs set to 0), and
    each role's charged seconds are split into the work on the model's values (the section's
    ``vector_operations``) and the rest; the two scales are fitted over the rounds (:func:`_scales`).
    Returns ``client_scale``, ``server_scale``, where the rounds tell them apart ``client_vector_scale``
    and ``server_vector_scale``, ``vector_operations`` and ``scale_rounds`` (the rows, with what was
    charged)."""
    import yaml  # deferred: kept out of the timed child process (its memory is measured)

    from sim.costs.engine import VECTOR_OPERATIONS  # deferred: kept out of the timed child process likewise
    from sim.results.read import read_run_table  # deferred: pandas, kept out of the timed child process likewise
    from sim.runner import run_scenario  # deferred: torch, kept out of the timed child process (its memory is measured)
    from sim.scenario import load  # deferred: the parser, kept out of the timed child process likewise

    engine = {
        **doc["engine"],
        "client_scale": 1.0,
        "server_scale": 1.0,
        "message": {"coef": {"const": 0.0, "bytes": 0.0}},
    }
    for key in ("client_vector_scale", "server_vector_scale"):
        engine.pop(key, None)
    vector = sorted(engine.get("vector_operations", VECTOR_OPERATIONS))
    engine["vector_operations"] = vector
    without_values = {
        op: {**entry, "coef": {}} if op.split("@", 1)[0] in vector else entry for op, entry in doc["operations"].items()
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="flower-scale-") as folder:
        profiles = {"all": Path(folder) / "all.json", "rest": Path(folder) / "rest.json"}
        profiles["all"].write_text(json.dumps({**doc, "engine": engine}))
        profiles["rest"].write_text(json.dumps({**doc, "operations": without_values, "engine": engine}))
        for k, point in enumerate(measured):
            n, d, dropout = point["clients"], point["dim"], point["dropout"]
            charged = {}
            for name, profile in profiles.items():
                path = Path(folder) / f"round{k}-{name}.yaml"
                path.write_text(yaml.safe_dump(engine_scenario(n, d, dropout, str(profile), os.cpu_count() or 1)))
                run = Path(folder) / f"run{k}-{name}"
                run_scenario(load(path, output=str(run)).base(), run, progress=False)
                clients, rounds = read_run_table(run, "clients"), read_run_table(run, "rounds")
                charged[name] = (float(clients["cpu_s"].sum()), float(rounds["server_cpu_s"].sum()))
            rows.append(
                {
                    "clients": n,
                    "dim": d,
                    "dropout": dropout,
                    **({"rounds": point["rounds"]} if "rounds" in point else {}),
                    "client_measured_s": point["client_measured_s"],
                    "client_charged_s": charged["all"][0],
                    "client_values_charged_s": charged["all"][0] - charged["rest"][0],
                    "server_measured_s": point["server_measured_s"],
                    "server_charged_s": charged["all"][1],
                    "server_values_charged_s": charged["all"][1] - charged["rest"][1],
                }
            )
    out: dict[str, Any] = {"vector_operations": vector}
    for role in ("client", "server"):
        on_values = [r[f"{role}_values_charged_s"] for r in rows]
        rest = [r[f"{role}_charged_s"] - r[f"{role}_values_charged_s"] for r in rows]
        out[f"{role}_scale"], values_scale = _scales([r[f"{role}_measured_s"] for r in rows], on_values, rest)
        if values_scale is not None:
            out[f"{role}_vector_scale"] = values_scale
    return {**out, "scale_rounds": rows}


ENGINE_REPEATS = 3
"""Flower rounds of each of :data:`ENGINE_POINTS` that :func:`measure_engine` probes, the points taken in
turn so that a slow minute of the host touches one round of each point: the work scales take each
point's median (one round with ``quick``)."""


def measure_engine(
    base: dict[str, Any], quick: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Probe Flower's simulation engine in :data:`ENGINE_REPEATS` rounds of each of :data:`ENGINE_POINTS`
    (about 10 s each) and fit its costs (:func:`engine_costs`, on every round's messages), then its work
    scales against profile ``base`` (the flower profile being written: :func:`work_scales`)."""
    say = progress or (lambda _msg: None)
    rounds = []
    points, repeats = (ENGINE_POINTS[:1], 1) if quick else (ENGINE_POINTS, ENGINE_REPEATS)
    for k in range(repeats):
        for n, d, dropout in points:
            say(
                f"engine: pass {k + 1} of {repeats}: a Flower round of {n} clients, {d} parameters, dropout {dropout:g}"
            )
            rounds.append(flower_round(n, d, dropout))
    section = engine_costs(rounds)
    say("engine: what the simulator charges the clients and the server for those rounds")
    return {**section, **work_scales({**base, "engine": section}, rounds)}


# ---------------------------------------------------------------- child process (inside the namespaces)


def _summed_pss_mb() -> float:
    """Summed Pss (MB) of every process visible in /proc (the child's PID namespace: all of the run)."""
    total_kb = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
        except OSError:
            continue
    return total_kb / 1024


def _sample_memory(stop: threading.Event, peak: list[float]) -> None:
    while not stop.wait(0.25):
        peak[0] = max(peak[0], _summed_pss_mb())


def run_child(n: int, d: int, dropout: float, out_path: Path, ray_dir: Path, verbose: bool) -> dict[str, Any]:
    """One simulation in this (namespaced) process: Ray start, ``run_simulation``, results to ``out_path``."""
    import ray  # deferred: optional (the peer extra)
    from flwr.simulation import run_simulation  # deferred: optional (the peer extra)

    result: dict[str, Any] = {}
    stop, peak = threading.Event(), [0.0]
    sampler = threading.Thread(target=_sample_memory, args=(stop, peak), daemon=True)
    sampler.start()
    start = time.perf_counter()
    pythonpath = os.pathsep.join(sys.path)
    os.environ["PYTHONPATH"] = pythonpath
    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=verbose,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        _node_ip_address="127.0.0.1",
        _temp_dir=str(ray_dir),
    )
    result["ray_start_s"] = time.perf_counter() - start
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.CRITICAL)
    dropped = dropped_partitions(n, dropout)
    probe = EngineProbe()
    probe.install()
    start = time.perf_counter()
    run_simulation(
        server_app=make_server_app(n, d, dropped, result, probe),
        client_app=make_client_app(d, dropped),
        num_supernodes=n,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        verbose_logging=verbose,
    )
    result["simulation_s"] = time.perf_counter() - start
    stop.set()
    sampler.join()
    result["peak_pss_mb"] = peak[0]
    result["engine"] = probe.record()
    out_path.write_text(json.dumps(result))
    return result


# ---------------------------------------------------------------- caller side


def _namespace_command(args: list[str]) -> list[str]:
    """``args`` run in new network, PID and mount namespaces with only the loopback interface up."""
    unshare = ["unshare", "--net", "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    return [*unshare, "--", "bash", "-c", 'ip link set lo up && exec "$@"', "bash", *args]


def _namespace_inode(pid: int, wait_s: float = 5.0) -> str | None:
    """The network namespace of ``unshare``'s forked child (None if it cannot be read)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if children:
                return str(Path(f"/proc/{children[0]}/ns/net").readlink())
        except OSError:
            return None
        time.sleep(0.01)
    return None


def _kill_namespace(inode: str | None) -> int:
    """SIGKILL every process left in our network namespace ``inode``; how many there were."""
    if inode is None:
        return 0
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if str((entry / "ns" / "net").readlink()) == inode:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def flower_round(n: int, d: int, dropout: float = 0.0, timeout_s: float = 600.0, verbose: bool = False) -> dict:
    """Run one Flower SecAgg+ round of ``n`` clients and ``d`` float32 values in a namespaced child process.

    Returns the child's measurements (see the module docstring; seconds, MB) with the SecAgg+ parameters,
    ``invocation_s`` and ``leftover_killed`` (processes of the run still alive after it, killed: 0 expected).
    Raises ``RuntimeError`` if the child fails or runs past ``timeout_s``.
    """
    if shutil.which("unshare") is None:
        raise RuntimeError("unshare (util-linux) is needed to keep Ray on a loopback-only network namespace")
    work = Path(tempfile.mkdtemp(prefix="flwr-peer-"))
    out_path, log_path = work / "result.json", work / "child.log"
    args = [sys.executable, "-m", __name__, "--clients", str(n), "--dims", str(d), "--dropout", str(dropout)]
    args += [CHILD_FLAG, str(out_path), "--ray-dir", str(work / "ray")] + (["--verbose"] if verbose else [])
    env = {**os.environ, **QUIET_ENV}
    start = time.perf_counter()
    try:
        with log_path.open("wb") as log:
            child = subprocess.Popen(
                _namespace_command(args), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            inode = _namespace_inode(child.pid)
            try:
                code = child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                code = None
        elapsed = time.perf_counter() - start
        leftover = _kill_namespace(inode)
        text = log_path.read_text(errors="replace")
        if verbose:
            sys.stderr.write(text)
        if code != 0 or not out_path.exists():
            why = f"timed out after {timeout_s:g} s" if code is None else f"exit code {code}"
            raise RuntimeError(f"Flower SecAgg+ n={n} d={d} dropout={dropout}: {why}\n{text[-4000:]}")
        result = json.loads(out_path.read_text())
        if result.get("completed_stages") != len(STAGES) or result["max_abs_error"] > result["quantisation_step"]:
            # Flower logs a failed stage and returns: its round then has no mean to time or check
            done = result.get("completed_stages", 0)
            raise RuntimeError(
                f"Flower SecAgg+ n={n} d={d} dropout={dropout}: the round did not aggregate correctly "
                f"({done} of {len(STAGES)} stages, error {result.get('max_abs_error')})\n{text[-4000:]}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = secaggplus_parameters(n)
    return {
        "clients": n,
        "dim": d,
        "dropout": dropout,
        "dropped": len(dropped_partitions(n, dropout)),
        **result,
        "invocation_s": elapsed,
        "leftover_killed": leftover,
        **params,
    }


def child_main(argv: list[str] | None = None) -> int:
    """The namespaced child's command line (``python -m sim.profiling.flower_rounds``; see :func:`flower_round`)."""
    parser = argparse.ArgumentParser(description="one Flower SecAgg+ round in this process (internal)")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--dims", type=int, required=True)
    parser.add_argument("--dropout", type=float, required=True)
    parser.add_argument(CHILD_FLAG, type=Path, required=True)
    parser.add_argument("--ray-dir", type=Path, required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    run_child(args.clients, args.dims, args.dropout, args.child_out, args.ray_dir, args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
