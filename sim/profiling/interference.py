"""Pipeline interference: measure Dordis eq. 3's ``beta_2 m`` term for a client on this machine.

Dordis (section 4.2, eq. 3) splits a client's update of d values into m chunks and pipelines them; a
chunk's latency at stage s is ``tau_s = beta_s1 d/m + beta_s2 m + beta_s3``. The ``beta_s2 m`` term is
inter-task intervention: some of the device's cycles go to the network IO of the other chunks in the
pipeline, more so as it deepens. Here it is measured, not assumed:

- the compute thread (the caller) runs the client's real chunk work one chunk after another: the AES-CTR
  self-mask keystream of the chunk (:meth:`sim.protocol.suite.RealSuite.self_mask`), its addition mod
  2^20 (:func:`sim.protocol.encoding.add_mod`) and the chunk's ``MaskedInput`` wire frame;
- a sender thread writes each finished chunk to a loopback TCP connection (127.0.0.1, ephemeral port)
  while later chunks are computed, and a receiver thread reads and discards it;
- the wall time (``time.perf_counter``) of each chunk's work is recorded; a point's value is the median
  over repeats of a round's mean seconds per chunk. The same rounds without the network threads are the
  baseline. Every repeat times every point in both modes, each round after one untimed chunk, so that
  both modes start from the same cache state.

Both are fitted as ``seconds per chunk = a (d/m) + b m + c`` by non-negative least squares
(:func:`sim.profiling.fit.fit_nonnegative`); the pipelined ``b`` is ``interference_s``: extra client CPU
seconds per chunk task per chunk in the pipeline, on the reference device (slow-down 1). The receiver
runs on the same machine, so the loopback IO costs both ends of the connection.

:func:`measure_pipeline` times in a child process (``python -m sim.profiling.interference``) with glibc's
malloc trim and mmap thresholds raised (``GLIBC_TUNABLES``): the wire encoder's bit packing allocates
temporaries of 32 bytes per value, and with the default thresholds whether they are freshly page-faulted
depends on allocation history, which moves the per-value cost by a factor of 2 to 3 from round to round
and swamps the effect measured here.
"""

from __future__ import annotations

import json
import math
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.profiling.fit import fit_nonnegative
from sim.protocol.encoding import add_mod
from sim.protocol.messages import MaskedInput
from sim.protocol.suite import RealSuite
from sim.protocol.wire import ModVector

BITS = 20
"""Width of the masked values (Dordis's 20-bit encoding): arithmetic is mod 2^20."""

FEATURES = ("const", "chunk_elements", "chunks")
"""Fit features: ``chunk_elements`` = d/m (coefficient a, seconds per value), ``chunks`` = m
(coefficient b, seconds per chunk in the pipeline), ``const`` (c, seconds)."""

MALLOC_TUNABLES = "glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=1073741824"
"""The child's allocator: no trimming and no mmap below 1 GiB, so temporaries reuse warm heap pages."""

METHOD = (
    "Median over repeats of a round's mean wall seconds per chunk of the client's chunk work (AES-CTR "
    "self-mask, addition mod 2^20, MaskedInput frame encoding) while a second thread sends the finished "
    "chunks over loopback TCP to a discarding receiver thread, fitted as a*(d/m) + b*m + c by non-negative "
    "least squares; interference_s = b, and the baseline is the same fit without the network threads."
)


class InterferenceError(RuntimeError):
    """The interference measurement could not be completed (socket, thread, child process or timing)."""


