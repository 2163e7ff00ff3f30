"""Worker processes that run a sweep's points, one point each at a time; stopped and reaped, never left behind.

Each worker is a spawned interpreter (no forked torch state) with a pipe to this process: it receives a
job, says it has begun it, calls the work function and sends back what came of it (:class:`Done`,
:class:`Raised` for an exception the work function let through, :class:`Interrupted`), then waits for the
next; ``None`` or the pipe closing ends it. This process notices a worker that dies (killed, out of memory)
by its sentinel (:class:`Died`); the other workers go on.

Signals: a worker starts with SIGINT and SIGTERM ignored (set so around its start here, which it inherits),
so that a Ctrl-C at a terminal, which reaches every process of the group, does not break its start-up; it
ignores them while idle too (its parent decides when it stops). Once it has begun a job, both interrupt it
once (:mod:`sim.runner.interrupts`), so that the run closes its manifest as ``interrupted``.
:meth:`Workers.stop` sends SIGINT to the workers that have begun their job, kills those that have not, waits
up to a grace period for the answers, then ends every worker and reaps it: asked to exit, killed if it has
not, and joined, so that no worker outlives its sweep, as a zombie either (a host whose init never reaps
orphans keeps those forever). No semaphore is made: pipes and process sentinels only.

multiprocessing starts a resource tracker process for spawned children, which Python 3.11 leaves to exit after
this process, an orphan; :func:`reaping_resource_tracker` ends and reaps it when the command is done.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

from sim.runner.interrupts import STOPPING, ignore_stopping, interruptible

Job = TypeVar("Job")
Result = TypeVar("Result")

EXIT_WAIT_S = 5.0
"""How long a worker asked to exit (or killed) is waited for before it is killed (or given up on), seconds."""


@dataclass(frozen=True)
class Done(Generic[Result]):
    """The work function returned ``result``."""

    result: Result


@dataclass(frozen=True)
class Raised:
    """The work function raised ``error`` (its type and message)."""

    error: str


@dataclass(frozen=True)
class Interrupted:
    """SIGINT or SIGTERM stopped the job."""


@dataclass(frozen=True)
class Died:
    """The worker process ended without answering (``exitcode``: negative for the signal that killed it), or
    was killed by :meth:`Workers.stop`."""

    exitcode: int | None


Outcome = Done[Any] | Raised | Interrupted | Died


@dataclass(frozen=True)
class _Begun:
    """A worker's word that it has begun its job, with SIGINT and SIGTERM set to interrupt it."""


def _serve(conn: Connection, work: Callable[[Any], Any]) -> None:
    """A worker's life: jobs in, outcomes out, until told to stop or its parent's end of the pipe closes."""
    ignore_stopping()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        outcome: Done[Any] | Raised | Interrupted
        try:
            with interruptible():
                conn.send(_Begun())
                outcome = Done(work(job))
        except KeyboardInterrupt:
            outcome = Interrupted()
        except Exception as exc:
            outcome = Raised(f"{type(exc).__name__}: {exc}")
        try:
            conn.send(outcome)
        except OSError:  # its parent is gone
            return


@dataclass
class _Worker(Generic[Job]):
    process: BaseProcess
    conn: Connection
    job: Job | None = None
    key: str = ""
    begun: bool = False
    """Whether it said it began its job (it can then be interrupted)."""


