r"""SecAgg (Bonawitz et al. CCS'17) and SecAgg+ (Bell et al. CCS'20) as sans-IO state machines.

The protocol is the box of Dordis Figure 5 without its XNoise parts:

0. AdvertiseKeys: each client sends two X25519 public keys (c: encryption, s: masks) [signed]. The
   server needs U1 of at least t clients and sends each one the keys of the clients it deals with.
1. ShareKeys: each client Shamir-shares its mask key s_sk and a fresh self-mask seed b among its share
   holders and encrypts each holder's pair of shares (AES-GCM under the agreed c key). U2.
2. MaskedInputCollection: each client sends y = x + PRG(b) + sum_v gamma_uv PRG(s_uv) mod 2^bits, the
   pairwise masks cancelling in the sum (gamma = +1 if u > v else -1). U3.
3. [ConsistencyCheck, malicious only: each client signs (round, U3); U4 with the signatures is sent back
   and every client verifies them, so the server cannot show different survivor sets to different
   clients.]
4. Unmasking: each client sends its shares of b for survivors and of s_sk for clients that dropped after
   sharing, never both for one client. The server reconstructs (checking each key against its public
   key), removes the self masks and the dropped clients' pairwise masks, and decodes the mean.

SecAgg+ is the same protocol on a sparse graph (:mod:`sim.protocol.graph`): a client masks with, and
shares among, only its neighbours, each neighbourhood with its own threshold. Thresholds: a client's
secrets are shared among its holders H(u) (itself and its neighbours) with ``t_u = floor(threshold *
|H(u)|) + 1``, strictly more than the fraction ``threshold`` (SecAgg: H(u) is everyone, so t = floor(threshold
* |U|) + 1; the malicious variant needs t > (|H(u)| + c)/2 with c of the holders colluding with the server,
:mod:`sim.protocol.collusion`; with none, t > |U|/2, Dordis footnote 3). The server aborts a step with
fewer than ``min_u t_u`` answers and a round whose secrets it cannot reconstruct.

Distributed DP (``SecAggConfig.private``, :mod:`sim.protocol.private`): each client's input is its DSkellam
encoding plus the noise components of its plan. Under XNoise (the underlined parts of Dordis Figure 5) a
client also Shamir-shares the seeds g_(u,k) of its removable components in its ShareKeys ciphertexts; in
Unmasking each survivor also sends its own seeds of the components every survivor removes (the indices follow
from |U \ U3|, which the client takes from the survivor set it checked, signed in the malicious variant, so
a server cannot understate dropout); and when survivors in U3 \ U5 did not answer, step 5
(ExcessiveNoiseRemoval, ``noise_removal``) collects shares of their excess seeds from U5 and reconstructs
them. The server regenerates every excess component from its seed and subtracts it before decoding.
Under rebasing (Baek et al.) y carries an unshared self mask b_y and the Unmasking answer carries
z = n' - n_0 - PRG(b_y) + PRG(b): only y + z can be unmasked, so every survivor must answer.

Misbehaving parties (see :mod:`sim.protocol.machine` for what a driver does with each error). The server
checks every value a client sends where it enters: ids in the round and in the sender's neighbourhood, key
lengths and orders, signature lengths and (malicious variant) validity before it relays them, ciphertext
and share lengths, share kinds and field elements, seed components, vector lengths and bit widths,
duplicates; anything else is a :class:`RemoteProtocolError` naming the sender, with the server unchanged.
Clients check the keys the server lists the same way. A share can still lie about the secret it belongs to:
the server reconstructs each secret from t shares and confirms it (a mask key by its advertised public key,
a seed by the parity checks of the remaining shares, :func:`sim.crypto.shamir.consistent`); when that
fails it decodes (:func:`sim.crypto.shamir.decode`), sets the liars' shares aside (``SecAggServer.liars``)
and goes on, or, if the secret cannot be determined (fewer than t + 2 shares of a seed, say), raises
:class:`~sim.protocol.machine.RoundAbortedError`. With exactly t shares of a seed a lie cannot be seen at
all: any t points fit some secret.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, ClassVar

import numpy as np

from sim.crypto import aead, shamir
from sim.crypto.randomness import RandomSource
from sim.crypto.signatures import SIGNATURE_BYTES
from sim.protocol.collusion import smallest_safe_fraction, smallest_safe_threshold, split_view_possible
from sim.protocol.encoding import FixedPoint, add_mod, sub_mod
from sim.protocol.machine import (
    SERVER,
    Aggregate,
    LocalProtocolError,
    Reaction,
    RemoteProtocolError,
    RoundAbortedError,
    RoundSetupError,
    Send,
    Work,
)
from sim.protocol.messages import (
    SHARE_OF_KEY,
    SHARE_OF_SEED,
    AdvertiseKeys,
    Ciphertexts,
    ConsistencySignature,
    KeyList,
    MaskedInput,
    RebaseAndUnmask,
    RemovalRequest,
    SeedShares,
    ShareKeys,
    SignedMaskedInput,
    SignedSurvivors,
    SignedUploads,
    Survivors,
    UnmaskShares,
    UnmaskSharesAndSeeds,
)
from sim.protocol.private import PrivateRound
from sim.protocol.suite import (
    KEY_BYTES,
    SHARE_BYTES,
    Suite,
    ciphertext_bytes,
    keys_bytes,
    plaintext_bytes,
    survivors_bytes,
    upload_bytes,
)
from sim.protocol.wire import Blank, Data, Message, ModVector, Vector

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

    @cached_property
    def complete(self) -> bool:
        """Whether every client neighbours every other (SecAgg)."""
        return all(len(self.neighbours[c]) == len(self.sampled) - 1 for c in self.sampled)

    def connected(self, members: set[int]) -> bool:
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


# ------------------------------------------------------------------------------------------------ server
def _by_secret(answered: Mapping[int, Message | None]) -> dict[tuple[int, int], dict[int, Data]]:
    """Shares of a step's answers (``(about, kind or component, share)`` triples) by secret, then holder."""
    shares: dict[tuple[int, int], dict[int, Data]] = {}
    for holder, m in answered.items():
        assert isinstance(m, UnmaskShares | SeedShares)
        for about, which, share in m.shares:
            shares.setdefault((about, which), {})[holder] = share
    return shares


