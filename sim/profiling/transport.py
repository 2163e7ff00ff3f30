"""Micro-benchmarks of the deployment's transport, for the simulator's testbed model.

The socket deployment (:mod:`sim.deploy`) spends CPU that the protocol's own operations do not report:
sealing a frame (AES-GCM tag) and writing it through the asyncio stream in pieces, reading and opening a
frame on the other side, and handing each machine call to the party's compute thread and back. The
testbed model (``testbed: {cores: K}``, docs/time-model.md) charges them on the host's shared cores:

- ``deploy.send`` in ``bytes`` (and a constant): seal one frame and write it to a loopback TCP socket
  (:func:`sim.deploy.framing.send_frame`), a thread draining the other end;
- ``deploy.receive`` in ``bytes``: read one frame from a loopback socket a thread writes into
  (:func:`sim.deploy.framing.read_frame`) and open it;
- ``deploy.call``: one :meth:`sim.deploy.compute.ComputeThread.run` of an empty function (the hop to the
  party's compute thread and back through the event loop).

Each benchmark keeps one event loop and one socket pair for all its points.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from functools import partial

from sim.deploy.compute import ComputeThread
from sim.deploy.framing import Session, read_frame, send_frame
from sim.profiling.micro import Benchmark, Point

_KEY = bytes(range(16))


def _sizes(quick: bool) -> tuple[int, ...]:
    return (1_000, 100_000, 1_000_000) if quick else (1_000, 10_000, 100_000, 1_000_000, 4_000_000)


class _Loopback:
    """An event loop with one end of a loopback TCP connection; a thread serves the other end."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.loop = asyncio.new_event_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        self.reader, self.writer = self.loop.run_until_complete(asyncio.open_connection("127.0.0.1", port))
        peer = listener.accept()[0]
        listener.close()
        self.thread = threading.Thread(target=serve, args=(peer,), daemon=True)
        self.thread.start()

    def run(self, coroutine: Callable[[], object]) -> object:
        return self.loop.run_until_complete(coroutine())  # type: ignore[arg-type]


def _drain(peer: socket.socket) -> None:
    while peer.recv(1 << 20):
        pass


def _send(quick: bool) -> Iterator[Point]:
    end = _Loopback(_drain)
    session = Session(_KEY, _KEY)
    for size in _sizes(quick):
        payload = bytes(size)

        async def once(payload: bytes = payload) -> None:
            await send_frame(end.writer, session.seal(0, payload))

        yield Point({"bytes": float(size)}, partial(end.run, once))


def _receive(quick: bool) -> Iterator[Point]:
    requests: queue.Queue[tuple[Session, int] | None] = queue.Queue()

    def feed(peer: socket.socket) -> None:
        """Send each requested frame, and seal the next one ahead, off the timed path."""
        ahead: tuple[Session, int, bytes] | None = None
        while (request := requests.get()) is not None:
            session, size = request
            frame = ahead[2] if ahead is not None and ahead[:2] == (session, size) else session.seal(0, bytes(size))
            peer.sendall(frame)
            ahead = (session, size, session.seal(0, bytes(size)))

    end = _Loopback(feed)
    for size in _sizes(quick):
        sender, receiver = Session(_KEY, _KEY), Session(_KEY, _KEY)

        async def once(sender: Session = sender, receiver: Session = receiver, size: int = size) -> None:
            requests.put((sender, size))
            receiver.open(await read_frame(end.reader))

        yield Point({"bytes": float(size)}, partial(end.run, once))


def _call(quick: bool) -> Iterator[Point]:
    loop = asyncio.new_event_loop()
    cpu = ComputeThread("profile")

    async def once() -> None:
        await cpu.run(lambda: None)

    yield Point({}, lambda: loop.run_until_complete(once()))


TRANSPORT = (
    Benchmark("deploy.send", ("const", "bytes"), _send),
    Benchmark("deploy.receive", ("const", "bytes"), _receive),
    Benchmark("deploy.call", ("const",), _call),
)
