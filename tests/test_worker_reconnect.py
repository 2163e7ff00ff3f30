"""A worker's reconnections (sim/deploy/worker.py): exponential back-off with jitter and a cap, and a clear
exit after a bounded number of failed connections.

Before, a worker connected again at once after any connection that closed (some 1,300 handshakes in 8 s
against a relay that corrupts frames), and a server that closed the connection during the handshake ended
the worker with a traceback. A small server of the test's own, on 127.0.0.1, either closes every
connection at once or completes the handshake and then sends a frame that does not authenticate; the
worker is the real ``dropsim worker`` in a child process.
"""

from __future__ import annotations

import asyncio
import random
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.deploy import identity as ids
from sim.deploy.framing import server_handshake
from sim.deploy.worker import MAX_FAILED_SESSIONS, RECONNECT_CAP_S, RECONNECT_FIRST_S, backoff

WAIT_S = 60.0
"""Longest a worker is waited for (it gives up after about 7 s of back-off; before, it never did)."""


def test_the_back_off_doubles_with_jitter_up_to_its_cap() -> None:
    rng = random.Random(3)
    for failures in range(1, 40):
        ceiling = min(RECONNECT_CAP_S, RECONNECT_FIRST_S * 2 ** (failures - 1))
        draws = [backoff(failures, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in draws), (failures, min(draws), max(draws))
        assert len(set(draws)) == len(draws)  # jittered: workers cut off together come back apart
    assert backoff(10**6, rng) <= RECONNECT_CAP_S


class Server:
    """A server at 127.0.0.1 that takes connections in a thread of its own and records when each came.
    ``corrupt``: it completes the handshake as the deployment's server, then sends a frame of no kind a
    session takes; otherwise it closes each connection before the handshake's reply."""

    def __init__(self, keys: Path, corrupt: bool) -> None:
        self.corrupt = corrupt
        self.signing = ids.read_identity(ids.server_key_file(keys)).signing
        self.worker = ids.read_public(ids.public_file(ids.worker_key_file(keys, 0)))
        self.arrivals: list[float] = []
        self.handshakes = 0
        self.port = 0
        self.ready = threading.Event()
        self.stop = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        async with server:
            await self.stop.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.arrivals.append(time.monotonic())
        try:
            if self.corrupt:
                await server_handshake(reader, writer, {0: self.worker}.get, self.signing, timeout=10.0)
                self.handshakes += 1
                writer.write(struct.pack(">I", 40) + bytes(40))  # a frame of no kind the session takes
                await writer.drain()
                await reader.read()  # until the worker closes
        except Exception:  # the worker's end of it is what the test reads
            pass
        finally:
            writer.close()

    def __enter__(self) -> Server:
        self.thread.start()
        assert self.ready.wait(10.0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)  # asyncio events are set from their own loop
        self.thread.join(10.0)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    folder = tmp_path / "keys"
    ids.create_identity(ids.server_key_file(folder))
    ids.create_identity(ids.worker_key_file(folder, 0))
    return folder


def _worker(keys: Path, port: int) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sim", "worker", "--connect", f"127.0.0.1:{port}", "--index", "0"]
    return subprocess.run([*command, "--keys", str(keys)], capture_output=True, text=True, timeout=WAIT_S)


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", [False, True], ids=["closed during the handshake", "frames corrupted"])
def test_a_worker_backs_off_and_gives_up_with_a_clear_message(keys: Path, corrupt: bool) -> None:
    with Server(keys, corrupt) as server:
        started = time.monotonic()
        done = _worker(keys, server.port)
        elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    why = "the last: unexpected frame kind 0" if corrupt else "the handshake failed: the server closed the connection"
    assert f"gave up after {MAX_FAILED_SESSIONS} failed connections in a row" in done.stderr
    assert why in done.stderr.splitlines()[-1]
    assert len(server.arrivals) == MAX_FAILED_SESSIONS
    if corrupt:
        assert server.handshakes == MAX_FAILED_SESSIONS
    gaps = [b - a for a, b in zip(server.arrivals, server.arrivals[1:], strict=False)]
    least = [min(RECONNECT_CAP_S, RECONNECT_FIRST_S * 2**k) / 2 for k in range(len(gaps))]
    assert all(gap >= low for gap, low in zip(gaps, least, strict=True)), (gaps, least)
    assert elapsed < WAIT_S
