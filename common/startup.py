"""Stop signals that arrive while a program is still importing (numpy, torch, matplotlib take a
second or more): noted, not raised. Python's default would print a KeyboardInterrupt traceback
from deep inside an import (or turn it into a misleading ImportError), or end the process
silently on SIGTERM/SIGUSR1. ``common.runner.main`` takes them over: the run then ends before
writing anything, with one line and exit code 75.

Call :func:`defer_stop_signals` first thing in an app's ``__main__``; this module (and the
package's ``__init__``) import nothing heavy, so there is nothing to interrupt before it.
"""
from __future__ import annotations

import signal
from typing import Any, List

#: Ctrl-C, Slurm's walltime warning, SIGTERM: what asks a run to stop (``common.worker.STOP_SIGNALS``)
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)

_received: List[int] = []


def _note(number: int, frame: Any) -> None:
    if not _received:
        _received.append(number)


def defer_stop_signals() -> None:
    """Until the runner installs its own handlers, a stop signal is only noted."""
    for number in STOP_SIGNALS:
        signal.signal(number, _note)


def received() -> List[int]:
    """The stop signal noted before the runner took over (at most one), or none."""
    return list(_received)
