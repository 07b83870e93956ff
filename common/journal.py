"""The journal: one JSON line per finished item, appended at rank 0 as results stream in.

It is what makes a killed run lose nothing: ``--resume`` reads it back and skips every item it
holds. Lines are flushed at once and fsync'd in groups (at most every ``sync_every`` seconds and
on close), so a crash of the process loses nothing and a crash of the node loses at most the
last fraction of a second. A torn last line (the writer died mid-line) is ignored on reading.

A write that fails (a full disk, an exceeded quota) raises nothing: the journal cuts what it had
half-written, writes no more, and notes the failure (:mod:`common.write_failures`), which stops
the run; everything before it stays readable for ``--resume``.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from . import write_failures
from .app import Record
from .errors import UsageError, quoted
from .outputs import to_jsonable

JOURNAL_NAME = "journal.jsonl"
FORMAT_VERSION = 1
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for every line (json.dumps makes one per call)


def read_journal(path: Path) -> Tuple[Optional[dict], Dict[str, Record]]:
    """(header, finished records by key) from a journal; tolerates a torn tail."""
    header, records = None, {}
    try:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
    except OSError as error:
        raise UsageError(f"{quoted(path)}: cannot read the journal ({error.strerror or error})") from None
    for number, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8 (random bytes), nested too deep
            if number > 0 and number >= len(lines) - 2:  # the last line, torn by a crash (the header never is)
                continue
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
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            self._drop_torn_tail()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            self._good = os.fstat(self._fd).st_size  # where the last whole line ends
        except OSError as error:
            self._failed(error)
            return
        if not existed:
            self._write({"type": "header", **header, "format": FORMAT_VERSION})
            self.sync()

    def _drop_torn_tail(self) -> None:
        """A crash may have left half a line: cut it off so the next record starts cleanly."""
        with open(self.path, "rb+") as handle:
            end = handle.seek(0, os.SEEK_END)
            position, block = end, 1 << 20
            while position > 0:
                start = max(0, position - block)
                handle.seek(start)
                chunk = handle.read(position - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    position = start + newline + 1
                    break
                position = start
            if position < end:
                handle.truncate(position)

    def _write(self, entry: dict) -> None:
        if self._fd is None:
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
