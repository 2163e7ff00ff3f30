"""Named cost profiles, other implementations' wire sizes, and the Dordis profile: its primitives do what
Dordis's do, it is measured by `dropsim profile --impl dordis`, and it charges every operation its
protocols need."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.costs import dordis_primitives as d
from sim.costs.model import DEFAULT_PROFILE, PROFILES, CostModel, CostModelError, resolve_profile
from sim.costs.wire import WireSizes, WireSizesError
from sim.crypto.randomness import SeededRandom
from sim.protocol import messages as m
from sim.protocol.fedavg import ClientUpdate
from sim.protocol.secagg.spec import OPERATIONS
from sim.protocol.suite import ciphertext_bytes
from sim.protocol.wire import Blank, ModVector, Opaque
from sim.runner import run_scenario
from sim.scenario import load

ZERO = {
    "encoding": "test",
    "frame": 0,
    "integer": 0,
    "public_key": 0,
    "signature": 0,
    "ciphertext": 0,
    "ciphertext_per_share": 0,
    "key_share": 0,
    "seed_share": 0,
    "noise_seed": 0,
    "noise_seed_share": 0,
    "vector": 0,
    "word_bits": 64,
    "word": 0,
    "packed": False,
    "parameter": 0,
}


def sizes(**changes: object) -> WireSizes:
    return WireSizes.from_dict({**ZERO, **changes}, "test")


# -- named profiles --------------------------------------------------------------------------------------
def test_names_resolve_to_the_shipped_profiles_and_anything_else_is_a_path():
    assert resolve_profile(None) == DEFAULT_PROFILE
    assert resolve_profile("dropsim") == DEFAULT_PROFILE
    assert resolve_profile("dordis") == PROFILES["dordis"]
    assert resolve_profile("./dordis") == Path("./dordis")
    assert CostModel.load("dropsim").implementation["name"] == "dropsim"  # a profile that states none
    assert CostModel.load("dordis").implementation["name"] == "dordis"
    assert CostModel.load("flower").implementation["name"] == "flower"
    assert set(PROFILES) == {"dropsim", "flower", "dordis"}
    assert CostModel.load().wire is None


def test_every_shipped_profile_charges_every_operation_of_the_protocols():
    for name in PROFILES:
        costs = CostModel.load(name)
        for op in OPERATIONS:
            assert costs.has(op), (name, op)
        assert costs.implementation["measured_by"].startswith("dropsim profile")


def test_the_shipped_flower_profile_was_measured_on_flower_1_42():
    doc = json.loads(PROFILES["flower"].read_text())
    assert doc["machine"]["versions"]["flwr"] == "1.42.0"
    assert doc["implementation"]["measured_by"] == "dropsim profile --impl flower"
    wire = CostModel.load("flower").wire
    assert wire is not None and (wire.word, wire.packed, wire.public_key, wire.ciphertext) == (8, False, 215, 612)
    # numpy's Mersenne Twister into int64: dearer than dropsim's AES-CTR keystream into uint32, and far
    # cheaper than Dordis's Python integers
    mask = {name: CostModel.load(name).seconds("prg.expand", {"elements": 1e6}) for name in PROFILES}
    assert mask["dropsim"] < mask["flower"] < mask["dordis"] / 50


def test_the_dordis_profile_times_dordis_and_copies_the_rest():
    doc = json.loads(PROFILES["dordis"].read_text())
    own = {op for op, e in doc["operations"].items() if e["as"] == "dordis"}
    assert own == {
        "x25519.keygen",
        "x25519.agree",
        "x25519.public",
        "aead.seal",
        "aead.open",
        "shamir.share",
        "shamir.reconstruct",
        "prg.expand",
        "vector.add",
        "wire.encode",
        "wire.decode",
        "ed25519.sign",
        "ed25519.verify",
    }
    assert (
        doc["operations"]["ed25519.sign"]["coef"] == {}
        and "signs nothing" in doc["operations"]["ed25519.sign"]["not_done"]
    )
    default = json.loads(DEFAULT_PROFILE.read_text())["operations"]
    for op, entry in doc["operations"].items():
        if entry["as"] == "dropsim":
            assert entry["coef"] == default[op]["coef"], op
    assert doc["implementation"]["copied_from"].startswith("sim/costs/default.json")
    costs = CostModel.load("dordis")
    # Python integers element by element: far dearer than dropsim's AES-CTR keystream
    assert costs.seconds("prg.expand", {"elements": 1e6}) > 20 * CostModel.load().seconds(
        "prg.expand", {"elements": 1e6}
    )


def test_a_profile_with_a_bad_implementation_or_wire_section_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": 1, "operations": {}, "implementation": ["x"]}))
    with pytest.raises(CostModelError, match="'implementation' must be a mapping of strings"):
        CostModel.load(path)
    path.write_text(json.dumps({"format": 1, "operations": {}, "wire": {**ZERO, "word": -1}}))
    with pytest.raises(WireSizesError, match=r"wire.word is -1; it must be a number of bytes >= 0"):
        CostModel.load(path)
    path.write_text(json.dumps({"format": 1, "operations": {}, "wire": {**ZERO, "extra": 1}}))
    with pytest.raises(WireSizesError, match=r"unknown keys \['extra'\]"):
        CostModel.load(path)
    lacking = {k: v for k, v in ZERO.items() if k != "frame"}
    path.write_text(json.dumps({"format": 1, "operations": {}, "wire": lacking}))
    with pytest.raises(WireSizesError, match=r"lacks \['frame'\]"):
        CostModel.load(path)


# -- wire sizes ------------------------------------------------------------------------------------------
def test_vectors_are_sized_by_words_packed_or_one_value_a_word():
    y = ModVector(20, Blank(1000, np.uint32))
    packed = sizes(frame=5, vector=3, word_bits=60, word=10, packed=True)
    assert packed.size(m.MaskedInput(1, 2, y)) == 5 + 3 + math.ceil(1000 / 3) * 10
    int64 = sizes(frame=100, vector=128, word=8)
    assert int64.size(m.MaskedInput(1, 2, y)) == 100 + 128 + 8000
    assert int64.size(m.ModelDownload(1, Blank(1000, np.float32))) == 100 + 128  # parameter 0
    assert sizes(parameter=4).size(m.ModelDownload(1, Blank(1000, np.float32))) == 4000
    assert sizes(integer=8, parameter=4).size(ClientUpdate(1, 2, 10.0, Blank(1000, np.float32))) == 8 + 4000


def test_keys_ciphertexts_and_shares_are_sized_as_declared():
    w = sizes(integer=2, public_key=215, ciphertext=868, ciphertext_per_share=120, key_share=476, seed_share=85)
    assert w.size(m.AdvertiseKeys(1, 0, Opaque(32), Opaque(32), b"")) == 430
    two, twelve = Opaque(ciphertext_bytes(2)), Opaque(ciphertext_bytes(12))
    assert w.size(m.ShareKeys(1, 0, ((1, two), (2, twelve)))) == (2 + 868) + (2 + 868 + 10 * 120)
    shares = ((1, m.SHARE_OF_KEY, Opaque(40)), (2, m.SHARE_OF_SEED, Opaque(40)), (3, m.SHARE_OF_SEED, Opaque(40)))
    assert w.size(m.UnmaskShares(1, 0, shares)) == (2 + 476) + 2 * (2 + 85)
    seeds = sizes(integer=2, noise_seed=7).size(m.UnmaskSharesAndSeeds(1, 0, (), ((1, Opaque(32)), (2, Opaque(32)))))
    assert seeds == 2 * (2 + 7)
    assert w.size(m.KeyList(1, ((0, Opaque(32), Opaque(32), b""), (1, Opaque(32), Opaque(32), b"")))) == 2 * 432


def test_a_message_the_implementation_does_not_send_is_a_clear_error():
    class Other(m.Survivors):
        pass

    with pytest.raises(WireSizesError, match="do not cover Other messages"):
        sizes().size(Other(1, (1, 2)))


SCENARIO = """
name: wire
seed: 3
rounds: 1
population: 12
sampling: {clients_per_round: 6}
dropout: {rate: 0.0}
data: {dataset: digits, partition: {dirichlet: 1.0}}
model: {name: mlp}
training: {local_epochs: 1, batch_size: 10}
aggregation: {protocol: secagg, bits: 20, clip: 2.0}
"""


def test_a_simulated_round_sends_the_profiles_bytes(tmp_path):
    doc = json.loads(DEFAULT_PROFILE.read_text())
    doc["wire"] = {**ZERO, "frame": 1, "public_key": 100, "word_bits": 60, "word": 10, "packed": True}
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(doc))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    run_scenario(load(scenario, [f"costs.profile={profile}"], output=str(out)).base(), out, progress=False)
    dim = json.loads((out / "manifest.json").read_text())["model_parameters"]
    clients = pd.read_csv(out / "clients.csv")
    # four messages up (keys, shares, masked input, unmasking shares): their frames, two keys, the packed words
    assert set(clients["bytes_up"]) == {4 + 2 * 100 + math.ceil(dim / 3) * 10}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cost_profile"]["implementation"] == {
        "name": "dropsim",
        "description": CostModel.load().implementation["description"],
        "measured_by": "dropsim profile",
    }


@pytest.mark.parametrize(
    "overrides",
    [
        ["aggregation.protocol=secagg"],
        ["aggregation.protocol=secagg+", "dropout.rate=0.3", "dropout.stage=during_unmasking"],
        ["privacy={strategy: xnoise, epsilon: 6, delta: 0.01, clip: 2.0, tolerance: 0.5}", "dropout.rate=0.3"],
        ["aggregation.protocol=fedavg"],
    ],
)
def test_the_dordis_profile_runs_every_protocol(tmp_path, overrides):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    outs = {}
    for profile in ("dropsim", "dordis"):
        out = outs[profile] = tmp_path / profile
        run_scenario(
            load(scenario, [*overrides, f"costs.profile={profile}"], output=str(out)).base(), out, progress=False
        )
    mine, theirs = (pd.read_csv(outs[p] / "rounds.csv").iloc[0] for p in ("dropsim", "dordis"))
    assert mine["model_sha256"] == theirs["model_sha256"]  # the same protocol, only its costs differ
    assert theirs["agg_time"] > mine["agg_time"]
    if "aggregation.protocol=fedavg" in overrides:  # one float delta: 4 bytes a value, its weight, no framing
        dim = json.loads((outs["dordis"] / "manifest.json").read_text())["model_parameters"]
        assert theirs["client_bytes_up_mean"] == 2 + 4 * dim
    else:  # masked values at 3.3 bytes, not 2.5
        assert theirs["client_bytes_up_mean"] > mine["client_bytes_up_mean"]


# -- Dordis's primitives ---------------------------------------------------------------------------------
def test_dordis_key_agreement_is_symmetric_and_gives_a_fernet_key():
    (sk_a, pk_a), (sk_b, pk_b) = d.keygen(), d.keygen()
    assert (len(sk_a), len(pk_a)) == (306, 215)
    key = d.agree(sk_a, pk_b)
    assert key == d.agree(sk_b, pk_a) and len(key) == 44
    token = d.seal(key, bytes(d.plaintext_bytes(2)))
    assert len(token) == 868 and d.open_sealed(key, token) == bytes(590)
    assert len(d.seal(key, bytes(d.plaintext_bytes(10)))) == 1828
    assert d.load_private(sk_a) == pk_a


def test_dordis_shamir_splits_blocks_and_combines_from_any_threshold_of_shares():
    sk, _ = d.keygen()
    shares = d.share(sk, 3, 6)
    assert len(shares) == 6 and all(len(s) == d.blocks(306) == 20 for s in shares)
    assert d.combine(shares) == sk and d.combine(shares[2:5]) == sk
    assert d.combine(d.share(bytes(range(32)), 2, 3)[1:]) == bytes(range(32))


def test_dordis_masks_are_mersenne_twister_integers_and_packing_round_trips():
    mask = d.expand(b"k" * 44, 1000, 20)
    assert mask == d.expand(b"k" * 44, 1000, 20) and max(mask) < 1 << 20
    values = [int(x) for x in np.random.default_rng(0).integers(0, 1 << 20, 1001)]
    words = d.pack(values, 20)
    assert len(words) == 334 and words[0] == (values[0] << 40) | (values[1] << 20) | values[2]
    assert d.unpack(d.deserialise(d.serialise(words)), 20, 1001) == values
    assert d.add([1 << 19, 3], [1 << 19, 4], 20) == [0, 7]


@pytest.mark.parametrize("value", [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**59 + 5, 2**60 - 1])
def test_pickled_sizes_are_those_pickle_writes(value):
    # pickle.dumps only measures the layout the sizes claim; nothing is ever unpickled
    assert d.pickled_int_bytes(value) == len(pickle.dumps(value, protocol=2)) - 3  # less PROTO and STOP
    rng = SeededRandom(bytes(32))
    for blocks in (3, 20):
        shares = [(i + 1, rng.bytes(16)) for i in range(blocks)]
        assert d.pickled_shares_bytes(blocks) == len(pickle.dumps(shares, protocol=4))


# -- Flower's functions ----------------------------------------------------------------------------------
def test_the_flower_profile_times_flowers_own_functions(tmp_path):
    pytest.importorskip("flwr", reason="the peer extra: pip install -e '.[peer]'")
    import shutil
    import subprocess

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], check=False).returncode:
        pytest.skip("the engine's probe runs Flower's rounds in a network namespace (unshare)")
    from sim.profiling.implementations import profile_implementation

    doc = profile_implementation("flower", tmp_path / "flower.json", quick=True)
    own = {op for op, e in doc["operations"].items() if e["as"] == "flower"}
    assert {"x25519.agree", "shamir.reconstruct", "prg.expand", "wire.encode", "encode.fixed_point"} <= own
    assert doc["machine"]["versions"]["flwr"] == "1.42.0"
    wire = doc["wire"]
    assert (wire["public_key"], wire["ciphertext"], wire["seed_share"], wire["key_share"]) == (215, 612, 52, 324)
    assert (wire["vector"], wire["word"], wire["packed"]) == (128, 8, False)
    engine = CostModel.load(tmp_path / "flower.json").engine  # probed in one real round (quick)
    assert engine is not None and engine.message_const_s > 0 and engine.client_scale > 0
    assert [(r["clients"], r["dim"]) for r in doc["engine"]["rounds"]] == [(15, 20_000)]


def test_profile_impl_without_its_extra_says_what_to_install(tmp_path, monkeypatch, capsys):
    import builtins

    from sim.cli.main import main

    real_import = builtins.__import__

    def no_flwr(name: str, *args: object, **kwargs: object) -> object:
        if name == "flwr" or name.startswith("flwr."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="flwr")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flwr)
    assert main(["profile", "--impl", "flower", "--quick", "--out", str(tmp_path / "f.json")]) == 2
    assert "--impl flower needs flwr: pip install -e '.[peer]'" in capsys.readouterr().err
    assert not (tmp_path / "f.json").exists()


def test_a_one_host_testbed_with_another_machines_profile_is_pointed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.preflight as preflight
    from sim.scenario import load

    root = Path(__file__).resolve().parent.parent
    flower = load(root / "scenarios" / "flower.yaml").base()
    kernel = load(root / "scenarios" / "deploy.yaml", ["testbed.emulation=kernel"]).base()
    process = load(root / "scenarios" / "deploy.yaml").base()
    profile = json.loads((root / "sim" / "costs" / "flower.json").read_text())["machine"]
    monkeypatch.setattr(preflight, "host", lambda: {"processor": profile["processor"], "cpus": profile["cpus"]})
    assert preflight.measured_elsewhere(flower) == ""  # the machine it was measured on
    monkeypatch.setattr(preflight, "host", lambda: {"processor": "Another CPU", "cpus": 16})
    note = preflight.measured_elsewhere(flower)
    assert note.startswith(f"was measured on a 2-core {profile['processor']}, not this host (a 16-core Another CPU)")
    assert "dropsim profile --impl flower --out here.json" in note
    assert "dropsim calibrate --host --out host.json" in preflight.measured_elsewhere(kernel)
    assert preflight.measured_elsewhere(process) == ""  # the process testbed scales its profile (cpu_scale)
    assert any(w.key == "costs.profile" and w.message == note for w in preflight.warnings(flower))
