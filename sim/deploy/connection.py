"""One authenticated TCP connection of the deployment: frames in, frames out, through the link's shaping.

A :class:`Connection` owns two tasks. The reader reads frames (:func:`sim.deploy.framing.read_frame`, a
frame above the size limit is refused before its body is read), checks each (:meth:`Session.open`:
authentication tag, sequence number) and hands ``(channel, payload, arrival time)`` to its owner; the
first bad frame closes the connection with the reason. The writer sends queued payloads in order, each
sealed just before it leaves and written piece by piece through the token buckets of the links it
crosses (:mod:`sim.deploy.shaping`), and reports when its first and last byte left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from sim.deploy.framing import Closed, FrameError, Session, read_frame, send_frame
from sim.deploy.shaping import TokenBucket

Sent = tuple[float, float]
"""Monotonic seconds at which a payload's first and last byte were written."""


class Connection:
    """A framed connection; ``on_frame(channel, payload, arrived)`` and ``on_close(reason)`` are its owner's
    (``reason`` is empty for an orderly close or EOF, else the frame error that closed it)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: Session,
        max_frame: int,
        on_frame: Callable[[int, bytes, float], None],
        on_close: Callable[[str], None],
        recv_bucket: TokenBucket | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.session = session
        self.max_frame = max_frame
        self.on_frame = on_frame
        self.on_close = on_close
        self.recv_bucket = recv_bucket
        self.send_buckets: Sequence[TokenBucket] = ()
        """Token buckets every outgoing byte takes from (the links it crosses), set by the owner."""
        self.outbox: asyncio.Queue[tuple[int, bytes, asyncio.Future[Sent]]] = asyncio.Queue()
        self.closed = False
        self.reason = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._busy = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._write())]

    def send(self, channel: int, payload: bytes) -> asyncio.Future[Sent]:
        """Queue ``payload`` on ``channel``; the future resolves when it has been written (or fails with
        :class:`Closed`)."""
        future: asyncio.Future[Sent] = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(Closed(self.reason or "connection closed"))
            future.exception()  # retrieved: a send to a closed connection is not an error to report
        else:
            self.outbox.put_nowait((channel, payload, future))
        return future

    async def _read(self) -> None:
        reason = ""
        try:
            while True:
                body = await read_frame(self.reader, self.max_frame, self.recv_bucket)
                channel, payload = self.session.open(body)
                self.on_frame(channel, payload, time.monotonic())
                if self.closed:  # the owner closed it on that frame: what the peer sent after is not read
                    return
        except FrameError as exc:
            reason = exc.reason
        except (Closed, ConnectionError, asyncio.IncompleteReadError):
            reason = ""
        except asyncio.CancelledError:
            return
        self._shut(reason)

    async def _write(self) -> None:
        try:
            while True:
                channel, payload, future = await self.outbox.get()
                self._busy = True
                frame = self.session.seal(channel, payload)
                start = time.monotonic()
                try:
                    await send_frame(self.writer, frame, self.send_buckets)
                except (ConnectionError, RuntimeError) as exc:
                    if not future.done():
                        future.set_exception(Closed(str(exc)))
                        future.exception()
                    self._shut("")
                    return
                self._busy = False
                if not future.done():
                    future.set_result((start, time.monotonic()))
        except asyncio.CancelledError:
            return

    def _shut(self, reason: str) -> None:
        if self.closed:
            return
        self.closed, self.reason = True, reason
        while not self.outbox.empty():
            _, _, future = self.outbox.get_nowait()
            if not future.done():
                future.set_exception(Closed(reason or "connection closed"))
                future.exception()
        self.writer.close()
        me = asyncio.current_task()
        for task in self._tasks:
            if task is not me:
                task.cancel()
        self.on_close(reason)

    def close(self, reason: str = "") -> None:
        """Close now (queued payloads are dropped)."""
        self._shut(reason)

    async def drain_and_close(self, timeout: float = 5.0) -> None:
        """Send what is queued (for at most ``timeout`` s), then close."""
        deadline = time.monotonic() + timeout
        while (self._busy or not self.outbox.empty()) and not self.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        self._shut("")
