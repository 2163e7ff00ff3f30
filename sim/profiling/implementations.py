"""``dropsim profile --impl NAME``: a cost profile of another implementation of the same protocol.

The simulator charges every operation the protocol machines report (:class:`~sim.protocol.machine.Work`,
with their sizes) from a profile. A profile of another implementation times *that implementation's* way of
doing each operation, at the sizes dropsim's machines report, and fits the same linear models: the
simulator then runs dropsim's protocol flow with that implementation's costs and, from its ``wire``
section (:mod:`sim.costs.wire`), its bytes on the wire. docs/profiles.md says what each implementation does
and how far the result is.

- ``dordis``: the primitives of :mod:`sim.costs.dordis_primitives` (P-384, Fernet, GF(2^128) Shamir in
  16-byte blocks, Mersenne Twister masks of Python integers, list arithmetic, 60-bit packing). Needs
  pycryptodome (``pip install -e '.[impl]'``).
- ``flower``: Flower 1.42's own SecAgg+ functions (``flwr.common.secure_aggregation``,
  ``flwr.supercore.primitives``), called as its workflow and mod call them. Needs flwr (``pip install -e
  '.[peer]'``).

Operations that an implementation does as dropsim does (local training in PyTorch, FedAvg, the
fixed-point and DSkellam encodings and noise sampling in numpy, the server's bookkeeping, the deployment's
sockets) are copied from a dropsim profile measured on the same machine (the shipped one by default),
each marked ``"as": "dropsim"``; operations the implementation does not do at all (signatures: neither
Dordis's SecAgg nor Flower's SecAgg+ signs anything) cost 0 and say so.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cryptography
import numpy as np

from sim.costs import dordis_primitives as dordis
from sim.costs.model import DEFAULT_PROFILE, FORMAT, CostModel, read_profile
from sim.profiling.flower_rounds import measure_engine
from sim.profiling.micro import Benchmark, Point, repeat
from sim.protocol.secagg.config import SECRET_ELEMENTS, share_threshold
from sim.protocol.suite import plaintext_bytes
from sim.results.manifest import host, versions
from sim.results.writer import write_json

BITS = 20
"""Bits of a masked value in the timed vector work (the scenarios' ``aggregation.bits``)."""


@dataclass(frozen=True)
class Implementation:
    """An implementation's benchmarks, what it does not do, its wire sizes and its description."""

    name: str
    description: str
    benchmarks: tuple[Benchmark, ...]
    not_done: dict[str, str]
    """Operations it does not perform, and why: charged 0."""
    wire: Callable[[], dict[str, Any]]
    """Its ``wire`` section, measured from its own primitives where they give the size."""
    versions: Callable[[], dict[str, str]]
    engine: Callable[[dict[str, Any], bool, Callable[[str], None]], dict[str, Any]] | None = None
    """Measures its own simulation engine's costs (the profile without them, ``quick``, ``progress``): the
    profile's ``engine`` section (:mod:`sim.costs.engine`), or None: it has none."""


def _counts(quick: bool) -> tuple[int, ...]:
    return (1, 4) if quick else (1, 10, 40)


def _elements(quick: bool) -> tuple[int, ...]:
    return (1_000, 5_000) if quick else (10_000, 100_000, 400_000)


def _holders(quick: bool) -> tuple[int, ...]:
    return (4, 8) if quick else (5, 10, 20, 40, 80)


FEATURES = {
    "x25519.keygen": ("const", "count"),
    "x25519.agree": ("const", "count"),
    "x25519.public": ("const", "count"),
    "aead.seal": ("const", "count", "bytes"),
    "aead.open": ("const", "count", "bytes"),
    "shamir.share": ("const", "pairs", "products"),
    "shamir.reconstruct": ("const", "key_offered", "seed_offered", "key_offered_sq", "seed_offered_sq"),
    "prg.expand": ("const", "elements"),
    "vector.add": ("const", "elements"),
    "encode.fixed_point": ("const", "elements"),
    "decode.fixed_point": ("const", "elements"),
    "wire.encode": ("const", "bytes", "packed"),
    "wire.decode": ("const", "bytes", "packed"),
}
"""The features each operation of another implementation is fitted in: the sizes dropsim's machines report
for it (Shamir in holder-threshold pairs and in the shares a reconstruction is offered, which are what
GF(2^128) block arithmetic costs by)."""


def _benchmarks(points: dict[str, Callable[[bool], Iterator[Point]]]) -> tuple[Benchmark, ...]:
    return tuple(Benchmark(op, FEATURES[op], fn) for op, fn in points.items())


def _offered(k: int, key: bool) -> dict[str, float]:
    """The features a reconstruction from ``k`` offered shares of a mask key (or of a seed) reports: the
    server machine's ``shamir.reconstruct`` (k and k^2, for a key or for a seed)."""
    return {
        "key_offered": k if key else 0,
        "seed_offered": 0 if key else k,
        "key_offered_sq": k * k if key else 0,
        "seed_offered_sq": 0 if key else k * k,
    }


# -- Dordis ----------------------------------------------------------------------------------------------
def _dordis_keygen(quick: bool) -> Iterator[Point]:
    for n in _counts(quick):
        yield Point({"count": n}, repeat(dordis.keygen, n))


def _dordis_agree(quick: bool) -> Iterator[Point]:
    sk, _ = dordis.keygen()
    _, pk = dordis.keygen()
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: dordis.agree(sk, pk), n))


