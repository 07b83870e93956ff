"""The journal: one JSON line per finished item, appended at rank 0 as results stream in.

It is what makes a killed run lose nothing but its last moments' results: ``--resume`` reads it
back and skips every item it holds. Lines are written in batches: a batch is all the lines of the last ``sync_every`` seconds
(at most ``max_lines`` of them), written with one write and one fsync by a thread of its own, so
that per result rank 0 only appends a JSON line in memory (mostly made by the follower that ran
the item: :func:`result_line`). The bounded window (``WINDOW_SECONDS``,
``WINDOW_LINES``): a SIGKILL of the whole job, or a crash of the node, loses at most the results
that reached rank 0 in its last 0.15 s (the batch being filled, 0.05 s, one idle turn of rank 0's
loop, 0.05 s, and the batch before it, still on its way to a disk that takes up to 0.05 s to write
and fsync it; a slower disk slows rank 0 down instead), and never more than 2 x ``max_lines`` =
2,000 results; those items run again on ``--resume``.

Every reader (``--resume``, ``python -m common.status``, report.html) is a :class:`JournalReader`,
which splits the file with :func:`whole_lines`, so all agree on its last line: a complete JSON record that lacks its newline
(the writer stopped just before it) is kept, and the writer adds the newline before its next
record; a last line that is not one (torn mid-line by a crash) is dropped, and the writer cuts it.

A write that fails (a full disk, an exceeded quota) raises nothing: the journal cuts what it had
half-written, writes no more, and notes the failure (:mod:`common.results.failures`), which stops
the run; everything before it stays readable for ``--resume``.
"""
from __future__ import annotations

import errno
import json
import os
import queue
import threading
from dataclasses import dataclass, fields
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from common.app import Record
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import UsageError, quoted
from common.results.failures import MOVED_AWAY, WriteFailure, WriteFailures
from common.results.outputs import to_jsonable
from common.results.regular_file import read_regular, refuse_unless_regular

FORMAT_VERSION = 1
#: how often the distribution loop checks that the results folder and the journal are still in place
PLACE_CHECK_SECONDS = 1.0
_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one for every line (json.dumps makes one per call)
#: a batch is written once it is this old (seconds) or this long (lines): the window a SIGKILL can lose
SYNC_SECONDS = 0.05
MAX_LINES = 1000
#: what a SIGKILL of the whole job can lose at most: the results of these last seconds, at most these many
WINDOW_SECONDS = 3 * SYNC_SECONDS
WINDOW_LINES = 2 * MAX_LINES
_RECORD_FIELDS = tuple(field.name for field in fields(Record))
# what _ENCODER writes for the engine's own fields of a result (each raises TypeError on another type)
_string, _float, _int = encode_basestring_ascii, float.__repr__, int.__repr__
_INF = float("inf")


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


class Kind:
    """Each journal line's ``type``: what the writer writes and every reader looks for."""

    HEADER = "header"  # the first line: the run's fingerprint
    RESULT = "result"  # an item finished
    START = "start"  # a run (the first or a resume) started: its ranks' layout
    STOP = "stop"  # a stop was asked
    ATTEMPT_FAILED = "attempt_failed"  # one attempt failed, with its traceback
    FAILED = "failed"  # an item failed for good (in that run)
    RANK_LOST = "rank_lost"  # a rank stopped answering; its items went to others


#: every line's kind
KINDS = tuple(value for name, value in vars(Kind).items() if name.isupper())  # a tuple: a type may be unhashable


def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