@dataclass(frozen=True)
class PipelineSettings:
    """What to time: every update size d in ``dims`` (values) split into every chunk count m in ``chunks``.

    Every point runs ``repeats`` rounds per mode, fewer (at least ``min_repeats``) once ``budget_s``
    seconds of wall time have passed; ``io_timeout_s`` bounds every wait on the sockets and threads
    (seconds).
    """

    dims: tuple[int, ...]
    chunks: tuple[int, ...]
    repeats: int
    budget_s: float
    min_repeats: int = 3
    io_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.dims or not self.chunks:
            raise ValueError(f"pipeline settings need dims and chunks, not {self.dims!r} and {self.chunks!r}")
        for d in self.dims:
            for m in self.chunks:
                if m < 1 or d < m or d % m:
                    raise ValueError(f"pipeline point d={d}, m={m}: m must be >= 1 and divide d")
        if len(set(self.dims)) < 2 or len(set(self.chunks)) < 2:
            raise ValueError(
                f"pipeline settings need at least two distinct dims and chunk counts to fit a, b, c; "
                f"got dims={self.dims}, chunks={self.chunks}"
            )
        if not 1 <= self.min_repeats <= self.repeats:
            raise ValueError(f"repeats={self.repeats}, min_repeats={self.min_repeats}: need 1 <= min <= repeats")
        if not (self.budget_s > 0 and self.io_timeout_s > 0):
            raise ValueError(f"budget_s={self.budget_s}, io_timeout_s={self.io_timeout_s}: both must be > 0")

    @property
    def grid(self) -> list[tuple[int, int]]:
        """The (d, m) points, in timing order."""
        return [(d, m) for d in self.dims for m in self.chunks]


FULL = PipelineSettings(dims=(1 << 17, 1 << 18, 1 << 19), chunks=(1, 2, 4, 8, 16), repeats=60, budget_s=45.0)
"""The settings of ``dropsim profile``: about 20 s on 2 cores, at most 45 s plus one repeat."""

QUICK = PipelineSettings(dims=(1 << 13, 1 << 15), chunks=(1, 2, 4, 8), repeats=30, budget_s=3.0)
"""A rough measurement in about a second, for tests and ``dropsim profile --quick``."""


@dataclass(frozen=True)
class PointTiming:
    """Median seconds per chunk (reference device) of one (d, m) point, pipelined and sequential."""

    elements: int
    """d, values in the whole update."""
    chunks: int
    """m, chunks the update is split into."""
    seconds: float
    """Pipelined: median over repeats of the round's mean compute seconds per chunk."""
    baseline_seconds: float
    """Sequential (no network threads): the same statistic."""
    repeats: int


def chunk_task(values: np.ndarray, seed: bytes, suite: RealSuite) -> bytes:
    """The client's work on one chunk: mask it with its AES-CTR keystream mod 2^20 and encode the frame."""
    mask = suite.self_mask(seed, len(values), BITS)
    assert isinstance(mask, np.ndarray)
    return MaskedInput(1, 0, ModVector(BITS, add_mod(values, mask, BITS))).encode()


class _Link:
    """A sender thread writing queued frames to a loopback TCP connection; a receiver thread discarding them.

    Every loop is bounded: the sender by ``max_frames`` frames, the receiver by ``max_bytes + 1`` reads,
    and both by ``timeout_s`` per wait.
    """

    def __init__(self, out: socket.socket, into: socket.socket, max_frames: int, max_bytes: int, timeout_s: float):
        self._out, self._in = out, into
        self._max_frames, self._max_bytes, self._timeout = max_frames, max_bytes, timeout_s
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        self._cond = threading.Condition()
        self._queued = 0
        self._received = 0
        self._errors: list[BaseException] = []
        self._threads = (
            threading.Thread(target=self._send_loop, name="interference-sender", daemon=True),
            threading.Thread(target=self._receive_loop, name="interference-receiver", daemon=True),
        )

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._errors.append(exc)
            self._cond.notify_all()

    def _send_loop(self) -> None:
        try:
            for _ in range(self._max_frames + 1):
                frame = self._queue.get(timeout=self._timeout)
                if frame is None:
                    return
                self._out.sendall(frame)
            raise InterferenceError(f"sender: more than the {self._max_frames} frames planned")
        except BaseException as exc:  # handed to the compute thread, which raises it
            self._fail(exc)

    def _receive_loop(self) -> None:
        view = memoryview(bytearray(1 << 20))
        try:
            for _ in range(self._max_bytes + 1):
                n = self._in.recv_into(view)
                if n == 0:
                    return
                with self._cond:
                    self._received += n
                    self._cond.notify_all()
            raise InterferenceError(f"receiver: more than the {self._max_bytes} bytes planned")
        except BaseException as exc:
            self._fail(exc)

    def _check(self) -> None:
        if self._errors:
            exc = self._errors[0]
            raise InterferenceError(f"loopback link failed: {type(exc).__name__}: {exc}") from exc

    def send(self, frame: bytes) -> None:
        self._check()
        self._queued += len(frame)
        self._queue.put(frame)

    def drain(self) -> None:
        """Wait until the receiver has read every queued byte (at most ``timeout_s``)."""
        with self._cond:
            done = self._cond.wait_for(lambda: bool(self._errors) or self._received >= self._queued, self._timeout)
        self._check()
        if not done:
            raise InterferenceError(
                f"loopback receiver read {self._received} of {self._queued} bytes within {self._timeout} s"
            )

    def stop(self) -> None:
        """End both threads: a sentinel for the sender, then end-of-stream for the receiver."""
        self._queue.put(None)
        sender, receiver = self._threads
        sender.join(self._timeout)
        with suppress(OSError):  # already closed or reset: the receiver then ends on the error
            self._out.shutdown(socket.SHUT_WR)
        receiver.join(self._timeout)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise InterferenceError(f"threads {alive} did not end within {self._timeout} s")


