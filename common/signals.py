"""The stop signals and their handling, in one place: which signal means what to a rank, a worker
and a pipeline step, and every helper that defers, holds back, blocks or ignores them.

A rank acts on a stop (Ctrl-C, Slurm's walltime warning, SIGTERM, a closed terminal): :class:`StopFlag` notes it and
the distribution loop looks at it between events. A worker leaves those to its rank and ends on
:data:`WORKER_TERMINATE_SIGNAL`, which its rank sends. Signals arriving while a program still
imports (numpy, torch, matplotlib take a second or more) are noted, not raised
(:func:`defer_stop_signals`): Python's default would print a KeyboardInterrupt traceback from deep
inside an import, or end the process silently on SIGTERM/SIGUSR1. ``common.run.runner.main`` takes
them over: the run then ends before writing anything, with one line and exit code 75.

An app's ``__main__`` calls :func:`defer_stop_signals` first thing; this module imports only the
standard library (and the package's ``__init__`` nothing heavy), so there is nothing to interrupt
before it.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

#: Slurm's walltime warning (``--signal=USR1@...``): a rank stops; a pipeline step ignores it
WALLTIME_SIGNAL = signal.SIGUSR1
#: The rank ends a busy worker with this signal (and SIGKILL after a while). SIGTERM itself is
#: ignored by a worker: Slurm and terminals signal the whole process group, and it is the rank that
#: decides whether running items get their --grace period.
WORKER_TERMINATE_SIGNAL = signal.SIGUSR2
#: the exit code of a worker that WORKER_TERMINATE_SIGNAL ended (the shell's for a signal): its rank then
#: knows that the items it held were cut off, not failed, whoever sent the signal (``kill`` of the whole
#: process group reaches a worker before its rank, whose stop may not yet be known when the worker's exit is)
WORKER_TERMINATED_EXIT = 128 + WORKER_TERMINATE_SIGNAL
#: a closed terminal or a dropped ssh connection: the kernel sends it to the terminal's foreground
#: process group. A rank stops as on SIGTERM (its outputs written, its results folder left as a
#: resume expects) instead of dying where it stands; a program started with it ignored (``nohup``)
#: keeps it ignored (:func:`handled_stop_signals`).
HANGUP_SIGNAL = signal.SIGHUP
#: Ctrl-C, Slurm's walltime warning, SIGTERM, SIGUSR2 (Open MPI's mpirun forwards it; a rank takes it
#: as it takes USR1) and a hang-up: what asks a run to stop. Workers leave all but USR2 to their rank
#: (:data:`WORKER_IGNORED_SIGNALS`); USR2 is how a rank ends a worker.
RUN_STOP_SIGNALS = (signal.SIGINT, WALLTIME_SIGNAL, signal.SIGTERM, WORKER_TERMINATE_SIGNAL, HANGUP_SIGNAL)
#: the signals that ask a run to stop which a worker ignores: the rank acts on them. The pool
#: starts a worker with them blocked (:func:`signals_blocked`), until its handlers are in place.
WORKER_IGNORED_SIGNALS = (signal.SIGINT, WALLTIME_SIGNAL, signal.SIGTERM, HANGUP_SIGNAL)
#: Signals that stop a worker (the engine's); held back (:func:`held_signals`) while a pipeline step
#: is being ended and recorded.
STEP_HELD_SIGNALS = (WORKER_TERMINATE_SIGNAL,)
#: the rank sends this before it kills a hung worker or an item past --item-timeout: the worker's log
#: then shows where every thread was (faulthandler writes it from C, even while the GIL is held).
#: Ignored by default, so one arriving before the handler is in place does no harm.
DUMP_SIGNAL = signal.SIGURG
#: what the end-of-run drawing process (common.observe.timeline) ignores: the run's stop signals, which its
#: rank handles, and a closed terminal's; blocked from its start until it ignores them
DRAWER_IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, WALLTIME_SIGNAL, signal.SIGHUP)
#: a signal this soon after the last one counted is the same request passed on twice: Slurm signals
#: every process of a step, and Apptainer's runtime (or a launcher) forwards it to the rank again
ECHO_SECONDS = 2.0

class EarlyStops:
    """The handler :func:`defer_stop_signals` installs: it notes each stop signal, once, in the
    order they came. Signal handlers belong to the process, so the note lives in the handler the
    process holds, not in this module: :func:`early_stops` finds it there."""

    def __init__(self) -> None:
        self.numbers: List[int] = []

    def __call__(self, number: int, frame: Any) -> None:
        if number not in self.numbers:
            self.numbers.append(number)


@functools.lru_cache(maxsize=None)
def started_under_nohup() -> bool:
    """Whether this process was started with SIGHUP ignored (``nohup``: the user asked for the run
    to outlive its terminal). A fact of the process's start, read once, before any handler of ours
    changes it: :func:`ignore_stop_signals` ignores SIGHUP at the end of a run, which a second run
    in the same process (``sweep.main`` called twice) must not take for nohup."""
    return signal.getsignal(HANGUP_SIGNAL) == signal.SIG_IGN


def handled_stop_signals() -> List[int]:
    """The stop signals this process acts on: :data:`RUN_STOP_SIGNALS` but a hang-up where it was
    started under nohup."""
    return [number for number in RUN_STOP_SIGNALS if not (number == HANGUP_SIGNAL and started_under_nohup())]


def defer_stop_signals() -> None:
    """Until the runner installs its own handlers, a stop signal is only noted."""
    note = early_stops()
    for number in handled_stop_signals():
        signal.signal(number, note)


def early_stops() -> EarlyStops:
    """The note of the stops that came while the program still imported (an empty one where
    :func:`defer_stop_signals` was not called). Take it before installing other handlers, read its
    ``numbers`` after: a signal that comes in between is noted in it."""
    for number in RUN_STOP_SIGNALS:
        handler = signal.getsignal(number)
        if isinstance(handler, EarlyStops):
            return handler
    return EarlyStops()


def ignore_stop_signals() -> None:
    """Once a process's outcome is decided, stop signals are ignored: Python gives every signal it
    handles its default action back while the interpreter shuts down (MPI_Finalize, module
    teardown), so a second Ctrl-C or SIGTERM then would kill the process instead of letting it
    exit 75 (or 0) as it said it would."""
    for number in RUN_STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def _leave_to_rank(signum: int, frame: Any) -> None:
    """The rank decides when work stops (Ctrl-C, walltime warning and SIGTERM go to it)."""


def leave_stop_signals_to_rank() -> None:
    """In a worker: the stops its rank acts on do nothing here. A handler that does nothing, not
    SIG_IGN: programs an item starts get the defaults back; but a hang-up ignored under nohup stays
    ignored, for them too."""
    for number in WORKER_IGNORED_SIGNALS:
        if number == HANGUP_SIGNAL and started_under_nohup():
            continue
        signal.signal(number, _leave_to_rank)


@contextlib.contextmanager
def signals_blocked(signals: Iterable[int]) -> Iterator[None]:
    """``signals`` blocked in this thread meanwhile. A child started then inherits the block through
    fork and exec: Slurm's walltime warning, which reaches every process of the job step, waits in a
    starting worker (still importing torch) until ``worker_main`` has its handlers, instead of
    killing it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