@dataclass
class _Peer:
    c_pk: Data
    s_pk: Data
    signature: Data


class SecAggServer:
    """Server side of one round."""

    _STEPS: ClassVar[dict[str, tuple[type[Message], str, str]]] = {
        "advertise_keys": (AdvertiseKeys, "_on_advertise", "_close_advertise"),
        "share_keys": (ShareKeys, "_on_share", "_close_share"),
        "masked_input": (MaskedInput, "_on_masked", "_close_masked"),
        "consistency_check": (ConsistencySignature, "_on_consistency", "_close_consistency"),
        "unmasking": (UnmaskShares, "_on_unmask", "_close_unmask"),
        "noise_removal": (SeedShares, "_on_seed_shares", "_close_noise_removal"),
    }
    """Transitions as data: step -> (message it collects, handler, closer)."""

    def __init__(self, config: SecAggConfig, suite: Suite) -> None:
        self.config = config
        self.suite = suite
        self.step = "advertise_keys"
        self.outcome = ""
        self.aggregate: Aggregate | None = None
        self._expected: set[int] = set(config.sampled)
        self._received: dict[int, Message | None] = {}
        self.u1: dict[int, _Peer] = {}
        self.u2: dict[int, dict[int, Data]] = {}
        self.u3: set[int] = set()
        self.total: Vector = Blank(config.dim, np.uint32)
        """Sum mod 2^bits of the masked inputs received so far."""
        self.u4: dict[int, Data] = {}
        self.u5: set[int] = set()
        self.upload_signatures: dict[int, Data] = {}
        self.exposed: int | None = None
        """Survivors whose noisy sum was unmasked (set even if the round then aborts in noise removal: that
        sum was revealed to the server and must be accounted)."""
        self.removed: tuple[int, ...] = ()
        """Noise components removed from every survivor (XNoise)."""
        self.liars: dict[int, str] = {}
        """Clients whose shares contradicted the other holders' while reconstructing, with what they sent: their
        shares were set aside. (The dealer of a secret may also have dealt a holder a wrong share: SecAgg's
        shares are not verifiable, so this names whom the shares point to, for this round only.)"""
        self._advertised: dict[Data, int] = {}
        """Public keys advertised so far, and by whom."""
        self._signed_u3 = b""
        """What each survivor signs in the consistency check (malicious variant)."""

    # -- driver interface -------------------------------------------------------------------------
    def begin(self) -> Reaction:
        return Reaction()

    def expected(self) -> frozenset[int]:
        if self.step in ("done", "aborted"):
            return frozenset()
        return frozenset(self._expected - self._received.keys())

    def receive(self, sender: int, message: Message) -> Reaction:
        if self.step not in self._STEPS:
            raise RemoteProtocolError(sender, f"sent {type(message).__name__} after the round ended ({self.step})")
        kind, handler, _ = self._STEPS[self.step]
        if not isinstance(message, kind):
            raise RemoteProtocolError(sender, f"sent {type(message).__name__} in step {self.step}, not {kind.__name__}")
        if sender not in self._expected:
            raise RemoteProtocolError(sender, f"is not expected in step {self.step}")
        if sender in self._received:
            raise RemoteProtocolError(sender, f"sent a second {kind.__name__}")
        if getattr(message, "round", None) != self.config.round:
            raise RemoteProtocolError(sender, f"sent a message for round {getattr(message, 'round', None)}")
        claimed = getattr(message, "client", sender)
        if claimed != sender:
            raise RemoteProtocolError(sender, f"sent a message claiming to be client {claimed}")
        work: list[Work] = getattr(self, handler)(sender, message)
        # A masked input is summed on arrival (_on_masked); keep only that it came, not its vector.
        self._received[sender] = None if isinstance(message, MaskedInput) else message
        return Reaction(work=tuple(work))

    def close_step(self) -> Reaction:
        if self.step not in self._STEPS:
            raise LocalProtocolError(f"close_step called in state {self.step}")
        _, _, closer = self._STEPS[self.step]
        answered = dict(sorted(self._received.items()))
        self._received = {}
        if len(answered) < self.config.minimum:
            return self._abort(
                f"{self.step}: {len(answered)} of {len(self._expected)} clients answered, "
                f"threshold {self.config.minimum}"
            )
        known = len(self.liars)
        reaction: Reaction = getattr(self, closer)(answered)
        if len(self.liars) > known:  # shares outvoted while reconstructing: the driver reports their senders
            reaction = Reaction(reaction.sends, reaction.work, tuple(list(self.liars.items())[known:]))
        return reaction

    # Closers receive {client: message} of the step's answers, in client order (None for masked inputs).

    def _abort(self, reason: str) -> Reaction:
        self.step = "aborted"
        self.outcome = f"aborted: {reason}"
        return Reaction()

    def _fail(self, reason: str, suspects: tuple[int, ...]) -> RoundAbortedError:
        """Abort for what the clients sent (not for dropout); the error to raise (see :mod:`sim.protocol.machine`)."""
        self._abort(reason)
        return RoundAbortedError(reason, suspects)

    def _recover(
        self, step: str, what: str, have: dict[int, Data], t: int, check: Callable[[Data], bool] | None = None
    ) -> Data:
        """The secret ``what`` from the holders' shares ``have`` (at least ``t``), liars outvoted and blamed;
        :class:`RoundAbortedError` when the lie cannot be outvoted."""
        holders = sorted(have)
        found = self.suite.recover(holders, [have[h] for h in holders], t, check, self.liars)
        self._blame(found.liars, what)
        if found.secret is None:
            raise self._fail(
                f"{step}: the {len(have)} shares of {what} contradict each other and the lie cannot be outvoted "
                f"(threshold {t}; set aside: {list(found.liars)})",
                found.liars,
            )
        return found.secret

    def _blame(self, liars: tuple[int, ...], what: str) -> None:
        for c in liars:
            self.liars.setdefault(c, f"sent a share of {what} that contradicts the other holders' shares")

    def _is_key_of(self, public: Data, key: Data) -> bool:
        return self.suite.public_of(key) == public

    # -- step 0 -----------------------------------------------------------------------------------
    def _on_advertise(self, sender: int, m: AdvertiseKeys) -> list[Work]:
        cfg, suite = self.config, self.suite
        for name, key in (("c_pk", m.c_pk), ("s_pk", m.s_pk)):
            if len(key) != KEY_BYTES:
                raise BadKeyError(sender, f"advertised a {name} of {len(key)} bytes, expected {KEY_BYTES}")
            if not suite.valid_key(key):
                raise BadKeyError(sender, f"advertised a {name} of low order (X25519 with it gives a zero secret)")
        want = SIGNATURE_BYTES if cfg.malicious else 0
        if len(m.signature) != want:
            raise RemoteProtocolError(
                sender, f"advertised its keys with a signature of {len(m.signature)} bytes, not {want}"
            )
        if suite.full:  # a key repeated in a key list makes every client that receives it refuse the list
            if m.c_pk == m.s_pk:
                raise BadKeyError(sender, "advertised the same key twice (as c_pk and s_pk)")
            for key in (m.c_pk, m.s_pk):
                if key in self._advertised:
                    raise BadKeyError(sender, f"advertised keys that client {self._advertised[key]} advertised")
        if cfg.malicious:  # relayed, a bad signature would make every client refuse the key list
            signed = keys_bytes(cfg.session, cfg.round, sender, m.c_pk, m.s_pk)
            verification = cfg.verification_keys.get(sender)
            if verification is None or not suite.verify(verification, signed, m.signature):
                raise BadSignatureError(sender, "advertised keys with a signature that does not verify")
        if suite.full:
            self._advertised[m.c_pk] = self._advertised[m.s_pk] = sender
        return []

    def _close_advertise(self, answered: dict[int, Message | None]) -> Reaction:
        for c, m in answered.items():
            assert isinstance(m, AdvertiseKeys)
            self.u1[c] = _Peer(m.c_pk, m.s_pk, m.signature)
        sends = []
        listed = 0
        for c in self.u1:
            entries = tuple(
                (v, self.u1[v].c_pk, self.u1[v].s_pk, self.u1[v].signature)
                for v in self.config.holders(c)
                if v in self.u1
            )
            listed += len(entries)
            sends.append(Send(c, KeyList(self.config.round, entries)))
        self.step, self._expected = "share_keys", set(self.u1)
        return Reaction(sends=tuple(sends), work=(Work("secagg.entries", {"count": listed}),))

    # -- step 1 -----------------------------------------------------------------------------------
    def _on_share(self, sender: int, m: ShareKeys) -> list[Work]:
        receivers = [v for v, _ in m.ciphertexts]
        if (
            len(set(receivers)) != len(receivers)
            or sender in receivers
            or not all(self.config.holds(v, sender) and v in self.u1 for v in receivers)
        ):
            raise RemoteProtocolError(sender, "sent ciphertexts for clients that are not its share holders")
        size = ciphertext_bytes(2 + self.config.shared_noise)
        for v, ct in m.ciphertexts:
            if len(ct) != size:  # its receiver would refuse it, blaming the server
                raise RemoteProtocolError(sender, f"sent client {v} a ciphertext of {len(ct)} bytes, not {size}")
        return [Work("secagg.entries", {"count": len(receivers)})]

    def _close_share(self, answered: dict[int, Message | None]) -> Reaction:
        inbox: dict[int, list[tuple[int, Data]]] = {c: [] for c in answered}
        for sender, m in answered.items():
            assert isinstance(m, ShareKeys)
            self.u2[sender] = dict(m.ciphertexts)
            for receiver, ct in m.ciphertexts:
                if receiver in inbox:
                    inbox[receiver].append((sender, ct))
        sends = tuple(Send(c, Ciphertexts(self.config.round, tuple(sorted(cts)))) for c, cts in inbox.items())
        self.step, self._expected = "masked_input", set(self.u2)
        routed = sum(len(cts) for cts in inbox.values())
        return Reaction(sends=sends, work=(Work("secagg.entries", {"count": routed}),))

    # -- step 2 -----------------------------------------------------------------------------------
    def _on_masked(self, sender: int, m: MaskedInput) -> list[Work]:
        if m.y.bits != self.config.bits or m.y.length != self.config.dim:
            raise RemoteProtocolError(sender, f"sent a masked input of {m.y.length} values of {m.y.bits} bits")
        if self.suite.full and not isinstance(m.y.values, np.ndarray):
            raise RemoteProtocolError(sender, "sent a masked input without its values")
        cfg = self.config
        if cfg.signed_uploads:
            if not isinstance(m, SignedMaskedInput):
                raise RemoteProtocolError(sender, "sent its masked input without the upload signature")
            key = cfg.verification_keys.get(sender)
            if key is None or not self.suite.verify(key, upload_bytes(cfg.session, cfg.round, sender), m.signature):
                raise BadSignatureError(sender, "sent an upload signature that does not verify")
            self.upload_signatures[sender] = m.signature
        if self.suite.full:
            if isinstance(self.total, Blank):
                self.total = np.zeros(self.config.dim, dtype=np.uint32)
            self.total = add_mod(self.total, m.y.values, self.config.bits)  # type: ignore[arg-type]
        return [Work("vector.add", {"elements": self.config.dim})]

    def _close_masked(self, answered: dict[int, Message | None]) -> Reaction:
        cfg = self.config
        self.u3 = set(answered)
        survivors = tuple(sorted(self.u3))
        work = (cfg.graph_work(len(survivors)),)
        # Go on only if the sum can be unmasked as a whole: survivors connected (else clients refuse, and
        # rightly: partial sums would be exposed) and every secret still held by enough survivors.
        if not cfg.connected(self.u3):
            reason = "the survivors are not connected in the graph (partial sums would be exposed)"
            return Reaction(work=work + self._abort(f"masked_input: {reason}").work)
        for v in sorted(self.u2):
            holding = sum(1 for h in cfg.holders(v) if h in self.u3)
            if holding < cfg.threshold(v):
                what = "mask seed" if v in self.u3 else "mask key"
                return Reaction(
                    work=work
                    + self._abort(
                        f"masked_input: {holding} survivors hold shares of client {v}'s {what}, threshold "
                        f"{cfg.threshold(v)}"
                    ).work
                )
        if cfg.private is not None and cfg.private.admit is not None:
            refused = cfg.private.admit(len(survivors))
            if refused:
                return Reaction(work=work + self._abort(f"masked_input: {refused}").work)
        request: Survivors = Survivors(cfg.round, survivors)
        if cfg.signed_uploads:
            request = SignedUploads(cfg.round, survivors, tuple(self.upload_signatures[c] for c in survivors))
        self.step = "consistency_check" if cfg.malicious else "unmasking"
        self._expected = set(survivors)
        if cfg.malicious:
            self._signed_u3 = survivors_bytes(cfg.session, cfg.round, survivors)
        return Reaction(sends=tuple(Send(c, request) for c in survivors), work=work)

    # -- step 3 (malicious) -----------------------------------------------------------------------
    def _on_consistency(self, sender: int, m: ConsistencySignature) -> list[Work]:
        # Relayed, a bad signature would make every client that checks it leave, blaming the server.
        key = self.config.verification_keys.get(sender)
        if key is None or not self.suite.verify(key, self._signed_u3, m.signature):
            raise BadSignatureError(sender, "sent a consistency signature that does not verify for the survivor set")
        return []

    def _close_consistency(self, answered: dict[int, Message | None]) -> Reaction:
        cfg = self.config
        for c, m in answered.items():
            assert isinstance(m, ConsistencySignature)
            self.u4[c] = m.signature
        sends, listed = [], 0
        everyone = SignedSurvivors(cfg.round, tuple(self.u4.items())) if cfg.complete else None
        for c in self.u4:
            if everyone is not None:
                request = everyone
            else:  # the signers a client checks: the holders of every client it holds shares of
                wanted = {h for x in cfg.holders(c) for h in cfg.holders(x)}
                request = SignedSurvivors(cfg.round, tuple((v, sig) for v, sig in self.u4.items() if v in wanted))
            listed += len(request.signatures)
            sends.append(Send(c, request))
        self.step, self._expected = "unmasking", set(self.u4)
        return Reaction(sends=tuple(sends), work=(Work("secagg.entries", {"count": listed}),))

    # -- step 4 -----------------------------------------------------------------------------------
    def _on_unmask(self, sender: int, m: UnmaskShares) -> list[Work]:
        seen = set()
        for about, kind, share in m.shares:
            if about in seen:
                raise RemoteProtocolError(sender, f"sent two shares about client {about}")
            seen.add(about)
            if about not in self.u2 or not self.config.holds(sender, about):  # u2 first: ids outside the round
                raise RemoteProtocolError(sender, f"sent a share about client {about}, which it does not hold")
            want = SHARE_OF_SEED if about in self.u3 else SHARE_OF_KEY
            if kind != want:
                raise RemoteProtocolError(sender, f"sent a share of kind {kind} about client {about}, expected {want}")
            if len(share) != SHARE_BYTES:
                raise RemoteProtocolError(sender, f"sent a share of {len(share)} bytes, expected {SHARE_BYTES}")
        if not self.suite.valid_shares([share for _, _, share in m.shares]):
            raise RemoteProtocolError(sender, f"sent a share that is not {SECRET_ELEMENTS} elements of GF(2^31 - 1)")
        private = self.config.private
        if private is not None and private.removing:
            if not isinstance(m, UnmaskSharesAndSeeds):
                raise RemoteProtocolError(sender, "sent no noise seeds with its shares")
            wanted = self.config.excess(len(self.u3))
            if tuple(k for k, _ in m.seeds) != wanted or any(len(g) != 32 for _, g in m.seeds):
                raise RemoteProtocolError(
                    sender, f"sent seeds of components {[k for k, _ in m.seeds]}, not {list(wanted)}"
                )
            if self.suite.full and not all(isinstance(g, bytes) for _, g in m.seeds):
                raise RemoteProtocolError(sender, "sent noise seeds without their bytes")
        if private is not None and private.rebasing:
            if not isinstance(m, RebaseAndUnmask):
                raise RemoteProtocolError(sender, "sent no rebased noise with its shares")
            if m.z.bits != self.config.bits or m.z.length != self.config.dim:
                raise RemoteProtocolError(sender, f"sent a rebasing vector of {m.z.length} values of {m.z.bits} bits")
            if self.suite.full and not isinstance(m.z.values, np.ndarray):
                raise RemoteProtocolError(sender, "sent a rebasing vector without its values")
            if self.suite.full:
                self.total = add_mod(self.total, m.z.values, self.config.bits)  # type: ignore[arg-type]
            return [Work("secagg.entries", {"count": len(m.shares)}), Work("vector.add", {"elements": self.config.dim})]
        return [Work("secagg.entries", {"count": len(m.shares)})]

    def _close_unmask(self, answered: dict[int, Message | None]) -> Reaction:
        cfg, suite = self.config, self.suite
        shares = _by_secret(answered)
        work: list[Work] = []
        survivors = sorted(self.u3)
        dropped = sorted(set(self.u2) - self.u3)
        private = cfg.private
        if private is not None and private.rebasing and set(answered) != self.u3:
            missing = sorted(self.u3 - set(answered))
            return self._abort(
                f"unmasking: survivors {missing} dropped before rebasing their noise; rebasing cannot remove "
                "their first noise, and unmasking without it would expose an under-noised sum"
            )

        def secret(about: int, kind: int) -> Data | None:
            """The secret from t shares, checked by the rest or by its public key; None if too few answered."""
            have = shares.get((about, kind), {})
            t = cfg.threshold(about)
            if len(have) < t:
                return None
            work.append(Work("shamir.reconstruct", {"secrets": 1, "shares": t, "elements": SECRET_ELEMENTS * t}))
            # A reconstructed key must match the public key its client advertised.
            check = partial(self._is_key_of, self.u1[about].s_pk) if kind == SHARE_OF_KEY else None
            what = f"client {about}'s {'mask key' if kind == SHARE_OF_KEY else 'mask seed'}"
            return self._recover("unmasking", what, have, t, check)

        total = self.total
        for u in survivors:
            b = secret(u, SHARE_OF_SEED)
            if b is None:
                return self._abort(f"unmasking: too few shares to recover client {u}'s mask seed")
            mask = suite.self_mask(b, cfg.dim, cfg.bits)
            work += [Work("prg.expand", {"elements": cfg.dim}), Work("vector.add", {"elements": cfg.dim})]
            if suite.full:
                total = sub_mod(total, mask, cfg.bits)  # type: ignore[arg-type]
        for v in dropped:
            s_sk = secret(v, SHARE_OF_KEY)
            if s_sk is None:
                return self._abort(f"unmasking: too few shares to recover dropped client {v}'s mask key")
            work.append(Work("x25519.public", {"count": 1}))  # done in secret(): the key matched its public key
            for u in (u for u in cfg.neighbours[v] if u in self.u3):
                mask = suite.pair_mask(s_sk, self.u1[u].s_pk, cfg.round, u, v, cfg.dim, cfg.bits)
                work += [
                    Work("x25519.agree", {"count": 1}),
                    Work("prg.expand", {"elements": cfg.dim}),
                    Work("vector.add", {"elements": cfg.dim}),
                ]
                if suite.full:  # y_u holds gamma_uv * PRG(s_uv) with gamma_uv = +1 if u > v else -1
                    total = sub_mod(total, mask, cfg.bits) if u > v else add_mod(total, mask, cfg.bits)  # type: ignore[arg-type]
        self.total = total
        self.exposed = len(survivors)
        self.u5 = set(answered)
        self.removed = cfg.excess(len(survivors))
        if self.removed:
            for u in sorted(self.u5):
                message = answered[u]
                assert isinstance(message, UnmaskSharesAndSeeds)
                work += self._remove(u, [g for _, g in message.seeds])
            missing = sorted(self.u3 - self.u5)
            if missing:
                # Stage 5: the seeds of survivors that did not answer come from shares held by U5.
                self.step, self._expected = "noise_removal", set(self.u5)
                request = RemovalRequest(cfg.round, tuple(sorted(self.u5)))
                return Reaction(sends=tuple(Send(c, request) for c in sorted(self.u5)), work=tuple(work))
        return self._finish(work)

    def _remove(self, u: int, seeds: list[Data]) -> list[Work]:
        """Subtract survivor ``u``'s excess noise components, regenerated from their seeds."""
        private = self.config.private
        assert private is not None
        if self.suite.full:
            assert isinstance(self.total, np.ndarray)
            values = self.total.astype(np.int64)
            for k, g in zip(self.removed, seeds, strict=True):
                assert isinstance(g, bytes)
                values -= private.component(g, k)
            self.total = private.wrap(values)
        return [private.noise_work(len(self.removed)), Work("vector.add", {"elements": self.config.dim})]

    def _finish(self, work: list[Work]) -> Reaction:
        cfg, survivors = self.config, tuple(sorted(self.u3))
        private = cfg.private
        if cfg.prepared:  # the driver decodes the concatenation of every chunk's sum
            self.aggregate = Aggregate(self.total, survivors, float(len(survivors)))
            self.step, self.outcome = "done", "ok"
            return Reaction(work=tuple(work))
        work += [Work("decode.fixed_point", {"elements": cfg.dim})] if private is None else list(private.decode_work())
        vector: Vector = Blank(cfg.dim if private is None else private.encoding.dim, np.float32)
        if self.suite.full:
            assert isinstance(self.total, np.ndarray)
            decoder = cfg.encoding if private is None else private
            vector = decoder.decode_mean(self.total, len(survivors))
        self.aggregate = Aggregate(vector, survivors, float(len(survivors)))
        self.step, self.outcome = "done", "ok"
        return Reaction(work=tuple(work))

    # -- step 5 (XNoise's ExcessiveNoiseRemoval) ----------------------------------------------------
    def _on_seed_shares(self, sender: int, m: SeedShares) -> list[Work]:
        missing = self.u3 - self.u5
        seen = set()
        for about, k, share in m.shares:
            if (about, k) in seen or about not in missing or k not in self.removed:
                raise RemoteProtocolError(sender, f"sent a share of seed {k} of client {about}, which was not asked")
            if not self.config.holds(sender, about):
                raise RemoteProtocolError(sender, f"sent a share about client {about}, which it does not hold")
            if len(share) != SHARE_BYTES:
                raise RemoteProtocolError(sender, f"sent a share of {len(share)} bytes, expected {SHARE_BYTES}")
            seen.add((about, k))
        if not self.suite.valid_shares([share for _, _, share in m.shares]):
            raise RemoteProtocolError(sender, f"sent a share that is not {SECRET_ELEMENTS} elements of GF(2^31 - 1)")
        return [Work("secagg.entries", {"count": len(m.shares)})]

    def _close_noise_removal(self, answered: dict[int, Message | None]) -> Reaction:
        cfg = self.config
        shares = _by_secret(answered)
        work: list[Work] = []
        for u in sorted(self.u3 - self.u5):
            t = cfg.threshold(u)
            seeds = []
            for k in self.removed:
                have = shares.get((u, k), {})
                if len(have) < t:
                    return self._abort(f"noise_removal: too few shares to recover survivor {u}'s noise seed {k}")
                seeds.append(self._recover("noise_removal", f"survivor {u}'s noise seed {k}", have, t))
            work.append(
                Work(
                    "shamir.reconstruct",
                    {"secrets": len(self.removed), "shares": t, "elements": SECRET_ELEMENTS * t * len(self.removed)},
                )
            )
            work += self._remove(u, seeds)
        return self._finish(work)


