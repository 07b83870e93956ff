"""The journal: one JSON line per finished item, appended at rank 0 as results stream in.

It is what makes a killed run lose nothing: ``--resume`` reads it back and skips every item it
holds. Lines are flushed at once and fsync'd in groups (at most every ``sync_every`` seconds and
on close), so a crash of the process loses nothing and a crash of the node loses at most the
last fraction of a second.

Every reader (``--resume``, ``python -m common.status``, report.html) splits the file with
:func:`whole_lines`, so all agree on its last line: a complete JSON record that lacks its newline
(the writer stopped just before it) is kept, and the writer adds the newline before its next
record; a last line that is not one (torn mid-line by a crash) is dropped, and the writer cuts it.

A write that fails (a full disk, an exceeded quota) raises nothing: the journal cuts what it had
half-written, writes no more, and notes the failure (:mod:`common.write_failures`), which stops
the run; everything before it stays readable for ``--resume``.
"""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import write_failures
from .app import Record
from .errors import UsageError, quoted
from .outputs import to_jsonable
from .regular_file import read_regular, refuse_unless_regular

JOURNAL_NAME = "journal.jsonl"
FORMAT_VERSION = 1
#: how often the distribution loop checks that the results folder and the journal are still in place
PLACE_CHECK_SECONDS = 1.0
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for every line (json.dumps makes one per call)


def _identity(status: os.stat_result) -> Tuple[int, int]:
    return status.st_dev, status.st_ino


def parse_line(raw: bytes) -> Optional[dict]:
    """One journal line as a dict, or None where it is not a JSON object (torn, damaged)."""
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8 (random bytes), nested too deep
        return None
    return entry if isinstance(entry, dict) else None


