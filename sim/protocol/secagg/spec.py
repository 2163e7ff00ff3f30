"""SecAgg's and SecAgg+'s registry entries (:data:`SECAGG`, :data:`SECAGG_PLUS`): steps, dropout stages, cost
operations, pipeline shape, machines, thresholds and their scenario checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from sim.protocol import graph
from sim.protocol.collusion import (
    largest_safe_collusion,
    smallest_safe_fraction,
    smallest_safe_threshold,
    split_view_possible,
)
from sim.protocol.machine import ServerMachine
from sim.protocol.messages import MaskedInput
from sim.protocol.secagg.client import SecAggClient
from sim.protocol.secagg.config import SecAggConfig, share_threshold
from sim.protocol.secagg.server import ENDED, SecAggServer, Step
from sim.protocol.spec import (
    DP_OPERATIONS,
    ENCODED_OPERATIONS,
    MALICIOUS,
    REMOVES_NOISE,
    ClientFactory,
    Fail,
    InstanceRequest,
    PipelineShape,
    ProtocolSpec,
    fixed_point,
)

if TYPE_CHECKING:
    from sim.protocol.params import AggregationParams

STEPS = tuple(step.value for step in Step if step not in ENDED)
"""The server's collection steps in order, optional ones included: its states before the round's end."""
DROPOUT_STAGES = {
    "before_share_keys": "share_keys",
    "before_upload": "masked_input",
    "during_unmasking": "unmasking",
    # XNoise's survivors send their excess seeds with their unmasking shares (Dordis Figure 5, stage 4): a
    # survivor dropping during noise removal leaves there, and its seeds are recovered from shares (stage 5).
    "during_noise_removal": "unmasking",
}
OPERATIONS = (
    *ENCODED_OPERATIONS,
    *DP_OPERATIONS,
    "x25519.keygen",
    "x25519.agree",
    "x25519.public",
    "ed25519.sign",
    "ed25519.verify",
    "aead.seal",
    "aead.open",
    "shamir.share",
    "shamir.reconstruct",
    "prg.expand",
    "secagg.entries",
)


class SecAggSpec(ProtocolSpec):
    """SecAgg on the complete graph, or SecAgg+ on a sparse one (``sparse_graph``)."""

    def _degree(self, params: AggregationParams, n: int) -> int:
        return graph.auto_degree(n) if params.neighbours is None else params.neighbours

    def holders(self, params: AggregationParams, n: int) -> int:
        """Everyone for SecAgg; the client and its neighbours (the degree rounded up to even, as
        :meth:`neighbourhoods` does) for SecAgg+."""
        if not self.sparse_graph:
            return n
        degree = self._degree(params, n)
        return min(n, degree + degree % 2 + 1)

    def threshold(self, params: AggregationParams, n: int) -> int:
        """SecAgg's t, or SecAgg+'s per neighbourhood."""
        if n < 1:
            return n
        return share_threshold(params.threshold, self.holders(params, n))

    def neighbourhoods(
        self, params: AggregationParams, sampled: tuple[int, ...], graph_seed: int
    ) -> dict[int, tuple[int, ...]]:
        """Complete for SecAgg, a Harary graph for SecAgg+."""
        if not self.sparse_graph:
            return graph.complete(sampled)
        degree = self._degree(params, len(sampled))
        if degree < len(sampled) - 1 and degree % 2:
            degree += 1  # the ring graph needs an even degree
        return graph.harary(sampled, degree, graph_seed)

    def machines(self, request: InstanceRequest) -> tuple[ServerMachine, ClientFactory]:
        r, params, chunk, private = request, request.params, request.chunk, request.private
        encoding = fixed_point(params, len(r.sampled))
        if chunk is not None and private is not None:
            private = private.chunk(chunk.start, chunk.stop)
        config = SecAggConfig(
            round=r.round,
            sampled=r.sampled,
            dim=chunk.length if chunk is not None else r.dim if private is None else private.length,
            encoding=encoding,
            neighbours=self.neighbourhoods(params, r.sampled, r.graph_seed),
            threshold_fraction=params.threshold,
            malicious=params.malicious,
            collusion=params.collusion,
            verification_keys=dict(r.verification_keys or {}),
            private=private,
            chunk=chunk.index if chunk is not None else 0,
            chunks=chunk.count if chunk is not None else 1,
            prepared=chunk is not None,
            context=r.context,
        )
        suite = r.suite
        return SecAggServer(config, suite), lambda c, rng, enc, sig: SecAggClient(config, c, suite, rng, enc, sig)

    def check_aggregation(
        self, params: AggregationParams, clients: int | None, registered: Mapping[str, ProtocolSpec], fail: Fail
    ) -> None:
        super().check_aggregation(params, clients, registered, fail)
        threshold, neighbours, k = params.threshold, params.neighbours, clients
        if threshold is not None and k is not None and k > 1:
            # Each secret is shared among the client and its neighbours; a threshold of 1 hands it out whole.
            complete = not self.sparse_graph or (neighbours is None and graph.auto_degree(k) >= k - 1)
            degree = k - 1 if complete else None
            holders = 1 + (degree if degree is not None else min(k - 1, neighbours or graph.auto_degree(k)))
            if math.floor(threshold * holders) + 1 < 2:
                fail(
                    "threshold",
                    f"is {threshold}: with {holders} holders per secret the reconstruction threshold would be 1, "
                    f"so every share would be the secret itself; use at least {1 / holders:.3g}",
                )

    def check_collusion(
        self,
        params: AggregationParams,
        collusion: int,
        private: bool,
        clients: int | None,
        rate: float | None,
        population: int | None,
        fail: Fail,
    ) -> None:
        if params.malicious and collusion:
            self._check_consistency(params, collusion, clients, rate, population, fail)
        if private and clients is not None and collusion:
            t = self.threshold(params, clients)
            if collusion >= t:
                fail(
                    "collusion",
                    f"is {collusion}, not below the reconstruction threshold t = {t} of {clients} sampled clients "
                    f"({self.name}); lower it or raise aggregation.threshold",
                )

    def _check_consistency(
        self,
        params: AggregationParams,
        colluders: int,
        clients: int | None,
        rate: float | None,
        population: int | None,
        fail: Fail,
    ) -> None:
        """The malicious variant's consistency check must withstand ``colluders`` signing two survivor sets:
        t > (holders + colluding holders) / 2 per secret (:mod:`sim.protocol.collusion`). Under Poisson
        sampling this checks the nominal round of round(rate population) clients; each round is checked again
        as its machines are built, and one whose size makes it unsafe aborts."""
        k = clients
        sampled = f"{k} sampled clients"
        if k is None:
            if rate is None or population is None:
                return
            k = max(1, round(rate * population))
            sampled = f"a nominal {k} sampled clients at Poisson rate {rate}"
        n = self.holders(params, k)
        t = self.threshold(params, k)
        if not split_view_possible(t, n, colluders):
            return
        where = sampled if n == k else f"{n} per neighbourhood of {sampled}"
        fix = f"raise aggregation.threshold to at least {smallest_safe_fraction(n, colluders)} (t = "
        fix += f"{smallest_safe_threshold(n, colluders)})"
        most = largest_safe_collusion(t, n)
        if most is not None and most >= 0:
            fix += f", or lower privacy.collusion to at most {most}"
        fail(
            "collusion",
            f"is {colluders} with aggregation.adversary: malicious and aggregation.threshold: {params.threshold}, "
            f"whose t = {t} of the {n} holders of each secret ({self.name}, {where}) is too low: a server "
            f"with {colluders} colluding client{'s' if colluders != 1 else ''} could show two camps of honest "
            "holders different survivor sets, each confirmed by t holders, and recover a client's input from one "
            "camp's shares of its seed and the other's of its key (the consistency check needs 2t > holders + "
            "colluding holders, docs/protocols.md); " + fix,
        )


SECAGG = SecAggSpec(
    "secagg",
    STEPS,
    DROPOUT_STAGES,
    optional_steps={"consistency_check": MALICIOUS, "noise_removal": REMOVES_NOISE},
    optional_stages={"during_noise_removal": REMOVES_NOISE},
    secure=True,
    operations=OPERATIONS,
    pipeline=PipelineShape(first_step="advertise_keys", upload=MaskedInput, aggregate_from="masked_input"),
)
SECAGG_PLUS = replace(SECAGG, name="secagg+", sparse_graph=True)
