"""What the engine and the scenario parser need to know of each aggregation protocol.

``steps`` are the server's collection steps in order (the keys of ``timeouts:``); ``dropout_stages`` the
points of the round where ``dropout.stage`` may make a client leave, in the order they occur.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProtocolSpec:
    name: str
    steps: tuple[str, ...]
    dropout_stages: tuple[str, ...]


PROTOCOLS: dict[str, ProtocolSpec] = {
    "fedavg": ProtocolSpec(
        name="fedavg",
        steps=("upload",),
        dropout_stages=("after_sampling", "before_upload"),
    ),
}
