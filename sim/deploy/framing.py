"""Authenticated, length-prefixed frames over TCP: the record layer of the deployment mode.

One frame on the stream is ``length u32 | kind u8 | channel u16 | seq u64 | payload | tag (16 bytes)``,
integers big-endian, ``length`` counting the bytes after itself. A DATA frame's payload is encrypted with
AES-128-GCM (NIST SP 800-38D) under nonce ``0^4 | seq`` with associated data ``kind | channel | seq``:
``payload`` on the wire is the ciphertext, as long as the plaintext, and ``tag`` authenticates both. Each
direction has its own key and a sequence number counted from 0, so a receiver rejects forged, replayed,
reordered and dropped frames, and a reader of the link learns only the frames' sizes and timing (not the
configuration, the model, or any update: docs/security.md).

The session keys come from a handshake in the manner of TLS 1.3 / SIGMA, in three flights of HELLO frames
(kind 2, tag of zeros), each signed with its sender's long-term Ed25519 key:

1. client: ``magic | party | eph_c | nonce_c``, signed;
2. server: ``eph_s | nonce_s``, its signature over the whole transcript so far;
3. client: its signature over the whole transcript (``" finish" | hello | eph_s | nonce_s``).

Both sides derive ``hkdf(X25519(eph_c, eph_s), "dropsim-deploy-1 c2s|s2c" | nonce_c | nonce_s, 16)``. The
third flight proves that the peer is live (it signs the server's fresh nonce): a recorded first flight
replayed by someone else is never authenticated, so it cannot displace the worker's live connection.

Each party draws its own long-term key pair from the operating system (:mod:`sim.deploy.identity`); only
verification keys are exchanged. Any :class:`FrameError` or :class:`Closed` ends the connection; its owner
closes the socket.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sim.crypto import agreement, signatures
from sim.crypto.randomness import RandomSource, SystemRandom
from sim.deploy.shaping import TokenBucket

T = TypeVar("T")

DATA = 1
"""Kind of an authenticated frame carrying a channel's payload."""
HELLO = 2
"""Kind of a handshake frame (authenticated by signatures; its tag is zeros)."""

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">BHQ")
TAG_BYTES = 16
MIN_BODY = _HEADER.size + TAG_BYTES
"""Fewest bytes after the length field: header and tag of an empty payload."""
OVERHEAD = 4 + 1 + 2 + 8 + 16
"""Bytes a frame adds to its payload."""
DEFAULT_MAX_FRAME = 64 * 2**20
"""Largest frame (bytes after the length field) a reader accepts by default."""
PIECE_BYTES = 64 * 2**10
"""Frames are written, and shaped reads are done, in pieces of at most this many bytes."""
KEY_BYTES = 16
"""AES-128 session keys."""
MAX_CHANNEL = 2**16 - 1
MAX_PARTY = 2**32 - 1

MAGIC = b"dropsim-deploy-1"
NONCE_BYTES = 32
_CLIENT_HELLO_BYTES = len(MAGIC) + 4 + agreement.KEY_BYTES + NONCE_BYTES + signatures.SIGNATURE_BYTES
_SERVER_HELLO_BYTES = agreement.KEY_BYTES + NONCE_BYTES + signatures.SIGNATURE_BYTES
_FINISH_BYTES = signatures.SIGNATURE_BYTES
HANDSHAKE_MAX_FRAME = 4096
"""Largest first frame a server reads from an unauthenticated peer."""