# ------------------------------------------------------------------------------------------------ client
class SecAggClient:
    """Client side of one round."""

    first_step = "advertise_keys"

    def __init__(
        self,
        config: SecAggConfig,
        client: int,
        suite: Suite,
        rng: RandomSource,
        encoding_rng: np.random.Generator | None,
        signing_key: Data | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.suite = suite
        self.rng = rng
        self.encoding_rng = encoding_rng
        self.signing_key = signing_key
        self.state = "new"
        self.x: Vector = Blank(config.dim, np.uint32)
        self.c_sk: Data = b""
        self.s_sk: Data = b""
        self.b: Data = b""
        self.peers: dict[int, _Peer] = {}
        self.ciphertexts: dict[int, Data] = {}
        self.u3: tuple[int, ...] = ()
        self._own: tuple[Data, Data] = (b"", b"")
        self.own_keys: tuple[Data, Data] = (b"", b"")
        """This client's advertised (c_pk, s_pk)."""
        """This client's own shares of its s_sk and b (it holds one of each)."""
        self.finished = False
        self.noise_seeds: list[Data] = []
        """Seeds g_(u,0..R) of this client's noise components (distributed DP)."""
        self.mask_seed: Data = b""
        """Seed of the self mask in y: b, or under rebasing an unshared b_y."""
        self.noise_shares: dict[int, tuple[Data, ...]] = {}
        """Shares this client holds of other clients' noise seeds g_(v,1..R) (XNoise)."""

    _EXPECTS: ClassVar[dict[str, tuple[type[Message], str]]] = {
        "keys": (KeyList, "_on_keys"),
        "ciphertexts": (Ciphertexts, "_on_ciphertexts"),
        "survivors": (Survivors, "_on_survivors"),
        "signatures": (SignedSurvivors, "_on_signatures"),
        "removal": (RemovalRequest, "_on_removal"),
    }
    """Transitions as data: state -> (message it accepts, handler)."""

    def stage_of(self, message: Message) -> str:
        """The protocol step that handling ``message`` performs (for dropout at a stage)."""
        if isinstance(message, KeyList):
            return "share_keys"
        if isinstance(message, Ciphertexts):
            return "masked_input"
        if isinstance(message, Survivors):
            return "consistency_check" if self.config.malicious else "unmasking"
        if isinstance(message, RemovalRequest):
            return "noise_removal"
        return "unmasking"

    def start(self, update: Vector, weight: float) -> Reaction:
        if self.state != "new":
            raise LocalProtocolError(f"start called in state {self.state}")
        cfg, suite, private = self.config, self.suite, self.config.private
        if private is None:
            work = [] if cfg.prepared else [Work("encode.fixed_point", {"elements": cfg.dim})]
        else:
            work = list(private.add_noise_work() if cfg.prepared else private.encode_work())
            self.noise_seeds = [suite.seed(self.rng) for _ in private.plan.components]
        work.append(Work("x25519.keygen", {"count": 2}))
        if suite.full:
            assert isinstance(update, np.ndarray)
            if cfg.prepared:
                if update.shape != (cfg.dim,):
                    raise LocalProtocolError(f"chunk {cfg.chunk} needs {cfg.dim} encoded values, not {update.shape}")
                self.x = update if private is None else private.add_noise(update, self.noise_seeds)  # type: ignore[arg-type]
            elif private is None:
                assert self.encoding_rng is not None
                self.x = cfg.encoding.encode(update, self.encoding_rng)
            else:
                assert self.encoding_rng is not None
                self.x = private.encode(update, self.encoding_rng, self.noise_seeds)  # type: ignore[arg-type]
        self.c_sk, c_pk = suite.keypair(self.rng)
        self.s_sk, s_pk = suite.keypair(self.rng)
        self.own_keys = (c_pk, s_pk)
        signature: Data = b""
        if cfg.malicious:
            assert self.signing_key is not None
            signature = suite.sign(self.signing_key, keys_bytes(cfg.session, cfg.round, self.client, c_pk, s_pk))
            work.append(Work("ed25519.sign", {"count": 1}))
        self.state = "keys"
        message = AdvertiseKeys(cfg.round, self.client, c_pk, s_pk, signature)
        return Reaction(sends=(Send(SERVER, message),), work=tuple(work))

    def receive(self, message: Message) -> Reaction:
        if self.state not in self._EXPECTS:
            raise RemoteProtocolError(SERVER, f"sent {type(message).__name__} in state {self.state}")
        kind, handler = self._EXPECTS[self.state]
        if not isinstance(message, kind):
            raise RemoteProtocolError(SERVER, f"sent {type(message).__name__}, expected {kind.__name__}")
        if getattr(message, "round", None) != self.config.round:
            raise RemoteProtocolError(SERVER, f"sent a message for round {getattr(message, 'round', None)}")
        step: Callable[[Any], Reaction] = getattr(self, handler)
        return step(message)

    # -- stage 1 ----------------------------------------------------------------------------------
    def _on_keys(self, m: KeyList) -> Reaction:
        cfg, suite, me = self.config, self.suite, self.client
        holders = set(cfg.holders(me))
        peers = {v: _Peer(c_pk, s_pk, sig) for v, c_pk, s_pk, sig in m.entries}
        if len(peers) != len(m.entries) or not set(peers) <= holders or me not in peers:
            raise InconsistentViewError(SERVER, "the key list is not a set of this client's holders including itself")
        t = cfg.threshold(me)
        if len(peers) < t:
            raise TooFewClientsError(SERVER, f"key list of {len(peers)} clients, threshold {t}")
        work: list[Work] = []
        if suite.full:
            keys = [p.c_pk for p in peers.values()] + [p.s_pk for p in peers.values()]
            if len(set(keys)) != len(keys):
                raise InconsistentViewError(SERVER, "the key list repeats a public key")
            if (peers[me].c_pk, peers[me].s_pk) != self.own_keys:
                raise InconsistentViewError(SERVER, "the key list shows other keys for this client")
        for v, p in peers.items():
            for name, key in (("c_pk", p.c_pk), ("s_pk", p.s_pk)):
                if not suite.valid_key(key):  # X25519 with a low-order key gives a zero secret
                    raise BadKeyError(SERVER, f"the key list gives client {v}'s {name} malformed or of low order")
        if cfg.malicious:
            work.append(Work("ed25519.verify", {"count": len(peers)}))
            for v, p in peers.items():
                signed = keys_bytes(cfg.session, cfg.round, v, p.c_pk, p.s_pk)
                if not suite.verify(cfg.verification_keys[v], signed, p.signature):
                    raise BadSignatureError(SERVER, f"client {v}'s advertised keys carry an invalid signature")
        self.peers = peers
        order = sorted(peers)
        self.b = suite.seed(self.rng)
        rebasing = cfg.private is not None and cfg.private.rebasing
        self.mask_seed = suite.seed(self.rng) if rebasing else self.b
        s_shares = suite.share(self.s_sk, t, order, self.rng)
        b_shares = suite.share(self.b, t, order, self.rng)
        extra = cfg.shared_noise
        g_shares = suite.share_many(self.noise_seeds[1:], t, order, self.rng) if extra else [[] for _ in order]
        secrets = 2 + extra
        work.append(
            Work(
                "shamir.share",
                {"secrets": secrets, "holders": len(order), "products": secrets * SECRET_ELEMENTS * len(order) * t},
            )
        )
        ciphertexts = []
        for v, s_share, b_share, g in zip(order, s_shares, b_shares, g_shares, strict=True):
            if v == me:
                self._own = (s_share, b_share)
                self.noise_shares[me] = tuple(g)
                continue
            sealed = suite.seal(self.c_sk, peers[v].c_pk, cfg.round, me, v, [s_share, b_share, *g], self.rng)
            ciphertexts.append((v, sealed))
        work += [
            Work("x25519.agree", {"count": len(ciphertexts)}),
            Work("aead.seal", {"count": len(ciphertexts), "bytes": len(ciphertexts) * plaintext_bytes(secrets)}),
        ]
        self.state = "ciphertexts"
        return Reaction(sends=(Send(SERVER, ShareKeys(cfg.round, me, tuple(ciphertexts))),), work=tuple(work))

    # -- stage 2 ----------------------------------------------------------------------------------
    def _on_ciphertexts(self, m: Ciphertexts) -> Reaction:
        cfg, suite, me = self.config, self.suite, self.client
        senders = [v for v, _ in m.ciphertexts]
        if len(set(senders)) != len(senders) or not set(senders) <= set(self.peers) - {me}:
            raise InconsistentViewError(SERVER, "ciphertexts from clients that are not this client's share holders")
        t = cfg.threshold(me)
        if len(senders) + 1 < t:
            raise TooFewClientsError(SERVER, f"ciphertexts from {len(senders)} clients, threshold {t}")
        self.ciphertexts = dict(m.ciphertexts)
        y = self.x
        work = [Work("prg.expand", {"elements": cfg.dim}), Work("vector.add", {"elements": cfg.dim})]
        mask = suite.self_mask(self.mask_seed, cfg.dim, cfg.bits)
        if suite.full:
            y = add_mod(y, mask, cfg.bits)  # type: ignore[arg-type]
        for v in sorted(self.ciphertexts):
            if v not in cfg.neighbours[me]:
                continue
            mask = suite.pair_mask(self.s_sk, self.peers[v].s_pk, cfg.round, me, v, cfg.dim, cfg.bits)
            work += [
                Work("x25519.agree", {"count": 1}),
                Work("prg.expand", {"elements": cfg.dim}),
                Work("vector.add", {"elements": cfg.dim}),
            ]
            if suite.full:
                y = add_mod(y, mask, cfg.bits) if me > v else sub_mod(y, mask, cfg.bits)  # type: ignore[arg-type]
        self.state = "survivors"
        self.x = Blank(cfg.dim, np.uint32)  # the input is no longer needed; free it
        message = MaskedInput(cfg.round, me, ModVector(cfg.bits, y))
        if cfg.signed_uploads:
            assert self.signing_key is not None
            signature = suite.sign(self.signing_key, upload_bytes(cfg.session, cfg.round, me))
            message = SignedMaskedInput(cfg.round, me, ModVector(cfg.bits, y), signature)
            work.append(Work("ed25519.sign", {"count": 1}))
        return Reaction(sends=(Send(SERVER, message),), work=tuple(work))

    # -- stage 3 / 4 ------------------------------------------------------------------------------
    def _check_survivors(self, u3: tuple[int, ...]) -> None:
        cfg, me = self.config, self.client
        known = set(self.ciphertexts) | {me}
        if len(set(u3)) != len(u3) or me not in u3:
            raise InconsistentViewError(SERVER, "the survivor set repeats a client or leaves this client out")
        if not set(u3) <= set(cfg.sampled):
            raise InconsistentViewError(SERVER, "the survivor set names clients that were not sampled")
        if cfg.complete and not set(u3) <= known:
            # Every survivor must have shared with everyone (U3 within U2, Figure 5).
            raise InconsistentViewError(
                SERVER, "the survivor set names a client that never sent this client its shares"
            )
        if not {v for v in u3 if v in self.peers} <= known:
            raise InconsistentViewError(
                SERVER, "the survivor set names a holder that never sent this client its shares"
            )
        if len(u3) < cfg.minimum:
            raise TooFewClientsError(SERVER, f"{len(u3)} survivors, threshold {cfg.minimum}")
        members = set(u3)
        mine = sum(1 for h in cfg.holders(me) if h in members)
        if mine < cfg.threshold(me):
            raise TooFewClientsError(SERVER, f"{mine} of this client's holders survive, threshold {cfg.threshold(me)}")
        if not cfg.connected(members):
            raise InconsistentViewError(SERVER, "the survivors are not connected: a partial sum could be unmasked")

    def _on_survivors(self, m: Survivors) -> Reaction:
        cfg = self.config
        self._check_survivors(m.clients)
        checks = [cfg.graph_work(len(m.clients))]
        if cfg.signed_uploads:
            # |U \ U3| decides which noise is removed: every claimed survivor must have signed its upload.
            if not isinstance(m, SignedUploads) or len(m.signatures) != len(m.clients):
                raise InconsistentViewError(SERVER, "the survivor set comes without every member's upload signature")
            for v, signature in zip(m.clients, m.signatures, strict=True):
                if not self.suite.verify(cfg.verification_keys[v], upload_bytes(cfg.session, cfg.round, v), signature):
                    raise BadSignatureError(SERVER, f"client {v}'s upload signature does not verify")
            checks.append(Work("ed25519.verify", {"count": len(m.clients)}))
        self.u3 = tuple(sorted(m.clients))
        if not cfg.malicious:
            reaction = self._unmask()
            return Reaction(reaction.sends, (*checks, *reaction.work))
        assert self.signing_key is not None
        signature = self.suite.sign(self.signing_key, survivors_bytes(cfg.session, cfg.round, self.u3))
        self.state = "signatures"
        reply = ConsistencySignature(cfg.round, self.client, signature)
        return Reaction(sends=(Send(SERVER, reply),), work=(*checks, Work("ed25519.sign", {"count": 1})))

    def _on_signatures(self, m: SignedSurvivors) -> Reaction:
        cfg, suite = self.config, self.suite
        signers = [v for v, _ in m.signatures]
        if len(set(signers)) != len(signers) or not set(signers) <= set(self.u3):
            raise InconsistentViewError(SERVER, "consistency signatures from clients outside the survivor set")
        message = survivors_bytes(cfg.session, cfg.round, self.u3)
        for v, signature in m.signatures:
            if not suite.verify(cfg.verification_keys[v], message, signature):
                raise BadSignatureError(SERVER, f"client {v}'s signature does not match this client's survivor set")
        # Every client this one will release a share about must have at least t of its own holders confirm
        # the same survivor set (Bonawitz et al. 5.1's |U4| >= t, per neighbourhood for SecAgg+): with
        # t > (holders + colluders)/2, which SecAggConfig enforces, two views cannot both gather t.
        confirmed = set(signers)
        for x in (self.client, *self.ciphertexts):
            count = sum(1 for h in cfg.holders(x) if h in confirmed)
            if count < cfg.threshold(x):
                raise TooFewClientsError(
                    SERVER, f"{count} of client {x}'s holders confirmed the survivor set, threshold {cfg.threshold(x)}"
                )
        reaction = self._unmask()
        return Reaction(reaction.sends, (Work("ed25519.verify", {"count": len(signers)}), *reaction.work))

    def _unmask(self) -> Reaction:
        cfg, suite, me = self.config, self.suite, self.client
        survivors = set(self.u3)
        shares: list[tuple[int, int, Data]] = []
        shares.append((me, SHARE_OF_SEED, self._own[1]))
        count = 2 + cfg.shared_noise
        for v in sorted(self.ciphertexts):
            try:
                opened = suite.open(self.c_sk, self.peers[v].c_pk, cfg.round, v, me, self.ciphertexts[v], count)
            except aead.DecryptionError as exc:
                raise BadCiphertextError(SERVER, f"the ciphertext from client {v}: {exc}") from None
            if v in survivors:
                shares.append((v, SHARE_OF_SEED, opened.b_share))
                self.noise_shares[v] = opened.noise
            else:
                shares.append((v, SHARE_OF_KEY, opened.s_share))
        opened_bytes = len(self.ciphertexts) * plaintext_bytes(count)
        work = [
            Work("x25519.agree", {"count": len(self.ciphertexts)}),
            Work("aead.open", {"count": len(self.ciphertexts), "bytes": opened_bytes}),
        ]
        self.state, self.finished = "done", True
        message: UnmaskShares
        private = cfg.private
        if private is not None and private.removing:
            excess = cfg.excess(len(self.u3))
            message = UnmaskSharesAndSeeds(
                cfg.round, me, tuple(shares), tuple((k, self.noise_seeds[k]) for k in excess)
            )
            if excess:  # the server may still ask for shares of other survivors' excess seeds
                self.state, self.finished = "removal", False
        elif private is not None and private.rebasing:
            z, rebase_work = self._rebase(private)
            work += rebase_work
            message = RebaseAndUnmask(cfg.round, me, tuple(shares), ModVector(cfg.bits, z))
        else:
            message = UnmaskShares(cfg.round, me, tuple(shares))
        return Reaction(sends=(Send(SERVER, message),), work=tuple(work))

    def _rebase(self, private: PrivateRound) -> tuple[Vector, list[Work]]:
        """Rebasing's z = n' - n_0 - PRG(b_y) + PRG(b), n' of the variance the survivors need."""
        cfg, suite = self.config, self.suite
        fresh_seed = suite.seed(self.rng)
        work = [
            private.noise_work(2),
            Work("prg.expand", {"elements": 2 * cfg.dim}),
            Work("vector.add", {"elements": 4 * cfg.dim}),
        ]
        if not suite.full:
            return Blank(cfg.dim, np.uint32), work
        assert isinstance(fresh_seed, bytes) and isinstance(self.noise_seeds[0], bytes)
        delta = private.fresh(fresh_seed, float(private.plan.rebased(len(self.u3)))) - private.component(
            self.noise_seeds[0], 0
        )
        z = private.wrap(delta)
        z = sub_mod(z, suite.self_mask(self.mask_seed, cfg.dim, cfg.bits), cfg.bits)  # type: ignore[arg-type]
        z = add_mod(z, suite.self_mask(self.b, cfg.dim, cfg.bits), cfg.bits)  # type: ignore[arg-type]
        return z, work

    # -- stage 5 (XNoise's ExcessiveNoiseRemoval) -----------------------------------------------------
    def _on_removal(self, m: RemovalRequest) -> Reaction:
        cfg, me = self.config, self.client
        u5 = set(m.clients)
        if len(u5) != len(m.clients) or not u5 <= set(self.u3) or me not in u5:
            raise InconsistentViewError(
                SERVER, "the noise-removal set is not a subset of the survivors with this client"
            )
        if len(u5) < cfg.minimum:
            raise TooFewClientsError(SERVER, f"{len(u5)} clients in noise removal, threshold {cfg.minimum}")
        excess = cfg.excess(len(self.u3))
        shares = [
            (v, k, self.noise_shares[v][k - 1])
            for v in sorted(set(self.u3) - u5)
            if v in self.noise_shares
            for k in excess
        ]
        self.state, self.finished = "done", True
        reply = SeedShares(cfg.round, me, tuple(shares))
        return Reaction(sends=(Send(SERVER, reply),), work=(Work("secagg.entries", {"count": len(shares)}),))