@dataclass
class WorkerTally:
    """One worker's finished items in the current run, as its result lines say: how many, their
    seconds in all, and when the latest ended (the status command shows a busy worker's pace with
    them where the status file, rewritten every few seconds, lags behind items of a second)."""

    items: int = 0
    seconds: float = 0.0
    last_end: Optional[float] = None

    def add(self, seconds: Any, end: Any, group_size: Any = 1) -> None:
        """One result line: ``seconds`` is its group's (each item of a group has a line of its own
        with the group's time), so an item's share is ``seconds / group_size``, as ``Record.own_seconds``."""
        self.items += 1
        share = max(1, group_size) if isinstance(group_size, int) and not isinstance(group_size, bool) else 1
        self.seconds += seconds / share if _is_time(seconds) and seconds > 0 else 0.0
        if _is_time(end):
            self.last_end = end if self.last_end is None else max(self.last_end, end)


class JournalReader:
    """The one reader of a journal, for ``--resume``, the status command and report.html: whole
    lines by the rule of :func:`whole_lines`, read incrementally (``--watch`` rereads only what was
    appended; a journal that shrank was replaced, and is read again from the start), each entry
    taken by its :class:`Kind`.

    ``strict`` (``--resume``): an unreadable journal, a line that is not JSON or a result, header
    or start that is not one the engine writes is a UsageError naming the line; otherwise (a look
    at a running job, the report) such lines are passed over. ``records``: keep each result as a
    Record (what ``--resume`` skips); ``attempts``: keep the failed attempts (the report's
    tracebacks); ``only``: parse only the lines of these kinds (a million result lines are not
    parsed to find the failed attempts)."""

    def __init__(self, path: Path, *, strict: bool = False, records: bool = False, attempts: bool = False,
                 only: Sequence[str] = ()):
        self.path, self.strict, self.keep_records, self.keep_attempts = Path(path), strict, records, attempts
        self._tags = tuple(f'"{kind}"'.encode() for kind in only)
        self._reset()

    def _reset(self) -> None:
        self.offset = 0  # bytes read: where the next update starts
        self.lines = 0  # lines read (a line's number in messages)
        self.header: Optional[dict] = None
        self.done: set = set()  # keys of finished items
        self.done_this_run: set = set()  # of them, those finished since the last start (a resume reruns some)
        self.records: Dict[str, Record] = {}  # with ``records``
        self.attempts: List[dict] = []  # with ``attempts``
        self.starts: List[dict] = []  # every run's start event, oldest first
        self.start_lines: List[int] = []  # the line of each
        self.failed: Dict[str, str] = {}  # key -> error, of this run's failed items not finished since
        self.workers: Dict[str, WorkerTally] = {}  # worker name -> its items finished since the last start
        self.attempt_ends: Dict[str, float] = {}  # key -> the end of its latest failed attempt since the last start
        self.lost: Dict[Any, dict] = {}  # rank -> its rank_lost event
        self.last: Optional[float] = None  # the latest time a line gives (an item's end, a start, a stop)
        # not strict: what --resume would refuse, for the status command to say (strict readers raise it):
        # a line it cannot take (for good), or a journal it cannot read (until a read succeeds again)
        self._damage: Optional[str] = None
        self._unreadable: Optional[str] = None

    @property
    def problem(self) -> Optional[str]:
        """Not strict: what ``--resume`` would refuse in the journal as read so far, or None."""
        return self._damage or self._unreadable

    def _damaged(self, number: int, kind: Any = None) -> None:
        if self.strict:
            raise UsageError(f"{quoted(self.path)}: line {number} is not a journal record; the journal is damaged")
        if kind in (Kind.HEADER, Kind.RESULT, Kind.START) or kind not in KINDS:  # the lines a resume reads or refuses
            self._damage = self._damage or f"line {number} is not a journal record: damaged"

    def update(self) -> "JournalReader":
        """Read what was appended since the last call (:class:`NotRegularFile` where the journal
        is a FIFO or another file that is not one)."""
        try:
            if self.offset and os.stat(self.path).st_size < self.offset:  # a new journal: start again
                self._reset()
            data = read_regular(self.path, "the journal", self.offset)
        except OSError as error:  # not there yet, or gone
            if self.strict:
                raise UsageError(f"{quoted(self.path)}: cannot read the journal ({error.strerror or error})") from None
            if not isinstance(error, FileNotFoundError):
                self._unreadable = f"cannot read it ({error.strerror or error})"
            return self
        self._unreadable = None
        lines, end, _ = whole_lines(data)  # a line still being written (torn for now) waits for the next read
        if self.strict and not self.offset and data.strip() and not any(line.strip() for line in lines):
            raise UsageError(f"{quoted(self.path)}: line 1 is not a journal record; the journal is damaged")
        self.offset += end
        for raw in lines:
            self.lines += 1
            if not raw.strip() or (self._tags and not any(tag in raw for tag in self._tags)):
                continue
            entry = parse_line(raw)
            if entry is None:  # not JSON, or JSON but no object (null, a list): of no kind
                self._damaged(self.lines)
                continue
            kind = entry.get("type")
            try:
                self._take(entry)
            except (AttributeError, KeyError, TypeError):
                self._damaged(self.lines, kind)
        return self

    def _take(self, entry: dict) -> None:
        """One entry, by its kind; TypeError or KeyError where it is not one the engine writes.
        Strict (``--resume``) reads only what a resume uses: the header, the results, the starts."""
        kind = entry.pop("type", None)
        if kind not in KINDS:  # an object, but no line the engine writes: --resume refuses it
            raise TypeError(f"type {kind!r}")
        if self.strict and kind not in (Kind.HEADER, Kind.RESULT, Kind.START):
            return
        if "key" in entry and not isinstance(entry["key"], str):  # not a line the engine writes
            if self.strict and kind == Kind.RESULT:
                raise TypeError("key is not a string")
            if not self.strict:
                return
        key = entry.get("key")
        when = entry.get("end", entry.get("time"))
        if _is_time(when):
            self.last = when if self.last is None else max(self.last, when)
        if kind == Kind.HEADER:
            self.header = entry
        elif kind == Kind.RESULT:
            record = _record(entry) if self.keep_records or self.strict else None
            if record is not None and self.keep_records:
                self.records[entry["key"]] = record
            self.done.add(entry["key"])
            self.done_this_run.add(entry["key"])
            self.failed.pop(entry["key"], None)
            worker = entry.get("worker")
            if isinstance(worker, str) and not self.strict:  # a resume has no use for them
                self.workers.setdefault(worker, WorkerTally()).add(entry.get("seconds"), entry.get("end"),
                                                                   entry.get("group_size", 1))
        elif kind == Kind.START:  # a resumed run retries what failed before
            self.starts.append(entry)
            self.start_lines.append(self.lines)
            self.failed, self.done_this_run, self.workers, self.attempt_ends = {}, set(), {}, {}
        elif kind == Kind.FAILED and key is not None:
            error = entry.get("error")
            self.failed[key] = error if isinstance(error, str) else ""
        elif kind == Kind.ATTEMPT_FAILED:
            if self.keep_attempts:
                self.attempts.append(entry)
            if key is not None and _is_time(entry.get("end")) and not self.strict:
                self.attempt_ends[key] = max(entry["end"], self.attempt_ends.get(key, entry["end"]))
        elif kind == Kind.RANK_LOST:
            self.lost[entry.get("rank")] = entry


