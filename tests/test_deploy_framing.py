"""The deployment mode's record layer and link shaping, over real loopback sockets where it matters.

Every socket test runs in ``asyncio.run`` under a few-second ``wait_for``; timing checks of the token
bucket are deliberately tolerant (they check that shaping happens, not the scheduler's precision), and
its arithmetic is checked exactly in fake time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.crypto import agreement, signatures
from sim.crypto.randomness import SeededRandom
from sim.deploy import framing
from sim.deploy import identity as ids
from sim.deploy.framing import (
    DEFAULT_MAX_FRAME,
    OVERHEAD,
    Closed,
    FrameError,
    Session,
    client_handshake,
    read_frame,
    send_frame,
    server_handshake,
)
from sim.deploy.shaping import TokenBucket, seconds_for

T = TypeVar("T")


def party_identity(party: int) -> tuple[bytes, bytes]:
    """A fixed key pair per party, for reproducible tests (a deployment's parties draw theirs from the OS)."""
    return signatures.generate(SeededRandom(bytes([party % 256]) * 32))


SERVER_SEED, SERVER_PUBLIC = party_identity(-1)
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def run(coroutine: Coroutine[Any, Any, T], timeout: float = 5.0) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


@asynccontextmanager
async def connection() -> AsyncIterator[tuple[Streams, Streams]]:
    """``(client end, server end)`` of one TCP connection on 127.0.0.1."""
    accepted: asyncio.Queue[Streams] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await asyncio.open_connection("127.0.0.1", port)
    served = await accepted.get()
    try:
        yield client, served
    finally:
        for _, writer in (client, served):
            writer.close()
        server.close()
        await server.wait_closed()


def verification_of(*parties: int) -> Callable[[int], bytes | None]:
    keys = {party: party_identity(party)[1] for party in parties}
    return keys.get


async def handshake(client: Streams, served: Streams, party: int = 0) -> tuple[Session, Session]:
    """``(client session, server session)`` after a successful handshake of worker ``party``."""
    signing, _ = party_identity(party)
    client_session, (seen, server_session) = await asyncio.gather(
        client_handshake(*client, party, signing, SERVER_PUBLIC),
        server_handshake(*served, verification_of(party), SERVER_SEED),
    )
    assert seen == party
    return client_session, server_session


def session_pair() -> tuple[Session, Session]:
    return Session(bytes(range(16)), bytes(range(16, 32))), Session(bytes(range(16, 32)), bytes(range(16)))


def reader_of(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    """A stream holding ``data`` (call inside the event loop)."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


def body(frame: bytes) -> bytes:
    return frame[4:]


# -- the record layer over a real connection ---------------------------------------------------------


def test_frames_round_trip_both_ways_on_four_channels():
    payloads = [b"", b"x", bytes(range(256)) * 300, b"\x00" * 70_000, b"last"]

    async def scenario() -> None:
        async with connection() as (client, served):
            client_session, server_session = await handshake(client, served, party=3)
            for i, payload in enumerate(payloads):
                await send_frame(client[1], client_session.seal(i % 4, payload))
                assert server_session.open(await read_frame(served[0])) == (i % 4, payload)
                await send_frame(served[1], server_session.seal(3 - i % 4, payload[::-1]))
                assert client_session.open(await read_frame(client[0])) == (3 - i % 4, payload[::-1])
            assert (client_session.sent, client_session.received) == (5, 5)
            assert (server_session.sent, server_session.received) == (5, 5)

    run(scenario())


def test_session_keys_follow_the_specified_derivation():
    # Replays both sides' randomness to derive c2s and s2c independently, with cryptography's raw X25519
    # and a 16-byte HKDF, and checks that sessions built from them talk to the handshake's sessions.
    client_seed, server_seed = bytes(32), bytes([1]) * 32

    async def scenario() -> tuple[Session, Session]:
        async with connection() as (client, served):
            signing, _ = party_identity(0)
            client_session, (_, server_session) = await asyncio.gather(
                client_handshake(*client, 0, signing, SERVER_PUBLIC, rng=SeededRandom(client_seed)),
                server_handshake(*served, verification_of(0), SERVER_SEED, rng=SeededRandom(server_seed)),
            )
            return client_session, server_session

    client_session, server_session = run(scenario())
    client_rng, server_rng = SeededRandom(client_seed), SeededRandom(server_seed)
    eph_c, nonce_c = client_rng.bytes(32), client_rng.bytes(32)
    eph_s, nonce_s = server_rng.bytes(32), server_rng.bytes(32)
    shared = X25519PrivateKey.from_private_bytes(eph_c).exchange(
        X25519PublicKey.from_public_bytes(agreement.public_of(eph_s))
    )
    c2s = agreement.hkdf(shared, b"dropsim-deploy-1 c2s" + nonce_c + nonce_s, 16)
    s2c = agreement.hkdf(shared, b"dropsim-deploy-1 s2c" + nonce_c + nonce_s, 16)
    assert server_session.open(body(Session(c2s, s2c).seal(1, b"up"))) == (1, b"up")
    assert Session(c2s, s2c).open(body(server_session.seal(2, b"down"))) == (2, b"down")
    assert Session(s2c, c2s).open(body(client_session.seal(0, b"c"))) == (0, b"c")


# -- seal and open ---------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**16 - 1), st.binary(max_size=300)), max_size=12))
def test_open_inverts_seal_in_order(frames):
    sender, receiver = session_pair()
    for count, (channel, payload) in enumerate(frames, start=1):
        frame = sender.seal(channel, payload)
        assert len(frame) == OVERHEAD + len(payload)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        assert receiver.open(body(frame)) == (channel, payload)
        assert sender.sent == receiver.received == count


def test_each_direction_has_its_own_key():
    client, server = session_pair()
    with pytest.raises(FrameError, match="bad tag"):
        client.open(body(Session(bytes(range(16)), bytes(16)).seal(0, b"reflected")))
    assert server.open(body(client.seal(0, b"ok"))) == (0, b"ok")


def expected_tamper_error(position: int) -> str:
    """What opening a frame with byte ``position`` (of the body, kind at 0) flipped reports."""
    if position == 0:
        return "unexpected frame kind"
    if 3 <= position < 11:
        return "out-of-order frame"
    return "unauthenticated frame: bad tag on seq 0"


@pytest.mark.parametrize("flip", [0x01, 0x80])
def test_tampering_any_byte_is_detected_and_does_not_advance(flip):
    sender, receiver = session_pair()
    frame = body(sender.seal(2, b"the model update"))
    for position in range(len(frame)):
        tampered = bytearray(frame)
        tampered[position] ^= flip
        with pytest.raises(FrameError, match=expected_tamper_error(position)):
            receiver.open(bytes(tampered))
        assert receiver.received == 0
    assert receiver.open(frame) == (2, b"the model update")


def test_tampering_the_length_prefix_is_detected():
    frame = session_pair()[0].seal(0, b"x" * 40)

    async def read_tampered(position: int) -> None:
        tampered = bytearray(frame)
        tampered[position] ^= 0x01
        session = session_pair()[1]
        session.open(await read_frame(reader_of(bytes(tampered))))

    for position in range(4):
        with pytest.raises((FrameError, Closed)):
            run(read_tampered(position))


def test_a_replayed_frame_is_rejected():
    sender, receiver = session_pair()
    frames = [body(sender.seal(0, bytes([i]))) for i in range(3)]
    receiver.open(frames[0])
    receiver.open(frames[1])
    with pytest.raises(FrameError) as caught:
        receiver.open(frames[0])
    assert caught.value.reason == "replayed frame: seq 0, already received up to 1"
    assert str(caught.value) == caught.value.reason
    assert receiver.open(frames[2]) == (0, b"\x02")


def test_a_skipped_frame_is_rejected():
    sender, receiver = session_pair()
    frames = [body(sender.seal(1, bytes([i]))) for i in range(3)]
    receiver.open(frames[0])
    with pytest.raises(FrameError) as caught:
        receiver.open(frames[2])
    assert caught.value.reason == "out-of-order frame: seq 2, expected 1"
    assert receiver.open(frames[1]) == (1, b"\x01")


def test_session_rejects_bad_arguments():
    with pytest.raises(ValueError, match="send_key must be 16 bytes"):
        Session(bytes(32), bytes(16))
    with pytest.raises(ValueError, match="channel must be in 0..65535"):
        session_pair()[0].seal(2**16, b"")
    with pytest.raises(FrameError, match="shorter than the 27 bytes"):
        session_pair()[1].open(bytes(26))


# -- reading frames ----------------------------------------------------------------------------------


def test_a_giant_length_prefix_is_refused_before_the_body_arrives():
    async def scenario() -> None:
        # No body and no EOF: a reader that waited for the body would hang until the timeout.
        await read_frame(reader_of(b"\xff\xff\xff\xff" + b"abc", eof=False))

    with pytest.raises(FrameError) as caught:
        run(scenario(), timeout=2.0)
    assert caught.value.reason == f"frame of {2**32 - 1} bytes exceeds the limit of {DEFAULT_MAX_FRAME} bytes"


def test_a_frame_shorter_than_header_and_tag_is_refused():
    async def scenario() -> bytes:
        return await read_frame(reader_of((26).to_bytes(4, "big") + bytes(26)))

    with pytest.raises(FrameError, match="frame of 26 bytes is shorter than the 27 bytes of header and tag"):
        run(scenario())


def test_eof_mid_frame_and_between_frames_is_closed():
    frame = session_pair()[0].seal(0, b"payload")

    async def scenario(cut: int) -> bytes:
        async with connection() as (client, served):
            client[1].write(frame[:cut])
            await client[1].drain()
            client[1].close()
            return await read_frame(served[0])

    for cut in (0, 2, 4, 10, len(frame) - 1):
        with pytest.raises(Closed):
            run(scenario(cut))
    assert run(scenario(len(frame))) == body(frame)


# -- the handshake -----------------------------------------------------------------------------------


async def serve_one(send: Callable[[Streams], Awaitable[None]], timeout: float = 30.0) -> tuple[int, Session]:
    """Run server_handshake against a client that does ``send``."""
    async with connection() as (client, served):
        await send(client)
        return await server_handshake(*served, verification_of(0, 1), SERVER_SEED, timeout=timeout)


def test_garbage_as_the_first_frame_is_refused():
    async def http(client: Streams) -> None:
        client[1].write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")

    with pytest.raises(FrameError, match=r"frame of 1195725856 bytes exceeds the limit of 4096 bytes"):
        run(serve_one(http))


def test_a_data_frame_as_the_first_frame_is_refused():
    async def data(client: Streams) -> None:
        client[1].write(session_pair()[0].seal(0, b"hello?"))

    with pytest.raises(FrameError, match="expected a handshake, got a frame of kind 1"):
        run(serve_one(data))


def test_a_hello_without_the_magic_is_refused():
    async def wrong_magic(client: Streams) -> None:
        payload = b"dropsim-deploy-0" + bytes(4 + 32 + 32 + 64)
        client[1].write(framing._hello_frame(payload))

    with pytest.raises(FrameError, match="expected a handshake, got a HELLO without the magic"):
        run(serve_one(wrong_magic))


def test_a_signed_low_order_ephemeral_key_is_refused():
    async def zero_key(client: Streams) -> None:
        hello = (0).to_bytes(4, "big") + bytes(32) + bytes(32)
        signature = signatures.sign(party_identity(0)[0], b"dropsim-deploy-1 client" + hello)
        client[1].write(framing._hello_frame(b"dropsim-deploy-1" + hello + signature))

    with pytest.raises(FrameError, match="ephemeral key is invalid"):
        run(serve_one(zero_key))


def test_a_client_signing_with_the_wrong_key_fails_authentication():
    async def scenario() -> None:
        async with connection() as (client, served):
            impostor, _ = party_identity(1)
            client_side = asyncio.ensure_future(client_handshake(*client, 0, impostor, SERVER_PUBLIC))
            try:
                await server_handshake(*served, verification_of(0, 1), SERVER_SEED)
            finally:
                served[1].close()
                with pytest.raises(Closed):
                    await client_side

    with pytest.raises(FrameError) as caught:
        run(scenario())
    assert caught.value.reason == "party 0 failed authentication"


def test_an_unknown_party_is_refused():
    async def scenario() -> None:
        async with connection() as (client, served):
            signing, _ = party_identity(7)
            client_side = asyncio.ensure_future(client_handshake(*client, 7, signing, SERVER_PUBLIC))
            try:
                await server_handshake(*served, verification_of(0, 1), SERVER_SEED)
            finally:
                client_side.cancel()

    with pytest.raises(FrameError) as caught:
        run(scenario())
    assert caught.value.reason == "unknown party 7"


def test_a_server_with_the_wrong_key_fails_authentication():
    async def scenario() -> None:
        async with connection() as (client, served):
            impostor, _ = party_identity(5)
            server_side = asyncio.ensure_future(server_handshake(*served, verification_of(0), impostor))
            try:
                await client_handshake(*client, 0, party_identity(0)[0], SERVER_PUBLIC)
            finally:
                client[1].close()  # the client refuses the server: no third flight
                with pytest.raises((Closed, FrameError)):
                    await server_side

    with pytest.raises(FrameError, match="^server failed authentication$"):
        run(scenario())


def test_a_silent_client_cannot_hold_the_server():
    async def silent(client: Streams) -> None:
        pass

    start = time.monotonic()
    with pytest.raises(FrameError) as caught:
        run(serve_one(silent, timeout=0.3))
    assert caught.value.reason == "handshake timed out after 0.3 s"
    assert 0.25 < time.monotonic() - start < 2.0


def test_a_replayed_first_flight_is_never_authenticated():
    """A recorded HELLO of worker 0, replayed by someone without its key, cannot finish the handshake: the
    server wants the third flight, a signature over its own fresh nonce (before, the first flight alone
    authenticated the party, and a replay displaced the worker's live connection)."""

    async def record() -> bytes:
        async with connection() as (client, served):
            recorded: list[bytes] = []
            client_side = asyncio.ensure_future(client_handshake(*client, 0, party_identity(0)[0], SERVER_PUBLIC))
            recorded.append(await read_frame(served[0], framing.HANDSHAKE_MAX_FRAME))
            client_side.cancel()
            return recorded[0]

    first = run(record())

    async def replay(client: Streams) -> None:
        client[1].write(len(first).to_bytes(4, "big") + first)

    with pytest.raises(FrameError) as caught:
        run(serve_one(replay, timeout=0.5))
    assert caught.value.reason == "handshake timed out after 0.5 s"

    async def replay_with_a_guess() -> None:
        async with connection() as (client, served):
            server_side = asyncio.ensure_future(server_handshake(*served, verification_of(0, 1), SERVER_SEED))
            await replay(client)
            await read_frame(client[0], framing.HANDSHAKE_MAX_FRAME)  # the server's flight
            client[1].write(framing._hello_frame(bytes(signatures.SIGNATURE_BYTES)))
            await server_side

    with pytest.raises(FrameError) as caught:
        run(replay_with_a_guess())
    assert caught.value.reason == "party 0 failed to finish the handshake (a replayed hello?)"


def test_payloads_are_encrypted_on_the_wire():
    """A DATA frame carries the payload's AES-GCM ciphertext, as long as the plaintext: nothing of a payload
    appears in its frame, and the same payload sealed twice looks different."""
    sender, receiver = session_pair()
    payload = b"scenario: {name: secret-run, seed: 7}" * 20
    frames = [sender.seal(0, payload) for _ in range(2)]
    for frame in frames:
        assert len(frame) == OVERHEAD + len(payload)
        assert payload[:16] not in frame and b"secret-run" not in frame
    assert frames[0][19:] != frames[1][19:]
    assert [receiver.open(body(f)) for f in frames] == [(0, payload), (0, payload)]


# -- identities ---------------------------------------------------------------------------------------


def test_each_party_draws_its_own_key_and_only_the_public_half_is_written_for_others(tmp_path):
    first, second = ids.new_identity(), ids.new_identity()
    assert first.signing != second.signing and first.verification != second.verification
    assert signatures.verify(first.verification, b"m", signatures.sign(first.signing, b"m"))
    assert first.signing.hex() not in repr(first)
    key_file = ids.worker_key_file(tmp_path, 3)
    made = ids.create_identity(key_file)
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert ids.read_identity(key_file) == made
    assert ids.read_public(ids.public_file(key_file)) == made.verification
    assert made.signing.hex() not in ids.public_file(key_file).read_text()
    assert ids.load_or_create(key_file) == (made, False)
    with pytest.raises(ids.IdentityError, match="exists already"):
        ids.create_identity(key_file)


def test_bad_key_files_and_folders_are_named(tmp_path):
    key_file = tmp_path / "worker-0.key"
    key_file.write_text("zz")
    with pytest.raises(ids.IdentityError, match="worker-0.key: not a signing key"):
        ids.read_identity(key_file)
    key_file.write_text("00" * 16)
    with pytest.raises(ids.IdentityError, match="is 32 bytes"):
        ids.read_identity(key_file)
    ids.create_identity(ids.worker_key_file(tmp_path, 1))
    with pytest.raises(ids.IdentityError, match=r"no verification key of worker-0.pub, worker-2.pub; on each"):
        ids.worker_directory(tmp_path, 3)
    (tmp_path / "worker-0.pub").write_text((tmp_path / "worker-1.pub").read_text())
    with pytest.raises(ids.IdentityError, match="worker-0.pub and worker-1.pub hold the same key"):
        ids.worker_directory(tmp_path, 2)
    with pytest.raises(ids.IdentityError, match="not a verification key"):
        ids.parse_announcement(b"not hex\n")


# -- shaping -----------------------------------------------------------------------------------------


class FakeTime:
    """A clock that only the bucket's sleeps advance; records every sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_bucket_arithmetic_in_fake_time():
    # 8000 bit/s is 1000 bytes/s; every number below is exact in binary floating point.
    fake = FakeTime()
    bucket = TokenBucket(8000, clock=fake.clock, sleep=fake.sleep, slack_s=0)

    async def scenario() -> None:
        await bucket.take(1000)  # a fluid link: 1000 bytes take 1 s, from the start
        await bucket.take(3000)
        await bucket.take(500)
        assert fake.sleeps == [1.0, 3.0, 0.5]
        fake.now += 100.0  # an idle link keeps no credit
        await bucket.take(250)
        assert fake.sleeps == [1.0, 3.0, 0.5, 0.25]
        await bucket.take(0)
        assert fake.sleeps == [1.0, 3.0, 0.5, 0.25]

    run(scenario())
    assert fake.now == 100.0 + seconds_for(4750, 8000)


def test_concurrent_takers_queue_in_call_order():
    fake = FakeTime()
    bucket = TokenBucket(8000, clock=fake.clock, sleep=fake.sleep, slack_s=0)
    # reservations are made at call time, before any wait: the second waits for the first's bytes too
    assert bucket.reserve(1000) == 1.0
    assert bucket.reserve(500) == 1.5
    assert bucket.busy_until == 1.5


def test_a_burst_lets_an_idle_link_pass_bytes_at_once():
    fake = FakeTime()
    bucket = TokenBucket(8000, burst_bytes=1000, clock=fake.clock, sleep=fake.sleep, slack_s=0)
    assert bucket.reserve(1000) == 0.0  # the burst, at once
    assert bucket.reserve(500) == 0.5
    fake.now += 10.0
    assert bucket.reserve(1500) == 0.5  # idle again: 1000 of credit


def test_bucket_credits_a_late_wake_up_to_the_next_taker():
    fake = FakeTime()
    bucket = TokenBucket(8000, clock=fake.clock, sleep=fake.sleep, slack_s=0.25)

    async def scenario() -> None:
        await bucket.take(500)  # the first 250 bytes' worth is the idle link's slack: sleeps 0.25 s
        fake.now += 0.125  # the scheduler woke it 0.125 s late: the next piece makes up for it
        await bucket.take(250)
        fake.now += 1.0  # idle for long: only the slack is credited
        await bucket.take(500)
        assert fake.sleeps == [0.25, 0.125, 0.25]

    run(scenario())


def test_bucket_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rate_bps must be a positive"):
        TokenBucket(0)
    with pytest.raises(ValueError, match="burst_bytes must be at least 0"):
        TokenBucket(1e6, burst_bytes=-1)


async def send_through(client: Streams, served: Streams, nbytes: int, buckets: list[TokenBucket]) -> float:
    """Seconds to send a frame of ``nbytes`` payload through ``buckets`` and read it on the other end."""
    sender, receiver = session_pair()
    start = time.monotonic()
    reading = asyncio.ensure_future(read_frame(served[0]))
    await send_frame(client[1], sender.seal(0, bytes(nbytes)), buckets)
    assert receiver.open(await reading) == (0, bytes(nbytes))
    return time.monotonic() - start


def test_sending_through_an_8_mbps_bucket_takes_about_0_2_s():
    async def scenario() -> float:
        async with connection() as (client, served):
            return await send_through(client, served, 200_000, [TokenBucket(8e6)])

    # 200 031 bytes at 1e6 bytes/s = 0.2 s
    assert 0.15 < run(scenario()) < 0.5


def test_reading_through_an_8_mbps_bucket_throttles_the_sender():
    async def scenario() -> float:
        async with connection() as (client, served):
            sender, receiver = session_pair()
            bucket = TokenBucket(8e6)
            start = time.monotonic()
            reading = asyncio.ensure_future(read_frame(served[0], bucket=bucket))
            await send_frame(client[1], sender.seal(0, bytes(200_000)))
            assert receiver.open(await reading) == (0, bytes(200_000))
            return time.monotonic() - start

    assert 0.15 < run(scenario()) < 0.5


def test_two_senders_sharing_a_bucket_both_finish_near_the_combined_time():
    # 200 kB each at 2e6 bytes/s: alone 0.1 s, together 0.2 s; interleaved piece by piece, both end late.
    async def scenario() -> list[float]:
        shared = TokenBucket(16e6)
        async with connection() as (client_a, served_a), connection() as (client_b, served_b):
            return list(
                await asyncio.gather(
                    send_through(client_a, served_a, 200_000, [shared]),
                    send_through(client_b, served_b, 200_000, [shared]),
                )
            )

    finished = run(scenario())
    assert all(0.15 < seconds < 0.6 for seconds in finished), finished


def test_the_key_commands_make_per_party_keys_and_refuse_the_shared_secret(tmp_path, capsys):
    from sim.cli import main

    keys = tmp_path / "keys"
    assert main(["worker", "--keygen", "--index", "2", "--keys", str(keys)]) == 0
    assert (keys / "worker-2.key").stat().st_mode & 0o777 == 0o600
    assert ids.read_public(keys / "worker-2.pub") == ids.read_identity(keys / "worker-2.key").verification
    assert main(["worker", "--keygen", "--index", "2", "--keys", str(keys)]) == 2  # never replaced
    assert "exists already" in capsys.readouterr().err
    assert main(["worker", "--connect", "127.0.0.1:1", "--index", "0", "--secret-file", "x"]) == 2
    assert "--secret-file is gone" in capsys.readouterr().err
    assert main(["worker", "--connect", "127.0.0.1:1", "--index", "2", "--keys", str(keys)]) == 2
    assert "server.pub: not a verification key" in capsys.readouterr().err
    scenario = "scenarios/deploy.yaml"
    assert main(["deploy", scenario, "--no-spawn", "--output", str(tmp_path / "out")]) == 2
    assert "--no-spawn needs --keys DIR" in capsys.readouterr().err
    command = ["deploy", scenario, "--no-spawn", "--keys", str(keys), "--workers", "3", "--output", str(tmp_path / "o")]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "no verification key of worker-0.pub, worker-1.pub" in err
    assert (keys / "server.key").exists() and (keys / "server.pub").exists()


# -- what a worker accepts from its server ------------------------------------------------------------


def _worker(**kwargs):  # type: ignore[no-untyped-def]
    from sim.deploy.worker import Worker

    return Worker("127.0.0.1", 1, 0, ids.new_identity(), ids.new_identity().verification, 1 << 20, **kwargs)


def test_a_worker_derives_its_secrets_from_the_seed_only_if_it_agreed_to():
    from sim.deploy import control
    from sim.deploy.worker import PolicyRefusedError

    config = control.Config(b"{}", b"", ids.new_deployment_id(), 1)
    with pytest.raises(PolicyRefusedError, match="only a worker started with --seeded-secrets agrees"):
        _worker()._configure(config)


@pytest.mark.parametrize("text", [b"[" * 100_000, b'{"file": "x", "scenario": ' + b"9" * 5000 + b"}"])
def test_a_configuration_too_deep_or_too_long_to_read_is_a_clear_refusal(text):
    from sim.deploy import control

    with pytest.raises(ValueError, match="the server's configuration is not a scenario: (RecursionError|ValueError)"):
        _worker()._configure(control.Config(text, b"", ids.new_deployment_id(), 0))


def test_a_lasting_key_never_signs_twice_for_one_deployment(tmp_path):
    from sim.deploy import control

    record = ids.sessions_file(ids.worker_key_file(tmp_path, 0))
    deployment = ids.new_deployment_id()
    ids.remember_deployment(record, deployment)
    ids.remember_deployment(record, ids.new_deployment_id())
    with pytest.raises(ids.IdentityError, match="has signed for before"):
        ids.remember_deployment(record, deployment)
    with pytest.raises(ids.IdentityError, match="has signed for before"):
        _worker(sessions=record)._configure(control.Config(b"{}", b"", deployment, 0))


def test_every_signature_is_bound_to_the_deployment():
    from sim.protocol.instances import RoundInstances
    from sim.protocol.params import AggregationParams

    params = AggregationParams("secagg", 20, 1.0, 0.5, None, True)
    sessions = {
        context: RoundInstances(params, 1, 1, (0, 1, 2), 8, context=context).servers[0].config.session  # type: ignore[attr-defined]
        for context in (b"", ids.new_deployment_id(), ids.new_deployment_id())
    }
    assert len(set(sessions.values())) == 3


def test_a_worker_checks_the_keys_a_round_lists():
    from sim.deploy import control
    from sim.deploy.worker import LeftError

    known = [ids.new_identity() for _ in range(3)]
    worker = _worker(directory=frozenset(k.verification for k in known))
    worker.identity = known[0]

    def start(*keys: bytes) -> control.RoundStart:
        return control.RoundStart(1, 5, (5, 6, 7), b"", 0, control.NO_RATE, keys)

    ok = start(known[0].verification, known[1].verification, b"")
    assert worker._roster(ok) == {5: known[0].verification, 6: known[1].verification, 7: b""}
    cases = {
        "does not list this worker's key": start(known[1].verification, known[0].verification, b""),
        "twice": start(known[0].verification, known[1].verification, known[1].verification),
        "not in this worker's key folder": start(known[0].verification, ids.new_identity().verification, b""),
        "3 clients": start(known[0].verification),
    }
    for reason, bad in cases.items():
        with pytest.raises(LeftError, match=reason):
            worker._roster(bad)


def test_a_deployment_waiting_for_workers_says_the_port_it_listens_on(tmp_path, capsys):
    """``--port 0`` lets the system choose: what the command says is the port it chose (it said 0)."""
    from sim.cli.deploy import through_deployment
    from sim.deploy.deployment import DeployOptions
    from sim.scenario import load

    keys = tmp_path / "keys"
    server = ids.create_identity(ids.server_key_file(keys))
    ids.create_identity(ids.worker_key_file(keys, 0))
    options = DeployOptions(identity=server, keys=keys, workers=1, spawn=False, port=0)
    scenario = load("scenarios/deploy.yaml", ["sampling.clients_per_round=1"], str(tmp_path / "out")).base()
    deployed = through_deployment(options)(scenario)
    try:
        host, port = deployed.driver.address  # type: ignore[attr-defined]
        assert host == "127.0.0.1" and port > 0
        assert f"waiting for workers at 127.0.0.1:{port} (dropsim worker --connect 127.0.0.1:{port})" in (
            capsys.readouterr().err
        )
    finally:
        deployed.close()
