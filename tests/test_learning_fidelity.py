"""``fidelity: learning`` against ``full``: the same scenario writes the same tables, byte for byte.

Learning trains, encodes, clips and adds noise for real and sums the survivors' inputs mod 2^bits, but
computes no key, signature, ciphertext, share or mask (:class:`sim.protocol.suite.LearningSuite`). The
masks cancel in the server's sum and the key streams are consumed as ``full`` consumes them, so every
model, epsilon, outcome and virtual time is the same: the cases cover every protocol, every dropout stage
each offers, every privacy strategy the protocols accept, the malicious variant, pipelined rounds and rounds
that abort. A learning run also completes with every cryptographic primitive made to raise.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sim.crypto import aead, agreement, prg, shamir, signatures
from sim.crypto.randomness import SeededRandom
from sim.protocol import wire
from sim.protocol.messages import MaskedInput, RebaseAndUnmask, ShareKeys, UnmaskSharesAndSeeds
from sim.protocol.suite import SHARE_BYTES, SUITES, Carried, LearningSuite, RealSuite, ciphertext_bytes
from sim.runner import run_scenario
from sim.scenario import load
from sim.scenario.errors import ScenarioError
from sim.scenario.types import FIDELITIES

SCENARIO = """
name: learning
seed: 5
rounds: 2
population: 12
sampling: {clients_per_round: 8}
dropout: {rate: 0.25, stage: before_upload}
data: {dataset: synthetic, samples_per_client: 10}
model: {name: linear}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: secagg, bits: 20, threshold: 0.5}
"""

DP = "privacy={{strategy: {}, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.4}}"

CASES: dict[str, tuple[str, ...]] = {
    "fedavg": ("aggregation={protocol: fedavg}", "dropout.stage=after_sampling"),
    "fedavg before_upload": ("aggregation={protocol: fedavg}",),
    "plain": ("aggregation={protocol: plain, bits: 20}",),
    "plain central": ("aggregation={protocol: plain, bits: 20}", DP.format("central")),
    "plain local": ("aggregation={protocol: plain, bits: 20}", DP.format("local")),
    "secagg before_share_keys": ("dropout.stage=before_share_keys",),
    "secagg during_unmasking": ("dropout.stage=during_unmasking",),
    "secagg+ before_upload": ("aggregation={protocol: secagg+, bits: 20}",),
    "secagg+ during_unmasking": ("aggregation={protocol: secagg+, bits: 20}", "dropout.stage=during_unmasking"),
    "orig": (DP.format("orig"),),
    "early": (DP.format("early"),),
    "con": (DP.format("con"),),
    "committee": (DP.format("committee"),),
    "xnoise": (DP.format("xnoise"),),
    "xnoise-appr during_unmasking": (DP.format("xnoise-appr"), "dropout.stage=during_unmasking"),
    "xnoise during_noise_removal": (DP.format("xnoise"), "dropout.stage=during_noise_removal"),
    "rebasing": (DP.format("rebasing"),),
    "malicious xnoise": ("aggregation.adversary=malicious", DP.format("xnoise"), "dropout.stage=during_unmasking"),
    "secagg+ malicious": ("aggregation={protocol: secagg+, bits: 20, adversary: malicious}",),
    "pipelined": ("pipeline={chunks: 2}", "dropout.stage=during_unmasking"),
    "pipelined xnoise": ("pipeline={chunks: 3}", DP.format("xnoise")),
    "calls made ahead": ("aggregation.threads=2", DP.format("xnoise"), "dropout.stage=during_noise_removal"),
    # rounds that abort
    "too few survive": ("dropout.rate=0.75",),
    "rebasing loses a survivor": (DP.format("rebasing"), "dropout.stage=during_unmasking"),
    "xnoise aborts in unmasking": (DP.format("xnoise"), "dropout.stage=during_noise_removal", "dropout.rate=0.5"),
}
"""Each case's ``--set`` overrides of :data:`SCENARIO` (a secagg round with a quarter dropping)."""

ABORTING = ("too few survive", "rebasing loses a survivor", "xnoise aborts in unmasking")

EXERCISED = {
    "xnoise during_noise_removal": ("stages.csv", "stage", "step.noise_removal"),
    "pipelined": ("rounds.csv", "chunks", "2"),
    "pipelined xnoise": ("rounds.csv", "chunks", "3"),
    "early": ("rounds.csv", "outcome", "privacy budget"),
}
"""What a case must show in a table besides its dropout stage (a step reached, its chunks, an outcome)."""

SAME = ("status", "rounds_completed", "model_parameters", "virtual_seconds", "tables_sha256", "cost_profile")
"""Manifest entries the two runs share (the rest records the fidelity, the wall clock and the host)."""


def _run(tmp_path: Path, fidelity: str, overrides: tuple[str, ...]) -> Path:
    path = tmp_path / "learning.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / fidelity
    scenario = load(path, [*overrides, f"fidelity={fidelity}"], output=str(out)).base()
    run_scenario(scenario, out, progress=False)
    return out


def _same_run(tmp_path: Path, overrides: tuple[str, ...]) -> dict[str, Any]:
    """Run ``overrides`` under both fidelities; assert every table and the manifest agree; the manifest."""
    full, learning = (_run(tmp_path, f, overrides) for f in ("full", "learning"))
    files = sorted(p.name for p in full.iterdir())
    assert files == sorted(p.name for p in learning.iterdir())
    for name in files:
        if name != "manifest.json":
            assert (full / name).read_bytes() == (learning / name).read_bytes(), name
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (full, learning))
    assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
    assert b["scenario"]["fidelity"] == "learning"
    return b