def read_journal(path: Path, starts: Optional[List[dict]] = None) -> Tuple[Optional[dict], Dict[str, Record]]:
    """(header, finished records by key) from a journal, for ``--resume`` (strict: a damaged
    journal is a UsageError); ``starts``, where given, gets each run's start event (its ranks'
    layout), oldest first."""
    reader = JournalReader(path, strict=True, records=True).update()
    if starts is not None:  # their layouts are read (a resume's --threads): each a list of ranks
        for entry, line in zip(reader.starts, reader.start_lines):
            if not isinstance(entry.get("layout", []), list):
                raise UsageError(f"{quoted(path)}: line {line} is not a journal record; the journal is damaged")
        starts.extend(reader.starts)
    return reader.header, reader.records


def holds_journal(path: Path) -> bool:
    """Whether ``path`` is a begun journal. An empty file is none: the run that made it was killed
    before its writer put the header on disk (the first few milliseconds), and finished nothing;
    a rerun starts afresh in it, with or without --resume, where it would otherwise be refused."""
    try:
        return os.stat(path).st_size > 0
    except OSError:  # none there (a FIFO or a folder in its place is refused before)
        return False


def read_header(path: Path) -> Optional[dict]:
    """The journal's first line (the run's header) without reading the rest; None where it cannot
    be read or is not a header."""
    try:
        with open(path, "rb") as handle:
            entry = parse_line(handle.readline(1 << 20))
    except OSError:
        return None
    return entry if entry is not None and entry.pop("type", None) == Kind.HEADER else None


