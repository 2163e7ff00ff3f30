"""What the pipelined-round tests share: a small SecAgg scenario and a round that keeps itself for inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sim.engine.pipelined import ChunkedInstances
from sim.engine.virtual_round import Round
from sim.scenario import load
from sim.scenario.types import Scenario

SCENARIO = """
name: pipe
seed: 5
rounds: 2
population: 30
sampling: {clients_per_round: 8}
clients:
  compute: {zipf_a: 1.2, slowdown: [1.0, 4.0]}
  bandwidth_mbps: {zipf_a: 1.2, range: [21, 210]}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: digits, partition: {dirichlet: 1.0}}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: secagg, bits: 20, clip: 2.0}
"""


def scenario(tmp_path: Path, *overrides: str) -> Scenario:
    path = tmp_path / "pipe.yaml"
    path.write_text(SCENARIO)
    return load(path, list(overrides), output=str(tmp_path / "out")).base()


class Captured:
    """A pipelined round under observation: the round (:class:`~sim.engine.virtual_round.Round`) and its pipeline,
    with every client's encoding and when each masked input reached the server (or was given up)."""

    def __init__(self, rnd: Round) -> None:
        assert isinstance(rnd.shape, ChunkedInstances), "a pipelined round"
        self.round, self.pipeline = rnd, rnd.shape
        self.encodings: dict[int, np.ndarray] = {}
        self.sent_at: dict[tuple[int, int], float] = {}
        """(client, chunk) -> when its masked input reached the server (or was given up)."""
        pipe, sent, encode = rnd.shape, rnd.shape._sent, rnd.shape._encode

        def _sent(c: int, j: int) -> None:
            self.sent_at.setdefault((c, j), rnd.env.now)
            sent(c, j)

        def _encode(c: int, update: Any) -> Any:
            encoded = encode(c, update)
            self.encodings[c] = np.asarray(encoded)
            return encoded

        pipe._sent = _sent  # type: ignore[method-assign]
        pipe._encode = _encode  # type: ignore[method-assign]

    def __getattr__(self, name: str) -> Any:
        """The round's attributes, then its pipeline's (``results``, ``cpu_gate``, ``failed``, ...)."""
        if hasattr(self.round, name):
            return getattr(self.round, name)
        return getattr(self.pipeline, name)

    @property
    def chunk_machines(self) -> dict[tuple[int, int], Any]:
        return self.round.client_machines

    @property
    def late(self) -> set[int]:
        return self.round.roster.late


class Capture:
    """Keeps every pipelined round it observes (``Simulation(scenario, observe=Capture.observe)``; reset
    ``rounds`` first)."""

    rounds: ClassVar[list[Captured]] = []

    @classmethod
    def observe(cls, rnd: Round) -> None:
        cls.rounds.append(Captured(rnd))