class FrameError(Exception):
    """The peer sent something illegal; the connection must be closed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Closed(ConnectionError):  # noqa: N818 (the name callers code against; it is an event, not a bug)
    """The peer closed the connection (EOF, possibly mid-frame, or a reset)."""


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME, bucket: TokenBucket | None = None
) -> bytes:
    """One frame's bytes after the length field (``kind .. tag``).

    The length is checked before any of the body is read, so a peer cannot make the reader wait for or
    allocate more than ``max_bytes``. With a ``bucket``, the body is read in pieces of at most 64 KiB,
    each after taking its size (the first also the 4 length bytes) from the bucket: the unread bytes then
    back up in the socket buffers, which throttles the sender through TCP's flow control.
    """
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as error:
        raise Closed(f"connection closed after {len(error.partial)} of a frame's 4 length bytes") from None
    except ConnectionError as error:
        raise Closed(f"connection lost: {error}") from None
    (length,) = _LENGTH.unpack(prefix)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_bytes} bytes")
    if length < MIN_BODY:
        raise FrameError(f"frame of {length} bytes is shorter than the {MIN_BODY} bytes of header and tag")
    try:
        if bucket is None:
            return await reader.readexactly(length)
        pieces = []
        done = 0
        while done < length:
            size = min(PIECE_BYTES, length - done)
            await bucket.take(size + (_LENGTH.size if done == 0 else 0))
            pieces.append(await reader.readexactly(size))
            done += size
        return b"".join(pieces)
    except asyncio.IncompleteReadError:
        raise Closed(f"connection closed in the middle of a frame of {length} bytes") from None
    except ConnectionError as error:
        raise Closed(f"connection lost in the middle of a frame of {length} bytes: {error}") from None


async def send_frame(writer: asyncio.StreamWriter, frame: bytes, buckets: Sequence[TokenBucket] = ()) -> None:
    """Write ``frame`` in pieces of at most 64 KiB, each after taking its size from every bucket in order.

    Raises :class:`Closed` if the connection is lost.
    """
    view = memoryview(frame)
    try:
        for start in range(0, len(frame), PIECE_BYTES):
            piece = view[start : start + PIECE_BYTES]
            for bucket in buckets:
                await bucket.take(len(piece))
            writer.write(piece)
            await writer.drain()
    except ConnectionError as error:
        if isinstance(error, Closed):
            raise
        raise Closed(f"connection lost while sending: {error}") from None


def _nonce(seq: int) -> bytes:
    return bytes(4) + seq.to_bytes(8, "big")


class Session:
    """The record-layer state of one connection end: a key and a sequence number per direction."""

    sent: int
    """DATA frames sealed so far (the next one's seq)."""
    received: int
    """DATA frames opened so far (the seq expected next)."""

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        for name, key in (("send_key", send_key), ("recv_key", recv_key)):
            if len(key) != KEY_BYTES:
                raise ValueError(f"{name} must be {KEY_BYTES} bytes (AES-128), not {len(key)}")
        self._send = AESGCM(send_key)
        self._recv = AESGCM(recv_key)
        self.sent = 0
        self.received = 0

    def seal(self, channel: int, payload: bytes) -> bytes:
        """The complete DATA frame (length prefix included) carrying ``payload`` on ``channel``."""
        if not 0 <= channel <= MAX_CHANNEL:
            raise ValueError(f"channel must be in 0..{MAX_CHANNEL}, not {channel}")
        length = MIN_BODY + len(payload)
        if length > 2**32 - 1:
            raise ValueError(f"a payload of {len(payload)} bytes does not fit a frame's 32-bit length")
        seq = self.sent
        header = _HEADER.pack(DATA, channel, seq)
        sealed = self._send.encrypt(_nonce(seq), payload, header)  # ciphertext | tag
        self.sent += 1
        return b"".join((_LENGTH.pack(length), header, sealed))

    def open(self, body: bytes) -> tuple[int, bytes]:
        """``(channel, payload)`` of a DATA frame's body as :func:`read_frame` returns it.

        Checks the kind, then the sequence number, then the tag, and decrypts; a frame that fails does not
        advance :attr:`received`.
        """
        if len(body) < MIN_BODY:
            raise FrameError(f"frame of {len(body)} bytes is shorter than the {MIN_BODY} bytes of header and tag")
        kind, channel, seq = _HEADER.unpack_from(body)
        if kind != DATA:
            raise FrameError(f"unexpected frame kind {kind}")
        if seq < self.received:
            raise FrameError(f"replayed frame: seq {seq}, already received up to {self.received - 1}")
        if seq > self.received:
            raise FrameError(f"out-of-order frame: seq {seq}, expected {self.received}")
        try:
            payload = self._recv.decrypt(_nonce(seq), body[_HEADER.size :], body[: _HEADER.size])
        except InvalidTag:
            raise FrameError(f"unauthenticated frame: bad tag on seq {seq}") from None
        self.received += 1
        return channel, payload


def _hello_frame(payload: bytes) -> bytes:
    return _LENGTH.pack(MIN_BODY + len(payload)) + _HEADER.pack(HELLO, 0, 0) + payload + bytes(TAG_BYTES)


def _hello_payload(body: bytes, size: int, magic: bytes = b"") -> bytes:
    """The payload after ``magic`` of a well-formed HELLO body of ``size`` payload bytes; FrameError otherwise."""
    kind, channel, seq = _HEADER.unpack_from(body)
    payload = body[_HEADER.size : -TAG_BYTES]
    if kind != HELLO:
        got = f"a frame of kind {kind}"
    elif len(payload) != size:
        got = f"a HELLO of {len(payload)} payload bytes instead of {size}"
    elif channel != 0 or seq != 0 or body[-TAG_BYTES:] != bytes(TAG_BYTES):
        got = "a HELLO with a nonzero channel, seq or tag"
    elif not payload.startswith(magic):
        got = f"a HELLO without the magic {magic.decode()!r}"
    else:
        return payload[len(magic) :]
    raise FrameError(f"expected a handshake, got {got}")


def _session_keys(eph_private: bytes, peer_public: bytes, nonce_c: bytes, nonce_s: bytes) -> tuple[bytes, bytes]:
    """``(c2s, s2c)``: ``hkdf(X25519(eph, peer), "dropsim-deploy-1 c2s|s2c" | nonce_c | nonce_s, 16)``."""
    keys = []
    for direction in (b" c2s", b" s2c"):
        # HKDF's first 16 output bytes do not depend on the requested length (RFC 5869, 2.3), so the
        # 32-byte agreed key truncated is exactly hkdf(shared, info, 16).
        try:
            agreed = agreement.agree(eph_private, peer_public, MAGIC + direction + nonce_c + nonce_s)
        except ValueError:
            raise FrameError("the peer's ephemeral key is invalid (a low-order point)") from None
        keys.append(agreed[:KEY_BYTES])
    return keys[0], keys[1]


def _finished(hello: bytes, eph_server: bytes, nonce_s: bytes) -> bytes:
    """What the client signs in the third flight: the whole transcript."""
    return MAGIC + b" finish" + hello + eph_server + nonce_s


async def _within(handshake: Coroutine[Any, Any, T], timeout: float) -> T:
    """``handshake``'s result, or FrameError if it takes longer than ``timeout`` seconds."""
    try:
        return await asyncio.wait_for(handshake, timeout)
    except asyncio.TimeoutError:
        raise FrameError(f"handshake timed out after {timeout:g} s") from None


async def client_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    party: int,
    signing_key: bytes,
    server_verification: bytes,
    rng: RandomSource | None = None,
    timeout: float = 30.0,
) -> Session:
    """Authenticate as worker ``party`` to the server holding ``server_verification``; the client's session.

    Raises FrameError if the server fails authentication, sends a malformed HELLO or the handshake takes
    longer than ``timeout`` seconds; Closed if the server closes the connection.
    """
    if not 0 <= party <= MAX_PARTY:
        raise ValueError(f"party must be a worker index in 0..{MAX_PARTY}, not {party}")

    async def handshake() -> Session:
        source = SystemRandom() if rng is None else rng
        eph_private, eph_public = agreement.generate(source)
        nonce_c = source.bytes(NONCE_BYTES)
        hello = party.to_bytes(4, "big") + eph_public + nonce_c
        signature = signatures.sign(signing_key, MAGIC + b" client" + hello)
        await send_frame(writer, _hello_frame(MAGIC + hello + signature))
        reply = _hello_payload(await read_frame(reader, HANDSHAKE_MAX_FRAME), _SERVER_HELLO_BYTES)
        eph_server, nonce_s = reply[: agreement.KEY_BYTES], reply[agreement.KEY_BYTES : -signatures.SIGNATURE_BYTES]
        transcript = MAGIC + b" server" + hello + eph_server + nonce_s
        if not signatures.verify(server_verification, transcript, reply[-signatures.SIGNATURE_BYTES :]):
            raise FrameError("server failed authentication")
        c2s, s2c = _session_keys(eph_private, eph_server, nonce_c, nonce_s)
        await send_frame(writer, _hello_frame(signatures.sign(signing_key, _finished(hello, eph_server, nonce_s))))
        return Session(send_key=c2s, recv_key=s2c)

    return await _within(handshake(), timeout)