#: a result line's engine fields by the type they hold (what the summary and the timeline compute with)
_STRING_FIELDS = ("key", "host", "device", "worker")
_NUMBER_FIELDS = ("seconds", "start", "end")
_INT_FIELDS = ("rank", "attempt", "group_size")
_INT_BOUND = 2 ** 63  # past it, a float of it overflows the summary's arithmetic


def _record(entry: dict) -> Record:
    """A result line as a Record; TypeError where an engine field is not of a type the engine
    writes (a journal edited or damaged by hand), which would otherwise fail the report after the
    resumed run. The general encoder's way also writes a NaN time (as null) or a None host: those pass."""
    get = entry.get
    for name in _STRING_FIELDS:
        value = get(name, "")
        if type(value) is not str and (value is not None or name == "key"):
            raise TypeError(f"{name} is not a string")
    for name in _NUMBER_FIELDS:
        value = get(name, 0.0)
        kind = type(value)  # bool is neither
        if not (kind is float or value is None or (kind is int and -_INT_BOUND < value < _INT_BOUND)):
            raise TypeError(f"{name} is not a number")
    for name in _INT_FIELDS:
        value = get(name, 0)
        if type(value) is not int or not -_INT_BOUND < value < _INT_BOUND:
            raise TypeError(f"{name} is not an integer")
    return Record(**entry)


def describe_difference(old: dict, new: dict, left_out: Optional[Mapping[str, Any]] = None) -> str:
    """'seed 1 (journal) vs 2 (now)' for each argument that differs (all of them: one at a time, a
    user fixing the first was refused again for the next); an argument a fingerprint leaves out (so
    that older journals resume) is what ``left_out`` says it stands for, else "the default". Where
    the two are of different apps, that alone is said: one app's arguments mean nothing to the other
    (and ``left_out``, this app's, would be made up for the journal's)."""
    if "app" in old and "app" in new and old["app"] != new["app"]:
        old, new, left_out = {"app": old["app"]}, {"app": new["app"]}, None

    def shown(fingerprint: dict, name: str) -> str:
        if name in fingerprint:
            return repr(fingerprint[name])
        return repr(left_out[name]) if left_out and name in left_out else "the default"

    differences = [f"{name} {shown(old, name)} (journal) vs {shown(new, name)} (now)"
                   for name in sorted(set(old) | set(new)) if name not in old or name not in new or old[name] != new[name]]
    return ", ".join(differences) or "nothing"


class _PlainJson:
    """json's C encoder for values that are JSON as they are, with ``_ENCODER``'s separators,
    refusing (None) whatever :func:`to_jsonable` would change: another type (numpy, Path:
    ``default`` raises), a NaN or an infinity; a cycle is refused, not recursed into. Keys: JSON's
    spelling of int, float, bool and None keys, which is to_jsonable's."""

    def __init__(self) -> None:
        self.markers: Dict[int, Any] = {}  # the encoder's ids of the containers it is inside
        self.encode = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
            self.markers, self._refuse, encode_basestring_ascii, None, ":", ",", False, False, False)

    @staticmethod
    def _refuse(value: Any) -> Any:
        raise TypeError(type(value).__name__)

    def __call__(self, value: Any) -> Optional[str]:
        try:
            return "".join(self.encode(value, 0))
        except (TypeError, ValueError, RecursionError):
            # the encoder leaves the ids of the containers it was inside when it gave up: without
            # this, they would pile up, one or more for each result of an app that returns numpy values
            self.markers.clear()
            return None