class Workers(Generic[Job]):
    """At most ``jobs`` spawned processes, each running ``work(job)`` for one job at a time.

    ``work`` must be importable by name (a module-level function), since spawned processes receive it pickled.
    """

    def __init__(self, work: Callable[[Job], Any], jobs: int) -> None:
        self._work = work
        self._jobs = jobs
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker[Job]] = []

    @property
    def free(self) -> int:
        """Jobs that can be started now."""
        return self._jobs - len(self.busy)

    @property
    def busy(self) -> list[tuple[str, Job]]:
        """The jobs running, by key."""
        return [(w.key, w.job) for w in self._workers if w.job is not None]

    @property
    def pids(self) -> dict[str, int]:
        """The process running each job, by key."""
        return {w.key: w.process.pid for w in self._workers if w.job is not None and w.process.pid is not None}

    def start(self, key: str, job: Job) -> None:
        """Run ``job`` (named ``key``) on an idle worker, spawning one if none is idle."""
        assert self.free > 0, "no worker is free"
        idle = [w for w in self._workers if w.job is None]
        worker = idle[0] if idle else self._spawn()
        worker.job, worker.key, worker.begun = job, key, False
        with contextlib.suppress(OSError):  # it died while idle: the next wait reports it
            worker.conn.send(job)

    def _spawn(self) -> _Worker[Job]:
        ours, theirs = self._context.Pipe()
        # not daemonic: a run may start processes of its own (training.workers)
        process = self._context.Process(target=_serve, args=(theirs, self._work))
        # The child inherits ignored signals, so its start-up is never interrupted; a signal sent to this
        # process in these few milliseconds is lost (signal.signal runs any already received first).
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOPPING}
        try:
            process.start()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        theirs.close()
        worker: _Worker[Job] = _Worker(process, ours)
        self._workers.append(worker)
        return worker

    def wait(self, timeout: float | None = None) -> list[tuple[str, Job, Outcome]]:
        """The jobs that ended (at least one, unless ``timeout`` seconds pass first), each with its outcome."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            running = [w for w in self._workers if w.job is not None]
            if not running:
                return []
            handles: list[Any] = [w.conn for w in running] + [w.process.sentinel for w in running]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = set(multiprocessing.connection.wait(handles, left))
            ended = []
            for w in running:
                job = w.job
                if job is None or (w.conn not in ready and w.process.sentinel not in ready):
                    continue
                outcome = self._receive(w)
                if outcome is not None:
                    ended.append((w.key, job, outcome))
                    w.job, w.key = None, ""
            if ended or (deadline is not None and time.monotonic() >= deadline):
                return ended

    def _receive(self, w: _Worker[Job]) -> Outcome | None:
        """What ``w`` says (None: it only said it began), or :class:`Died` once it has ended without a word (its
        pipe closed, or its sentinel ready with nothing to read)."""
        try:
            if w.conn.poll():
                answer: Outcome | _Begun = w.conn.recv()
                if isinstance(answer, _Begun):
                    w.begun = True
                    return None
                return answer
        except (EOFError, OSError):  # it closed its end: it is ending
            return Died(self._reap(w))
        if w.process.is_alive():  # woken by its word alone, already read
            return None
        return Died(self._reap(w))

    def _reap(self, w: _Worker[Job], kill: bool = False) -> int | None:
        """End ``w`` (asked to exit, or killed at once with ``kill``; killed if it has not exited in time), join
        it and take it out of the pool; its exit code."""
        if not kill:
            with contextlib.suppress(OSError):
                w.conn.send(None)
            w.process.join(EXIT_WAIT_S)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(EXIT_WAIT_S)
        w.conn.close()
        code = w.process.exitcode
        if code is not None:  # joined: nothing of it is left
            w.process.close()
        self._workers.remove(w)
        return code

    def stop(self, grace: float) -> list[tuple[str, Job, Outcome]]:
        """Interrupt the begun jobs (SIGINT) and kill the workers of those not begun yet, collect what the
        others answer within ``grace`` seconds, then end and reap every worker; a job without an answer is
        reported :class:`Died`."""
        ended: list[tuple[str, Job, Outcome]] = []
        self.begun()
        for w in list(self._workers):
            job, key = w.job, w.key
            if job is None:
                continue
            if not w.begun:
                ended.append((key, job, Died(self._reap(w, kill=True))))
            elif w.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.process.pid, signal.SIGINT)
        deadline = time.monotonic() + grace
        while self.busy and time.monotonic() < deadline:
            ended += self.wait(max(0.0, deadline - time.monotonic()))
        for w in list(self._workers):
            job, key = w.job, w.key
            code = self._reap(w, kill=job is not None)
            if job is not None:
                ended.append((key, job, Died(code)))
        return ended

    def begun(self) -> list[str]:
        """The jobs whose workers said they began them (read without waiting; a job's first message is always
        that word): those :meth:`stop` interrupts rather than kills."""
        for w in self._workers:
            if w.job is not None and not w.begun:
                with contextlib.suppress(EOFError, OSError):
                    if w.conn.poll() and isinstance(w.conn.recv(), _Begun):
                        w.begun = True
        return [w.key for w in self._workers if w.job is not None and w.begun]

    def close(self) -> None:
        """End and reap every worker (all idle: nothing is lost)."""
        for w in list(self._workers):
            self._reap(w)


@contextlib.contextmanager
def reaping_resource_tracker(timeout: float = EXIT_WAIT_S) -> Iterator[None]:
    """Within the context, processes may be spawned; at its end, multiprocessing's resource tracker is ended
    and reaped if the context started it (at most ``timeout`` seconds: a process still holding its pipe keeps
    it alive, and it is then left to end on its own).

    Python 3.11 never stops the tracker: it ends when the last process holding its pipe does, after this one,
    an orphan that only init can reap. Use this around a whole command, when no multiprocessing object is left
    at its end: the tracker warns about, and removes, any semaphore still registered.
    """
    # private: the standard library offers no public way to stop it (3.11's own _stop waits without a bound)
    tracker: Any = resource_tracker._resource_tracker
    ours = tracker._fd is None
    try:
        yield
    finally:
        fd, pid = tracker._fd, tracker._pid
        if ours and fd is not None and pid is not None:
            tracker._fd = tracker._pid = None
            os.close(fd)
            _reap_within(pid, timeout)


def _reap_within(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.02)