def _dordis_public(quick: bool) -> Iterator[Point]:
    sk, _ = dordis.keygen()
    for n in _counts(quick):
        yield Point({"count": n}, repeat(lambda: dordis.load_private(sk), n))


def _dordis_plaintexts(quick: bool) -> Iterator[tuple[int, int]]:
    """(count, shares) of the share ciphertexts timed: SecAgg's two shares, and with XNoise's seed shares."""
    for shares in (2, 12) if quick else (2, 12, 52):
        for n in _counts(quick):
            yield n, shares


def _dordis_seal(quick: bool) -> Iterator[Point]:
    key = dordis.agree(dordis.keygen()[0], dordis.keygen()[1])
    for n, shares in _dordis_plaintexts(quick):
        plaintext = os.urandom(dordis.plaintext_bytes(shares))
        yield Point({"count": n, "bytes": n * plaintext_bytes(shares)}, repeat(partial(dordis.seal, key, plaintext), n))


def _dordis_open(quick: bool) -> Iterator[Point]:
    key = dordis.agree(dordis.keygen()[0], dordis.keygen()[1])
    for n, shares in _dordis_plaintexts(quick):
        token = dordis.seal(key, os.urandom(dordis.plaintext_bytes(shares)))
        yield Point(
            {"count": n, "bytes": n * plaintext_bytes(shares)}, repeat(partial(dordis.open_sealed, key, token), n)
        )


def _dordis_share(quick: bool) -> Iterator[Point]:
    """A client's sharing: its PEM private key and its self-mask seed, and XNoise's noise seeds."""
    sk_pem, _ = dordis.keygen()
    for holders in _holders(quick):
        t = share_threshold(0.5, holders)
        for seeds in (0, 4) if quick else (0, 10):

            def run(holders: int = holders, t: int = t, seeds: int = seeds) -> None:
                dordis.share(sk_pem, t, holders)
                dordis.share(os.urandom(32), t, holders)
                for _ in range(seeds):
                    dordis.share(os.urandom(32), t, holders)

            secrets = 2 + seeds
            yield Point({"pairs": holders * t, "products": secrets * SECRET_ELEMENTS * holders * t}, run)


def _dordis_reconstruct(quick: bool) -> Iterator[Point]:
    """One secret from every share the server holds: a dropped client's PEM key, or a seed."""
    sk_pem, _ = dordis.keygen()
    for offered in _holders(quick):
        t = share_threshold(0.5, offered)
        for key in (True, False):
            secret = sk_pem if key else os.urandom(32)
            shares = dordis.share(secret, t, offered)
            yield Point({"shares": t, **_offered(offered, key)}, partial(dordis.combine, shares))


def _dordis_vector(quick: bool, make: Callable[[int], Callable[[], object]]) -> Iterator[Point]:
    for n in _elements(quick):
        yield Point({"elements": n}, make(n))


def _dordis_prg(quick: bool) -> Iterator[Point]:
    seed = dordis.agree(dordis.keygen()[0], dordis.keygen()[1])
    yield from _dordis_vector(quick, lambda n: lambda: dordis.expand(seed, n, BITS))


