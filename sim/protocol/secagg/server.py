r"""The server side of SecAgg and SecAgg+ (:class:`SecAggServer`): the box of Dordis Figure 5, sans-IO.

Per step the server collects the answers of the clients it expects and closes the step (U1 ... U5, aborting
with fewer than ``min_u t_u`` answers): it relays the advertised keys of each client's holders (0), routes
the share ciphertexts (1), sums the masked inputs mod 2^bits (2) and goes on only if the survivors are
connected in the graph and every secret is still held by at least its threshold of them, [relays the
survivors' consistency signatures (3, malicious variant)], then reconstructs each survivor's self-mask seed
b and each dropped client's mask key s_sk, removes the self masks and the dropped clients' pairwise masks,
and decodes the mean (4). Under XNoise it also regenerates every survivor's excess noise components from
their seeds and subtracts them, collecting shares of the seeds of survivors that did not answer in step 5
(ExcessiveNoiseRemoval, ``noise_removal``); under rebasing (Baek et al.) it adds each survivor's z and
aborts if a survivor did not answer. With the ``learning`` fidelity's suite the inputs carry no masks, so
the sum of step 2 is already the one unmasking gives: the server skips the masks' removal and goes on
with the noise.

Misbehaving clients (see :mod:`sim.protocol.machine` for what a driver does with each error). The server
checks every value a client sends where it enters: ids in the round and in the sender's neighbourhood, key
lengths and orders, signature lengths and (malicious variant) validity before it relays them, ciphertext
and share lengths, share kinds and field elements, seed components, vector lengths and bit widths,
duplicates; anything else is a :class:`~sim.protocol.machine.RemoteProtocolError` naming the sender, with the
server unchanged. A share can still lie about the secret it belongs to: the server reconstructs each secret
from t shares and confirms it (a mask key by its advertised public key, a seed by the parity checks of the
remaining shares, :func:`sim.crypto.shamir.consistent`); when that fails it decodes
(:func:`sim.crypto.shamir.decode`), sets the liars' shares aside (``SecAggServer.liars``) and goes on, or,
if the secret cannot be determined (fewer than t + 2 shares of a seed, say), raises
:class:`~sim.protocol.machine.RoundAbortedError`. With exactly t shares of a seed a lie cannot be seen at
all: any t points fit some secret.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from functools import partial
from typing import Any, ClassVar

import numpy as np

from sim.crypto.signatures import SIGNATURE_BYTES
from sim.protocol.encoding import WORD, add_mod, add_mod_into, reduce_into, sub_mod_into
from sim.protocol.machine import (
    Aggregate,
    LocalProtocolError,
    Reaction,
    RemoteProtocolError,
    RoundAbortedError,
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
from sim.protocol.secagg.config import SECRET_ELEMENTS, BadKeyError, BadSignatureError, Peer, SecAggConfig
from sim.protocol.suite import (
    KEY_BYTES,
    SHARE_BYTES,
    Suite,
    ciphertext_bytes,
    keys_bytes,
    survivors_bytes,
    upload_bytes,
)
from sim.protocol.wire import Blank, Data, Message, Vector


class Step(Enum):
    """The server's states: the step it collects, in order (optional ones included), or the round's end. A value
    is the step's name: what drivers read as ``step``, the keys of ``timeouts:`` and the tables' step names."""

    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY_CHECK = "consistency_check"
    """Malicious variant only."""
    UNMASKING = "unmasking"
    NOISE_REMOVAL = "noise_removal"
    """XNoise only, when a survivor did not answer in unmasking."""
    DONE = "done"
    ABORTED = "aborted"


ENDED = frozenset({Step.DONE, Step.ABORTED})
"""The states in which nothing is collected any more."""

_Handler = Callable[["SecAggServer", int, Any], list[Work]]
"""``handler(server, sender, message)``: check one answer of the step where it enters (raising before any change)
and take it in; the work done."""
_Closer = Callable[["SecAggServer", dict[int, Message | None]], Reaction]
"""``closer(server, answered)``: end the step with the answers, in client order; go on, finish or abort."""


def _by_secret(answered: Mapping[int, Message | None]) -> dict[tuple[int, int], dict[int, Data]]:
    """Shares of a step's answers (``(about, kind or component, share)`` triples) by secret, then holder."""
    shares: dict[tuple[int, int], dict[int, Data]] = {}
    for holder, m in answered.items():
        assert isinstance(m, UnmaskShares | SeedShares)
        for about, which, share in m.shares:
            shares.setdefault((about, which), {})[holder] = share
    return shares


