"""Virtual-time cost of compute operations: linear models fitted by ``dropsim profile``.

An operation's cost on the reference device (the machine that ran the profile) is

    seconds = sum_k coef[k] * size[k],   with size["const"] = 1,

for the features it was fitted on (e.g. ``elements``, ``samples``, ``batches``). A client's time is that
times its slow-down factor; the server's is that divided by its speed. An operation may be charged
differently at the server and at a client (``op@server``, ``op@client``: a profile calibrated on deployed
parties, whose processes differ); where a profile has no such entry, both pay ``op``. A profile is a JSON
file:

    {"format": 1, "machine": {...}, "operations": {op: {"coef": {feature: s_per_unit}, "r2": ..., ...}}}

The default profile ships inside the package (``sim/costs/default.json``) with the machine it was
measured on; ``costs.profile`` in a scenario names another: a file, or one of the shipped profiles of
:data:`PROFILES` by name (``dropsim``, ``flower``, ``dordis``: docs/profiles.md). Missing operations are
an error that names the operation and the profile, never a silent zero.

A profile says which implementation it describes and how it was measured (``"implementation": {"name",
"description", "measured_by"}``; a profile without it describes dropsim's own code), and may declare
how that implementation sizes the protocol's messages on the wire (``"wire"``: :mod:`sim.costs.wire`) and
what its own single-host simulation engine costs (``"engine"``: :mod:`sim.costs.engine`).

An optional top-level ``"pipeline": {"interference_s": b, "r2": ..., "points": [...], "baseline": {...},
"method": ...}`` (measured by :mod:`sim.profiling.interference`) gives :attr:`CostModel.interference_s`, the
``beta_2`` of Dordis eq. 3 (section 4.2, ``tau = beta_1 d/m + beta_2 m + beta_3``): extra seconds of
client compute per chunk task for each of the m chunks in the pipeline, on the reference device, scaled
like all client compute by the client's slow-down factor. A profile without the key has 0.0 (no
interference), so older profiles still load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sim.costs.engine import EngineCosts, EngineCostsError
from sim.costs.wire import WireSizes
from sim.errors import InputError
from sim.protocol.machine import SERVER, Work
from sim.protocol.wire import Message

DEFAULT_PROFILE = Path(__file__).with_name("default.json")
PROFILES = {
    "dropsim": DEFAULT_PROFILE,
    "flower": Path(__file__).with_name("flower.json"),
    "dordis": Path(__file__).with_name("dordis.json"),
}
"""The shipped profiles by name (``costs: {profile: NAME}``): dropsim's own code, Flower 1.42's SecAgg+
functions and Dordis's implementation (docs/profiles.md). A name wins over a file of the same name in the
working directory; write ``./dordis`` for that."""
OWN_IMPLEMENTATION = {
    "name": "dropsim",
    "description": "dropsim's own code: X25519, AES-GCM, AES-CTR masks, prime-field Shamir, vectorised numpy",
    "measured_by": "dropsim profile",
}
"""The ``implementation`` of a profile that does not state one."""
SERVER_ROLE, CLIENT_ROLE = "server", "client"
"""The roles an operation may be charged for differently (``op@server``, ``op@client``)."""
FORMAT = 1


class CostModelError(InputError):
    """A profile that cannot be used: unreadable, malformed, or lacking an operation."""


@dataclass(frozen=True)
class LinearCost:
    """Seconds on the reference device: ``sum(coef[k] * size[k])``, ``const`` always 1."""

    coef: Mapping[str, float]

    def terms(self, size: Mapping[str, float]) -> dict[str, float]:
        """Seconds by feature at ``size`` (``const``: its coefficient), whose sum :meth:`seconds` is (at
        least 0)."""
        return {k: c if k == "const" else c * float(size.get(k, 0.0)) for k, c in self.coef.items()}

    def seconds(self, size: Mapping[str, float]) -> float:
        total = 0.0
        for feature, c in self._terms:  # in the order of coef: the same sum, rounding included
            total += c if feature is None else c * float(size.get(feature, 0.0))
        return max(total, 0.0)

    @cached_property
    def _terms(self) -> tuple[tuple[str | None, float], ...]:
        """``coef`` as (feature, coefficient) pairs, None for ``const``."""
        return tuple((None if k == "const" else k, c) for k, c in self.coef.items())


def _interference(pipeline: Any, source: str) -> float:
    """``pipeline.interference_s`` of a profile: a finite number >= 0 (seconds), 0.0 without ``pipeline``."""
    if pipeline is None:
        return 0.0
    if not isinstance(pipeline, dict):
        raise CostModelError(
            f"cost profile {source}: 'pipeline' is {pipeline!r}; it must be a mapping with 'interference_s' "
            f"(seconds), or be left out"
        )
    value = pipeline.get("interference_s")
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise CostModelError(
            f"cost profile {source}: 'pipeline.interference_s' is {value!r}; it must be a number of seconds "
            f">= 0 (or leave out 'pipeline' for no interference)"
        )
    return float(value)


class CostModel:
    """The operations of one profile."""

    def __init__(
        self,
        operations: Mapping[str, LinearCost],
        machine: Mapping[str, Any],
        source: str,
        interference_s: float = 0.0,
        implementation: Mapping[str, Any] | None = None,
        wire: WireSizes | None = None,
        engine: EngineCosts | None = None,
    ) -> None:
        self.operations = dict(operations)
        self.machine = dict(machine)
        self.source = source
        self.interference_s = interference_s
        """Pipeline interference (Dordis eq. 3's beta_2): reference-device seconds added to each chunk task's
        client compute per chunk in the pipeline; 0.0 when the profile has no ``pipeline`` entry."""
        self.implementation = dict(implementation or OWN_IMPLEMENTATION)
        """Which implementation the profile describes (``name``, ``description``, ``measured_by``)."""
        self.wire = wire
        """How that implementation sizes messages on the wire; None: as dropsim's frames."""
        self.engine = engine
        """The implementation's own simulation engine (``testbed: {emulation: engine}``), or None."""
        self._found: dict[tuple[str, str | None], LinearCost] = {}
        """What :meth:`cost` found, by (op, role): a run asks for the same few hundred thousand times."""

    @classmethod
    def load(cls, path: str | Path | None = None) -> CostModel:
        """Read a profile: the shipped default when ``path`` is None, a shipped profile by its name
        (:data:`PROFILES`), else the file at ``path``."""
        p = resolve_profile(path)
        return cls.from_dict(read_profile(p), str(p))

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> CostModel:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CostModelError(f"cost profile {source}: not a dropsim profile of format {FORMAT}")
        ops = doc.get("operations")
        if not isinstance(ops, dict):
            raise CostModelError(f"cost profile {source}: 'operations' must be a mapping")
        operations: dict[str, LinearCost] = {}
        for op, entry in ops.items():
            coef = entry.get("coef") if isinstance(entry, dict) else None
            if not isinstance(coef, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in coef.values()
            ):
                raise CostModelError(f"cost profile {source}: operation {op!r} needs 'coef': {{feature: seconds}}")
            operations[op] = LinearCost({str(k): float(v) for k, v in coef.items()})
        implementation = doc.get("implementation")
        if implementation is not None and not (
            isinstance(implementation, dict) and all(isinstance(v, str) for v in implementation.values())
        ):
            raise CostModelError(
                f"cost profile {source}: 'implementation' must be a mapping of strings (name, description, measured_by)"
            )
        wire = WireSizes.from_dict(doc["wire"], source) if doc.get("wire") is not None else None
        try:
            engine = EngineCosts.from_dict(doc["engine"], source) if doc.get("engine") is not None else None
        except EngineCostsError as exc:
            raise CostModelError(str(exc)) from None
        named = engine.vector_operations if engine and "vector_operations" in doc["engine"] else ()
        unknown = sorted(set(named) - {op.split("@", 1)[0] for op in operations})
        if unknown:
            raise CostModelError(
                f"cost profile {source}: 'engine.vector_operations' names {unknown[0]!r}, which is not an operation "
                "of the profile"
            )
        return cls(
            operations,
            doc.get("machine", {}),
            source,
            _interference(doc.get("pipeline"), source),
            implementation,
            wire,
            engine,
        )

    def has(self, op: str) -> bool:
        return op in self.operations

    def with_operations(self, operations: Mapping[str, LinearCost]) -> CostModel:
        """This profile with ``operations`` added (replacing any of the same name); the rest as it is."""
        return CostModel(
            {**self.operations, **operations},
            self.machine,
            self.source,
            self.interference_s,
            self.implementation,
            self.wire,
            self.engine,
        )

    def scaled(self, factor: float, keep: tuple[str, ...] = (), role: str | None = None) -> CostModel:
        """This profile with every operation's cost, and the pipeline interference, times ``factor``, except
        the operations named in ``keep`` (at every role: ``op@server`` and ``op@client`` too). With ``role``,
        only what a party of that role pays: its ``op@role`` entries, made from ``op`` where it has none."""
        if role is not None:
            scaled_ops = dict(self.operations)
            for op, cost in self.operations.items():
                base, _, at = op.partition("@")
                if base in keep or (at and at != role) or (not at and f"{op}@{role}" in self.operations):
                    continue
                scaled_ops[f"{base}@{role}"] = LinearCost({k: c * factor for k, c in cost.coef.items()})
            return CostModel(
                scaled_ops, self.machine, self.source, self.interference_s, self.implementation, self.wire, self.engine
            )
        ops = {
            op: cost if op.split("@", 1)[0] in keep else LinearCost({k: c * factor for k, c in cost.coef.items()})
            for op, cost in self.operations.items()
        }
        return CostModel(
            ops, self.machine, self.source, self.interference_s * factor, self.implementation, self.wire, self.engine
        )

    def inside_engine(self) -> CostModel:
        """This profile as the parties pay it inside its simulation engine (``testbed: {emulation:
        engine}``): for each role, the work on the model's values times that role's vector scale and every
        other operation times its scale (:meth:`EngineCosts.scales`); unchanged without an engine."""
        engine = self.engine
        if engine is None:
            return self
        vector = engine.vector_operations
        rest = tuple(sorted({op.split("@", 1)[0] for op in self.operations} - set(vector)))
        costs = self
        for party in (CLIENT_ROLE, SERVER_ROLE):
            other, on_values = engine.scales(party)
            costs = costs.scaled(other, keep=vector, role=party).scaled(on_values, keep=rest, role=party)
        return costs

    def seconds(self, op: str, size: Mapping[str, float], role: str | None = None) -> float:
        """Reference-device seconds of ``op`` at ``size``; for a party of ``role`` (``server`` or
        ``client``), the profile's ``op@role`` where it has one (a profile calibrated on deployed parties:
        :mod:`sim.profiling.calibrate`)."""
        return self.cost(op, role).seconds(size)

    def cost(self, op: str, role: str | None = None) -> LinearCost:
        """The linear model that :meth:`seconds` charges ``op`` by (for a party of ``role``)."""
        found = self._found.get((op, role))
        if found is not None:
            return found
        found = self._found[op, role] = self._lookup(op, role)
        return found

    def _lookup(self, op: str, role: str | None) -> LinearCost:
        if role is not None:
            specific = self.operations.get(f"{op}@{role}")
            if specific is not None:
                return specific
        cost = self.operations.get(op)
        if cost is None:
            raise CostModelError(
                f"cost profile {self.source} has no operation {op!r}; run `dropsim profile` to measure it "
                f"(it has: {', '.join(sorted(self.operations)) or 'nothing'})"
            )
        return cost

    def work_seconds(self, work: tuple[Work, ...] | list[Work], role: str | None = None) -> float:
        """Reference-device seconds of a machine's reported work (by a party of ``role``: :meth:`seconds`),
        added in order. An item listed several times (a SecAgg+ client's work per neighbour) is costed once."""
        found = self._found
        if len(work) <= 2:  # most often one frame's encoding or decoding: nothing listed twice
            return sum([(found.get((w.op, role)) or self.cost(w.op, role)).seconds(w.size) for w in work])
        costed: dict[int, float] = {}
        terms = []
        for w in work:
            seconds = costed.get(id(w))
            if seconds is None:
                seconds = costed[id(w)] = (found.get((w.op, role)) or self.cost(w.op, role)).seconds(w.size)
            terms.append(seconds)
        return sum(terms)


def resolve_profile(path: str | Path | None) -> Path:
    """The file of profile ``path``: the shipped default for None, a shipped profile for one of the names
    of :data:`PROFILES`, else ``path`` itself."""
    if path is None:
        return DEFAULT_PROFILE
    if isinstance(path, str) and path in PROFILES:
        return PROFILES[path]
    return Path(path)


def read_profile(path: Path) -> Any:
    """The parsed JSON document of the profile at ``path`` (checked by :meth:`CostModel.from_dict`)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CostModelError(f"cost profile {path}: cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise CostModelError(f"cost profile {path}:{exc.lineno}: not valid JSON: {exc.msg}") from None


def role(party: int) -> str:
    """The role of ``party``: :data:`SERVER_ROLE` for the server (:data:`sim.protocol.machine.SERVER`),
    else :data:`CLIENT_ROLE`."""
    return SERVER_ROLE if party == SERVER else CLIENT_ROLE


def frame_size(message: Message) -> dict[str, float]:
    """Cost features of encoding or decoding ``message`` (``wire.encode``, ``wire.decode``): frame bytes and
    bit-packed values."""
    return {"bytes": message.wire_size(), "packed": message.packed_elements()}
