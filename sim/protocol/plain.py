"""``plain``: the fixed-point encoding of the secure protocols, without masks.

Each client sends its encoded update (:mod:`sim.protocol.encoding`) in the clear; the server sums the
encodings mod 2^bits and decodes the mean. With the same survivors and the same encoding randomness this
is bit for bit the aggregate SecAgg and SecAgg+ compute, so it isolates what secure aggregation costs.

With distributed DP (a :class:`~sim.protocol.private.PrivateRound`) each client sends its noisy DSkellam
encoding instead; strategies that remove or rebase noise need the secure protocols' seed sharing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.crypto.randomness import RandomSource
from sim.protocol.encoding import FixedPoint, add_mod
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
from sim.protocol.messages import EncodedUpdate
from sim.protocol.private import PrivateRound
from sim.protocol.spec import (
    DP_OPERATIONS,
    ENCODED_OPERATIONS,
    ClientFactory,
    InstanceRequest,
    ProtocolSpec,
    fixed_point,
)
from sim.protocol.wire import Blank, Message, ModVector, Vector

if TYPE_CHECKING:
    pass


class PlainServer:
    """One step, ``upload``: collect encoded updates, sum, decode the mean."""

    def __init__(
        self, round: int, sampled: tuple[int, ...], dim: int, encoding: FixedPoint, private: PrivateRound | None = None
    ) -> None:
        self.round = round
        self.sampled = frozenset(sampled)
        self.model_dim = dim
        self.dim = dim if private is None else private.length
        """Values per encoded vector."""
        self.encoding = encoding
        self.private = private
        self.bits = encoding.bits if private is None else private.bits
        self.step = "upload"
        self.outcome = ""
        self.aggregate: Aggregate | None = None
        self.exposed: int | None = None
        """Nothing is revealed but the aggregate (:attr:`ServerMachine.exposed`)."""
        self._inputs: set[int] = set()
        self._total: Vector = Blank(dim, np.uint32)
        """Sum mod 2^bits of the encodings received so far (summed on arrival)."""

    def begin(self) -> Reaction:
        return Reaction()

    def expected(self) -> frozenset[int]:
        return self.sampled - self._inputs if self.step == "upload" else frozenset()

    def awaits(self, client: int) -> bool:
        return self.step == "upload" and client in self.sampled and client not in self._inputs

    def receive(self, sender: int, message: Message) -> Reaction:
        if self.step != "upload":
            raise RemoteProtocolError(sender, f"sent {type(message).__name__} after the upload step ({self.step})")
        if not isinstance(message, EncodedUpdate):
            raise RemoteProtocolError(sender, f"sent {type(message).__name__}, not EncodedUpdate")
        if sender not in self.sampled or message.client != sender:
            raise RemoteProtocolError(sender, f"is not sampled or claims to be client {message.client}")
        if message.round != self.round:
            raise RemoteProtocolError(sender, f"sent an update for round {message.round}, this is {self.round}")
        if sender in self._inputs:
            raise RemoteProtocolError(sender, "sent a second update")
        if message.data.bits != self.bits or message.data.length != self.dim:
            raise RemoteProtocolError(sender, f"sent {message.data.length} values of {message.data.bits} bits")
        values = message.data.values
        if not isinstance(values, Blank):
            if isinstance(self._total, Blank):
                self._total = np.zeros(self.dim, dtype=np.uint32)
            self._total = add_mod(self._total, values, self.bits)
        self._inputs.add(sender)
        return Reaction(work=(Work("vector.add", {"elements": self.dim}),))

    def close_step(self) -> Reaction:
        if self.step != "upload":
            raise LocalProtocolError(f"close_step called in state {self.step}")
        if not self._inputs:
            self.step, self.outcome = "aborted", "aborted: no client uploaded an update"
            return Reaction()
        survivors = tuple(sorted(self._inputs))
        if self.private is not None and self.private.admit is not None:
            refused = self.private.admit(len(survivors))
            if refused:
                self.step, self.outcome = "aborted", f"aborted: upload: {refused}"
                return Reaction()
        vector: Vector = Blank(self.model_dim, np.float32)
        if not isinstance(self._total, Blank):
            decoder = self.encoding if self.private is None else self.private
            vector = decoder.decode_mean(self._total, len(survivors))
        self.aggregate = Aggregate(vector, survivors, float(len(survivors)))
        self.step, self.outcome = "done", "ok"
        self._inputs.clear()
        if self.private is not None:
            return Reaction(work=self.private.decode_work())
        return Reaction(work=(Work("decode.fixed_point", {"elements": self.dim}),))


class PlainClient:
    """Encode the update and send it."""

    first_step = "upload"

    def __init__(
        self,
        round: int,
        client: int,
        dim: int,
        encoding: FixedPoint,
        rng: np.random.Generator | None,
        private: PrivateRound | None = None,
        keys: RandomSource | None = None,
    ) -> None:
        self.round, self.client, self.encoding, self.rng = round, client, encoding, rng
        self.private, self.keys = private, keys
        self.dim = dim if private is None else private.length
        self.bits = encoding.bits if private is None else private.bits
        self.started = False
        self.finished = False

    def stage_of(self, message: Message) -> str:
        return "upload"

    def start(self, update: Vector, weight: float) -> Reaction:
        if self.started:
            raise LocalProtocolError("start called twice")
        self.started = self.finished = True
        values: Vector = Blank(self.dim, np.uint32)
        private = self.private
        if not isinstance(update, Blank):
            assert self.rng is not None
            if private is None:
                values = self.encoding.encode(update, self.rng)
            else:
                assert self.keys is not None
                seeds = [self.keys.bytes(32) for _ in private.plan.components]
                values = private.encode(update, self.rng, seeds)
        message = EncodedUpdate(self.round, self.client, ModVector(self.bits, values))
        work = (Work("encode.fixed_point", {"elements": self.dim}),) if private is None else private.encode_work()
        return Reaction(sends=(Send(SERVER, message),), work=work)

    def receive(self, message: Message) -> Reaction:
        raise RemoteProtocolError(SERVER, f"sent {type(message).__name__}; plain clients expect no messages")


class PlainSpec(ProtocolSpec):
    """``plain``'s registry entry: one ``upload`` step of encodings in the clear (central or local DP only)."""

    def machines(self, request: InstanceRequest) -> tuple[ServerMachine, ClientFactory]:
        r = request
        encoding = fixed_point(r.params, len(r.sampled))
        return PlainServer(r.round, r.sampled, r.dim, encoding, r.private), lambda c, rng, enc, _sig: PlainClient(
            r.round, c, r.dim, encoding, enc, r.private, rng
        )


PLAIN = PlainSpec("plain", ("upload",), {"before_upload": "upload"}, operations=(*ENCODED_OPERATIONS, *DP_OPERATIONS))
