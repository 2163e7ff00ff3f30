"""What the pipelined-round tests share: a small SecAgg scenario and a round that keeps itself for inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sim.engine.pipelined import PipelinedRound
from sim.scenario import load
from sim.scenario.schema import Scenario

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


class Capture(PipelinedRound):
    """A pipelined round that keeps itself and every client's encoding for inspection (patch it in as
    ``sim.engine.simulation.PipelinedRound``; reset ``rounds`` first)."""

    rounds: ClassVar[list[Capture]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encodings: dict[int, np.ndarray] = {}
        self.sent_at: dict[tuple[int, int], float] = {}
        """(client, chunk) -> when its masked input reached the server (or was given up)."""
        Capture.rounds.append(self)

    def _sent(self, c: int, j: int) -> None:
        self.sent_at.setdefault((c, j), self.env.now)
        super()._sent(c, j)

    def _encode(self, c, update):  # type: ignore[no-untyped-def]
        encoded = super()._encode(c, update)
        self.encodings[c] = np.asarray(encoded)
        return encoded
