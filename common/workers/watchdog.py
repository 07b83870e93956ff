"""The watch over a rank's workers: the silent ones and those whose item runs too long are killed.

A worker that lives but says nothing (its heartbeat thread cannot run: SIGSTOPped, or stuck in
native code holding the GIL) for ``worker_timeout`` seconds, counted from its first message, is
killed (SIGKILL); so is a worker whose item (or group) has run for more than ``item_timeout``
seconds, and one still starting (App.setup_worker) after ``setup_timeout`` seconds. Its log gets
where it was (faulthandler) and why it was killed; its pool then handles it as any dead worker,
its item failing with that reason (a starting one's failed start counts towards giving up its device).

The watch reads what the pool keeps on each worker (``common.workers.pool.WorkerHandle``): when it
was last heard from and what it was handed. What the watch itself notes on a worker, what it runs
since when (:meth:`Watchdog.note_start`) and why it killed it, is the worker's :class:`WorkerWatch`,
which only this module writes.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Tuple

import psutil

from common.clock import SYSTEM_CLOCK, Clock
from common.errors import SILENT, TIMED_OUT
from common.observe.logs import worker_file_log
from common.results.layout import worker_log
from common.signals import DUMP_SIGNAL

log = logging.getLogger("multinode_gpu")

#: heartbeats go out every worker_timeout / 4 seconds, but at least this often
MAX_HEARTBEAT_INTERVAL = 5.0
#: how long a worker's stack dump (DUMP_SIGNAL) may take before the kill
DUMP_SECONDS = 0.2
#: how the reasons for killing a worker begin, as users read them (the timeline colours those attempts by
#: their kind, ``Failed.kind``, not by these words)
SILENT_WORDS, TIMED_OUT_WORDS = "worker silent for", "timed out after"


@dataclass(frozen=True)
class Kill:
    """Why the watch killed a worker."""

    why: str  # its item's error
    kind: str  # SILENT or TIMED_OUT (Failed.kind: the timeline colours those attempts)
    keys: Tuple[str, ...]  # the items it was running then (:meth:`Watchdog.running_keys`)


@dataclass
class WorkerWatch:
    """What the watch notes on one worker (the pool reads it, only the watch writes it)."""

    running: Any = None  # what it runs now: its first bundle (a group) or that bundle's first entry
    since: float = 0.0  # monotonic, when ``running`` started (the previous answer came)
    since_wall: float = 0.0  # the same as epoch seconds, for the timeline
    killed: Optional[Kill] = None  # set once the watch killed it


def unanswered(worker: Any) -> int:
    """Items the worker has finished but not yet answered for (its answers are on their way)."""
    return max(0, worker.finished.value - worker.items_done) if worker.finished is not None else 0


class Watchdog:
    """Kills the workers of a pool that fell silent or whose item ran past its time limit."""

    def __init__(self, worker_timeout: Optional[float], item_timeout: Optional[float], logs_dir: Path,
                 clock: Clock = SYSTEM_CLOCK, setup_timeout: Optional[float] = None):
        """``worker_timeout``: seconds of silence after which a worker is killed; ``item_timeout``:
        seconds an item (or group) may run; ``setup_timeout``: seconds a worker may take to start
        (App.setup_worker); None (or 0): no limit. ``logs_dir``: the workers' logs, where each
        killed worker's gets why."""
        self.worker_timeout, self.item_timeout = worker_timeout or None, item_timeout or None
        self.setup_timeout = setup_timeout or None
        self.logs_dir, self.clock = Path(logs_dir), clock

    @property
    def heartbeat(self) -> Optional[float]:
        """Seconds between a worker's heartbeats (None: it sends none, nothing watches its silence)."""
        return min(MAX_HEARTBEAT_INTERVAL, self.worker_timeout / 4) if self.worker_timeout else None

    @property
    def active(self) -> bool:
        return bool(self.worker_timeout or self.item_timeout or self.setup_timeout)

    def note_start(self, worker: Any) -> None:
        """After the worker's bundles changed: if what it runs now is new, it started now. A worker
        runs what it is handed in order, so the next item starts when the previous one is answered
        (to within the pipe's latency: an item gets at least its --item-timeout), with no message
        per item (chunks of very short items exist)."""
        head = worker.assigned[0] if worker.assigned else None
        if head is not None and not head.together:
            head = head.entries[0]
        watch = worker.watch
        if head is not watch.running:
            watch.running, watch.since, watch.since_wall = head, self.clock.monotonic(), self.clock.time()

    def check(self, workers: Iterable[Any]) -> None:
        """Kill workers silent for worker_timeout, and those whose item ran past item_timeout."""
        now = self.clock.monotonic()
        for worker in list(workers):
            if worker.watch.killed is not None:
                continue
            silence = now - worker.heard if worker.heard is not None else 0.0
            running = now - worker.watch.since if worker.watch.running is not None else 0.0
            starting = now - worker.spawned if not worker.ready and not worker.setup_reported else 0.0
            silent = self.worker_timeout is not None and silence > self.worker_timeout
            late = self.item_timeout is not None and running > self.item_timeout
            slow_start = self.setup_timeout is not None and starting > self.setup_timeout
            if not (silent or late or slow_start) or worker.conn.poll():  # unread messages: read them first
                continue
            keys = ", ".join(self.running_keys(worker))
            kind = TIMED_OUT
            if slow_start and not silent:  # its heartbeat goes on: stuck in its setup (a dead filesystem, a lock)
                why = f"its setup ran past {self.setup_timeout:g} s (--setup-timeout)"
                said = f"worker still starting after {starting:.0f} s (--setup-timeout {self.setup_timeout:g})"
            elif late:
                why = f"{TIMED_OUT_WORDS} {self.item_timeout:g} s (--item-timeout)"
                said = f"{keys} timed out after {self.item_timeout:g} s (--item-timeout)"
            else:
                kind = SILENT
                why = f"{SILENT_WORDS} {silence:.0f} s (stopped or hung)"
                said = (f"worker silent for {silence:.0f} s (stopped, or hung in code that holds the GIL; "
                        f"--worker-timeout {self.worker_timeout:g}) while "
                        + (f"running {keys}" if keys else "starting" if not worker.ready else "idle"))
            self.kill(worker, why, said, kind)

    @staticmethod
    def running_keys(worker: Any) -> Tuple[str, ...]:
        """The keys of what the worker runs now: its group, or its chunk's item after those finished
        (their answers may still be held back in the worker, which sends a chunk's together)."""
        if worker.watch.running is None:
            return ()
        head = worker.assigned[0]
        if head.together:
            entries = head.entries
        else:  # in a chunk: past the items finished but not yet answered for
            entries = head.entries[min(unanswered(worker), len(head.entries) - 1):][:1]
        return tuple(entry.item.key for entry in entries)

    def kill(self, worker: Any, why: str, said: str, kind: str) -> None:
        """SIGKILL, with every process it started (a pipeline step's own children hold GPUs too:
        their memory goes with them), after a stack dump into its log; the sentinel then reports
        it like any dead worker, its item failing with ``why``."""
        worker.watch.killed = Kill(why, kind, self.running_keys(worker))
        log.error("%s: %s; killing it (pid %d)", worker.name, said, worker.process.pid)
        handler = worker_file_log(str(worker_log(self.logs_dir, worker.name)), worker.name)
        handler.handle(logging.makeLogRecord({
            "name": log.name, "levelno": logging.ERROR, "levelname": "ERROR",
            "msg": f"{said}: killed by its rank (SIGKILL); where its threads were follows (nothing if it was stopped)"}))
        handler.close()
        try:
            descendants = psutil.Process(worker.process.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        try:
            os.kill(worker.process.pid, DUMP_SIGNAL)  # runs even in native code; not while stopped
            self.clock.sleep(DUMP_SECONDS)
            worker.process.kill()
        except OSError:
            pass
        for process in descendants:
            try:
                process.kill()
            except psutil.Error:
                pass
