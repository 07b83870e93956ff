"""Stop signals that arrive while a program is still importing (numpy, torch, matplotlib take a
second or more): noted, not raised. Python's default would print a KeyboardInterrupt traceback
from deep inside an import (or turn it into a misleading ImportError), or end the process
silently on SIGTERM/SIGUSR1. ``common.runner.main`` takes them over: the run then ends before
writing anything, with one line and exit code 75.

Call :func:`defer_stop_signals` first thing in an app's ``__main__``; this module (and the
package's ``__init__``) import nothing heavy, so there is nothing to interrupt before it.

:func:`guard_standard_streams` (the runner's first step) makes stdout and stderr that are closed,
piped into a reader that left, or full, harmless: a run's outcome never depends on its prints.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, List, Optional, TextIO

#: Ctrl-C, Slurm's walltime warning, SIGTERM, and SIGUSR2 (Open MPI's mpirun forwards it; a rank
#: takes it as it takes USR1): what asks a run to stop. Workers leave all but USR2 to their rank
#: (``common.worker.STOP_SIGNALS``); USR2 is how a rank ends a worker.
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2)

_received: List[int] = []


def _note(number: int, frame: Any) -> None:
    if number not in _received:
        _received.append(number)


def defer_stop_signals() -> None:
    """Until the runner installs its own handlers, a stop signal is only noted."""
    for number in STOP_SIGNALS:
        signal.signal(number, _note)


def received() -> List[int]:
    """The stop signals noted before the runner (or a worker) took over, each once, in order."""
    return list(_received)


def ignore_stop_signals() -> None:
    """Once a process's outcome is decided, stop signals are ignored: Python gives every signal it
    handles its default action back while the interpreter shuts down (MPI_Finalize, module
    teardown), so a second Ctrl-C or SIGTERM then would kill the process instead of letting it
    exit 75 (or 0) as it said it would."""
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


class ForgivingStream:
    """A standard stream whose write errors are dropped: a reader that went away (``| head -1``),
    a full disk or ``/dev/full``, a closed descriptor. What a run prints is a courtesy; its outcome
    (the results folder, the exit code) never depends on it. At the first error the descriptor is
    pointed at /dev/null, so that Python's own flush at exit fails neither (exit code 120)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.broken = False

    def _give_up(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except (OSError, ValueError):
                self._give_up()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._give_up()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _reopen_closed(descriptor: int) -> None:
    """Give a closed standard descriptor (``>&-``) /dev/null: else the next file opened (the
    journal) would take its number, and whatever is printed would land in it."""
    try:
        os.fstat(descriptor)
    except OSError:
        opened = os.open(os.devnull, os.O_RDWR)
        if opened != descriptor:
            os.dup2(opened, descriptor)
            os.close(opened)


def guard_standard_streams() -> None:
    """Closed, broken or full stdout and stderr never change a run's outcome: closed descriptors
    get /dev/null, and ``sys.stdout`` and ``sys.stderr`` drop their write errors."""
    for descriptor in (0, 1, 2):
        _reopen_closed(descriptor)
    for name, descriptor in (("stdout", 1), ("stderr", 2)):
        stream: Optional[Any] = getattr(sys, name)
        if isinstance(stream, ForgivingStream):
            continue
        if stream is None:  # Python started with the descriptor closed
            stream = open(descriptor, "w", buffering=1, closefd=False, errors="backslashreplace")
        setattr(sys, name, ForgivingStream(stream))
