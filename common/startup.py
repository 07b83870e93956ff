"""A program's first steps, before anything heavy is imported.

:func:`guard_standard_streams` (the runner's first step) makes stdout and stderr that are closed,
piped into a reader that left, or full, harmless: a run's outcome never depends on its prints.
Stop signals, deferred while a program imports, are :mod:`common.signals`'s.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional, TextIO

from common.errors import UsageError


class ForgivingStream:
    """A standard stream whose write errors are dropped: a reader that went away (``| head -1``),
    a full disk or ``/dev/full``, a closed descriptor. What a run prints is a courtesy; its outcome
    (the results folder, the exit code) never depends on it. At the first error the descriptor is
    pointed at /dev/null, so that Python's own flush at exit fails neither (exit code 120)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.broken = False
        self.error: Optional[BaseException] = None  # the write error it gave up at

    def _give_up(self, error: BaseException) -> None:
        self.broken, self.error = True, error
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
            except (OSError, ValueError) as error:
                self._give_up(error)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError) as error:
                self._give_up(error)

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


def stdout_lost() -> Optional[str]:
    """Why what was printed did not all reach stdout, where its reader did not simply leave (a
    full disk, ``/dev/full``): for a mode whose printout is its whole result (``--dry-run``,
    ``--schema``), which must not then exit 0. None where all was written, or the reader left
    (``| head -1``)."""
    flush = getattr(sys.stdout, "flush", None)
    if flush is not None:
        flush()
    error = getattr(sys.stdout, "error", None)
    if error is None or isinstance(error, BrokenPipeError):
        return None
    return getattr(error, "strerror", None) or str(error)


def check_working_folder() -> None:
    """Refuse (UsageError) a working folder that is gone: one deleted under the shell (a job
    script's ``cd`` into a folder another job removed) fails the first relative path, and every
    worker's start, in a traceback, after the results folder was begun."""
    try:
        os.getcwd()
    except OSError as error:
        raise UsageError(f"the current folder cannot be read ({error.strerror or error}: deleted since the shell "
                         f"entered it?); cd into a folder that exists and run again") from None


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
