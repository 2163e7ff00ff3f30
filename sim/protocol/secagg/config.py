r"""What both sides of a SecAgg (Bonawitz et al. CCS'17) or SecAgg+ (Bell et al. CCS'20) round share.

:class:`SecAggConfig` is what every party of a round knows in advance (public): the sampled clients, the
graph (SecAgg: every client neighbours every other; SecAgg+: a sparse graph, :mod:`sim.protocol.graph`), the
encoding of inputs as integers mod 2^bits (fixed point, or DSkellam with a noise plan under distributed DP,
:mod:`sim.protocol.private`), the variant, the collusion tolerance and the session digest every signature is
bound to. Thresholds: a client's secrets are shared among its holders H(u) (itself and its neighbours) with
``t_u = floor(threshold * |H(u)|) + 1`` (:func:`share_threshold`), strictly more than the fraction
``threshold`` (SecAgg: H(u) is everyone, so t = floor(threshold * |U|) + 1; the malicious variant needs
t > (|H(u)| + c)/2 with c of the holders colluding with the server, :mod:`sim.protocol.collusion`; with none,
t > |U|/2, Dordis footnote 3). A configuration that breaks this raises
:class:`~sim.protocol.machine.RoundSetupError`; the server aborts a step with fewer than ``min_u t_u``
answers (``SecAggConfig.minimum``).

Also here, for both machines: :data:`SECRET_ELEMENTS`, the :class:`~sim.protocol.machine.RemoteProtocolError`
subclasses either side raises about what the other sent, and ``Peer``, the keys (and signature) a client
advertised, which the server keeps and relays and each client checks.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import cached_property

from sim.crypto import shamir
from sim.protocol.collusion import smallest_safe_fraction, smallest_safe_threshold, split_view_possible
from sim.protocol.encoding import FixedPoint
from sim.protocol.machine import RemoteProtocolError, RoundSetupError, Work
from sim.protocol.private import PrivateRound
from sim.protocol.wire import Data

SECRET_ELEMENTS = shamir.elements_for(32)
"""Field elements of one 32-byte secret (see :mod:`sim.crypto.shamir`)."""


class BadSignatureError(RemoteProtocolError):
    """A signature that does not verify under the signer's long-term key (malicious variant)."""


class BadCiphertextError(RemoteProtocolError):
    """A share ciphertext that does not decrypt and authenticate, or names the wrong parties."""


class InconsistentViewError(RemoteProtocolError):
    """A set of clients from the server that contradicts what this client saw or may accept."""


class BadKeyError(RemoteProtocolError):
    """A public key that is malformed, of low order (X25519 with it gives the all-zero secret), or already
    another party's."""


class TooFewClientsError(RemoteProtocolError):
    """Fewer clients than the threshold: continuing would expose an input."""


def share_threshold(fraction: float, holders: int) -> int:
    """``floor(fraction * holders) + 1``, at most ``holders``: strictly more than the fraction."""
    return min(holders, math.floor(fraction * holders) + 1)


@dataclass(frozen=True)
class SurvivorView:
    """What every client derives alike from one survivor list (U3)."""

    members: frozenset[int]
    ordered: tuple[int, ...]
    """The list sorted: the survivor set every signature and share refers to."""
    within_sampled: bool
    """Whether every member was sampled."""