def _dordis_add(quick: bool) -> Iterator[Point]:
    def make(n: int) -> Callable[[], object]:
        rng = random.Random(0)
        x, y = ([rng.getrandbits(BITS) for _ in range(n)] for _ in range(2))
        return lambda: dordis.add(x, y, BITS)

    yield from _dordis_vector(quick, make)


def _dordis_frames(quick: bool, decode: bool) -> Iterator[Point]:
    """A masked vector packed and serialised (``packed`` values), and the float model (``bytes``)."""
    for n in _elements(quick):
        rng = random.Random(n)
        values = [rng.getrandbits(BITS) for _ in range(n)]
        words = dordis.pack(values, BITS)
        data = dordis.serialise(words)
        model = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        flat = model.tobytes()
        masked = {"bytes": float(math.ceil(n * BITS / 8)), "packed": float(n)}  # dropsim's frame bytes
        floats = {"bytes": float(len(flat)), "packed": 0.0}
        if decode:
            yield Point(masked, partial(_unpack_serialised, data, n))
            yield Point(floats, partial(_copy_floats, flat))
        else:
            yield Point(masked, partial(_pack_serialise, values))
            yield Point(floats, model.tobytes)


def _unpack_serialised(data: bytes, n: int) -> list[int]:
    return dordis.unpack(dordis.deserialise(data), BITS, n)


def _pack_serialise(values: list[int]) -> bytes:
    return dordis.serialise(dordis.pack(values, BITS))


def _copy_floats(flat: bytes) -> np.ndarray:
    return np.frombuffer(flat, np.float32).copy()


def _dordis_wire() -> dict[str, Any]:
    sk_pem, pk_pem = dordis.keygen()
    key = dordis.agree(sk_pem, pk_pem)
    two = len(dordis.seal(key, bytes(dordis.plaintext_bytes(2))))
    twelve = len(dordis.seal(key, bytes(dordis.plaintext_bytes(12))))
    rng = random.Random(0)
    words = dordis.pack([rng.getrandbits(BITS) for _ in range(30_000)], BITS)
    return {
        "encoding": (
            "Dordis: a pickled dict per message over socket.io (framing not counted); P-384 public keys as PEM; "
            "Fernet tokens of pickled shares; Shamir shares as pickled lists of (index, 16-byte block); XNoise "
            f"seeds in the clear; masked values packed {dordis.WORD_BITS // BITS} to a {dordis.WORD_BITS}-bit Python "
            "integer (at 20 bits) and pickled; the model as float32"
        ),
        "frame": 0,
        "integer": 2,
        "public_key": len(pk_pem),
        "signature": 0,
        "ciphertext": two,
        "ciphertext_per_share": (twelve - two) / 10,
        "key_share": dordis.pickled_shares_bytes(dordis.blocks(len(sk_pem))),
        "seed_share": dordis.pickled_shares_bytes(dordis.blocks(32)),
        "noise_seed": dordis.pickled_int_bytes((1 << 32) - 1),
        "noise_seed_share": dordis.pickled_shares_bytes(dordis.blocks(32)),
        "vector": 0,
        "word_bits": dordis.WORD_BITS,
        "word": sum(dordis.pickled_int_bytes(w) for w in words) / len(words),
        "packed": True,
        "parameter": 4,
    }


def _dordis_versions() -> dict[str, str]:
    import Crypto  # deferred: optional (the impl extra)

    return {"pycryptodome": Crypto.__version__, "cryptography": cryptography.__version__}


DORDIS = Implementation(
    name="dordis",
    description=(
        "Dordis (EuroSys 2024) as its paper and artifact implement it, re-implemented in "
        "sim/costs/dordis_primitives.py: P-384 ECDH with PEM keys, Fernet, Shamir over GF(2^128) in 16-byte "
        "blocks (pycryptodome) from every share held, masks of Python integers from Mersenne Twister, "
        "list arithmetic, 60-bit packing; no signatures"
    ),
    benchmarks=_benchmarks(
        {
            "x25519.keygen": _dordis_keygen,
            "x25519.agree": _dordis_agree,
            "x25519.public": _dordis_public,
            "aead.seal": _dordis_seal,
            "aead.open": _dordis_open,
            "shamir.share": _dordis_share,
            "shamir.reconstruct": _dordis_reconstruct,
            "prg.expand": _dordis_prg,
            "vector.add": _dordis_add,
            "wire.encode": lambda q: _dordis_frames(q, decode=False),
            "wire.decode": lambda q: _dordis_frames(q, decode=True),
        }
    ),
    not_done={
        "ed25519.sign": "Dordis's SecAgg signs nothing (no signature scheme in its code)",
        "ed25519.verify": "Dordis's SecAgg signs nothing (no signature scheme in its code)",
    },
    wire=_dordis_wire,
    versions=_dordis_versions,
)


