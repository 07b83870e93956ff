"""The first write to the results folder that failed: a full disk, an exceeded quota, an I/O error.

The journal, the rank's log and the end-of-run outputs note their failure in the run's
:class:`WriteFailures` (made by the runner, handed to each) instead of raising; the runner's stop
flag reads it, so rank 0 stops handing out work and ends with one line saying
what failed, where, how much is safely journaled and how to resume (exit 75). A small reserve file
(:func:`reserve_space`), deleted when the disk fills, leaves room for the summary that says so.
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.errors import quoted
from common.results.layout import ResultsLayout

#: bytes kept aside in the results folder while a run lives, freed to write its summary on a full disk
RESERVE_BYTES = 64 * 1024
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: what a failure is about when the results folder or its journal was deleted, renamed or replaced
MOVED_AWAY = "the results folder"


@dataclass
class WriteFailure:
    what: str  # "the journal", "the log", "the outputs"
    path: str
    error: OSError

    @property
    def no_space(self) -> bool:
        return self.error.errno in NO_SPACE

    @property
    def journal(self) -> bool:
        return self.what in ("the journal", MOVED_AWAY)

    @property
    def moved_away(self) -> bool:
        """The folder (or its journal) was deleted, renamed or replaced: nothing more may be written there."""
        return self.what == MOVED_AWAY

    def describe(self) -> str:
        """"cannot write the journal 'results/x/journal.jsonl' (No space left on device)"."""
        if self.moved_away:
            return self.error.strerror or str(self.error)
        reason = self.error.strerror or str(self.error)
        return f"cannot write {self.what}{' ' + quoted(self.path) if self.path else ''} ({reason})"

    def remedy(self) -> str:
        if self.error.errno == errno.EDQUOT:
            return "free some space or raise the quota"
        if self.error.errno == errno.ENOSPC:
            return "free some space"
        return "fix that"


class WriteFailures:
    """One run's failed writes to its results folder. ``first`` is the one the run reports (and
    stops on); writers note theirs from any thread (the journal's, the log's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first: Optional[WriteFailure] = None

    def note(self, what: str, path: object, error: OSError) -> WriteFailure:
        """Remember a failed write; returns it."""
        with self._lock:
            failure = WriteFailure(what, str(path), error)
            if self.first is None:
                self.first = failure
            return failure

    def item_error(self, number: Optional[int], path: str, key: str, worker: str) -> bool:
        """Whether an item's OSError (``number``: its errno, as its worker reported it; None if it
        raised something else) says a disk is full or a quota exceeded (an output it writes, such as
        a saved model): then it is noted like rank 0's own failed writes and the run stops, instead
        of retrying the item and failing it; it runs again on --resume."""
        if number not in NO_SPACE:
            return False
        self.note(f"an output of item {key} on {worker}", path, OSError(number, os.strerror(number)))
        return True


def about_results(error: OSError, results: Path) -> bool:
    """Whether ``error`` is one the run should stop on rather than crash: no space, no quota, or
    any error naming a file in the results folder."""
    if error.errno in NO_SPACE:
        return True
    if not error.filename:
        return False
    try:
        return Path(os.path.abspath(os.fsdecode(error.filename))).is_relative_to(Path(results).absolute())
    except (TypeError, ValueError):
        return False


def reserve_space(folder: Path) -> None:
    """Set ``RESERVE_BYTES`` aside in ``folder`` (best effort: a disk already full gets none)."""
    path = ResultsLayout(Path(folder)).reserve
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)  # a FIFO there: ENXIO, not a wait
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        free_reserve(folder)


def free_reserve(folder: Path) -> bool:
    """Give the reserve back to the filesystem; whether there was one."""
    try:
        ResultsLayout(Path(folder)).reserve.unlink()
        return True
    except OSError:
        return False
