"""Plain FedAvg aggregation (McMahan et al. 2017): clients upload float updates, the server averages.

The server's aggregate is the weighted mean ``sum_i w_i * delta_i / sum_i w_i`` over the clients whose
update arrived before the ``upload`` step closed, with ``w_i`` the client's sample count. The sum is formed
in float64 in ascending client order when the step closes, so it does not depend on arrival order (the
simulated and the socket driver see different orders and must agree bit for bit); the work is charged as
one accumulation per arrival plus one finalisation, as a streaming server would do it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from sim.protocol.machine import (
    SERVER,
    Aggregate,
    LocalProtocolError,
    Reaction,
    RemoteProtocolError,
    Send,
    ServerMachine,
    Work,
)
from sim.protocol.spec import ClientFactory, InstanceRequest, ProtocolSpec
from sim.protocol.wire import F32_VECTOR, F64, U32, U64, Blank, Message, Vector, vector_length

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class ClientUpdate(Message):
    """A client's model delta (float32) and its weight (sample count)."""

    TYPE: ClassVar[int] = 2
    FIELDS: ClassVar = (("round", U32), ("client", U64), ("weight", F64), ("delta", F32_VECTOR))
    round: int
    client: int
    weight: float
    delta: Vector


class FedAvgServer:
    """Server side of one FedAvg round: one step, ``upload``."""

    def __init__(self, round: int, sampled: tuple[int, ...], dim: int) -> None:
        self.round = round
        self.sampled = frozenset(sampled)
        self.dim = dim
        self.step = "upload"
        self.outcome = ""
        self.aggregate: Aggregate | None = None
        self.exposed: int | None = None
        """Nothing is revealed but the aggregate (:attr:`ServerMachine.exposed`)."""
        self._updates: dict[int, tuple[float, Vector]] = {}

    def begin(self) -> Reaction:
        return Reaction()

    def expected(self) -> frozenset[int]:
        if self.step != "upload":
            return frozenset()
        return self.sampled - self._updates.keys()

    def awaits(self, client: int) -> bool:
        return self.step == "upload" and client in self.sampled and client not in self._updates

    def receive(self, sender: int, message: object) -> Reaction:
        if not isinstance(message, ClientUpdate):
            raise RemoteProtocolError(sender, f"sent {type(message).__name__}, not legal in step {self.step}")
        if self.step != "upload":
            raise RemoteProtocolError(sender, f"sent an update after the upload step closed ({self.step})")
        if sender not in self.sampled:
            raise RemoteProtocolError(sender, "is not sampled in this round")
        if message.client != sender:
            raise RemoteProtocolError(sender, f"sent an update claiming to be client {message.client}")
        if message.round != self.round:
            raise RemoteProtocolError(sender, f"sent an update for round {message.round}, this is {self.round}")
        if sender in self._updates:
            raise RemoteProtocolError(sender, "sent a second update in one round")
        if vector_length(message.delta) != self.dim:
            raise RemoteProtocolError(sender, f"sent {vector_length(message.delta)} values, expected {self.dim}")
        if not (message.weight > 0 and np.isfinite(message.weight)):
            raise RemoteProtocolError(sender, f"sent weight {message.weight}; a positive number is expected")
        self._updates[sender] = (message.weight, message.delta)
        return Reaction(work=(Work("fedavg.accumulate", {"elements": self.dim}),))

    def close_step(self) -> Reaction:
        if self.step != "upload":
            raise LocalProtocolError(f"close_step called in state {self.step}")
        if not self._updates:
            self.step = "aborted"
            self.outcome = "aborted: no client uploaded an update"
            return Reaction()
        survivors = tuple(sorted(self._updates))
        total = float(sum(self._updates[c][0] for c in survivors))
        vector: Vector
        if any(isinstance(self._updates[c][1], Blank) for c in survivors):
            vector = Blank(self.dim, np.dtype("<f4"))
        else:
            acc = np.zeros(self.dim, dtype=np.float64)
            for c in survivors:
                weight, delta = self._updates[c]
                acc += weight * np.asarray(delta, dtype=np.float64)
            vector = (acc / total).astype(np.float32)
        self.aggregate = Aggregate(vector, survivors, total)
        self._updates.clear()
        self.step = "done"
        self.outcome = "ok"
        return Reaction(work=(Work("fedavg.finalize", {"elements": self.dim}),))


class FedAvgClient:
    """Client side of one FedAvg round: send the update, done."""

    first_step = "upload"

    def __init__(self, round: int, client: int) -> None:
        self.round = round
        self.client = client
        self.started = False
        self.finished = False

    def start(self, update: Vector, weight: float) -> Reaction:
        if self.started:
            raise LocalProtocolError("start called twice")
        self.started = self.finished = True
        message = ClientUpdate(self.round, self.client, float(weight), update)
        return Reaction(sends=(Send(SERVER, message),))

    def stage_of(self, message: object) -> str:
        return "upload"

    def receive(self, message: object) -> Reaction:
        raise RemoteProtocolError(SERVER, f"sent {type(message).__name__}; FedAvg clients expect no messages")


class FedAvgSpec(ProtocolSpec):
    """FedAvg's registry entry: one ``upload`` step of float updates (nothing encoded, nothing secret)."""

    def machines(self, request: InstanceRequest) -> tuple[ServerMachine, ClientFactory]:
        r = request
        return FedAvgServer(r.round, r.sampled, r.dim), lambda c, _rng, _enc, _sig: FedAvgClient(r.round, c)


FEDAVG = FedAvgSpec(
    "fedavg",
    ("upload",),
    {"before_upload": "upload"},
    encoded=False,
    operations=("fedavg.accumulate", "fedavg.finalize"),
)
