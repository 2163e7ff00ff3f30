"""Secure aggregation cost: measured compute per client and at the server, bytes, and the cost model.

After a small warm-up round of each protocol (a long simulation runs warm), runs one round of
``plain``, SecAgg and SecAgg+ through the in-memory driver (:func:`sim.loopback.run_loopback`, every
frame really encoded and decoded) for each number of clients n, model size d and dropout rate (clients
leaving before the masked-input upload, the case that makes the server reconstruct keys and recompute
masks). Reports the round's wall-clock seconds (every client in turn in this process, or each step's
clients on ``--workers`` threads), seconds spent inside the machines (client mean and max, server), bytes
per client up and down, and, side by side, what the shipped cost model charges for the same reported
work, with the ratio measured / model (with threads, a client's seconds include waiting for the
interpreter's lock).

    python benchmarks/secagg.py                    # n in {16, 100}, d in {1e5, 1e6}, dropout in {0, 0.1}
    python benchmarks/secagg.py --clients 16 --dims 100000 --csv out.csv
    python benchmarks/secagg.py --workers 2        # each step's clients on 2 threads (same results)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.model import CostModel
from sim.crypto import prg, signatures
from sim.crypto.randomness import SeededRandom
from sim.loopback import ClientSteps, run_loopback
from sim.protocol.machine import Work
from sim.protocol.params import AggregationParams
from sim.protocol.registry import round_machines
from sim.protocol.suite import RealSuite


def _masks(work: list[Work], d: int) -> int:
    """Mask expansions of ``d`` values in ``work`` (its ``prg.expand`` elements over d)."""
    elements = sum(int(w.size.get("elements", 0)) for w in work if w.op == "prg.expand")
    return elements // d if d else 0


def mask_seconds(
    clients_work: list[Work], server_work: list[Work], d: int, bits: int = 20, steps: ClientSteps | None = None
) -> tuple[int, float]:
    """The round's mask expansions (``prg.expand`` work) done alone at memory speed, each into its thread's
    kept buffer (:func:`sim.crypto.prg.expand` with ``scratch``): the clients' dealt out evenly among the
    threads of ``steps`` (the round's own; in turn without), then the server's on this thread, as in the
    round. Returns (masks, seconds)."""
    steps = steps or ClientSteps(1)
    seed = bytes(range(32))
    workers = steps.workers
    barrier = threading.Barrier(workers)

    def warm(_: int, __: None) -> None:  # every thread's buffer made: each waits until all have one
        prg.expand(seed, d, bits, scratch=True)
        if workers > 1:
            barrier.wait(timeout=60)

    def expand(_: int, count: int) -> None:
        for _ in range(count):
            prg.expand(seed, d, bits, scratch=True)

    theirs, ours = _masks(clients_work, d), _masks(server_work, d)
    steps.run(warm, dict.fromkeys(range(workers)), lambda _: None)
    expand(0, 1)
    start = time.perf_counter()
    steps.run(expand, {i: theirs // workers + (i < theirs % workers) for i in range(workers)}, lambda _: None)
    expand(0, ours)
    return theirs + ours, time.perf_counter() - start


def one_round(
    protocol: str,
    n: int,
    d: int,
    dropout: float,
    costs: CostModel,
    malicious: bool = False,
    masks: bool = True,
    workers: int | ClientSteps = 1,
) -> dict[str, object]:
    """One round through the in-memory driver, the clients' calls of each step on ``workers`` threads (or
    those of a :class:`ClientSteps` kept from round to round), and (with ``masks``) its mask expansions
    alone on the same threads (:func:`mask_seconds`)."""
    sampled = tuple(range(n))
    malicious = malicious and protocol != "plain"
    params = AggregationParams(protocol, bits=20, clip=1.0, threshold=0.5, malicious=malicious)
    identities = {c: signatures.generate(SeededRandom((c + 10**6).to_bytes(32, "little"))) for c in sampled}
    verification = {c: ident[1] for c, ident in identities.items()}
    server, factory = round_machines(params, 1, sampled, d, RealSuite(), graph_seed=1, verification_keys=verification)
    rng = np.random.default_rng(0)
    updates = {c: (rng.standard_normal(d) * 1e-3).astype(np.float32) for c in sampled}
    clients = {
        c: factory(c, SeededRandom(c.to_bytes(32, "little")), np.random.default_rng(c), identities[c][0])
        for c in sampled
    }
    leave_step = "upload" if protocol == "plain" else "masked_input"
    k = math.floor(dropout * n + 0.5)
    leave = {c: leave_step for c in sampled[:k]}
    start = time.perf_counter()
    result = run_loopback(server, clients, updates, leave, workers=workers)
    round_s = time.perf_counter() - start
    clients_work = [w for c in sampled for w in result.client_work[c]]
    expanded, masks_s = 0, float("nan")
    if masks:
        with contextlib.nullcontext(workers) if isinstance(workers, ClientSteps) else ClientSteps(workers) as steps:
            expanded, masks_s = mask_seconds(clients_work, result.server_work, d, steps=steps)
    if server.outcome != "ok":
        raise RuntimeError(f"{protocol} n={n} d={d}: {server.outcome}")
    alive = [c for c in sampled if c not in result.left]
    client_model = [costs.work_seconds(result.client_work[c]) for c in alive]
    client_measured = [result.client_seconds[c] for c in alive]
    server_model = costs.work_seconds(result.server_work)
    return {
        "protocol": protocol + (" malicious" if malicious else ""),
        "clients": n,
        "dim": d,
        "dropout": dropout,
        "workers": workers.workers if isinstance(workers, ClientSteps) else workers,
        "round_s": round_s,
        "masks": expanded,
        "masks_s": masks_s,
        "client_s_mean": float(np.mean(client_measured)),
        "client_s_max": float(np.max(client_measured)),
        "server_s": result.server_seconds,
        "client_mb_up": float(np.mean([result.bytes_up[c] for c in alive])) / 1e6,
        "client_mb_down": float(np.mean([result.bytes_down[c] for c in alive])) / 1e6,
        "server_mb_in": sum(result.bytes_up.values()) / 1e6,
        "model_client_s_mean": float(np.mean(client_model)),
        "model_server_s": server_model,
        "client_measured_over_model": float(np.mean(client_measured)) / float(np.mean(client_model)),
        "server_measured_over_model": result.server_seconds / server_model if server_model else math.nan,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 100])
    parser.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--protocols", nargs="+", default=["plain", "secagg", "secagg+"])
    parser.add_argument("--malicious", action="store_true", help="the malicious variant of SecAgg and SecAgg+")
    parser.add_argument("--workers", type=int, default=1, help="threads for each step's clients (run_loopback)")
    parser.add_argument("--csv", type=Path, default=Path("secagg.csv"))
    args = parser.parse_args(argv)
    costs = CostModel.load()
    for protocol in args.protocols:  # warm-up: first calls in a fresh process pay for imports and caches
        one_round(protocol, 8, 10_000, 0.0, costs, workers=args.workers)
    rows = []
    for n in args.clients:
        for d in args.dims:
            for dropout in args.dropout:
                for protocol in args.protocols:
                    rows.append(one_round(protocol, n, d, dropout, costs, args.malicious, workers=args.workers))
                    print(f"done: {protocol} n={n} d={d} dropout={dropout}", file=sys.stderr)
    table = pd.DataFrame(rows)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}; cost profile: {costs.source}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