#: the stop signals that would kill multiprocessing's resource tracker, which ignores only SIGINT
#: and SIGTERM: srun passes the walltime's USR1 to every process of the job step, and a closed
#: terminal its hang-up to every process of its foreground group
TRACKER_BLOCKED_SIGNALS = (WALLTIME_SIGNAL, WORKER_TERMINATE_SIGNAL, HANGUP_SIGNAL)


def start_resource_tracker() -> None:
    """multiprocessing's resource tracker, which starting a worker needs, started (once) with
    :data:`TRACKER_BLOCKED_SIGNALS` blocked, a block it keeps: a tracker killed by the walltime
    warning is started again by the next worker, with "process died unexpectedly, relaunching.
    Some resources might leak." in the log. The mask is restored after (multiprocessing unblocks
    SIGINT and SIGTERM instead of restoring it)."""
    from multiprocessing import resource_tracker

    with signals_blocked(TRACKER_BLOCKED_SIGNALS):
        resource_tracker.ensure_running()


@contextlib.contextmanager
def held_signals(signals: Sequence[int]) -> Iterator[None]:
    """Delay ``signals`` until the block is done, then let their Python handlers run.

    Only the main thread sets handlers; elsewhere the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: List[int] = []
    previous: Dict[int, Any] = {}
    for signum in signals:
        previous[signum] = signal.signal(signum, lambda number, frame: arrived.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in arrived:
            handler = previous.get(signum)
            if callable(handler):
                handler(signum, None)


def _say(text: str) -> None:
    """A line on stderr from a signal handler: one write to the file descriptor, as a print could
    land inside another print to the same stream (a reentrant call, an error of its own)."""
    try:
        os.write(2, text.encode())
    except OSError:  # stderr closed or full: the run goes on without the line
        pass


class StopFlag:
    """Set by a stop signal (:data:`RUN_STOP_SIGNALS`), or by a write to the results folder that
    failed (a full disk: ``first_failure`` returns it, :mod:`common.results.failures`); the
    distribution loop looks at it between events. A second signal (``ECHO_SECONDS`` or more after
    the first) means: do not wait for running items any longer; so does a journal that cannot be
    written (their results could not be kept)."""

    def __init__(self, first_failure: Callable[[], Optional[Any]]) -> None:
        self.first_failure = first_failure
        self.why: Optional[str] = None
        self.first: Optional[int] = None  # the first stop signal's number (the walltime's: WALLTIME_SIGNAL)
        self.count = 0
        self._last = -math.inf
        self._outputs_interruptible = False  # see writing_outputs
        self._count_at_failure: Optional[int] = None

    def install(self) -> None:
        for number in handled_stop_signals():
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame: Any) -> None:
        now = time.monotonic()
        if now - self._last < ECHO_SECONDS:
            return
        self._last = now
        self.count += 1
        self.why = self.why or f"received {signal.Signals(number).name}"
        self.first = self.first or number
        if self.count >= 3 and number == signal.SIGINT and self._outputs_interruptible:
            self._outputs_interruptible = False
            raise KeyboardInterrupt  # Ctrl-C three times: the user insists
        if self._outputs_interruptible:  # else the signal seems ignored while a long figure is drawn
            left = 3 - self.count
            more = (f"; Ctrl-C {'once more' if left == 1 else f'{left} more times, 2 s or more apart,'} stops now "
                    f"(what finished is journaled: --resume goes on from it)" if number == signal.SIGINT else "")
            _say(f"received {signal.Signals(number).name} while writing the outputs: finishing them{more}\n")

    @contextlib.contextmanager
    def writing_outputs(self) -> Iterator[None]:
        """While rank 0 writes the outputs: each stop signal says they are being finished, and a third
        Ctrl-C interrupts them (KeyboardInterrupt, which the runner turns into a stop: --resume writes
        them); anywhere else the second signal has already ended every wait."""
        self._outputs_interruptible = True
        try:
            yield
        finally:
            self._outputs_interruptible = False

    def take_over(self) -> None:
        """Install the handlers and count each stop noted while the program still imported."""
        early = early_stops()
        self.install()
        for number in early.numbers:
            self._handle(number, None)

    @property
    def urgent(self) -> bool:
        """Stop waiting for the running items: a second signal; or a failed write (which stopped the run
        by itself) and a signal; or a journal that cannot be written (their results could not be kept)."""
        failure = self.first_failure()
        self._note(failure)
        return self.count > 1 or (failure is not None and (failure.journal or self.count > self._count_at_failure))

    def _note(self, failure: Optional[Any]) -> None:
        """The signals counted when the failed write was first seen: only one after it ends the wait
        (one before it began the stop, whose line asked for the same signal again)."""
        if failure is not None and self._count_at_failure is None:
            self._count_at_failure = self.count

    def __call__(self) -> Optional[str]:
        failure = self.first_failure()
        self._note(failure)
        if self.why is None and failure is not None:
            self.why = failure.describe()
        return self.why
