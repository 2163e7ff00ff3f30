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

Layout: :mod:`sim.protocol.secagg.config` holds what both sides share (:class:`SecAggConfig`, the thresholds,
:data:`SECRET_ELEMENTS` and the errors), :mod:`sim.protocol.secagg.server` the server
(:class:`SecAggServer`), :mod:`sim.protocol.secagg.client` the client (:class:`SecAggClient`),
:mod:`sim.protocol.secagg.spec` the two protocols' registry entries (:data:`SECAGG`, :data:`SECAGG_PLUS`). Each
name is imported from the module that defines it: this package re-exports nothing.
"""