def whole_lines(data: bytes) -> Tuple[List[bytes], int, bool]:
    """The journal's lines in ``data`` by the rule every reader follows: every line but the last
    as it is, and the last one (with or without its newline) only when it is a complete JSON
    object; one that is not was torn by a crash and is left out. Returns (lines, the bytes they
    take, whether the last kept line lacks its newline)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: b"" where the data ends with one
    if tail.strip():
        if parse_line(tail) is not None:
            return lines + [tail], len(data), True
        return lines, len(data) - len(tail), False
    end = len(data) - len(tail)
    while lines and not lines[-1].strip():  # blank lines before the end
        end -= len(lines.pop()) + 1
    if lines and parse_line(lines[-1]) is None:  # torn, then a newline (a crash between two writes)
        end -= len(lines.pop()) + 1
    return lines, end, False


def read_journal(path: Path) -> Tuple[Optional[dict], Dict[str, Record]]:
    """(header, finished records by key) from a journal, by the rule of :func:`whole_lines`."""
    header, records = None, {}
    try:
        data = read_regular(path, what="the journal")
    except OSError as error:
        raise UsageError(f"{quoted(path)}: cannot read the journal ({error.strerror or error})") from None
    lines = whole_lines(data)[0]
    if not any(line.strip() for line in lines) and data.strip():  # the header is never a torn last line
        raise UsageError(f"{quoted(path)}: line 1 is not valid JSON; the journal is damaged")
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        entry = parse_line(raw)
        if entry is None:
            raise UsageError(f"{quoted(path)}: line {number + 1} is not valid JSON; the journal is damaged") from None
        try:
            kind = entry.pop("type", None)
            if kind == "header":
                header = entry
            elif kind == "result":
                records[entry["key"]] = Record(**entry)
        except (AttributeError, KeyError, TypeError):
            raise UsageError(f"{quoted(path)}: line {number + 1} is not a journal record; the journal is damaged") from None
    return header, records


def describe_difference(old: dict, new: dict) -> str:
    """'seed 1 (journal) vs 2 (now)' for the first argument that differs."""
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            return f"{name} {old.get(name)!r} (journal) vs {new.get(name)!r} (now)"
    return "nothing"


class Journal:
    """Append-only writer used by rank 0."""

    def __init__(self, path: Path, header: dict, *, sync_every: float = 0.05):
        self.path = Path(path)
        self.sync_every = sync_every
        self.failure: Optional[write_failures.WriteFailure] = None
        self._last_sync = 0.0
        self._dirty = False
        self._fd: Optional[int] = None
        self._identity: Optional[Tuple[Tuple[int, int], Tuple[int, int]]] = None  # (folder's, journal's)
        self._last_place_check = 0.0
        refuse_unless_regular(self.path, "the journal")  # opening a FIFO to append would wait for a reader
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            self._mend_tail()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            opened = os.fstat(self._fd)
            self._good = opened.st_size  # where the last whole line ends
            self._identity = (_identity(os.stat(self.path.parent)), _identity(opened))
        except OSError as error:
            self._failed(error)
            return
        self._last_place_check = time.monotonic()
        if not existed:
            self._write({"type": "header", **header, "format": FORMAT_VERSION})
            self.sync()

    def _mend_tail(self) -> None:
        """Make the file end with a whole line, by the rule of :func:`whole_lines`: a crash may
        have left half a line (cut off) or a whole record without its newline (given one)."""
        data = read_regular(self.path, what="the journal")
        _, end, newline_missing = whole_lines(data)
        with open(self.path, "rb+") as handle:
            if end < len(data):
                handle.truncate(end)
            if newline_missing:
                handle.seek(end)
                handle.write(b"\n")

    def moved_away(self) -> Optional[str]:
        """Why the journal is no longer the results folder's, or None: the folder or the journal
        was deleted, renamed or replaced since the run opened it. Records appended then would go
        to a file no later ``--resume`` reads, and the outputs to a folder without their journal."""
        if self._fd is None or self._identity is None:
            return None
        folder, journal = self._identity
        try:
            try:
                now = _identity(os.stat(self.path.parent))
            except FileNotFoundError:
                return f"the results folder {quoted(self.path.parent)} was deleted or renamed during the run"
            if now != folder:
                return (f"the results folder {quoted(self.path.parent)} was replaced (deleted or renamed, then made "
                        f"again) during the run")
            if os.fstat(self._fd).st_nlink == 0:
                return f"the journal {quoted(self.path)} was deleted during the run"
            try:
                if _identity(os.stat(self.path)) == journal:
                    return None
            except FileNotFoundError:
                pass
            return f"the journal {quoted(self.path)} was renamed or replaced during the run"
        except OSError:
            return None  # cannot tell (a flaky network filesystem): the writes themselves will say

    def check_place(self) -> bool:
        """Whether the journal is still the results folder's; where it is not, note it (which
        stops the run, see :mod:`common.write_failures`) and write no more."""
        self._last_place_check = time.monotonic()
        why = self.moved_away()
        if why is None:
            return True
        self.failure = write_failures.note(write_failures.MOVED_AWAY, self.path,
                                           OSError(errno.ENOENT, why))
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return False

    def _write(self, entry: dict) -> None:
        if self._fd is None or not self.check_place():
            return
        line = _ENCODER.encode(to_jsonable(entry)).encode() + b"\n"
        left = memoryview(line)
        try:
            while left:
                left = left[os.write(self._fd, left):]
        except OSError as error:
            self._failed(error)
            return
        self._good += len(line)
        self._dirty = True

    def _failed(self, error: OSError) -> None:
        """Stop writing: cut a half-written line (truncating needs no space) and note why."""
        self.failure = write_failures.note("the journal", self.path, error)
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._good)
            except OSError:
                pass  # a torn last line is ignored on reading anyway
            os.close(self._fd)
            self._fd = None

    def add_result(self, record: Record) -> None:
        self._write({"type": "result", **vars(record)})
        self.maybe_sync()

    def add_event(self, kind: str, **fields: Any) -> None:
        """Failed attempts, permanent failures, stops: kept for the summary and the timeline."""
        self._write({"type": kind, **fields})
        self.maybe_sync()

    def maybe_sync(self) -> None:
        """From the distribution loop: sync when due, and look every ``PLACE_CHECK_SECONDS``
        whether the results folder is still there (an item may run for hours)."""
        if self._fd is not None and time.monotonic() - self._last_place_check >= PLACE_CHECK_SECONDS:
            self.check_place()
        if self._dirty and time.monotonic() - self._last_sync >= self.sync_every:
            self.sync()

    def sync(self) -> None:
        if self._fd is None:
            return
        if self._dirty or self._last_sync == 0.0:
            try:
                os.fsync(self._fd)
            except OSError as error:  # a filesystem that allocates late (NFS, quotas) says so here
                self._failed(error)
                return
            self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
