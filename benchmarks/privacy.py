"""Distributed-DP cost under SecAgg: compute and bytes per strategy, measured against the cost model.

One round per strategy (``orig``, ``xnoise``, ``xnoise-appr``, ``rebasing``) through the in-memory driver
(:func:`sim.loopback.run_loopback`, every frame really encoded and decoded, the noise really sampled and
removed) for each number of clients n, model size d and dropout rate (clients leaving before the masked
input; T = n/2). Reports wall-clock seconds inside the machines (client mean, server), what the shipped
cost model charges for the same work (ratio measured / model), bytes a surviving client uploads, and its
extra upload over Orig (Dordis Table 3: XNoise's is seeds, rebasing's is a model-sized vector).

    python benchmarks/privacy.py                          # n in {16, 50}, d in {1e4, 1e5}, dropout {0, 0.2}
    python benchmarks/privacy.py --clients 16 --dims 100000 --csv out.csv
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.model import CostModel
from sim.crypto.randomness import SeededRandom
from sim.dp.accounting import choose_scale
from sim.dp.dskellam import DSkellamEncoding
from sim.dp.strategies import RoundNoise
from sim.loopback import run_loopback
from sim.protocol.params import AggregationParams
from sim.protocol.private import PrivateRound
from sim.protocol.registry import round_machines
from sim.protocol.suite import RealSuite
from sim.round.privacy import padded


def one_round(strategy: str, n: int, d: int, dropout: float, costs: CostModel) -> dict[str, object]:
    sampled = tuple(range(n))
    params = AggregationParams("secagg", bits=20, clip=1.0, threshold=0.5, strategy=strategy)
    plan = RoundNoise(strategy, 0.5, n, n // 2)
    scale = choose_scale(20, 3.0, math.sqrt(n), padded(d), n, float(plan.largest_residual))
    private = PrivateRound(DSkellamEncoding(d, 20, 1.0, scale), bytes(32), "skellam", plan)
    server, factory = round_machines(params, 1, sampled, d, RealSuite(), graph_seed=1, private=private)
    rng = np.random.default_rng(0)
    updates = {c: (rng.standard_normal(d) * 1e-3).astype(np.float32) for c in sampled}
    clients = {c: factory(c, SeededRandom(c.to_bytes(32, "little")), np.random.default_rng(c), None) for c in sampled}
    k = math.floor(dropout * n + 0.5)
    result = run_loopback(server, clients, updates, {c: "masked_input" for c in sampled[:k]})
    if server.outcome != "ok":
        raise RuntimeError(f"{strategy} n={n} d={d}: {server.outcome}")
    alive = [c for c in sampled if c not in result.left]
    measured = float(np.mean([result.client_seconds[c] for c in alive]))
    model = float(np.mean([costs.work_seconds(result.client_work[c]) for c in alive]))
    server_model = costs.work_seconds(result.server_work)
    return {
        "strategy": strategy,
        "clients": n,
        "dim": d,
        "dropout": dropout,
        "removed_components": len(getattr(server, "removed", ())),
        "client_s_mean": measured,
        "server_s": result.server_seconds,
        "client_measured_over_model": measured / model,
        "server_measured_over_model": result.server_seconds / server_model,
        "client_mb_up": float(np.mean([result.bytes_up[c] for c in alive])) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 50])
    parser.add_argument("--dims", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--strategies", nargs="+", default=["orig", "xnoise", "xnoise-appr", "rebasing"])
    parser.add_argument("--csv", type=Path, default=Path("privacy.csv"))
    args = parser.parse_args(argv)
    costs = CostModel.load()
    for strategy in args.strategies:  # warm-up: first calls pay for imports and caches
        one_round(strategy, 8, 4_096, 0.0, costs)
    rows = []
    for n in args.clients:
        for d in args.dims:
            for dropout in args.dropout:
                for strategy in args.strategies:
                    rows.append(one_round(strategy, n, d, dropout, costs))
                    print(f"done: {strategy} n={n} d={d} dropout={dropout}", file=sys.stderr)
    table = pd.DataFrame(rows)
    orig = table[table["strategy"] == "orig"].set_index(["clients", "dim", "dropout"])["client_mb_up"]
    keys = list(zip(table["clients"], table["dim"], table["dropout"], strict=True))
    table["extra_mb_up_vs_orig"] = [
        mb - orig.get(key, math.nan) for mb, key in zip(table["client_mb_up"], keys, strict=True)
    ]
    print(f"# {platform.node()} {platform.processor() or platform.machine()}; cost profile: {costs.source}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    table.to_csv(args.csv, index=False)
    print(f"written: {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