@pytest.mark.parametrize("case", list(CASES))
def test_learning_writes_the_tables_of_full(tmp_path: Path, case: str) -> None:
    manifest = _same_run(tmp_path, CASES[case])
    out = tmp_path / "learning"
    rounds = (out / "rounds.csv").read_text()
    stage = next((o.split("=", 1)[1] for o in CASES[case] if o.startswith("dropout.stage=")), "before_upload")
    assert (pd.read_csv(out / "clients.csv")["dropped_stage"] == stage).any()  # somebody dropped there
    if case in EXERCISED:
        table, column, value = EXERCISED[case]
        assert pd.read_csv(out / table)[column].astype(str).str.contains(value).any()
    if case in ABORTING:
        assert "aborted" in rounds  # the case exercises an aborting round
    else:
        assert ",ok," in rounds and manifest["rounds_completed"] == 2


def test_learning_computes_no_cryptography(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every primitive raises: a learning round of the malicious variant with XNoise's noise removal still
    completes (and a full one does not)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("learning fidelity computed cryptography")

    for module, names in (
        (agreement, ("generate", "agree", "public_of")),
        (shamir, ("share", "share_bytes", "reconstruct", "reconstruct_bytes", "decode")),
        (prg, ("expand",)),
        (aead, ("encrypt", "decrypt")),
        (signatures, ("generate", "sign", "verify")),
    ):
        for name in names:
            monkeypatch.setattr(module, name, refuse)
    overrides = ("aggregation.adversary=malicious", DP.format("xnoise"), "dropout.stage=during_noise_removal")
    _run(tmp_path, "learning", overrides)
    assert ",ok," in (tmp_path / "learning" / "rounds.csv").read_text()
    with pytest.raises(AssertionError, match="computed cryptography"):
        _run(tmp_path, "full", overrides)


def test_learning_consumes_the_key_stream_as_full() -> None:
    """After the same calls, both suites' random sources give the same next bytes (the seeds drawn later,
    e.g. rebasing's fresh one, are full's)."""
    streams = []
    for suite in (RealSuite(), LearningSuite()):
        rng = SeededRandom(bytes(range(32)))
        seeds = [suite.seed(rng) for _ in range(2)]
        c_sk, _ = suite.keypair(rng)
        suite.share(c_sk, 3, [0, 1, 2, 3], rng)
        shares = suite.share_many(seeds, 3, [0, 1, 2, 3], rng)
        suite.seal(c_sk, suite.keypair(rng)[1], 1, 0, 1, [shares[1][0], shares[1][1]], rng)
        streams.append((seeds, rng.bytes(64)))
    assert streams[0] == streams[1]


def test_learning_shares_carry_their_secret() -> None:
    suite, rng = LearningSuite(), SeededRandom(bytes(32))
    secrets = [suite.seed(rng) for _ in range(2)]
    table = suite.share_many(secrets, 2, [0, 1, 2], rng)
    assert all(len(s) == SHARE_BYTES for row in table for s in row)
    sealed = suite.seal(b"", b"", 1, 0, 1, [*table[1], *table[1]], rng)
    assert len(sealed) == ciphertext_bytes(4) and isinstance(sealed, Carried)
    opened = suite.open(b"", b"", 1, 0, 1, sealed, 4)
    assert suite.recover([0, 1], [opened.noise[1], table[2][1]], 2).secret == secrets[1]
    assert suite.recover([0], [table[0][0]], 2).secret is None


def test_a_learning_message_is_sized_as_its_real_frame() -> None:
    """Real vectors beside stand-ins: ``wire_size`` is the encoded frame's length of the real message."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 1 << 20, 37, dtype=np.uint32)
    share, real_share = Carried(SHARE_BYTES, b"s" * 32), b"\x01" * SHARE_BYTES
    sealed, real_sealed = Carried(ciphertext_bytes(3), ()), b"\x02" * ciphertext_bytes(3)
    pairs = [
        (MaskedInput(1, 2, wire.ModVector(20, y)), MaskedInput(1, 2, wire.ModVector(20, y))),
        (ShareKeys(1, 2, ((3, sealed), (4, sealed))), ShareKeys(1, 2, ((3, real_sealed), (4, real_sealed)))),
        (
            UnmaskSharesAndSeeds(1, 2, ((3, 0, share),), ((1, b"g" * 32),)),
            UnmaskSharesAndSeeds(1, 2, ((3, 0, real_share),), ((1, b"g" * 32),)),
        ),
        (
            RebaseAndUnmask(1, 2, ((3, 0, share),), wire.ModVector(20, y)),
            RebaseAndUnmask(1, 2, ((3, 0, real_share),), wire.ModVector(20, y)),
        ),
    ]
    for learning, real in pairs:
        assert learning.wire_size() == len(real.encode())


def test_fidelity_learning_is_parsed_and_the_abstract_model_stays_timing_only(tmp_path: Path) -> None:
    assert set(SUITES) == set(FIDELITIES)  # every fidelity builds its machines with a suite
    path = tmp_path / "learning.yaml"
    path.write_text(SCENARIO)
    assert load(path, ["fidelity=learning"]).base().fidelity == "learning"
    with pytest.raises(ScenarioError, match="fidelity: timing"):
        load(path, ["fidelity=learning", "model={params: 1000}"]).base()
