"""Dordis's primitive choices, re-implemented to be timed: ``dropsim profile --impl dordis`` (docs/profiles.md).

For profiling only: no protocol, test vector or deployment of dropsim runs on these (its own primitives are
:mod:`sim.crypto`). They do what Dordis's implementation does for each operation the protocol charges, as
its paper (Dordis section 5) and its artifact's code describe it, so that the time they take is the time
Dordis would take on this machine:

- **Key agreement: P-384.** Two key pairs per client and round (``cryptography``'s SECP384R1), sent as PEM
  (215 bytes a public key; the private key is 306 bytes of PKCS#8 PEM). Each agreement parses the party's
  own PEM private key and the peer's PEM public key again, computes ECDH, derives 32 bytes with
  HKDF-SHA256 (no salt, no info) and encodes them in URL-safe base64 (44 bytes): that text is both the
  Fernet key and the mask seed.
- **Authenticated encryption: Fernet** (AES-128-CBC and HMAC-SHA256) of a share plaintext of 590 bytes
  (the two shares of SecAgg; 88.5 more per shared noise seed under XNoise).
- **Shamir over GF(2^128), pycryptodome's** ``Crypto.Protocol.SecretSharing.Shamir``: the secret is
  PKCS#7-padded to 16-byte blocks and each block is split on its own (the PEM private key is 20 blocks, a
  32-byte seed 3); reconstruction interpolates each block from every share the server holds, not just t.
- **Masks from Python's Mersenne Twister**: ``random`` seeded with the 44-byte key (or the 32-byte
  self-mask seed), one ``randrange(0, 2**bits)`` Python integer per element (a fresh ``random.Random``
  here, the module's global generator in Dordis: the same algorithm and cost).
- **Vectors as Python lists**: masks are added element by element, ``(x + y) & (2**bits - 1)``.
- **Packing**: ``floor(60 / bits)`` values to a Python integer, the first in the highest bits, and the
  list of integers pickled (:func:`pickled_int_bytes` sizes an integer as pickle writes it).
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PLAINTEXT_BYTES = 590
"""Bytes of a share plaintext holding SecAgg's two shares (of the mask key and the self-mask seed)."""
PLAINTEXT_PER_SEED = 88.5
"""Bytes a shared XNoise seed adds to it."""
WORD_BITS = 60
"""Bits of the Python integer that values are packed into."""
BLOCK = 16
"""Bytes of a Shamir block (GF(2^128))."""


def keygen() -> tuple[bytes, bytes]:
    """One P-384 key pair as Dordis sends and keeps it: (PKCS#8 PEM private key, PEM public key)."""
    sk = ec.generate_private_key(ec.SECP384R1())
    sk_pem = sk.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pk_pem = sk.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return sk_pem, pk_pem


def agree(sk_pem: bytes, pk_pem: bytes) -> bytes:
    """The shared key of a P-384 pair as Dordis derives it: 44 bytes of URL-safe base64 of HKDF-SHA256."""
    sk = serialization.load_pem_private_key(sk_pem, password=None)
    pk = serialization.load_pem_public_key(pk_pem)
    assert isinstance(sk, ec.EllipticCurvePrivateKey) and isinstance(pk, ec.EllipticCurvePublicKey)
    shared = sk.exchange(ec.ECDH(), pk)
    return base64.urlsafe_b64encode(HKDF(hashes.SHA256(), length=32, salt=None, info=None).derive(shared))


def load_private(sk_pem: bytes) -> bytes:
    """Parse a reconstructed PEM private key and give its public key (the server's check of a dropped
    client's key, as dropsim's ``x25519.public``)."""
    sk = serialization.load_pem_private_key(sk_pem, password=None)
    return sk.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def plaintext_bytes(shares: int) -> int:
    """Bytes of a share plaintext with ``shares`` shares (2, plus one per shared noise seed)."""
    return PLAINTEXT_BYTES + round(PLAINTEXT_PER_SEED * max(0, shares - 2))


def seal(key: bytes, plaintext: bytes) -> bytes:
    return Fernet(key).encrypt(plaintext)


def open_sealed(key: bytes, token: bytes) -> bytes:
    return Fernet(key).decrypt(token)


def _pad(secret: bytes) -> bytes:
    n = BLOCK - len(secret) % BLOCK
    return secret + bytes([n]) * n


