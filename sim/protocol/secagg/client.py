r"""The client side of SecAgg and SecAgg+ (:class:`SecAggClient`): the box of Dordis Figure 5, sans-IO.

A client advertises two X25519 public keys (c: encryption, s: masks) [signed] (0); Shamir-shares its mask
key s_sk and a fresh self-mask seed b among its holders, each holder's pair of shares encrypted with
AES-GCM under the agreed c key (1); sends y = x + PRG(b) + sum_v gamma_uv PRG(s_uv) mod 2^bits over its
neighbours v, gamma = +1 if u > v else -1 (2); [signs (round, U3) and checks the other survivors'
signatures, malicious variant (3)]; and sends its shares of b for survivors and of s_sk for clients that
dropped after sharing, never both for one client (4). Under distributed DP x is its DSkellam encoding plus
the noise components of its plan; under XNoise it also shares the seeds g_(u,k) of its removable components
in its ShareKeys ciphertexts, sends its own seeds of the components every survivor removes (the indices
follow from |U \ U3|, which the client takes from the survivor set it checked, signed in the malicious
variant, so a server cannot understate dropout), and in step 5 (``noise_removal``) its shares of the excess
seeds of survivors that did not answer. Under rebasing (Baek et al.) y carries an unshared self mask b_y and
the Unmasking answer carries z = n' - n_0 - PRG(b_y) + PRG(b). With a suite whose cryptography is sized
but whose vectors are real (``learning`` fidelity, :class:`~sim.protocol.suite.LearningSuite`) no mask is
added: y = x and z = n' - n_0, whose sums are those of ``full`` once its masks cancel.

A client checks what the server sends it before it acts on it: the keys it lists (its holders, well formed, of
full order, none repeated, its own as it advertised them, signed in the malicious variant), the ciphertexts'
senders, and every survivor set (within the clients that shared with it, at least the thresholds, connected
in the graph, so no partial sum can be unmasked); anything else is a
:class:`~sim.protocol.machine.RemoteProtocolError` naming the server, and the client releases nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

import numpy as np

from sim.crypto import aead
from sim.crypto.randomness import RandomSource
from sim.protocol.encoding import WORD, add_mod, add_mod_into, reduce_into, sub_mod, sub_mod_into
from sim.protocol.machine import SERVER, LocalProtocolError, Reaction, RemoteProtocolError, Send, Work
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
from sim.protocol.secagg.config import (
    SECRET_ELEMENTS,
    BadCiphertextError,
    BadKeyError,
    BadSignatureError,
    InconsistentViewError,
    Peer,
    SecAggConfig,
    SurvivorView,
    TooFewClientsError,
)
from sim.protocol.suite import Suite, keys_bytes, plaintext_bytes, survivors_bytes, upload_bytes
from sim.protocol.wire import Blank, Data, Message, ModVector, Vector


class State(Enum):
    """The client's states: what it waits for next from the server (its value names it in messages)."""

    NEW = "new"
    """Before :meth:`SecAggClient.start`."""
    KEYS = "keys"
    CIPHERTEXTS = "ciphertexts"
    SURVIVORS = "survivors"
    SIGNATURES = "signatures"
    """Malicious variant only."""
    REMOVAL = "removal"
    """XNoise only: a survivor asked for shares of the noise seeds of survivors that did not answer."""
    DONE = "done"