#: None where this Python has no C encoder
_PLAIN_JSON = _PlainJson() if getattr(json.encoder, "c_make_encoder", None) is not None else None


def _app_value(value: Any) -> str:
    """An app's result or params as _ENCODER writes ``to_jsonable(value)``: most are plain JSON
    already, written at C speed without the copy to_jsonable makes (tests/test_journal_lines.py)."""
    if value is None:
        return "null"
    text = _PLAIN_JSON(value) if _PLAIN_JSON is not None else None
    return text if text is not None else _ENCODER.encode(to_jsonable(value))


def as_journaled(value: Any) -> Any:
    """``value`` as the journal keeps it and a resume reads it back: numpy arrays, tensors and tuples
    as lists, numpy scalars as Python numbers, NaN as None, keys as strings. An item's result is
    handed on so from its worker, so that the app's ``finish`` sees the same values in a run and in
    its resume (a result kept as returned was an array in one and a list in the other, a NaN in one
    and None in the other). TypeError or ValueError where a value has no JSON form (a set, bytes, an
    object of the app's: the journal could not keep it)."""
    return json.loads(_app_value(value))


def _result_line(record: Record) -> bytes:
    """The journal line of a result, as ``_ENCODER.encode`` writes the record's dict (same keys in
    the same order), made without the dict (a follower makes it for each result it batches: see
    :func:`result_line`; rank 0 for the others). Raises
    TypeError or ValueError for an engine field that is not a plain str, int or finite float."""
    seconds, start, end, result, params = record.seconds, record.start, record.end, record.result, record.params
    if not (-_INF < seconds < _INF and -_INF < start < _INF and -_INF < end < _INF):
        raise ValueError("not finite")
    return (f'{{"type":"{Kind.RESULT}","key":{_string(record.key)},'
            f'"result":{"null" if result is None else _app_value(result)},'
            f'"seconds":{_float(seconds)},"rank":{_int(record.rank)},"host":{_string(record.host)},'
            f'"device":{_string(record.device)},"worker":{_string(record.worker)},"start":{_float(start)},'
            f'"end":{_float(end)},"attempt":{_int(record.attempt)},"group_size":{_int(record.group_size)},'
            f'"params":{"null" if params is None else _app_value(params)}}}').encode()