# -- Flower ----------------------------------------------------------------------------------------------
def _flwr() -> Any:
    """Flower's SecAgg+ primitives (flwr 1.42), imported on use: the ``peer`` extra."""
    # deferred: optional (the peer extra)
    from flwr.common.secure_aggregation import ndarrays_arithmetic, quantization, secaggplus_utils

    # deferred: optional (the peer extra)
    from flwr.common.secure_aggregation.crypto import shamir, symmetric_encryption
    from flwr.compat.common import parameter  # deferred: optional (the peer extra)
    from flwr.supercore.primitives import asymmetric  # deferred: optional (the peer extra)

    return SimpleNamespace(
        asym=asymmetric,
        sym=symmetric_encryption,
        shamir=shamir,
        utils=secaggplus_utils,
        arith=ndarrays_arithmetic,
        quant=quantization,
        param=parameter,
    )


FLOWER_SEED_SHARE = 4 + 3 * 16
"""Bytes of a Flower share of a 32-byte seed: a 4-byte index and 3 padded 16-byte blocks."""


def _flower_keypair(f: Any) -> tuple[bytes, bytes]:
    sk, pk = f.asym.generate_key_pairs()
    return f.asym.private_key_to_bytes(sk), f.asym.public_key_to_bytes(pk)


def _flower_keygen(quick: bool) -> Iterator[Point]:
    f = _flwr()
    for n in _counts(quick):
        yield Point({"count": n}, repeat(partial(_flower_keypair, f), n))


def _flower_agree_once(f: Any, sk: bytes, pk: bytes) -> bytes:
    """As the mod and the workflow do it: parse both keys from their bytes, then ECDH and HKDF."""
    return bytes(f.sym.generate_shared_key(f.asym.bytes_to_private_key(sk), f.asym.bytes_to_public_key(pk)))


def _flower_agree(quick: bool) -> Iterator[Point]:
    f = _flwr()
    sk, _ = _flower_keypair(f)
    _, pk = _flower_keypair(f)
    for n in _counts(quick):
        yield Point({"count": n}, repeat(partial(_flower_agree_once, f, sk, pk), n))


def _flower_public(quick: bool) -> Iterator[Point]:
    f = _flwr()
    sk, _ = _flower_keypair(f)
    for n in _counts(quick):
        yield Point({"count": n}, repeat(partial(f.asym.bytes_to_private_key, sk), n))


def _flower_plaintext(f: Any) -> bytes:
    sk, _ = _flower_keypair(f)
    b_share = f.shamir.create_shares(os.urandom(32), 2, 3)[0]
    sk_share = f.shamir.create_shares(sk, 2, 3)[0]
    return bytes(f.utils.share_keys_plaintext_concat(1, 2, b_share, sk_share))


def _flower_sealing(quick: bool, open_: bool) -> Iterator[Point]:
    f = _flwr()
    key = _flower_agree_once(f, _flower_keypair(f)[0], _flower_keypair(f)[1])
    plaintext = _flower_plaintext(f)
    token = f.sym.encrypt(key, plaintext)
    for n in _counts(quick):
        run = partial(f.sym.decrypt, key, token) if open_ else partial(f.sym.encrypt, key, plaintext)
        yield Point({"count": n, "bytes": n * plaintext_bytes(2)}, repeat(run, n))


def _flower_share(quick: bool) -> Iterator[Point]:
    """A client's two sharings: its mask seed and its PEM mask private key."""
    f = _flwr()
    sk, _ = _flower_keypair(f)
    for holders in _holders(quick):
        t = share_threshold(0.5, holders)

        def run(holders: int = holders, t: int = t) -> None:
            f.shamir.create_shares(os.urandom(32), t, holders)
            f.shamir.create_shares(sk, t, holders)

        yield Point({"pairs": holders * t, "products": 2 * SECRET_ELEMENTS * holders * t}, run)