@dataclass(frozen=True)
class SecAggConfig:
    """What every party of one round knows in advance (public)."""

    round: int
    sampled: tuple[int, ...]
    dim: int
    encoding: FixedPoint
    neighbours: Mapping[int, tuple[int, ...]]
    """Each client's neighbours (SecAgg: everyone else)."""
    threshold_fraction: float
    malicious: bool
    collusion: int = 0
    """T_C, clients that may collude with the server: in the malicious variant every client's threshold must
    withstand that many of its holders signing two survivor sets (:mod:`sim.protocol.collusion`)."""
    verification_keys: Mapping[int, Data] = field(default_factory=dict)
    """Long-term Ed25519 verification key of each client (malicious variant)."""
    private: PrivateRound | None = None
    """Distributed DP: the encoding with noise (then ``dim`` is its padded length) and the noise plan."""
    chunk: int = 0
    """Which chunk of the update this instance aggregates (Dordis 4.1: one instance per chunk)."""
    chunks: int = 1
    context: bytes = b""
    """What else every signature is bound to: a deployment's own random id (the simulator: nothing), so that
    a client's signatures of one deployment are worth nothing in another with the same rounds."""
    prepared: bool = False
    """Pipelined: clients start with their slice of the already encoded update (fixed point: uint32 mod
    2^bits; distributed DP: int64 before noise) and the server ends with the unmasked sum mod 2^bits, which
    the driver decodes once every chunk is in (``dim`` is then the chunk's length)."""

    @property
    def shared_noise(self) -> int:
        """Noise seeds each client Shamir-shares (XNoise's removable components)."""
        return self.private.plan.removable if self.private is not None and self.private.removing else 0

    @property
    def signed_uploads(self) -> bool:
        """Whether uploads are signed and the survivor set comes with the signatures (Dordis 3.3): under
        distributed DP in the malicious variant, where overstating U3 would remove too much noise."""
        return self.malicious and self.private is not None

    def excess(self, survivors: int) -> tuple[int, ...]:
        """Noise components every survivor's noise loses when ``survivors`` of the sampled clients remain."""
        if self.private is None or not self.private.removing:
            return ()
        return self.private.plan.removed(len(self.sampled) - survivors)

    @property
    def bits(self) -> int:
        return self.encoding.bits

    @cached_property
    def _holders(self) -> dict[int, tuple[int, ...]]:
        return {c: tuple(sorted((c, *self.neighbours[c]))) for c in self.sampled}

    @cached_property
    def _holder_sets(self) -> dict[int, frozenset[int]]:
        return {c: frozenset(h) for c, h in self._holders.items()}

    def __post_init__(self) -> None:
        for c in self.sampled:
            if len(self._holders[c]) >= 2 and self.threshold(c) < 2:
                raise RoundSetupError(
                    f"threshold {self.threshold_fraction} gives client {c}'s {len(self._holders[c])} holders a "
                    "reconstruction threshold of 1: every share would be the secret itself"
                )
        if self.collusion < 0:
            raise RoundSetupError(f"collusion {self.collusion}: a number of clients >= 0 is expected")
        for c in self.sampled if self.malicious else ():
            n, t = len(self._holders[c]), self.threshold(c)
            if split_view_possible(t, n, self.collusion):
                raise RoundSetupError(
                    f"threshold {self.threshold_fraction} gives client {c}'s {n} holders t = {t}, which a server "
                    f"with {self.collusion} colluding client{'s' if self.collusion != 1 else ''} can reach in two "
                    "camps shown different survivor sets "
                    f"(2t <= holders + colluding holders): the malicious variant needs t >= "
                    f"{smallest_safe_threshold(n, self.collusion)} (threshold >= "
                    f"{smallest_safe_fraction(n, self.collusion)})"
                )

    def holders(self, client: int) -> tuple[int, ...]:
        """H(u): the client and its neighbours, sorted."""
        return self._holders[client]

    def holds(self, holder: int, client: int) -> bool:
        """Whether ``holder`` is one of ``client``'s share holders."""
        return holder in self._holder_sets[client]

    def threshold(self, client: int) -> int:
        return share_threshold(self.threshold_fraction, len(self._holders[client]))

    @cached_property
    def minimum(self) -> int:
        """Fewest answers any step may go on with."""
        return min((self.threshold(c) for c in self.sampled), default=1)

    @cached_property
    def session(self) -> bytes:
        """Digest binding every signature to this round's parameters: variant, round, clients, graph, and the
        ``context`` (a deployment's id) where there is one."""
        h = hashlib.sha256(b"dropsim/secagg/v1/session")
        h.update(struct.pack("<?Id", self.malicious, self.round, self.threshold_fraction))
        if self.context:
            h.update(struct.pack("<I", len(self.context)) + self.context)
        if self.prepared:  # one instance per chunk: nothing signed for one chunk is valid in another
            h.update(struct.pack("<II", self.chunk, self.chunks))
        for c in sorted(self.sampled):
            h.update(struct.pack(f"<QI{len(self.neighbours[c])}Q", c, len(self.neighbours[c]), *self.neighbours[c]))
        return h.digest()

    def survivor_view(self, u3: tuple[int, ...]) -> SurvivorView:
        """:class:`SurvivorView` of the list ``u3``, made once per list object: the simulator hands every
        client of a broadcast the same tuple, so a round of n clients does this O(n) work once, not n times
        (a decoded frame is a new tuple, and gets its own)."""
        views = self._survivor_views
        seen = views.get(id(u3))
        if seen is not None and seen[0] is u3:
            return seen[1]
        members = frozenset(u3)
        view = SurvivorView(members, tuple(sorted(u3)), members <= self.sampled_set)
        if len(views) >= 8:  # one list a round (a few with pipelined chunks): keep the latest
            views.clear()
        views[id(u3)] = (u3, view)  # the tuple is held, so its id is not reused while it is here
        return view

    @cached_property
    def _survivor_views(self) -> dict[int, tuple[tuple[int, ...], SurvivorView]]:
        return {}

    @cached_property
    def sampled_set(self) -> frozenset[int]:
        """:attr:`sampled` as a set, for checking survivor lists (:meth:`survivor_view`)."""
        return frozenset(self.sampled)

    @cached_property
    def complete(self) -> bool:
        """Whether every client neighbours every other (SecAgg)."""
        return all(len(self.neighbours[c]) == len(self.sampled) - 1 for c in self.sampled)

    def connected(self, members: AbstractSet[int]) -> bool:
        """Whether ``members`` induce a connected subgraph: then the pairwise masks among them cancel only
        in their total, and no partial sum of them can be unmasked."""
        if self.complete or len(members) <= 1:
            return True
        key = frozenset(members)
        if key not in self._connectivity:  # every client checks the same survivor set: search it once
            self._connectivity[key] = self._search(key)
        return self._connectivity[key]

    @cached_property
    def _connectivity(self) -> dict[frozenset[int], bool]:
        return {}

    def _search(self, members: frozenset[int]) -> bool:
        start = next(iter(members))
        seen, frontier = {start}, [start]
        while frontier:
            u = frontier.pop()
            for v in self.neighbours[u]:
                if v in members and v not in seen:
                    seen.add(v)
                    frontier.append(v)
        return len(seen) == len(members)

    def graph_work(self, members: int) -> Work:
        """Bookkeeping work of checking a survivor set of ``members`` clients against the graph."""
        degree = len(self.neighbours[self.sampled[0]]) if self.sampled else 0
        return Work("secagg.entries", {"count": members * (1 if self.complete else degree)})


@dataclass
class Peer:
    c_pk: Data
    s_pk: Data
    signature: Data
