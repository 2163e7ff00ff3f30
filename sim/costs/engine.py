"""An implementation's own single-host simulation engine, as a cost profile declares it (``"engine"``).

Flower's ``run_simulation`` runs a round's ClientApps on a pool of Ray actors on one host, and its engine
adds costs of its own to every message (docs/profiles.md, "Flower's simulation engine"). The flower
profile measures them (``dropsim profile --impl flower``, from :mod:`sim.profiling.flower_rounds`) and
declares them here; the simulator charges them under ``testbed: {emulation: engine}``
(:mod:`sim.engine.actors`):

- ``workers``: the engine keeps one actor per ``cpus_per_client`` of the host's cores, and each actor runs
  one client's message at a time (flwr's ``BasicActorPool``, one worker thread per actor);
- ``delivery_interval_s``: messages the server pushes reach the actors' queue on a sweep of the engine's
  state every this many seconds (flwr's ``add_messages_to_queue``); the sweeps are in step with the
  server's polls when a run starts (:meth:`sim.engine.actors.ActorEngine.next_sweep`);
- ``pull_interval_s``: the server polls for its replies every this many seconds from the moment it pushed
  (flwr's ``InMemoryGrid.send_and_receive``): a reply counts at the first poll after it is stored;
- ``message``: reference seconds an actor's worker spends on one message besides the ClientApp's own
  work, ``const + bytes * b + stored * s``: ``bytes`` the message's and its reply's contents (serialising,
  copying and deserialising them on their way to the actor and back), ``stored`` how many of the two are
  larger than ``inline_limit_bytes`` (Ray passes a task's argument or result above 100 KiB through its
  shared-memory object store, not inline: a put and a fetch more);
- ``client_scale``: seconds a client's work (its ClientApp's, the engine's own costs aside) takes inside
  the engine per second the profile charges for it: the profile times each primitive alone, warm, while
  inside an actor the same work runs slower (fresh memory, arrays arriving through the object store, the
  framework's conversions around fit). Measured on rounds apart from any validation grid (every message's
  ClientApp seconds against what the simulator charges for those rounds); the simulator multiplies every
  client charge by it under ``emulation: engine``;
- ``model_with_upload``: the implementation sends the model with the upload request (Flower's workflow
  sends it with the collect-masked-vectors request, and its clients train and quantise then): the first
  request only sets a client up, and the model's bytes and decoding, the training and the update's
  encoding are charged to the client's handling of the upload request;
- ``server_scale``: the same for the server's work (the ServerApp shares its process with the engine's
  threads: its stages' own seconds against what the simulator charges);
- ``client_vector_scale``, ``server_vector_scale``: the same for the work on the model's values, the
  operations named in ``vector_operations`` (masks, quantisation, vector sums, the vectors' encoding),
  which the engine slows by another factor than the per-message cryptography (fresh arrays the size of
  the model in every message, where the profile times each primitive warm). With them, ``client_scale`` and
  ``server_scale`` scale every other operation. A section without them scales every operation by
  ``client_scale`` and ``server_scale`` (docs/profiles.md, "Flower's simulation engine").

The profile's section:

    "engine": {"name": ..., "description": ..., "measured_by": ..., "cpus_per_client": 1,
               "delivery_interval_s": 0.1, "pull_interval_s": 0.1, "inline_limit_bytes": 102400,
               "client_scale": 1.2, "server_scale": 1.0, "client_vector_scale": 1.9,
               "server_vector_scale": 2.5, "vector_operations": ["prg.expand", ...], "model_with_upload": true,
               "message": {"coef": {"const": s, "bytes": s_per_byte, "stored": s_per_object},
                           "r2": ..., "points": ...}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.errors import InputError

KEYS = frozenset(
    {
        "name",
        "description",
        "measured_by",
        "cpus_per_client",
        "delivery_interval_s",
        "pull_interval_s",
        "inline_limit_bytes",
        "model_with_upload",
        "client_scale",
        "server_scale",
        "client_vector_scale",
        "server_vector_scale",
        "vector_operations",
        "message",
        # what the measurement saw, kept for the record
        "delivery_wait_measured_s",
        "rounds",
        "scale_rounds",
    }
)
"""The keys an ``engine`` section may have (any other is a misspelling: an error, not a default)."""

VECTOR_OPERATIONS = (
    "prg.expand",
    "vector.add",
    "encode.fixed_point",
    "decode.fixed_point",
    "wire.encode",
    "wire.decode",
    "fedavg.accumulate",
    "fedavg.finalize",
    "encode.dskellam",
    "decode.dskellam",
    "noise.skellam",
    "noise.gaussian",
    "noise.dgaussian",
)
"""The operations on the model's values, each over arrays the size of the model: a mask, a sum, the
quantisation, the encoding of a message (whose bytes are mostly a vector's, where there is one), the
noise and its encoding. What ``client_vector_scale`` and ``server_vector_scale`` scale when a section
does not name its own ``vector_operations``."""


class EngineCostsError(InputError):
    """A profile's ``engine`` section that cannot be used."""


@dataclass(frozen=True)
class EngineCosts:
    """A simulation engine's own costs (see the module doc); times in seconds, sizes in bytes."""

    name: str
    description: str
    measured_by: str
    cpus_per_client: float
    delivery_interval_s: float
    pull_interval_s: float
    message_const_s: float
    """Reference seconds of a worker per message, whatever its size."""
    message_s_per_byte: float
    """Reference seconds of a worker per byte of a message and its reply."""
    message_s_per_stored: float = 0.0
    """Reference seconds of a worker per message or reply above :attr:`inline_limit_bytes`."""
    inline_limit_bytes: float = math.inf
    """Largest message or reply passed inline (bytes); larger ones go through the object store."""
    client_scale: float = 1.0
    """Seconds of a client's work inside the engine per second the profile charges for it."""
    server_scale: float = 1.0
    """Seconds of the server's work beside the engine per second the profile charges for it."""
    model_with_upload: bool = False
    """Whether the model travels with the upload request (and clients train and encode then)."""
    client_vector_scale: float | None = None
    """Seconds of a client's work on the model's values (:attr:`vector_operations`) inside the engine per
    second the profile charges for it; None: :attr:`client_scale`."""
    server_vector_scale: float | None = None
    """The same for the server's work on the model's values; None: :attr:`server_scale`."""
    vector_operations: tuple[str, ...] = VECTOR_OPERATIONS
    """The operations the vector scales apply to (the others take :attr:`client_scale`, :attr:`server_scale`)."""

    def scales(self, role: str) -> tuple[float, float]:
        """(the scale of every other operation, the scale of the work on the model's values) for a party of
        ``role`` (``client`` or ``server``)."""
        if role == "client":
            rest, vector = self.client_scale, self.client_vector_scale
        else:
            rest, vector = self.server_scale, self.server_vector_scale
        return rest, (rest if vector is None else vector)

    def workers(self, cores: int) -> int:
        """Actors on a host of ``cores`` cores: one per ``cpus_per_client`` (at least one)."""
        return max(1, math.floor(cores / self.cpus_per_client + 1e-9))

    def message_seconds(self, nbytes: float) -> float:
        """Reference seconds of a worker for taking a message of ``nbytes`` bytes to the ClientApp."""
        return self.message_const_s + self.payload_seconds(nbytes)

    def payload_seconds(self, nbytes: float) -> float:
        """Reference seconds of a worker for moving one message or reply of ``nbytes`` bytes."""
        stored = self.message_s_per_stored if nbytes > self.inline_limit_bytes else 0.0
        return self.message_s_per_byte * nbytes + stored

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> EngineCosts:
        def where(key: str = "") -> str:
            return f"cost profile {source}: 'engine{'.' + key if key else ''}'"

        if not isinstance(doc, dict):
            raise EngineCostsError(f"{where()} is {doc!r}; it must be a mapping (docs/profiles.md)")

        def text(key: str) -> str:
            value = doc.get(key, "")
            if not isinstance(value, str):
                raise EngineCostsError(f"{where(key)} is {value!r}; it must be a string")
            return value

        unknown = sorted(set(doc) - KEYS)
        if unknown:
            raise EngineCostsError(f"{where(unknown[0])} is not a key of an engine section (docs/profiles.md)")

        def number(value: Any, key: str, positive: bool) -> float:
            if value is None:
                raise EngineCostsError(f"{where(key)} is missing; it must be a number")
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                bound = "> 0" if positive else ">= 0"
                raise EngineCostsError(f"{where(key)} is {value!r}; it must be a number {bound}")
            return float(value)

        def flag(key: str) -> bool:
            value = doc.get(key, False)
            if not isinstance(value, bool):
                raise EngineCostsError(f"{where(key)} is {value!r}; it must be true or false")
            return value

        def scale(key: str) -> float | None:
            return number(doc[key], key, True) if key in doc else None

        operations = doc.get("vector_operations", list(VECTOR_OPERATIONS))
        if not isinstance(operations, list) or not all(
            isinstance(op, str) and op and "@" not in op for op in operations
        ):
            raise EngineCostsError(
                f"{where('vector_operations')} is {operations!r}; it must be a list of operation names (without "
                "@role: each role's vector scale applies to its own)"
            )

        message = doc.get("message")
        coef = message.get("coef") if isinstance(message, dict) else None
        if not isinstance(coef, Mapping) or set(coef) - {"const", "bytes", "stored"} or "const" not in coef:
            raise EngineCostsError(
                f"{where('message')} needs 'coef': {{'const': seconds, 'bytes': seconds per byte, 'stored': seconds "
                "per message in the object store}"
            )
        return cls(
            name=text("name"),
            description=text("description"),
            measured_by=text("measured_by"),
            cpus_per_client=number(doc.get("cpus_per_client", 1), "cpus_per_client", True),
            delivery_interval_s=number(doc.get("delivery_interval_s"), "delivery_interval_s", False),
            pull_interval_s=number(doc.get("pull_interval_s"), "pull_interval_s", False),
            message_const_s=number(coef.get("const", 0.0), "message.coef.const", False),
            message_s_per_byte=number(coef.get("bytes", 0.0), "message.coef.bytes", False),
            message_s_per_stored=number(coef.get("stored", 0.0), "message.coef.stored", False),
            inline_limit_bytes=(
                number(doc["inline_limit_bytes"], "inline_limit_bytes", True)
                if "inline_limit_bytes" in doc
                else math.inf
            ),
            client_scale=number(doc.get("client_scale", 1.0), "client_scale", True),
            server_scale=number(doc.get("server_scale", 1.0), "server_scale", True),
            model_with_upload=flag("model_with_upload"),
            client_vector_scale=scale("client_vector_scale"),
            server_vector_scale=scale("server_vector_scale"),
            vector_operations=tuple(operations),
        )
