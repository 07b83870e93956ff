"""The journal: one JSON line per finished item, appended at rank 0 as results stream in.

It is what makes a killed run lose nothing: ``--resume`` reads it back and skips every item it
holds. Lines are written in batches: a batch is all the lines of the last ``sync_every`` seconds
(at most ``max_lines`` of them), written with one write and one fsync by a thread of its own, so
that per result rank 0 only makes a JSON line in memory. The bounded window (``WINDOW_SECONDS``, ``WINDOW_LINES``): a SIGKILL of the whole job, or a
crash of the node, loses at most the results that reached rank 0 in its last 0.15 s (the batch
being filled, 0.05 s, one idle turn of rank 0's loop, 0.05 s, and the batch before it, still on its
way to a disk that takes up to 0.05 s to write and fsync it; a slower disk slows rank 0 down
instead), and never more than 2 x ``max_lines`` = 2,000 results; those items run again on
``--resume``. A torn last
line (the writer died mid-line) is ignored on reading.

A write that fails (a full disk, an exceeded quota) raises nothing: the journal cuts what it had
half-written, writes no more, and notes the failure (:mod:`common.write_failures`), which stops
the run; everything before it stays readable for ``--resume``.
"""
from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import write_failures
from .app import Record
from .errors import UsageError, quoted
from .outputs import to_jsonable

JOURNAL_NAME = "journal.jsonl"
FORMAT_VERSION = 1
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for every line (json.dumps makes one per call)
#: a batch is written once it is this old (seconds) or this long (lines): the window a SIGKILL can lose
SYNC_SECONDS = 0.05
MAX_LINES = 1000
#: what a SIGKILL of the whole job can lose at most: the results of these last seconds, at most these many
WINDOW_SECONDS = 3 * SYNC_SECONDS
WINDOW_LINES = 2 * MAX_LINES
_RECORD_FIELDS = tuple(field.name for field in fields(Record))


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


class _DiskWriter:
    """Writes and fsyncs the journal's batches in a thread of its own, so rank 0's loop never
    waits for the disk (an fsync takes milliseconds, tens of them on a busy disk). One batch is
    written at a time; ``put`` waits while the one before is still on its way (a slow disk slows
    rank 0 down rather than let unwritten lines pile up)."""

    def __init__(self, fd: int, good: int):
        self.fd, self.good = fd, good  # good: where the last whole line written ends
        self.error: Optional[OSError] = None
        self._batches: "queue.SimpleQueue[Optional[Tuple[bytes, threading.Event]]]" = queue.SimpleQueue()
        self._last: Optional[threading.Event] = None
        self._thread = threading.Thread(target=self._run, name="journal", daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> threading.Event:
        """Queue a batch (whole lines); the event is set once it is written and fsync'd (or failed)."""
        if self._last is not None:
            self._last.wait()
        done = threading.Event()
        self._last = done
        self._batches.put((data, done))
        return done

    def _run(self) -> None:
        while True:
            job = self._batches.get()
            if job is None:
                return
            data, done = job
            if self.error is None:
                try:
                    left = memoryview(data)
                    while left:
                        left = left[os.write(self.fd, left):]
                    self.good += len(data)
                    os.fsync(self.fd)  # a filesystem that allocates late (NFS, quotas) says so here
                except OSError as error:
                    self.error = error
                    try:  # cut a half-written line (truncating needs no space)
                        os.ftruncate(self.fd, self.good)
                    except OSError:
                        pass  # a torn last line is ignored on reading anyway
            done.set()

    def stop(self) -> None:
        """After the last batch is written."""
        self._batches.put(None)
        self._thread.join()


class Journal:
    """Append-only writer used by rank 0."""

    def __init__(self, path: Path, header: dict, *, sync_every: float = SYNC_SECONDS, max_lines: int = MAX_LINES):
        self.path = Path(path)
        self.sync_every, self.max_lines = sync_every, max_lines
        self._pending: List[bytes] = []  # lines not yet handed to the writer: the batch
        self._since = 0.0  # when the batch's first line came
        self.failure: Optional[write_failures.WriteFailure] = None
        self._fd: Optional[int] = None
        self._writer: Optional[_DiskWriter] = None
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            self._drop_torn_tail()
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            good = os.fstat(self._fd).st_size  # where the last whole line ends
        except OSError as error:
            self._failed(error)
            return
        self._writer = _DiskWriter(self._fd, good)
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

    def _write(self, entry: dict, plain: bool = False) -> None:
        """``plain``: ``entry`` holds JSON values only (no numpy, Path or NaN to convert)."""
        if self._fd is None:
            return
        if not self._pending:
            self._since = time.monotonic()  # the batch's age counts from its first line
        try:
            line = _ENCODER.encode(entry if plain else to_jsonable(entry))
        except (TypeError, ValueError):  # not so plain after all
            line = _ENCODER.encode(to_jsonable(entry))
        self._pending.append(line.encode())
        if len(self._pending) >= self.max_lines:
            self._hand_over()

    def _hand_over(self) -> Optional[threading.Event]:
        """The batch to the writer thread (one write and one fsync for all its lines)."""
        self._check()
        if self._writer is None or not self._pending:
            return None
        data = b"\n".join(self._pending) + b"\n"
        self._pending.clear()
        return self._writer.put(data)

    def _check(self) -> None:
        """A write or fsync of the writer thread failed: stop, and note why."""
        if self._writer is not None and self._writer.error is not None:
            self._failed(self._writer.error)

    def _failed(self, error: OSError) -> None:
        """Stop writing (a half-written line was cut) and note why."""
        self.failure = write_failures.note("the journal", self.path, error)
        self._pending.clear()
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def add_result(self, record: Record) -> None:
        # the fields one by one: vars() would give the record a dict of its own (memory, at rank 0);
        # the engine's own fields are plain (str, int, float): only the app's values need converting
        entry = {"type": "result"}
        for name in _RECORD_FIELDS:
            entry[name] = getattr(record, name)
        entry["result"] = to_jsonable(record.result)
        entry["params"] = to_jsonable(record.params)
        self._write(entry, plain=True)
        self.maybe_sync()

    def add_event(self, kind: str, **fields: Any) -> None:
        """Failed attempts, permanent failures, stops: kept for the summary and the timeline."""
        self._write({"type": kind, **fields})
        self.maybe_sync()

    def maybe_sync(self) -> None:
        """Hand the batch to the writer once it is ``sync_every`` seconds old."""
        if self._pending and time.monotonic() - self._since >= self.sync_every:
            self._hand_over()
        else:
            self._check()

    def sync(self) -> None:
        """Write and fsync everything so far, and wait for it."""
        done = self._hand_over()
        if done is None and self._writer is not None:
            done = self._writer.put(b"")  # an fsync of what came before
        if done is not None:
            done.wait()
        self._check()

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
