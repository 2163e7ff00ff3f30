"""Stopping a run from outside: Ctrl-C (SIGINT) and a kill (SIGTERM, what a batch scheduler sends at its time
limit) end it alike.

Under :func:`interruptible`, either signal raises :class:`KeyboardInterrupt` where the process is, once: the
run closes its manifest as ``interrupted`` and keeps its finished rounds, a sweep stops and reaps its workers
(:mod:`sim.runner.workers`), and the command says so and exits with 128 plus the signal's number (130 for
SIGINT, 143 for SIGTERM). Both signals are then ignored until the context ends, so that a second one cannot
cut that cleanup short; ignored by a Python handler that does nothing, not by ``SIG_IGN``, since Python
raises ``OSError`` for a signal already received whose handler became ``SIG_IGN`` before it ran (SIGTERM to
a whole process group and its parent's SIGINT reach a sweep's worker together). A signal ignored
(``SIG_IGN``) when the context starts stays ignored (a shell's background job ignores SIGINT, as ``nohup``
does SIGHUP): whoever started the process chose that.

Handlers are only set in the main thread (Python runs them nowhere else); elsewhere the contexts change
nothing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

STOPPING = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run."""


@dataclass
class Interruption:
    """Which signal stopped the run, once one has (None until then)."""

    signal: signal.Signals | None = None

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by the signal: 128 + its number (Ctrl-C if none was seen)."""
        return 128 + int(self.signal or signal.SIGINT)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The handler of a signal that changes nothing now."""


@contextmanager
def interruptible() -> Iterator[Interruption]:
    """SIGINT and SIGTERM raise KeyboardInterrupt once, then are ignored; the previous handlers come back at
    the end. The :class:`Interruption` says which came."""
    caught = Interruption()
    if not _in_main_thread():
        yield caught
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        caught.signal = signal.Signals(signum)
        for s in previous:
            signal.signal(s, _ignore)  # the run is ending: a second signal must not cut its cleanup
        raise KeyboardInterrupt

    previous = {s: signal.getsignal(s) for s in STOPPING if signal.getsignal(s) is not signal.SIG_IGN}
    for s in previous:
        signal.signal(s, stop)
    try:
        yield caught
    finally:
        _restore(previous)


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while the context holds (a sweep that is already stopping reaps its
    workers), then their handlers back."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, _ignore) for s in STOPPING}
    try:
        yield
    finally:
        _restore(previous)


def _restore(handlers: dict[signal.Signals, Any]) -> None:
    for s, handler in handlers.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)  # None: one set outside Python


def ignore_stopping() -> None:
    """Ignore SIGINT and SIGTERM from now on (a sweep's idle worker: its parent decides when it stops)."""
    for s in STOPPING:
        signal.signal(s, _ignore)