def share(secret: bytes, threshold: int, holders: int) -> list[list[tuple[int, bytes]]]:
    """Shares of ``secret`` for holders 1..``holders``: per holder, ``(index, 16-byte share)`` of each block."""
    # deferred: pycryptodome is optional (the impl extra)
    from Crypto.Protocol.SecretSharing import Shamir

    padded = _pad(secret)
    out: list[list[tuple[int, bytes]]] = [[] for _ in range(holders)]
    for i in range(0, len(padded), BLOCK):
        for j, (index, piece) in enumerate(Shamir.split(threshold, holders, padded[i : i + BLOCK], False)):
            out[j].append((index, piece))
    return out


def combine(shares: Sequence[Sequence[tuple[int, bytes]]]) -> bytes:
    """The secret from every holder's shares in ``shares``, block by block (all of them, as Dordis does)."""
    # deferred: pycryptodome is optional (the impl extra)
    from Crypto.Protocol.SecretSharing import Shamir

    blocks = [Shamir.combine([holder[b] for holder in shares], False) for b in range(len(shares[0]))]
    padded = b"".join(blocks)
    return padded[: -padded[-1]]


def expand(seed: bytes, length: int, bits: int) -> list[int]:
    """A mask of ``length`` Python integers below 2^``bits``, from Mersenne Twister seeded with ``seed``."""
    rng = random.Random(seed)
    top = 1 << bits
    return [rng.randrange(0, top) for _ in range(length)]


def add(x: Sequence[int], y: Sequence[int], bits: int) -> list[int]:
    mask = (1 << bits) - 1
    return [(a + b) & mask for a, b in zip(x, y, strict=True)]


def pack(values: Sequence[int], bits: int) -> list[int]:
    """``floor(60 / bits)`` values to an integer, the first in the highest bits (the last may hold fewer)."""
    per = max(1, WORD_BITS // bits)
    words = []
    for i in range(0, len(values), per):
        word = 0
        for v in values[i : i + per]:
            word <<= bits
            word += v
        words.append(word)
    return words


def unpack(words: Sequence[int], bits: int, length: int) -> list[int]:
    """The inverse of :func:`pack` for ``length`` values."""
    per = max(1, WORD_BITS // bits)
    mask = (1 << bits) - 1
    out: list[int] = []
    for i, packed in enumerate(words):
        count, word = min(per, length - i * per), packed
        group = []
        for _ in range(count):
            group.append(word & mask)
            word >>= bits
        out.extend(reversed(group))
    return out


def pickled_int_bytes(value: int) -> int:
    """Bytes pickle (protocol 2 and later) writes for the integer ``value``: BININT1, BININT2, BININT or
    LONG1 (opcode, length byte, two's-complement little-endian bytes)."""
    if 0 <= value < 1 << 8:
        return 2
    if 0 <= value < 1 << 16:
        return 3
    if -(1 << 31) <= value < 1 << 31:
        return 5
    return 2 + (value.bit_length() + 8) // 8


def serialise(words: Sequence[int]) -> bytes:
    """The packed words as pickle lays out integers (each's little-endian bytes after its length): the
    cost of writing them, without pickle."""
    out = []
    for w in words:
        n = (w.bit_length() + 8) // 8
        out.append(bytes((n,)) + w.to_bytes(n, "little", signed=True))
    return b"".join(out)


def deserialise(data: bytes) -> list[int]:
    """The inverse of :func:`serialise`."""
    words, i = [], 0
    while i < len(data):
        n = data[i]
        words.append(int.from_bytes(data[i + 1 : i + 1 + n], "little", signed=True))
        i += 1 + n
    return words


def pickled_shares_bytes(blocks: int) -> int:
    """Bytes of one holder's pickled list of ``(index, 16-byte share)`` for ``blocks`` blocks (protocol 4):
    16 of framing (PROTO, FRAME, EMPTY_LIST, MEMOIZE, MARK, APPENDS, STOP) and 23 a block (BININT1 index,
    SHORT_BINBYTES of 16, TUPLE2, MEMOIZE): 476 for a PEM private key's 20 blocks, 85 for a seed's 3."""
    return 16 + 23 * blocks


def blocks(secret_bytes: int) -> int:
    """16-byte Shamir blocks of a secret of ``secret_bytes`` after PKCS#7 padding (always at least one byte)."""
    return secret_bytes // BLOCK + 1