@contextmanager
def _loopback(max_frames: int, max_bytes: int, timeout_s: float) -> Iterator[_Link]:
    """A started :class:`_Link` on 127.0.0.1 (ephemeral port); threads joined and sockets closed on exit."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        listener.settimeout(timeout_s)
        out = stack.enter_context(socket.create_connection(listener.getsockname()[:2], timeout=timeout_s))
        out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait for the last segment's ACK
        into, _ = listener.accept()
        stack.enter_context(into)
        into.settimeout(timeout_s)
        link = _Link(out, into, max_frames, max_bytes, timeout_s)
        link.start()
        try:
            yield link
        finally:
            link.stop()


def _round(parts: Sequence[np.ndarray], seeds: Sequence[bytes], suite: RealSuite, link: _Link | None) -> float:
    """Mean seconds per chunk of one round; with ``link`` each finished chunk is sent while the next is
    computed, and the round ends when all of them have been read."""
    chunk_task(parts[-1], seeds[-1], suite)  # untimed: both modes start from the same cache state
    spent = 0.0
    for values, seed in zip(parts, seeds, strict=True):
        start = time.perf_counter()
        frame = chunk_task(values, seed, suite)
        spent += time.perf_counter() - start
        if link is not None:
            link.send(frame)
    if link is not None:
        link.drain()
    return spent / len(parts)


def time_points(
    settings: PipelineSettings, seed: int = 0, progress: Callable[[str], None] | None = None
) -> list[PointTiming]:
    """Time every (d, m) of ``settings`` in this process, pipelined and sequential.

    Each repeat runs every point once in each mode (sequential, then pipelined), so a change in the
    machine's load while timing spreads over all points rather than shifting some. ``seed`` draws the
    chunk values and mask seeds.
    """
    say = progress or (lambda _msg: None)
    rng = np.random.default_rng(seed)
    suite = RealSuite()
    grid = settings.grid
    inputs = {}
    for d, m in grid:
        values = rng.integers(0, 1 << BITS, d, dtype=np.uint32)
        inputs[d, m] = (np.split(values, m), [rng.bytes(32) for _ in range(m)])
    frame_bytes = max(MaskedInput(1, 0, ModVector(BITS, np.zeros(d // m, np.uint32))).wire_size() for d, m in grid)
    max_frames = (settings.repeats + 1) * sum(m for _, m in grid)
    piped: dict[tuple[int, int], list[float]] = {p: [] for p in grid}
    sequential: dict[tuple[int, int], list[float]] = {p: [] for p in grid}
    try:
        with _loopback(max_frames, max_frames * frame_bytes, settings.io_timeout_s) as link:
            for point in grid:  # warm-up: allocator, cipher backend, socket buffers
                _round(*inputs[point], suite, None)
                _round(*inputs[point], suite, link)
            deadline = time.perf_counter() + settings.budget_s
            for rep in range(settings.repeats):
                for point in grid:
                    sequential[point].append(_round(*inputs[point], suite, None))
                    piped[point].append(_round(*inputs[point], suite, link))
                if rep + 1 >= settings.min_repeats and time.perf_counter() > deadline:
                    break
    except OSError as exc:
        raise InterferenceError(f"loopback TCP on 127.0.0.1 failed: {exc}") from exc
    timings = []
    for d, m in grid:
        timing = PointTiming(d, m, float(np.median(piped[d, m])), float(np.median(sequential[d, m])), len(piped[d, m]))
        if not (math.isfinite(timing.seconds) and math.isfinite(timing.baseline_seconds)):
            raise InterferenceError(f"non-finite timing at d={d}, m={m}: {timing}")
        timings.append(timing)
    say(f"pipeline: {len(grid)} points x {timings[0].repeats} repeats")
    return timings


def fit_interference(points: Sequence[tuple[int, int]], seconds: Sequence[float]) -> dict[str, Any]:
    """Fit seconds per chunk at (d, m) ``points`` as ``a (d/m) + b m + c`` with a, b, c >= 0.

    Returns ``{"interference_s": b, "coef": {"const": c, "chunk_elements": a, "chunks": b}, "r2": ...}``;
    a coefficient the non-negative fit dropped is 0.0.
    """
    if len(points) != len(seconds) or len(points) < len(FEATURES):
        raise ValueError(
            f"fit_interference needs one seconds value per (d, m) point and at least {len(FEATURES)} points; "
            f"got {len(points)} points and {len(seconds)} seconds"
        )
    rows = [{"chunk_elements": d / m, "chunks": float(m)} for d, m in points]
    fit = fit_nonnegative(FEATURES, rows, [float(s) for s in seconds])
    coef = {f: float(fit["coef"].get(f, 0.0)) for f in FEATURES}
    return {"interference_s": coef["chunks"], "coef": coef, "r2": float(fit["r2"])}


def _time_in_child(settings: PipelineSettings, seed: int) -> list[PointTiming]:
    """:func:`time_points` in ``python -m sim.profiling.interference`` with :data:`MALLOC_TUNABLES`."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    timeout = 2 * settings.budget_s + 60
    cmd = [sys.executable, "-m", "sim.profiling.interference", json.dumps(asdict(settings)), str(seed)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise InterferenceError(f"interference measurement did not finish within {timeout} s") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-5:]
        raise InterferenceError(f"interference measurement failed (exit {done.returncode}): " + " | ".join(tail))
    try:
        return [PointTiming(**p) for p in json.loads(done.stdout)]
    except (ValueError, TypeError) as exc:
        raise InterferenceError(f"interference measurement printed no point list: {exc}") from None


