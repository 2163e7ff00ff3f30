"""Named, independent random streams derived from one scenario seed.

Every source of randomness in a run draws from its own stream, made as
``numpy.random.SeedSequence(seed, spawn_key=(STREAM, *context))``. A stream depends only on the
scenario seed, its name and its context (a round, a client), never on how much another stream was used,
so ``timing`` fidelity (which skips training and noise) samples, drops and times exactly the same
clients as ``full`` fidelity.
"""

from __future__ import annotations

import enum

import numpy as np


class Stream(enum.IntEnum):
    """The independent random streams of a run; the values are part of the reproducibility contract."""

    PROFILES = 1
    """Assignment of Zipf compute and bandwidth ranks to clients."""
    SAMPLING = 2
    """Which available clients the server samples each round."""
    DROPOUT = 3
    """Which sampled clients drop, and per-client dropout probabilities."""
    PARTITION = 4
    """Train/test split and the partition of data among clients."""
    MODEL_INIT = 5
    """Initial global model weights."""
    TRAINING = 6
    """Mini-batch order of each client's local training."""
    NOISE = 7
    """Differential-privacy noise."""
    KEYS = 8
    """Key material of the secure-aggregation protocols."""
    SYNTHETIC = 9
    """Procedural data sets."""
    ENCODING = 10
    """Stochastic rounding of the fixed-point encoding."""
    IDENTITY = 11
    """Long-term signing keys of clients (the PKI of the malicious variant)."""
    GRAPH = 12
    """The public SecAgg+ communication graph of each round."""
    ROTATION = 13
    """The public seed of each round's randomised Hadamard rotation (DSkellam)."""
    CFS_PHASE = 14
    """The phase of each party's CFS period in the kernel testbed's model (``sim.engine.host.PartyQuotas``)."""


def seed_sequence(seed: int, stream: Stream, *context: int) -> np.random.SeedSequence:
    """The seed sequence of ``stream`` for ``context`` (e.g. ``(round, client)``) under scenario ``seed``."""
    return np.random.SeedSequence(entropy=seed, spawn_key=(int(stream), *(int(c) for c in context)))


def generator(seed: int, stream: Stream, *context: int) -> np.random.Generator:
    """A PCG64 generator for ``stream`` and ``context`` under scenario ``seed``."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, stream, *context)))


def seed_bytes(seed: int, stream: Stream, *context: int) -> bytes:
    """32 bytes of key material for ``stream`` and ``context`` (seeds a :class:`sim.crypto.randomness.SeededRandom`)."""
    return seed_sequence(seed, stream, *context).generate_state(8, dtype=np.uint32).astype("<u4").tobytes()


def int_seed(seed: int, stream: Stream, *context: int) -> int:
    """A 63-bit integer seed (for torch generators) for ``stream`` and ``context``."""
    return int(seed_sequence(seed, stream, *context).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