class SecAggServer:
    """Server side of one round."""

    # Transitions as data: :attr:`_STEPS`, at the end of the class (it holds the methods below), maps each
    # collecting state to the message it collects, its handler and its closer.

    def __init__(self, config: SecAggConfig, suite: Suite) -> None:
        self.config = config
        self.suite = suite
        self.state = Step.ADVERTISE_KEYS
        self.outcome = ""
        self.aggregate: Aggregate | None = None
        self._expected: set[int] = set(config.sampled)
        self._received: dict[int, Message | None] = {}
        self.u1: dict[int, Peer] = {}
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
    @property
    def step(self) -> str:
        """The state's name (:class:`Step`'s value)."""
        return self.state.value

    def begin(self) -> Reaction:
        return Reaction()

    def expected(self) -> frozenset[int]:
        if self.state in ENDED:
            return frozenset()
        return frozenset(self._expected - self._received.keys())

    def awaits(self, client: int) -> bool:
        return self.state not in ENDED and client in self._expected and client not in self._received

    def receive(self, sender: int, message: Message) -> Reaction:
        if self.state not in self._STEPS:
            raise RemoteProtocolError(sender, f"sent {type(message).__name__} after the round ended ({self.step})")
        kind, handle, _ = self._STEPS[self.state]
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
        work = handle(self, sender, message)
        # A masked input is summed on arrival (_on_masked); keep only that it came, not its vector.
        self._received[sender] = None if isinstance(message, MaskedInput) else message
        return Reaction(work=tuple(work))

    def close_step(self) -> Reaction:
        if self.state not in self._STEPS:
            raise LocalProtocolError(f"close_step called in state {self.step}")
        _, _, close = self._STEPS[self.state]
        answered = dict(sorted(self._received.items()))
        self._received = {}
        if len(answered) < self.config.minimum:
            return self._abort(
                f"{self.step}: {len(answered)} of {len(self._expected)} clients answered, "
                f"threshold {self.config.minimum}"
            )
        known = len(self.liars)
        reaction = close(self, answered)
        if len(self.liars) > known:  # shares outvoted while reconstructing: the driver reports their senders
            reaction = Reaction(reaction.sends, reaction.work, tuple(list(self.liars.items())[known:]))
        return reaction

    # Closers receive {client: message} of the step's answers, in client order (None for masked inputs).

    def _abort(self, reason: str) -> Reaction:
        self.state = Step.ABORTED
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
            self.u1[c] = Peer(m.c_pk, m.s_pk, m.signature)
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
        self.state, self._expected = Step.SHARE_KEYS, set(self.u1)
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
        self.state, self._expected = Step.MASKED_INPUT, set(self.u2)
        routed = sum(len(cts) for cts in inbox.values())
        return Reaction(sends=sends, work=(Work("secagg.entries", {"count": routed}),))

    # -- step 2 -----------------------------------------------------------------------------------
    def _on_masked(self, sender: int, m: MaskedInput) -> list[Work]:
        if m.y.bits != self.config.bits or m.y.length != self.config.dim:
            raise RemoteProtocolError(sender, f"sent a masked input of {m.y.length} values of {m.y.bits} bits")
        if self.suite.vectors and not isinstance(m.y.values, np.ndarray):
            raise RemoteProtocolError(sender, "sent a masked input without its values")
        cfg = self.config
        if cfg.signed_uploads:
            if not isinstance(m, SignedMaskedInput):
                raise RemoteProtocolError(sender, "sent its masked input without the upload signature")
            key = cfg.verification_keys.get(sender)
            if key is None or not self.suite.verify(key, upload_bytes(cfg.session, cfg.round, sender), m.signature):
                raise BadSignatureError(sender, "sent an upload signature that does not verify")
            self.upload_signatures[sender] = m.signature
        if self.suite.vectors:
            if isinstance(self.total, Blank):
                self.total = np.zeros(self.config.dim, dtype=np.uint32)  # the server's own: summed into in place
            self.total = add_mod_into(self.total, m.y.values, self.config.bits)  # type: ignore[arg-type]
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
        self.state = Step.CONSISTENCY_CHECK if cfg.malicious else Step.UNMASKING
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
        self.state, self._expected = Step.UNMASKING, set(self.u4)
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
            if self.suite.vectors and not all(isinstance(g, bytes) for _, g in m.seeds):
                raise RemoteProtocolError(sender, "sent noise seeds without their bytes")
        if private is not None and private.rebasing:
            if not isinstance(m, RebaseAndUnmask):
                raise RemoteProtocolError(sender, "sent no rebased noise with its shares")
            if m.z.bits != self.config.bits or m.z.length != self.config.dim:
                raise RemoteProtocolError(sender, f"sent a rebasing vector of {m.z.length} values of {m.z.bits} bits")
            if self.suite.vectors and not isinstance(m.z.values, np.ndarray):
                raise RemoteProtocolError(sender, "sent a rebasing vector without its values")
            if self.suite.vectors:
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
            # k offered shares, k^2 for implementations that interpolate from every share they hold
            key, k = kind == SHARE_OF_KEY, len(have)
            work.append(
                Work(
                    "shamir.reconstruct",
                    {
                        "secrets": 1,
                        "shares": t,
                        "elements": SECRET_ELEMENTS * t,
                        "key_offered": k if key else 0,
                        "seed_offered": 0 if key else k,
                        "key_offered_sq": k * k if key else 0,
                        "seed_offered_sq": 0 if key else k * k,
                    },
                )
            )
            # A reconstructed key must match the public key its client advertised.
            check = partial(self._is_key_of, self.u1[about].s_pk) if kind == SHARE_OF_KEY else None
            what = f"client {about}'s {'mask key' if kind == SHARE_OF_KEY else 'mask seed'}"
            return self._recover("unmasking", what, have, t, check)

        total = self.total.copy() if isinstance(self.total, np.ndarray) else self.total  # unmasked in place
        for u in survivors:
            b = secret(u, SHARE_OF_SEED)
            if b is None:
                return self._abort(f"unmasking: too few shares to recover client {u}'s mask seed")
            mask = suite.self_mask(b, cfg.dim, WORD, scratch=True)  # whole words, reduced once (encoding.WORD)
            work += [Work("prg.expand", {"elements": cfg.dim}), Work("vector.add", {"elements": cfg.dim})]
            if suite.full:
                total = sub_mod_into(total, mask, WORD)  # type: ignore[arg-type]
        for v in dropped:
            s_sk = secret(v, SHARE_OF_KEY)
            if s_sk is None:
                return self._abort(f"unmasking: too few shares to recover dropped client {v}'s mask key")
            work.append(Work("x25519.public", {"count": 1}))  # done in secret(): the key matched its public key
            for u in (u for u in cfg.neighbours[v] if u in self.u3):
                mask = suite.pair_mask(s_sk, self.u1[u].s_pk, cfg.round, u, v, cfg.dim, WORD, scratch=True)
                work += [
                    Work("x25519.agree", {"count": 1}),
                    Work("prg.expand", {"elements": cfg.dim}),
                    Work("vector.add", {"elements": cfg.dim}),
                ]
                if suite.full:  # y_u holds gamma_uv * PRG(s_uv) with gamma_uv = +1 if u > v else -1
                    total = sub_mod_into(total, mask, WORD) if u > v else add_mod_into(total, mask, WORD)  # type: ignore[arg-type]
        if suite.full:
            total = reduce_into(total, cfg.bits)  # type: ignore[arg-type]
        self.total = total
        self.exposed = len(survivors)
        self.u5 = set(answered)
        self.removed = cfg.excess(len(survivors))
        if self.removed:
            revealed: dict[int, list[Data]] = {}
            for u in sorted(self.u5):
                message = answered[u]
                assert isinstance(message, UnmaskSharesAndSeeds)
                revealed[u] = [g for _, g in message.seeds]
                work += self._removal_work()
            self._remove(revealed)
            missing = sorted(self.u3 - self.u5)
            if missing:
                # Stage 5: the seeds of survivors that did not answer come from shares held by U5.
                self.state, self._expected = Step.NOISE_REMOVAL, set(self.u5)
                request = RemovalRequest(cfg.round, tuple(sorted(self.u5)))
                return Reaction(sends=tuple(Send(c, request) for c in sorted(self.u5)), work=tuple(work))
        return self._finish(work)

    def _remove(self, seeds: dict[int, list[Data]]) -> None:
        """Subtract the excess noise components of each survivor of ``seeds`` (survivor -> its seeds of the
        removed components), all regenerated from their seeds at once, on every core
        (:meth:`PrivateRound.components`)."""
        private = self.config.private
        assert private is not None
        if self.suite.vectors and seeds:
            assert isinstance(self.total, np.ndarray)
            seeded = []
            for mine in seeds.values():
                for k, g in zip(self.removed, mine, strict=True):
                    assert isinstance(g, bytes)
                    seeded.append((g, k))
            self.total = private.wrap(self.total.astype(np.int64) - private.components(seeded))

    def _removal_work(self) -> list[Work]:
        """The work of removing one survivor's excess components."""
        private = self.config.private
        assert private is not None
        return [private.noise_work(len(self.removed)), Work("vector.add", {"elements": self.config.dim})]

    def _finish(self, work: list[Work]) -> Reaction:
        cfg, survivors = self.config, tuple(sorted(self.u3))
        private = cfg.private
        if cfg.prepared:  # the driver decodes the concatenation of every chunk's sum
            self.aggregate = Aggregate(self.total, survivors, float(len(survivors)))
            self.state, self.outcome = Step.DONE, "ok"
            return Reaction(work=tuple(work))
        work += [Work("decode.fixed_point", {"elements": cfg.dim})] if private is None else list(private.decode_work())
        vector: Vector = Blank(cfg.dim if private is None else private.encoding.dim, np.float32)
        if self.suite.vectors:
            assert isinstance(self.total, np.ndarray)
            decoder = cfg.encoding if private is None else private
            vector = decoder.decode_mean(self.total, len(survivors))
        self.aggregate = Aggregate(vector, survivors, float(len(survivors)))
        self.state, self.outcome = Step.DONE, "ok"
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
        recovered: dict[int, list[Data]] = {}
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
                    {
                        "secrets": len(self.removed),
                        "shares": t,
                        "elements": SECRET_ELEMENTS * t * len(self.removed),
                        "key_offered": 0,
                        "seed_offered": sum(len(shares.get((u, k), {})) for k in self.removed),
                        "key_offered_sq": 0,
                        "seed_offered_sq": sum(len(shares.get((u, k), {})) ** 2 for k in self.removed),
                    },
                )
            )
            work += self._removal_work()
            recovered[u] = seeds
        self._remove(recovered)
        return self._finish(work)

    _STEPS: ClassVar[dict[Step, tuple[type[Message], _Handler, _Closer]]] = {
        Step.ADVERTISE_KEYS: (AdvertiseKeys, _on_advertise, _close_advertise),
        Step.SHARE_KEYS: (ShareKeys, _on_share, _close_share),
        Step.MASKED_INPUT: (MaskedInput, _on_masked, _close_masked),
        Step.CONSISTENCY_CHECK: (ConsistencySignature, _on_consistency, _close_consistency),
        Step.UNMASKING: (UnmaskShares, _on_unmask, _close_unmask),
        Step.NOISE_REMOVAL: (SeedShares, _on_seed_shares, _close_noise_removal),
    }
    """Transitions as data: collecting state -> (the message it collects, its handler, its closer). The table
    holds this class's functions: a subclass that overrides a handler or closer gives its own table."""