def measure_pipeline(
    quick: bool = False,
    settings: PipelineSettings | None = None,
    seed: int = 0,
    isolated: bool = True,
) -> dict[str, Any]:
    """Measure and fit the interference; returns the profile's ``pipeline`` entry.

    ``{"interference_s": b, "coef": {...}, "r2": ..., "points": [...], "baseline": {"interference_s",
    "coef", "r2"}, "bits": 20, "isolated": ..., "load_average": [before, after], "method": "..."}``, where
    ``load_average`` is the host's 1-minute load before and after timing (other processes share the cores
    and slow the timed work down). ``settings`` default to :data:`QUICK` or :data:`FULL`; ``seed`` draws
    the chunk values and mask seeds; ``isolated`` times in a child process with the allocator settings of
    :data:`MALLOC_TUNABLES` (else in this process).
    """
    chosen = settings if settings is not None else (QUICK if quick else FULL)
    load_before = os.getloadavg()[0]
    points = _time_in_child(chosen, seed) if isolated else time_points(chosen, seed)
    load_after = os.getloadavg()[0]
    grid = [(p.elements, p.chunks) for p in points]
    pipelined = fit_interference(grid, [p.seconds for p in points])
    baseline = fit_interference(grid, [p.baseline_seconds for p in points])
    return {
        **pipelined,
        "points": [asdict(p) for p in points],
        "baseline": baseline,
        "bits": BITS,
        "isolated": isolated,
        "load_average": [load_before, load_after],
        "method": METHOD,
    }


def main(argv: Sequence[str]) -> int:
    """The timing child: ``python -m sim.profiling.interference SETTINGS_JSON SEED`` prints the points as JSON."""
    if len(argv) != 2:
        print("usage: python -m sim.profiling.interference SETTINGS_JSON SEED", file=sys.stderr)
        return 2
    raw = json.loads(argv[0])
    settings = PipelineSettings(**{**raw, "dims": tuple(raw["dims"]), "chunks": tuple(raw["chunks"])})
    points = time_points(settings, int(argv[1]), progress=lambda msg: print(msg, file=sys.stderr))
    print(json.dumps([asdict(p) for p in points]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