async def server_handshake(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    verification: Callable[[int], bytes | None],
    signing_key: bytes,
    max_bytes: int = HANDSHAKE_MAX_FRAME,
    rng: RandomSource | None = None,
    timeout: float = 30.0,
) -> tuple[int, Session]:
    """Authenticate a connecting worker; ``(its party, the server's session)``.

    ``verification(party)`` is the party's verification key, or None for a party the server does not know.
    Raises FrameError if the first frame is not a well-formed HELLO of at most ``max_bytes``, the party is
    unknown or fails authentication (in the first or the third flight), or the handshake takes longer than
    ``timeout`` seconds (so silent or slow peers cannot hold the server); Closed if the client closes the
    connection.
    """

    async def handshake() -> tuple[int, Session]:
        payload = _hello_payload(await read_frame(reader, max_bytes), _CLIENT_HELLO_BYTES, MAGIC)
        hello = payload[: -signatures.SIGNATURE_BYTES]
        party = int.from_bytes(hello[:4], "big")
        public = verification(party)
        if public is None:
            raise FrameError(f"unknown party {party}")
        if not signatures.verify(public, MAGIC + b" client" + hello, payload[-signatures.SIGNATURE_BYTES :]):
            raise FrameError(f"party {party} failed authentication")
        eph_client, nonce_c = hello[4 : 4 + agreement.KEY_BYTES], hello[4 + agreement.KEY_BYTES :]
        source = SystemRandom() if rng is None else rng
        eph_private, eph_public = agreement.generate(source)
        nonce_s = source.bytes(NONCE_BYTES)
        c2s, s2c = _session_keys(eph_private, eph_client, nonce_c, nonce_s)
        signature = signatures.sign(signing_key, MAGIC + b" server" + hello + eph_public + nonce_s)
        await send_frame(writer, _hello_frame(eph_public + nonce_s + signature))
        # the third flight: the client signs the server's fresh values, so a replayed first flight stops here
        finish = _hello_payload(await read_frame(reader, max_bytes), _FINISH_BYTES)
        if not signatures.verify(public, _finished(hello, eph_public, nonce_s), finish):
            raise FrameError(f"party {party} failed to finish the handshake (a replayed hello?)")
        return party, Session(send_key=s2c, recv_key=c2s)

    return await _within(handshake(), timeout)
