"""Logging on stderr, each line prefixed with where it comes from: rank, host; and log files in
the results folder that never crash a rank or a worker when they cannot be written."""
from __future__ import annotations

import logging
import socket
import sys
import time
from typing import List, Optional, Tuple

from common.errors import quoted
from common.results.failures import WriteFailures

log = logging.getLogger("multinode_gpu")
#: a held routine line (FileLog.hold) is written at the latest this many seconds after it
HOLD_SECONDS = 0.2


class FileLog(logging.FileHandler):
    """A log file that, the first time it cannot be written (a full disk, an exceeded quota), says
    so in one line on stderr and hands its records to ``fallback`` (None: to nobody, since the
    logger also writes to stderr). No "--- Logging error ---" tracebacks. The file is opened at
    the first record, so opening it cannot fail at start-up either."""

    def __init__(self, path: str, fallback: Optional[logging.Handler] = None, what: str = "the log",
                 write_failures: Optional[WriteFailures] = None, name: str = ""):
        """``write_failures``: where a failed write is noted (the run stops on it); only without a
        ``fallback``. ``name``: what each line says it comes from (for :meth:`hold`)."""
        # UTF-8 whatever the locale; a path or message holding bytes that are no UTF-8 (a --results of
        # such a name, decoded with surrogates) is written with them escaped, not a failed write
        super().__init__(path, delay=True, encoding="utf-8", errors="backslashreplace")
        self.fallback, self.what, self.write_failures, self.name = fallback, what, write_failures, name
        self.failed = False
        self.held: List[Tuple[float, str]] = []  # (when, message) of routine lines not yet written
        self._second, self._second_text = -1, ""  # the last second formatted, and its text

    def hold(self, when: float, message: str) -> None:
        """A routine INFO line (an item done), written with the next ones: at the latest
        HOLD_SECONDS after the first of them, before any other record (the order is kept), on
        :meth:`write_held` (a worker about to wait for work) and on close. A worker's short
        items then cost no pass through logging and no write each (most of the time between
        two items, measured); a SIGKILL loses the held lines, at most HOLD_SECONDS of them."""
        with self.lock:  # type: ignore[union-attr]
            held = self.held
            held.append((when, message))
            if when - held[0][0] >= HOLD_SECONDS:
                self._write_held()

    def write_held(self) -> None:
        if self.held:
            with self.lock:  # type: ignore[union-attr]
                self._write_held()

    def _write_held(self) -> None:
        """The held lines as the formatter writes them ("%(asctime)s [name] INFO %(message)s")."""
        held, self.held = self.held, []
        if not held or self.failed:
            return
        lines = []
        time_format, msec_format = logging.Formatter.default_time_format, logging.Formatter.default_msec_format
        for when, message in held:
            second = int(when)
            if second != self._second:  # a second's text made once for all its lines
                self._second, self._second_text = second, time.strftime(time_format, time.localtime(second))
            stamp = msec_format % (self._second_text, int((when - second) * 1000))  # logging's own asctime
            lines.append(f"{stamp} [{self.name}] INFO {message}\n")
        try:
            if self.stream is None:
                self.stream = self._open()
            self.stream.write("".join(lines))
            self.flush()
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": lines[-1].rstrip("\n"), "levelno": logging.INFO}))

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            self._fall_back(record)
            return
        if self.held:
            self._write_held()  # emit runs under the handler's lock
        super().emit(record)

    def close(self) -> None:
        try:
            self.write_held()
        finally:
            super().close()

    def _fall_back(self, record: logging.LogRecord) -> None:
        if self.fallback is not None and record.levelno >= self.fallback.level:
            self.fallback.handle(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if self.failed:
            return
        self.failed = True
        error = sys.exc_info()[1]
        reason = getattr(error, "strerror", None) or str(error)
        if isinstance(error, OSError) and self.fallback is None and self.write_failures is not None:
            self.write_failures.note(self.what, self.baseFilename, error)
        where = "stderr" if self.fallback is None else "stderr (warnings and errors)"
        print(f"cannot write {self.what} {quoted(self.baseFilename)} ({reason}); it goes to {where} from now on",
              file=sys.stderr, flush=True)
        try:
            self.close()
        except (OSError, ValueError):
            pass
        self._fall_back(record)


def rank_tag(rank: int) -> str:
    """What starts each line a rank writes on stderr, its log's and its progress messages alike."""
    return f"[rank {rank} {socket.gethostname().split('.')[0]}]"


def setup_logging(rank: int, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{rank_tag(rank)} %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def add_file_log(path: str, first_line: str = "", write_failures: Optional[WriteFailures] = None) -> None:
    """Also keep the rank's log in the results folder (its records are on stderr too); each line
    names the host, since the ranks' logs of a multi-node run sit side by side. ``first_line`` goes
    to the file only (where the rank runs), so every rank's log exists and says where it ran."""
    handler = FileLog(path, write_failures=write_failures)
    host = socket.gethostname().split(".")[0]
    handler.setFormatter(logging.Formatter(f"%(asctime)s {host} %(levelname)s %(message)s"))
    if first_line:
        handler.handle(logging.makeLogRecord({"msg": first_line, "levelno": logging.INFO, "levelname": "INFO"}))
    log.addHandler(handler)


def log_to_files(text: str, level: int = logging.ERROR) -> None:
    """``text`` (a traceback) in the rank's log file only: stderr has had its one line."""
    record = logging.makeLogRecord({"msg": text, "levelno": level, "levelname": logging.getLevelName(level)})
    for handler in log.handlers:
        if isinstance(handler, FileLog):
            handler.handle(record)


class _FirstLine(logging.Formatter):
    """A record's first line: no traceback on stderr."""

    def format(self, record: logging.LogRecord) -> str:
        lines = super().format(record).splitlines()
        return lines[0] + (" (more in the log, which could not be written)" if len(lines) > 1 else "")


def worker_file_log(path: str, name: str) -> FileLog:
    """A worker's log: its file, or, once that cannot be written, stderr for the first line of its
    warnings and errors (a line per item, or a traceback, there would bury the rank's own messages)."""
    formatter = logging.Formatter(f"%(asctime)s [{name}] %(levelname)s %(message)s")
    fallback = logging.StreamHandler(sys.stderr)
    fallback.setLevel(logging.WARNING)
    fallback.setFormatter(_FirstLine(f"%(asctime)s [{name}] %(levelname)s %(message)s"))
    handler = FileLog(path, fallback, what="the worker log", name=name)
    handler.setFormatter(formatter)
    return handler
