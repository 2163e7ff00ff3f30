"""The simulator's overhead: wall time of full-fidelity rounds against their primitive work timed alone.

A full-fidelity run (real training, real secure aggregation, real noise) is stepped round by round, timed
without instrumentation. The same rounds (same seeds; the final models are checked equal) are run again
while every call of a primitive is recorded with its arguments: X25519 key generation and agreement, Ed25519
signing and verification, AES-GCM sealing and opening, PRG mask expansion, Shamir sharing and
reconstruction, noise sampling, the fixed-point and DSkellam encodings, modular sums, frame encoding and
decoding, local training and the test-set evaluation. Only outermost calls are recorded (a primitive that
calls another counts once). After the run, the recorded calls are replayed alone, back to back, each
timed on its own; their sum is the work the rounds needed. The timed run and the replay are each
repeated (``--repeats``, default 2) and the fastest taken: on a shared machine, other tenants only ever
add time. The overhead is

    wall seconds of the rounds / replayed primitive seconds - 1,

what the SimPy engine, the protocol state machines, the network and compute model and the bookkeeping
add. The target is at most 15 %. ``outside_s`` is the same difference measured directly, within the
recorded run: its wall seconds not spent inside any primitive. ``overhead_in_run`` is ``outside_s`` over
the uninstrumented wall time less ``outside_s``: it does not depend on the replay, whose memory state
differs (it runs while the recording holds every argument, which slows large-array work such as noise
sampling), and it counts the engine's time as the instrumented run measured it.

Wall time covers ``Simulation.step`` only (not loading data, building the model or writing tables), after
one warm-up round (a long run is warm: the first round loads torch's optimiser machinery, about a second).

    python benchmarks/overhead.py                       # scenarios/privacy.yaml (XNoise, SecAgg) and SecAgg+
    python benchmarks/overhead.py --rounds 3 --set sampling.clients_per_round=32 --csv overhead.csv
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]

PRIMITIVES: tuple[tuple[str, str, str], ...] = (
    # (module, attribute, the name it is reported under)
    ("sim.crypto.agreement", "generate", "x25519.keygen"),
    ("sim.crypto.agreement", "agree", "x25519.agree"),
    ("sim.crypto.agreement", "public_of", "x25519.public"),
    ("sim.crypto.signatures", "sign", "ed25519.sign"),
    ("sim.crypto.signatures", "verify", "ed25519.verify"),
    ("sim.crypto.aead", "encrypt", "aead.seal"),
    ("sim.crypto.aead", "decrypt", "aead.open"),
    ("sim.crypto.prg", "expand", "prg.expand"),
    ("sim.crypto.shamir", "share", "shamir.share"),
    ("sim.crypto.shamir", "reconstruct", "shamir.reconstruct"),
    ("sim.dp.noise", "sample", "noise"),
    ("sim.dp.noise", "total", "noise"),
    ("sim.protocol.encoding:FixedPoint", "encode", "encode.fixed_point"),
    ("sim.protocol.encoding:FixedPoint", "decode_mean", "decode.fixed_point"),
    ("sim.dp.dskellam:DSkellamEncoding", "encode", "encode.dskellam"),
    ("sim.dp.dskellam:DSkellamEncoding", "wrap", "encode.dskellam"),
    ("sim.dp.dskellam:DSkellamEncoding", "decode_sum", "decode.dskellam"),
    ("sim.protocol.encoding", "add_mod", "vector.add"),
    ("sim.protocol.encoding", "sub_mod", "vector.add"),
    ("sim.protocol.encoding", "add_mod_into", "vector.add"),
    ("sim.protocol.encoding", "sub_mod_into", "vector.add"),
    ("sim.protocol.encoding", "reduce_into", "vector.add"),
    ("sim.protocol.wire:Message", "encode", "wire.encode"),
    ("sim.protocol.wire", "decode", "wire.decode"),
    ("sim.learning.trainer:Learner", "local_update", "training"),
    ("sim.learning.trainer:Learner", "evaluate", "evaluation"),
)
"""Every primitive a full-fidelity round performs. Functions imported by name into other modules
(``add_mod``, ``sub_mod``) are patched there too. ``noise.total`` samples its components on threads: it is
recorded whole (the components' ``sample`` calls, inside it, are nested), so that the replay does what the
run did, on as many threads."""


@dataclass
class Recorder:
    """Calls of primitives made while it is installed: ``(name, function, args, kwargs)``, outermost only.

    One depth for every thread: a primitive that runs others on threads (``noise.total``) counts once, and
    its threads' calls are nested in it. Only such a primitive may start threads that call primitives."""

    calls: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    inside: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    """Seconds spent inside each primitive during the run."""
    _depth: int = 0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside[name] += time.perf_counter() - start
                self._depth -= 1
                self.calls.append((name, fn, args, kwargs))

        return recorded

    def replay(self) -> dict[str, float]:
        """Run every recorded call again, alone and in order; seconds per primitive."""
        seconds: dict[str, float] = defaultdict(float)
        for name, fn, args, kwargs in self.calls:
            start = time.perf_counter()
            fn(*args, **kwargs)
            seconds[name] += time.perf_counter() - start
        return dict(seconds)


def _owner(path: str) -> Any:
    module, _, cls = path.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, cls) if cls else owner


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Install ``recorder`` on every primitive (and on the names modules imported them under)."""
    patched: list[tuple[Any, str, Any]] = []
    for path, attribute, name in PRIMITIVES:
        owner = _owner(path)
        original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        wrapped = recorder.wrap(name, original)
        patched.append((owner, attribute, original))
        setattr(owner, attribute, wrapped)
        if not isinstance(owner, type):  # ``from module import fn`` elsewhere in sim
            for module in list(sys.modules.values()):
                if (
                    module is not owner
                    and getattr(module, "__name__", "").startswith("sim.")
                    and (getattr(module, attribute, None) is original)
                ):
                    patched.append((module, attribute, original))
                    setattr(module, attribute, wrapped)
    try:
        yield recorder
    finally:
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)


def measure(scenario: Path, overrides: Sequence[str], rounds: int, label: str, repeats: int = 2) -> dict[str, object]:
    """One run of ``rounds`` full-fidelity rounds: wall seconds, replayed primitive seconds, overhead."""
    import sim.protocol.plain
    import sim.protocol.secagg.client
    import sim.protocol.secagg.server  # noqa: F401  (loaded before patching, so their imported names are patched)
    from sim.runner import Simulation
    from sim.scenario import load

    sc = load(scenario, [*overrides, f"rounds={rounds + 1}", "fidelity=full"]).base()
    # From the same seeds (the same rounds): timed without instrumentation, ``repeats`` times, then once
    # recorded (holding every call's arguments makes the recorded run slower than a plain one).
    wall = float("inf")
    for _ in range(repeats):
        timed = Simulation(sc)
        timed.step()  # warm: the first round loads torch's optimiser machinery and fills caches
        start = time.perf_counter()
        for _ in range(rounds):
            timed.step()
        wall = min(wall, time.perf_counter() - start)
        timed.close()
    digest = timed.learner.model_sha256() if timed.learner is not None else ""
    del timed
    simulation = Simulation(sc)
    simulation.step()
    recorder = Recorder()
    with recording(recorder):
        start = time.perf_counter()
        for _ in range(rounds):
            simulation.step()
        recorded_wall = time.perf_counter() - start
    if simulation.learner is not None and simulation.learner.model_sha256() != digest:
        raise RuntimeError("the recorded run reached another model than the timed one: not the same rounds")
    simulation.close()
    alone = min((recorder.replay() for _ in range(repeats)), key=lambda seconds: sum(seconds.values()))
    work = sum(alone.values())
    outside = recorded_wall - sum(recorder.inside.values())
    row: dict[str, object] = {
        "setup": label,
        "protocol": sc.aggregation.protocol,
        "privacy": sc.privacy.strategy if sc.privacy.enabled else "none",
        "clients": sc.sampling.clients_per_round,
        "dim": simulation.dim,
        "rounds": rounds,
        "wall_s": wall,
        "primitives_s": work,
        "overhead": wall / work - 1.0,
        "outside_s": outside,
        "recorded_wall_s": recorded_wall,
        "overhead_in_run": outside / (wall - outside),
        "calls": len(recorder.calls),
    }
    for name, seconds in sorted(alone.items()):
        row[f"{name}_s"] = seconds
    return row


SETUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "secagg-xnoise": ("scenarios/privacy.yaml", ()),
    "secagg+-xnoise": ("scenarios/privacy.yaml", ("aggregation.protocol=secagg+", "sampling.clients_per_round=32")),
    "secagg+": ("scenarios/secagg.yaml", ("aggregation.protocol=secagg+", "sampling.clients_per_round=32")),
}
"""Named setups: a scenario file and its overrides (full fidelity, the given number of rounds)."""


SHOWN = ["setup", "clients", "dim", "rounds", "wall_s", "primitives_s", "overhead", "outside_s", "overhead_in_run"]
SHOWN += ["recorded_wall_s", "noise_s", "training_s"]
"""The columns the tables print (the CSV has every one)."""


def run(setups: Sequence[str], rounds: int, extra: Sequence[str], repeats: int = 2) -> pd.DataFrame:
    rows = []
    for name in setups:
        path, overrides = SETUPS[name]
        rows.append(measure(ROOT / path, [*overrides, *extra], rounds, name, repeats))
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="scenario override for every setup")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs and replays; the fastest counts")
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args(argv)
    table = run(args.setups, args.rounds, args.set, args.repeats)
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(table[SHOWN].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
