"""Known-answer tests of every primitive, and properties of Shamir sharing and the mask PRG."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.crypto import aead, agreement, prg, shamir, signatures
from sim.crypto.randomness import SeededRandom

h = bytes.fromhex


class _FixedRandom:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def bytes(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        assert len(out) == n
        return out


def test_x25519_rfc7748_section_6_1():
    alice = h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob = h("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    assert agreement.public_of(alice) == h("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert agreement.public_of(bob) == h("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    shared = X25519PrivateKey.from_private_bytes(alice).exchange(
        X25519PublicKey.from_public_bytes(agreement.public_of(bob))
    )
    assert shared == h("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    # dropsim's agree is HKDF-SHA256 of that shared secret, the same from both sides
    assert agreement.agree(alice, agreement.public_of(bob), b"x") == agreement.hkdf(shared, b"x")
    assert agreement.agree(bob, agreement.public_of(alice), b"x") == agreement.hkdf(shared, b"x")
    assert agreement.agree(alice, agreement.public_of(bob), b"y") != agreement.agree(
        alice, agreement.public_of(bob), b"x"
    )


def test_hkdf_sha256_rfc5869_test_case_3():
    # Test case 3: IKM = 0x0b * 22, salt and info empty, L = 42 (dropsim uses no salt).
    okm = agreement.hkdf(b"\x0b" * 22, b"", length=42)
    assert okm == h("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")


def test_ed25519_rfc8032_test_1():
    seed = h("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    public = h("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
    expected = h(
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )
    assert signatures.generate(_FixedRandom(seed)) == (seed, public)
    assert signatures.sign(seed, b"") == expected
    assert signatures.verify(public, b"", expected)
    assert not signatures.verify(public, b"x", expected)
    assert not signatures.verify(public, b"", expected[:-1] + b"\x00")
    assert not signatures.verify(b"short", b"", expected)


def test_aes_gcm_mcgrew_viega_test_case_2():
    # K = 0^128, IV = 0^96, P = 0^128: C = 0388dace..., T = ab6e47d4... (AES-128; dropsim uses 256-bit keys).
    sealed = AESGCM(bytes(16)).encrypt(bytes(12), bytes(16), None)
    assert sealed == h("0388dace60b6a392f328c2b971b2fe78") + h("ab6e47d42cec13bdf53a67b21257bddf")


def test_aead_round_trip_and_tampering():
    key, rng = bytes(range(32)), SeededRandom(bytes(32))
    ct = aead.encrypt(key, b"secret shares", b"round 1 from 2 to 3", rng)
    assert len(ct) == len(b"secret shares") + aead.OVERHEAD
    assert aead.decrypt(key, ct, b"round 1 from 2 to 3") == b"secret shares"
    flipped = ct[:20] + bytes([ct[20] ^ 1]) + ct[21:]
    with pytest.raises(aead.DecryptionError, match="does not authenticate"):
        aead.decrypt(key, flipped, b"round 1 from 2 to 3")
    with pytest.raises(aead.DecryptionError):
        aead.decrypt(key, ct, b"round 2 from 2 to 3")
    with pytest.raises(aead.DecryptionError, match="shorter than nonce and tag"):
        aead.decrypt(key, ct[:10], b"")


def test_aes_ctr_sp800_38a_f5_5():
    # CTR-AES256.Encrypt, block 1: the keystream primitive the PRG and SeededRandom are built on.
    key = h("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4")
    counter = h("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    out = Cipher(algorithms.AES256(key), modes.CTR(counter)).encryptor().update(h("6bc1bee22e409f96e93d7e117393172a"))
    assert out == h("601ec313775789a5b7a7f504bbf3d228")


def test_prg_is_the_aes256_ctr_keystream_reduced_mod_2_bits():
    seed = bytes(range(32))
    stream = Cipher(algorithms.AES256(seed), modes.CTR(bytes(16))).encryptor().update(bytes(40))
    words = np.frombuffer(stream, dtype="<u4")
    assert np.array_equal(prg.expand(seed, 10, 32), words.astype(np.uint64))
    assert np.array_equal(prg.expand(seed, 10, 20), (words & 0xFFFFF).astype(np.uint64))
    assert prg.expand(seed, 10, 20).max() < 1 << 20
    assert not np.array_equal(prg.expand(seed, 10, 20), prg.expand(bytes(32), 10, 20))
    with pytest.raises(ValueError, match="bits must be in 1..32"):
        prg.expand(seed, 10, 33)


def test_prg_masks_are_uniform():
    values = prg.expand(bytes(32), 200_000, 4)
    counts = np.bincount(values.astype(np.int64), minlength=16)
    expected = 200_000 / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45  # 15 degrees of freedom: P(chi2 > 45) < 1e-4


def test_seeded_random_is_a_deterministic_keystream():
    a, b = SeededRandom(bytes(32)), SeededRandom(bytes(32))
    assert a.bytes(5) + a.bytes(11) == b.bytes(16)
    assert SeededRandom(bytes(31) + b"\x01").bytes(16) != SeededRandom(bytes(32)).bytes(16)


def test_shamir_by_hand():
    # f(x) = 1234 + 166 x + 94 x^2 over GF(2^31 - 1): shares at x = 1, 2, 3 are 1494, 1942, 2578.
    rng = _FixedRandom(np.array([166, 94], dtype="<u4").tobytes() + bytes(64))
    table = shamir.share(np.array([1234]), 3, [1, 2, 3], rng)
    assert table[:, 0].tolist() == [1494, 1942, 2578]
    assert shamir.reconstruct([1, 2, 3], table).tolist() == [1234]
    assert shamir.lagrange_at_zero((1, 2, 3)).tolist() == [3, shamir.PRIME - 3, 1]


@settings(max_examples=60, deadline=None)
@given(
    secret=st.binary(min_size=32, max_size=32),
    n=st.integers(1, 30),
    data=st.data(),
)
def test_shamir_any_t_shares_reconstruct_and_fewer_do_not(secret, n, data):
    t = data.draw(st.integers(1, n))
    xs = data.draw(st.lists(st.integers(1, shamir.PRIME - 1), min_size=n, max_size=n, unique=True))
    shares = shamir.share_bytes(secret, t, xs, SeededRandom(bytes(32)))
    assert all(len(s) == shamir.share_size(32) == 44 for s in shares)
    pick = data.draw(st.lists(st.integers(0, n - 1), min_size=t, max_size=t, unique=True))
    assert shamir.reconstruct_bytes([xs[i] for i in pick], [shares[i] for i in pick], 32) == secret
    if t > 1:
        fewer = pick[:-1]
        values = shamir.reconstruct(
            [xs[i] for i in fewer], np.asarray([np.frombuffer(shares[i], "<u4") for i in fewer])
        )
        assert values.tolist() != shamir.bytes_to_elements(secret).tolist()


def test_shamir_rejects_bad_parties():
    rng = SeededRandom(bytes(32))
    with pytest.raises(ValueError, match="distinct"):
        shamir.share(np.array([1]), 1, [1, 1], rng)
    with pytest.raises(ValueError, match="1..p-1"):
        shamir.share(np.array([1]), 1, [0, 1], rng)
    with pytest.raises(ValueError, match="threshold must be in 1..2"):
        shamir.share(np.array([1]), 3, [1, 2], rng)
    with pytest.raises(ValueError, match="one row of shares per party"):
        shamir.reconstruct([1, 2], np.zeros((1, 3), dtype=np.int64))


def test_bytes_to_field_elements_round_trip():
    data = bytes(range(256))[:32]
    elements = shamir.bytes_to_elements(data)
    assert elements.shape == (11,) and elements.max() < 1 << 24
    assert shamir.elements_to_bytes(elements, 32) == data