def _flower_reconstruct(quick: bool) -> Iterator[Point]:
    """One secret from every share the server holds (the workflow combines all it collected)."""
    f = _flwr()
    sk, _ = _flower_keypair(f)
    for offered in _holders(quick):
        t = share_threshold(0.5, offered)
        for key in (True, False):
            shares = f.shamir.create_shares(sk if key else os.urandom(32), t, offered)
            yield Point({"shares": t, **_offered(offered, key)}, partial(f.shamir.combine_shares, shares))


def _flower_prg(quick: bool) -> Iterator[Point]:
    f = _flwr()
    seed = _flower_agree_once(f, _flower_keypair(f)[0], _flower_keypair(f)[1])
    for n in _elements(quick):
        yield Point({"elements": n}, partial(f.utils.pseudo_rand_gen, seed, 1 << BITS, [(n,)]))


def _flower_add(quick: bool) -> Iterator[Point]:
    """One mask added (``parameters_addition``, int64): the client adds its masks one by one and reduces
    modulo the range once at the end (``secaggplus_mod``), the server sums the masked vectors and reduces
    once (``SecAggPlusWorkflow``), so an addition is what each add costs."""
    f = _flwr()
    rng = np.random.default_rng(0)
    for n in _elements(quick):
        a, b = ([rng.integers(0, 1 << BITS, n, dtype=np.int64)] for _ in range(2))
        yield Point({"elements": n}, partial(f.arith.parameters_addition, a, b))


def _flower_encode(quick: bool) -> Iterator[Point]:
    f = _flwr()
    rng = np.random.default_rng(0)
    for n in _elements(quick):
        x = [rng.standard_normal(n).astype(np.float32)]
        yield Point({"elements": n}, partial(f.quant.quantize, x, 1.0, 1 << (BITS - 4)))


def _flower_decode(quick: bool) -> Iterator[Point]:
    f = _flwr()
    rng = np.random.default_rng(0)
    for n in _elements(quick):
        q = [rng.integers(0, 1 << BITS, n, dtype=np.int64)]
        yield Point({"elements": n}, partial(f.quant.dequantize, q, 1.0, 1 << (BITS - 4)))


def _flower_frames(quick: bool, decode: bool) -> Iterator[Point]:
    """The masked vector as int64 ``.npy`` bytes (``packed`` values at 20 bits), and the float32 model."""
    f = _flwr()
    rng = np.random.default_rng(0)
    for n in _elements(quick):
        masked = rng.integers(0, 1 << BITS, n, dtype=np.int64)
        model = rng.standard_normal(n).astype(np.float32)
        for array, features in (
            (masked, {"bytes": float(math.ceil(n * BITS / 8)), "packed": float(n)}),
            (model, {"bytes": float(4 * n), "packed": 0.0}),
        ):
            data = f.param.ndarray_to_bytes(array)
            run = partial(f.param.bytes_to_ndarray, data) if decode else partial(f.param.ndarray_to_bytes, array)
            yield Point(features, run)


def _flower_wire() -> dict[str, Any]:
    f = _flwr()
    sk, pk = _flower_keypair(f)
    key = _flower_agree_once(f, sk, pk)
    plaintext = _flower_plaintext(f)
    token = f.sym.encrypt(key, plaintext)
    key_share = f.shamir.create_shares(sk, 2, 3)[0]
    seed_share = f.shamir.create_shares(os.urandom(32), 2, 3)[0]
    header = len(f.param.ndarray_to_bytes(np.zeros(1000, np.int64))) - 8000
    return {
        "encoding": (
            "Flower 1.42 SecAgg+: records of a Message (their framing not counted); P-384 public keys as PEM; "
            "Fernet tokens of (src, dst, seed share, key share); Shamir shares as a 4-byte index and 16-byte "
            "blocks; every masked value an int64 in a .npy array; the model as float32 .npy arrays"
        ),
        "frame": 0,
        "integer": 8,
        "public_key": len(pk),
        "signature": 0,
        "ciphertext": len(token),
        "ciphertext_per_share": len(f.sym.encrypt(key, plaintext + bytes(len(seed_share)))) - len(token),
        "key_share": len(key_share),
        "seed_share": len(seed_share),
        "noise_seed": 8,
        "noise_seed_share": len(seed_share),
        "vector": header,
        "word_bits": 64,
        "word": 8,
        "packed": False,
        "parameter": 4,
    }