_Handler = Callable[["SecAggClient", Any], Reaction]
"""``handler(client, message)``: check the server's message (raising before any change) and answer it."""


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
        self.state = State.NEW
        self.x: Vector = Blank(config.dim, np.uint32)
        self.c_sk: Data = b""
        self.s_sk: Data = b""
        self.b: Data = b""
        self.peers: dict[int, Peer] = {}
        self.ciphertexts: dict[int, Data] = {}
        self.u3: tuple[int, ...] = ()
        self.u3_members: frozenset[int] = frozenset()
        """The survivors, as a set."""
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

    # Transitions as data: :attr:`_EXPECTS`, at the end of the class (it holds the methods below), maps each
    # waiting state to the message it accepts and its handler.

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
        if self.state is not State.NEW:
            raise LocalProtocolError(f"start called in state {self.state.value}")
        cfg, suite, private = self.config, self.suite, self.config.private
        if private is None:
            work = [] if cfg.prepared else [Work("encode.fixed_point", {"elements": cfg.dim})]
        else:
            work = list(private.add_noise_work() if cfg.prepared else private.encode_work())
            self.noise_seeds = [suite.seed(self.rng) for _ in private.plan.components]
        work.append(Work("x25519.keygen", {"count": 2}))
        if suite.vectors:
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
        self.state = State.KEYS
        message = AdvertiseKeys(cfg.round, self.client, c_pk, s_pk, signature)
        return Reaction(sends=(Send(SERVER, message),), work=tuple(work))

    def receive(self, message: Message) -> Reaction:
        if self.state not in self._EXPECTS:
            raise RemoteProtocolError(SERVER, f"sent {type(message).__name__} in state {self.state.value}")
        kind, handle = self._EXPECTS[self.state]
        if not isinstance(message, kind):
            raise RemoteProtocolError(SERVER, f"sent {type(message).__name__}, expected {kind.__name__}")
        if getattr(message, "round", None) != self.config.round:
            raise RemoteProtocolError(SERVER, f"sent a message for round {getattr(message, 'round', None)}")
        return handle(self, message)

    # -- stage 1 ----------------------------------------------------------------------------------
    def _on_keys(self, m: KeyList) -> Reaction:
        cfg, suite, me = self.config, self.suite, self.client
        holders = set(cfg.holders(me))
        peers = {v: Peer(c_pk, s_pk, sig) for v, c_pk, s_pk, sig in m.entries}
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
                {
                    "secrets": secrets,
                    "holders": len(order),
                    "products": secrets * SECRET_ELEMENTS * len(order) * t,
                    "pairs": len(order) * t,
                },
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
        self.state = State.CIPHERTEXTS
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
        # Whole 32-bit masks, and the sum reduced mod 2^bits once (encoding.WORD): the same sum, fewer passes
        mask = suite.self_mask(self.mask_seed, cfg.dim, WORD, scratch=True)
        if suite.full:
            y = add_mod(y, mask, WORD)  # type: ignore[arg-type]  # a new vector: the masks go into it in place
        pair_work = (  # the same for every neighbour: one set of objects (the cost model sizes it once)
            Work("x25519.agree", {"count": 1}),
            Work("prg.expand", {"elements": cfg.dim}),
            Work("vector.add", {"elements": cfg.dim}),
        )
        neighbours = frozenset(cfg.neighbours[me])
        for v in sorted(self.ciphertexts):
            if v not in neighbours:
                continue
            mask = suite.pair_mask(self.s_sk, self.peers[v].s_pk, cfg.round, me, v, cfg.dim, WORD, scratch=True)
            work += pair_work
            if suite.full:
                y = add_mod_into(y, mask, WORD) if me > v else sub_mod_into(y, mask, WORD)  # type: ignore[arg-type]
        if suite.full:
            y = reduce_into(y, cfg.bits)  # type: ignore[arg-type]
        # Without masks (learning fidelity) y is x itself: the masks cancel in the server's sum.
        self.state = State.SURVIVORS
        self.x = Blank(cfg.dim, np.uint32)  # the input is no longer needed; free it
        message = MaskedInput(cfg.round, me, ModVector(cfg.bits, y))
        if cfg.signed_uploads:
            assert self.signing_key is not None
            signature = suite.sign(self.signing_key, upload_bytes(cfg.session, cfg.round, me))
            message = SignedMaskedInput(cfg.round, me, ModVector(cfg.bits, y), signature)
            work.append(Work("ed25519.sign", {"count": 1}))
        return Reaction(sends=(Send(SERVER, message),), work=tuple(work))

    # -- stage 3 / 4 ------------------------------------------------------------------------------
    def _check_survivors(self, u3: tuple[int, ...]) -> SurvivorView:
        cfg, me = self.config, self.client
        known = set(self.ciphertexts) | {me}
        view = cfg.survivor_view(u3)
        members = view.members
        if len(members) != len(u3) or me not in members:
            raise InconsistentViewError(SERVER, "the survivor set repeats a client or leaves this client out")
        if not view.within_sampled:
            raise InconsistentViewError(SERVER, "the survivor set names clients that were not sampled")
        if cfg.complete and not members <= known:
            # Every survivor must have shared with everyone (U3 within U2, Figure 5).
            raise InconsistentViewError(
                SERVER, "the survivor set names a client that never sent this client its shares"
            )
        if not members.intersection(self.peers) <= known:  # over this client's holders, not every survivor
            raise InconsistentViewError(
                SERVER, "the survivor set names a holder that never sent this client its shares"
            )
        if len(u3) < cfg.minimum:
            raise TooFewClientsError(SERVER, f"{len(u3)} survivors, threshold {cfg.minimum}")
        mine = sum(1 for h in cfg.holders(me) if h in members)
        if mine < cfg.threshold(me):
            raise TooFewClientsError(SERVER, f"{mine} of this client's holders survive, threshold {cfg.threshold(me)}")
        if not cfg.connected(members):
            raise InconsistentViewError(SERVER, "the survivors are not connected: a partial sum could be unmasked")
        return view

    def _on_survivors(self, m: Survivors) -> Reaction:
        cfg = self.config
        view = self._check_survivors(m.clients)
        checks = [cfg.graph_work(len(m.clients))]
        if cfg.signed_uploads:
            # |U \ U3| decides which noise is removed: every claimed survivor must have signed its upload.
            if not isinstance(m, SignedUploads) or len(m.signatures) != len(m.clients):
                raise InconsistentViewError(SERVER, "the survivor set comes without every member's upload signature")
            for v, signature in zip(m.clients, m.signatures, strict=True):
                if not self.suite.verify(cfg.verification_keys[v], upload_bytes(cfg.session, cfg.round, v), signature):
                    raise BadSignatureError(SERVER, f"client {v}'s upload signature does not verify")
            checks.append(Work("ed25519.verify", {"count": len(m.clients)}))
        self.u3, self.u3_members = view.ordered, view.members
        if not cfg.malicious:
            reaction = self._unmask()
            return Reaction(reaction.sends, (*checks, *reaction.work))
        assert self.signing_key is not None
        signature = self.suite.sign(self.signing_key, survivors_bytes(cfg.session, cfg.round, self.u3))
        self.state = State.SIGNATURES
        reply = ConsistencySignature(cfg.round, self.client, signature)
        return Reaction(sends=(Send(SERVER, reply),), work=(*checks, Work("ed25519.sign", {"count": 1})))

    def _on_signatures(self, m: SignedSurvivors) -> Reaction:
        cfg, suite = self.config, self.suite
        signers = [v for v, _ in m.signatures]
        if len(set(signers)) != len(signers) or not set(signers) <= self.u3_members:
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
        survivors = self.u3_members
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
        self.state, self.finished = State.DONE, True
        message: UnmaskShares
        private = cfg.private
        if private is not None and private.removing:
            excess = cfg.excess(len(self.u3))
            message = UnmaskSharesAndSeeds(
                cfg.round, me, tuple(shares), tuple((k, self.noise_seeds[k]) for k in excess)
            )
            if excess:  # the server may still ask for shares of other survivors' excess seeds
                self.state, self.finished = State.REMOVAL, False
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
        if not suite.vectors:
            return Blank(cfg.dim, np.uint32), work
        assert isinstance(fresh_seed, bytes) and isinstance(self.noise_seeds[0], bytes)
        delta = private.fresh(fresh_seed, float(private.plan.rebased(len(self.u3)))) - private.component(
            self.noise_seeds[0], 0
        )
        z = private.wrap(delta)
        if not suite.full:  # no masks to rebase (learning fidelity): z = n' - n_0
            return z, work
        z = sub_mod(z, suite.self_mask(self.mask_seed, cfg.dim, cfg.bits), cfg.bits)  # type: ignore[arg-type]
        z = add_mod(z, suite.self_mask(self.b, cfg.dim, cfg.bits), cfg.bits)  # type: ignore[arg-type]
        return z, work

    # -- stage 5 (XNoise's ExcessiveNoiseRemoval) -----------------------------------------------------
    def _on_removal(self, m: RemovalRequest) -> Reaction:
        cfg, me = self.config, self.client
        u5 = set(m.clients)
        if len(u5) != len(m.clients) or not u5 <= self.u3_members or me not in u5:
            raise InconsistentViewError(
                SERVER, "the noise-removal set is not a subset of the survivors with this client"
            )
        if len(u5) < cfg.minimum:
            raise TooFewClientsError(SERVER, f"{len(u5)} clients in noise removal, threshold {cfg.minimum}")
        excess = cfg.excess(len(self.u3))
        shares = [
            (v, k, self.noise_shares[v][k - 1])
            for v in sorted(self.u3_members - u5)
            if v in self.noise_shares
            for k in excess
        ]
        self.state, self.finished = State.DONE, True
        reply = SeedShares(cfg.round, me, tuple(shares))
        return Reaction(sends=(Send(SERVER, reply),), work=(Work("secagg.entries", {"count": len(shares)}),))

    _EXPECTS: ClassVar[dict[State, tuple[type[Message], _Handler]]] = {
        State.KEYS: (KeyList, _on_keys),
        State.CIPHERTEXTS: (Ciphertexts, _on_ciphertexts),
        State.SURVIVORS: (Survivors, _on_survivors),
        State.SIGNATURES: (SignedSurvivors, _on_signatures),
        State.REMOVAL: (RemovalRequest, _on_removal),
    }
    """Transitions as data: waiting state -> (the message it accepts, its handler). The table holds this class's
    functions: a subclass that overrides a handler gives its own table."""