def result_line(record: Record) -> Optional[bytes]:
    """A result's journal line, as :meth:`Journal.append_result` writes it; None where it must be made
    the general way (an engine field of an unusual type). A follower makes its results' lines, so
    that rank 0 does not encode every result of the run (:meth:`Journal.append_line`)."""
    try:
        return _result_line(record)
    except (TypeError, ValueError):
        return None


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

    def __init__(self, path: Path, header: dict, *, sync_every: float = SYNC_SECONDS, max_lines: int = MAX_LINES,
                 write_failures: Optional[WriteFailures] = None, clock: Clock = SYSTEM_CLOCK):
        """``write_failures``: the run's, where a failed write is noted (the run stops on it);
        ``clock``: what a batch's age and the place check's period are measured on."""
        self.clock = clock
        self.write_failures = write_failures or WriteFailures()
        self.path = Path(path)
        self.sync_every, self.max_lines = sync_every, max_lines
        self._pending: List[bytes] = []  # lines not yet handed to the writer: the batch
        self._since = 0.0  # when the batch's first line came
        self.failure: Optional[WriteFailure] = None
        self._fd: Optional[int] = None
        self._writer: Optional[_DiskWriter] = None
        self._identity: Optional[Tuple[Tuple[int, int], Tuple[int, int]]] = None  # (folder's, journal's)
        self._last_place_check = 0.0
        refuse_unless_regular(self.path, "the journal")  # opening a FIFO to append would wait for a reader
        if holds_journal(self.path):
            self._mend_tail()
        existed = holds_journal(self.path)  # a header torn by a kill is mended away: written again
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            opened = os.fstat(self._fd)
            self._identity = (_identity(os.stat(self.path.parent)), _identity(opened))
        except OSError as error:
            self._failed(error)
            return
        self._last_place_check = self.clock.monotonic()
        self._writer = _DiskWriter(self._fd, opened.st_size)  # st_size: where the last whole line ends
        if not existed:
            self._write({"type": Kind.HEADER, **header, "format": FORMAT_VERSION})
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
        stops the run, see :mod:`common.results.failures`) and write no more."""
        self._last_place_check = self.clock.monotonic()
        why = self.moved_away()
        if why is None:
            return True
        self._stop_writing(self.write_failures.note(MOVED_AWAY, self.path, OSError(errno.ENOENT, why)))
        return False

    def _write(self, entry: dict, plain: bool = False) -> None:
        """``plain``: ``entry`` holds JSON values only (no numpy, Path or NaN to convert)."""
        if self._fd is None:
            return
        if not self._pending:
            self._since = self.clock.monotonic()  # the batch's age counts from its first line
        try:
            line = _ENCODER.encode(entry if plain else to_jsonable(entry))
        except (TypeError, ValueError):  # not so plain after all
            line = _ENCODER.encode(to_jsonable(entry))
        self._pending.append(line.encode())
        if len(self._pending) >= self.max_lines:
            self._hand_over()

    def _hand_over(self) -> Optional[threading.Event]:
        """The batch to the writer thread (one write and one fsync for all its lines), once the
        journal is known to be still the results folder's."""
        self._check()
        if self._writer is None or not self._pending or not self.check_place():
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
        self._stop_writing(self.write_failures.note("the journal", self.path, error))

    def _stop_writing(self, failure: WriteFailure) -> None:
        self.failure = failure
        self._pending.clear()
        self._release()

    def _release(self) -> None:
        """The writer thread stopped and the file closed (what they had is written or given up)."""
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def append_result(self, record: Record) -> None:
        """A result's line into the batch; the caller (rank 0, which adds a
        :class:`common.messages.Results` message's many at once) then calls :meth:`maybe_sync` once.
        A full batch still goes to the writer at once."""
        if self._fd is None:
            return
        line = result_line(record)
        if line is None:  # an engine field of an unusual type: the general way
            entry = {"type": Kind.RESULT}
            for name in _RECORD_FIELDS:
                entry[name] = getattr(record, name)
            self._write(entry)
            return
        self.append_line(line)

    def append_line(self, line: bytes) -> None:
        """:meth:`append_result` for a line :func:`result_line` made elsewhere (by the follower that
        ran the item: the very bytes this journal would have made of the record)."""
        if self._fd is None:
            return
        pending = self._pending
        if not pending:
            self._since = self.clock.monotonic()
        pending.append(line)
        if len(pending) >= self.max_lines:
            self._hand_over()

    def add_event(self, kind: str, **fields: Any) -> None:
        """Failed attempts, permanent failures, stops: kept for the summary and the timeline."""
        self._write({"type": kind, **fields})
        self.maybe_sync()

    def maybe_sync(self) -> None:
        """Hand the batch to the writer once it is ``sync_every`` seconds old; from the
        distribution loop, look every ``PLACE_CHECK_SECONDS`` whether the results folder is still
        there (an item may run for hours)."""
        now = self.clock.monotonic()
        if self._fd is not None and now - self._last_place_check >= PLACE_CHECK_SECONDS:
            self.check_place()
        if self._pending and now - self._since >= self.sync_every:
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
        self._release()