def _flower_engine(base: dict[str, Any], quick: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """Flower's simulation engine probed in real rounds (Ray in a loopback-only namespace)."""
    return measure_engine(base, quick, progress)


def _flower_versions() -> dict[str, str]:
    import Crypto  # deferred: optional (the impl extra)
    import flwr  # deferred: optional (the peer extra)

    return {"flwr": flwr.__version__, "pycryptodome": Crypto.__version__, "cryptography": cryptography.__version__}


FLOWER = Implementation(
    name="flower",
    description=(
        "Flower 1.42's SecAgg+ (SecAggPlusWorkflow, secaggplus_mod), timed through Flower's own functions: "
        "P-384 ECDH with PEM keys parsed at each use, Fernet, pycryptodome's Shamir over GF(2^128) in 16-byte "
        "blocks from every share collected, masks from numpy's RandomState seeded with a 32-bit fold of the "
        "key, int64 arrays, its own quantisation; no signatures"
    ),
    benchmarks=_benchmarks(
        {
            "x25519.keygen": _flower_keygen,
            "x25519.agree": _flower_agree,
            "x25519.public": _flower_public,
            "aead.seal": lambda q: _flower_sealing(q, open_=False),
            "aead.open": lambda q: _flower_sealing(q, open_=True),
            "shamir.share": _flower_share,
            "shamir.reconstruct": _flower_reconstruct,
            "prg.expand": _flower_prg,
            "vector.add": _flower_add,
            "encode.fixed_point": _flower_encode,
            "decode.fixed_point": _flower_decode,
            "wire.encode": lambda q: _flower_frames(q, decode=False),
            "wire.decode": lambda q: _flower_frames(q, decode=True),
        }
    ),
    not_done={
        "ed25519.sign": "Flower's SecAgg+ signs nothing (sign_message is for node authentication only)",
        "ed25519.verify": "Flower's SecAgg+ signs nothing (sign_message is for node authentication only)",
    },
    wire=_flower_wire,
    versions=_flower_versions,
    engine=_flower_engine,
)

IMPLEMENTATIONS = {impl.name: impl for impl in (DORDIS, FLOWER)}
"""The implementations ``dropsim profile --impl`` can measure."""


def _shown(path: Path) -> str:
    """``path`` as the profile records it: the shipped default by its place in the source tree."""
    return "sim/costs/default.json" if path.resolve() == DEFAULT_PROFILE.resolve() else str(path)


def profile_implementation(
    name: str,
    out: Path,
    base: Path | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure implementation ``name`` on this machine and write its profile to ``out``: its own operations
    timed, the rest copied from the dropsim profile ``base`` (the shipped one by default). Returns it."""
    from sim.profiling.profiler import _measure  # deferred: torch; the dropsim command imports this module at start

    impl = IMPLEMENTATIONS[name]
    base_path = base or DEFAULT_PROFILE
    base_doc = read_profile(base_path)
    CostModel.from_dict(base_doc, str(base_path))  # a usable profile, or a clear error
    say = progress or (lambda _msg: None)
    repeats = 1 if quick else 5
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    operations: dict[str, Any] = {}
    own = {bench.op for bench in impl.benchmarks} | set(impl.not_done)
    for op, entry in base_doc["operations"].items():
        if op.split("@", 1)[0] not in own:
            operations[op] = {**entry, "as": "dropsim"}
    for bench in impl.benchmarks:
        say(bench.op)
        operations[bench.op] = {**_measure(bench, quick, repeats), "as": name}
    for op, why in impl.not_done.items():
        operations[op] = {"coef": {}, "r2": 1.0, "points": 0, "as": name, "not_done": why}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "implementation": {
            "name": name,
            "description": impl.description,
            "measured_by": f"dropsim profile --impl {name}" + (" --quick" if quick else ""),
            "copied_from": f"{_shown(base_path)} (measured {base_doc.get('machine', {}).get('measured_at', '?')})",
        },
        "machine": {
            **host(),
            "measured_at": now,
            "quick": quick,
            "versions": {**versions(), **impl.versions()},
        },
        "operations": operations,
        "wire": impl.wire(),
    }
    if "pipeline" in base_doc:
        doc["pipeline"] = {**base_doc["pipeline"], "as": "dropsim"}
    if impl.engine is not None:
        doc["engine"] = impl.engine(doc, quick, say)
    CostModel.from_dict(doc, str(out))
    write_json(out, doc)
    return doc
