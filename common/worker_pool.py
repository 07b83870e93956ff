"""The workers of one rank: spawned processes, one per device, watched and replaced.

The pool starts each worker with 'spawn' and an environment made for it: pinned to exactly its
GPU by ``CUDA_VISIBLE_DEVICES``, thread counts set, and every MPI/PMI variable removed so the child
can never re-initialise MPI. It notices a dead worker within one poll (its process sentinel),
reports the item it was running as failed and starts a fresh one.

A worker that lives but says nothing (its heartbeat thread cannot run: SIGSTOPped, or stuck in
native code holding the GIL) for ``worker_timeout`` seconds, counted from its first message, is
killed (SIGKILL) and handled as a dead one; so is a worker whose item (or group) has run for more
than ``item_timeout`` seconds. Its log gets where it was (faulthandler) and why it was killed.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import signal
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import psutil

from .app import Record
from .devices import Device
from .items import Item
from .layout import worker_log
from .logs import worker_file_log
from .messages import (
    Answers,
    Assign,
    Dropped,
    Failed,
    ItemDone,
    ItemError,
    PoolAnswer,
    PoolCall,
    PoolRequest,
    Quit,
    Ready,
    Result,
    Revoke,
    Revoked,
    SetupFailed,
)
from .mpi import without_launcher
from .resources import ResourceBroker
from .signals import DUMP_SIGNAL, WORKER_IGNORED_SIGNALS, WORKER_TERMINATE_SIGNAL, signals_blocked
from .worker import worker_main

log = logging.getLogger("multinode_gpu")

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
MAX_SETUP_FAILURES = 3
#: heartbeats go out every worker_timeout / 4 seconds, but at least this often
MAX_HEARTBEAT_INTERVAL = 5.0
#: how long a worker's stack dump (DUMP_SIGNAL) may take before the kill
DUMP_SECONDS = 0.2
#: how the reasons for killing a worker begin (the timeline colours those attempts)
SILENT, TIMED_OUT = "worker silent for", "timed out after"


def failure_kind(error: str) -> str:
    """"silent" or "timeout" for an attempt ended by the pool's watch, else "failed"."""
    return "silent" if error.startswith(SILENT) else "timeout" if error.startswith(TIMED_OUT) else "failed"


@contextmanager
def _child_environment(device: Device, threads: int) -> Iterator[None]:
    """os.environ as the child must see it, for the instant its process is started."""
    saved = dict(os.environ)
    try:
        child = without_launcher(os.environ)
        os.environ.clear()
        os.environ.update(child)
        os.environ["CUDA_VISIBLE_DEVICES"] = device.physical if device.is_gpu else ""
        # GPU numbers mean what NVML and Slurm mean by them (PCI order), whatever order the user's
        # environment asks CUDA for: the monitor and the summary name GPUs by those numbers
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        for name in _THREAD_VARIABLES:
            os.environ[name] = str(threads)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _describe_exit(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"worker died from signal {-code}"
        if name == "SIGKILL":  # what users most often meet: the kernel's (or Slurm's) out-of-memory kill
            return "worker died from signal SIGKILL (out of memory? see dmesg or Slurm's job report)"
        return f"worker died from signal {name}"
    return f"worker exited with code {code}"


@dataclass
class Bundle:
    """Items handed to a worker in one message: a group run together, or a chunk of short items
    run one after the other. Entries are [item, attempt, time handed] until answered."""

    entries: list
    together: bool
    size: int


@dataclass
class WorkerHandle:
    name: str
    device: Device
    process: Any
    conn: Any
    ready: bool = False
    # Bundles handed over, in order: the first runs, the rest wait in the worker's inbox.
    assigned: Deque["Bundle"] = field(default_factory=deque)
    handed_total: int = 0
    items_done: int = 0
    retiring: bool = False
    setup_reported: bool = False  # it said its setup failed (counted then, not again at its exit)
    unreachable: bool = False  # a send to it failed: what it was handed never reached it
    heard: Optional[float] = None  # monotonic time of its last message (None: it has said nothing yet)
    running: Any = None  # what it runs now: its first bundle (a group) or that bundle's first entry
    running_since: float = 0.0  # monotonic, when ``running`` started (the previous answer came)
    running_wall: float = 0.0  # the same as epoch seconds, for the timeline
    killed_because: str = ""  # why the watch killed it (its item's error)
    killed_running: Any = None  # what it was running then
    # items the process has finished, answered or not (shared memory it writes): answers of a chunk
    # travel together, so on its death this tells which item it was running
    finished: Any = None


@dataclass
class Event:
    """What a poll of the pool saw: an item done or failed, or a global-pool message."""

    kind: str  # "done", "failed", "returned" (handed over but never started), "pool"
    record: Optional[Record] = None  # done and failed: where and when it ran (failed: no result)
    error: str = ""  # failed
    traceback: str = ""  # failed
    keys: Tuple[str, ...] = ()  # returned
    message: Optional[tuple] = None  # pool: (verb, requester, pool, count)

    @property
    def key(self) -> str:
        return self.record.key if self.record else ""

    def as_message(self) -> Any:
        """The event as rank 0 receives it (a record of :mod:`common.messages`)."""
        if self.kind == "done":
            return Result(self.record)
        if self.kind == "failed":
            return Failed(self.record, self.error, self.traceback)
        if self.kind == "returned":
            return Dropped(list(self.keys))
        return PoolCall(*self.message)


class WorkerCounts:
    """What the rank's loop asks of any pool of workers (``self.workers``: name -> handle with
    ``ready``, ``assigned`` and ``retiring``): shared by :class:`WorkerPool` and the in-process
    stand-in of the tests and benchmarks (``common.inprocess``)."""

    workers: Dict[str, Any]

    @property
    def idle(self) -> List[Any]:
        """Started workers with nothing to do."""
        return [w for w in self.workers.values() if w.ready and not w.assigned and not w.retiring]

    @property
    def queued(self) -> int:
        """Bundles handed to workers: running or waiting in a worker's inbox."""
        return sum(len(w.assigned) for w in self.workers.values())

    @property
    def capacity(self) -> int:
        """Workers alive or being started: what this rank can run at once."""
        return len(self.workers)


class WorkerPool(WorkerCounts):
    """Spawned workers of one rank. Single-threaded: the rank's loop calls ``poll``."""

    def __init__(self, app: Any, devices: List[Device], *, rank: int, host: str, logs_dir: Path, seed: int,
                 threads: int, batch: Optional[int], node_pools: Dict[str, int], global_pools: List[str],
                 worker_timeout: Optional[float] = None, item_timeout: Optional[float] = None):
        """``worker_timeout``: seconds of silence after which a worker is killed; ``item_timeout``:
        seconds an item (or group) may run; None (or 0): no limit."""
        self.app, self.devices, self.rank, self.host = app, devices, rank, host
        self.worker_timeout, self.item_timeout = worker_timeout or None, item_timeout or None
        self.heartbeat = min(MAX_HEARTBEAT_INTERVAL, self.worker_timeout / 4) if self.worker_timeout else None
        self.logs_dir, self.seed, self.threads, self.batch = Path(logs_dir), seed, threads, batch
        self.node_resources = ResourceBroker(node_pools)
        self.global_pools = set(global_pools)
        self.context = multiprocessing.get_context("spawn")
        self.workers: Dict[str, WorkerHandle] = {}
        self.setup_failures: Dict[str, int] = {}
        self.given_up: Dict[str, str] = {}  # worker name -> why its device was given up
        self.closing = False
        #: the rank's stop flag (why, or None): a worker that ends once a stop was asked is not replaced
        self.stop_asked: Callable[[], Optional[str]] = lambda: None
        self._kill_at = 0.0  # set by shutdown: when join kills the workers still alive
        self.selector = selectors.DefaultSelector()

    # ----- life cycle -----
    def start(self) -> None:
        for device in self.devices:
            self._spawn(device)

    def _spawn(self, device: Device) -> None:
        name = f"rank{self.rank}-{device}"
        parent_end, child_end = self.context.Pipe()
        log_path = worker_log(self.logs_dir, name)
        finished = self.context.RawValue("q", 0)
        process = self.context.Process(
            target=worker_main, name=name, daemon=True,
            args=(child_end, self.app, device, name, str(log_path), self.seed, self.threads),
            kwargs={"heartbeat": self.heartbeat, "finished": finished})
        # multiprocessing starts its resource tracker with the first spawned process, and then
        # unblocks SIGINT and SIGTERM (it does not restore the mask): start it first, outside the block
        resource_tracker.ensure_running()
        with _child_environment(device, self.threads), signals_blocked(WORKER_IGNORED_SIGNALS):
            process.start()
        child_end.close()
        worker = WorkerHandle(name, device, process, parent_end, finished=finished)
        self.workers[name] = worker
        self.selector.register(parent_end, selectors.EVENT_READ, (worker, "conn"))
        self.selector.register(process.sentinel, selectors.EVENT_READ, (worker, "sentinel"))

    def assign(self, worker: WorkerHandle, bundle: List[Tuple[Item, int]], together: bool = False) -> None:
        """Hand over [(item, attempt), ...]: one item, a group to run together, or a chunk."""
        now = time.time()
        worker.assigned.append(Bundle([[item, attempt, now] for item, attempt in bundle], together, len(bundle)))
        worker.handed_total += len(bundle)
        self._note_start(worker)
        self._send(worker, Assign(list(bundle), together))

    @staticmethod
    def _note_start(worker: WorkerHandle) -> None:
        """After the worker's bundles changed: if what it runs now is new, it started now. A worker
        runs what it is handed in order, so the next item starts when the previous one is answered
        (to within the pipe's latency: an item gets at least its --item-timeout), with no message
        per item (chunks of very short items exist)."""
        head = worker.assigned[0] if worker.assigned else None
        if head is not None and not head.together:
            head = head.entries[0]
        if head is not worker.running:
            worker.running = head
            worker.running_since, worker.running_wall = time.monotonic(), time.time()

    def _send(self, worker: WorkerHandle, message: tuple) -> None:
        """Send, tolerating a worker that died since the last poll (its sentinel reports it)."""
        try:
            worker.conn.send(message)
        except (OSError, ValueError):
            worker.unreachable = True

    def pick_worker(self, avoid: Tuple[str, ...] = (), depth: int = 1) -> Optional[WorkerHandle]:
        """The worker to hand the next item to: an idle one first, else one with fewer than
        ``depth`` items (one queued behind the running one hides the round trip), preferring
        one that has not already failed this item."""
        best, best_rank = None, None
        for worker in self.workers.values():
            if not worker.ready or worker.retiring or len(worker.assigned) >= depth:
                continue
            if self.batch and worker.handed_total >= self.batch:
                continue
            rank = (len(worker.assigned), worker.name in avoid)
            if best_rank is None or rank < best_rank:
                best, best_rank = worker, rank
        return best

    def revoke_queued(self) -> None:
        """Ask every busy worker to give back the items waiting in its inbox (a stop); the one
        running hears of the stop too (``worker.stop_requested``)."""
        for worker in self.workers.values():
            if worker.assigned:
                self._send(worker, Revoke())

    def shutdown(self, kill_after: float = 5.0, wait: bool = True) -> None:
        """Stop every worker: politely if idle, WORKER_TERMINATE_SIGNAL if busy, SIGKILL after ``kill_after`` s.

        ``wait=False``: when every worker was idle, return at once and leave their exit (an
        interpreter with torch loaded takes about half a second to end) to ``join``, so the rank
        can write its outputs meanwhile. Busy or starting workers are always waited for here.
        """
        self.closing = True
        busy = False
        for worker in self.workers.values():
            try:
                if not worker.assigned and worker.ready:
                    worker.conn.send(Quit())
                elif worker.process.is_alive():
                    busy = True
                    os.kill(worker.process.pid, WORKER_TERMINATE_SIGNAL)
            except (OSError, ValueError):
                pass
        self._kill_at = time.monotonic() + kill_after
        if wait or busy:
            self.join()

    def join(self) -> None:
        """After ``shutdown``: wait for the workers it stopped, killing those still alive at its deadline."""
        if not self.workers:  # joined already
            return
        for worker in self.workers.values():
            worker.process.join(max(0.0, self._kill_at - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(2)
            worker.conn.close()
        self.workers.clear()
        self.selector.close()

    # ----- events -----
    def poll(self, timeout: float) -> List[Event]:
        """Wait up to ``timeout`` s for messages or deaths; return what happened."""
        if not self.workers:
            time.sleep(timeout)
            return []
        events: List[Event] = []
        for key, _ in self.selector.select(timeout):
            worker, what = key.data
            if self.workers.get(worker.name) is not worker:  # already handled (and maybe replaced)
                continue
            if what == "conn":
                self._drain(worker, events)
            elif not worker.conn.poll():  # dead, and nothing left to read from it
                self._on_exit(worker, events)
        if self.worker_timeout or self.item_timeout:
            self._watch()
        return events

    def _watch(self) -> None:
        """Kill workers silent for worker_timeout, and those whose item ran past item_timeout."""
        now = time.monotonic()
        for worker in list(self.workers.values()):
            if worker.killed_because:
                continue
            silence = now - worker.heard if worker.heard is not None else 0.0
            running = now - worker.running_since if worker.running is not None else 0.0
            silent = self.worker_timeout is not None and silence > self.worker_timeout
            late = self.item_timeout is not None and running > self.item_timeout
            if not (silent or late) or worker.conn.poll():  # unread messages: read them first
                continue
            keys = self._running_keys(worker)
            if late:
                why = f"{TIMED_OUT} {self.item_timeout:g} s (--item-timeout)"
                said = f"{keys} timed out after {self.item_timeout:g} s (--item-timeout)"
            else:
                why = f"{SILENT} {silence:.0f} s (stopped or hung)"
                said = (f"worker silent for {silence:.0f} s (stopped, or hung in code that holds the GIL; "
                        f"--worker-timeout {self.worker_timeout:g}) while "
                        + (f"running {keys}" if keys else "starting" if not worker.ready else "idle"))
            self._kill(worker, why, said)

    @staticmethod
    def _unanswered(worker: WorkerHandle) -> int:
        """Items the worker has finished but not yet answered for (its answers are on their way)."""
        return max(0, worker.finished.value - worker.items_done) if worker.finished is not None else 0

    def _running_keys(self, worker: WorkerHandle) -> str:
        if worker.running is None:
            return ""
        if isinstance(worker.running, Bundle):
            entries = worker.running.entries
        else:  # in a chunk: past the items finished but not yet answered for
            head = worker.assigned[0].entries
            entries = head[min(self._unanswered(worker), len(head) - 1):][:1]
        return ", ".join(entry[0].key for entry in entries)

    def _kill(self, worker: WorkerHandle, why: str, said: str) -> None:
        """SIGKILL, with every process it started (a pipeline step's own children hold GPUs too:
        their memory goes with them), after a stack dump into its log; the sentinel then reports
        it like any dead worker, its item failing with ``why``."""
        worker.killed_because, worker.killed_running = why, worker.running
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
            time.sleep(DUMP_SECONDS)
            worker.process.kill()
        except OSError:
            pass
        for process in descendants:
            try:
                process.kill()
            except psutil.Error:
                pass

    def _drain(self, worker: WorkerHandle, events: List[Event]) -> None:
        """Read one message (the selector reports the pipe again while more are waiting)."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._on_exit(worker, events)
            return
        worker.heard = time.monotonic()  # any message says it is alive
        self._handle(worker, message, events)

    def _handle(self, worker: WorkerHandle, message: Any, events: List[Event]) -> None:
        if isinstance(message, Ready):
            worker.ready = True
            self.setup_failures.pop(worker.name, None)
        elif isinstance(message, SetupFailed):
            worker.setup_reported = True
            self._setup_failed(worker, message.error)
        elif isinstance(message, Answers):
            for answer in message.answers:
                self._handle(worker, answer, events)
        elif isinstance(message, (ItemDone, ItemError)):
            key = message.key
            running = worker.assigned[0]
            entry = next((e for e in running.entries if e[0].key == key), None)
            if entry is None:  # cannot happen unless the pipe reorders; fail loudly
                raise RuntimeError(f"{worker.name} answered {key}, which it was not running")
            running.entries.remove(entry)
            if not running.entries:
                worker.assigned.popleft()
            self._note_start(worker)
            attempt, group_size = entry[1], running.size if running.together else 1
            worker.items_done += 1
            done = isinstance(message, ItemDone)
            record = self._record(worker, key, message.result if done else None, attempt, message.started,
                                  message.ended, group_size)
            if done:
                events.append(Event("done", record))
            else:
                events.append(Event("failed", record, error=message.error, traceback=message.traceback))
            if self.batch and worker.items_done >= self.batch and not self.closing:
                worker.retiring = True  # a fresh process gives back memory the old one never did
                self._send(worker, Quit())
        elif isinstance(message, Revoked):
            keys = set(message.keys)
            for bundle in worker.assigned:
                bundle.entries = [e for e in bundle.entries if e[0].key not in keys]
            worker.assigned = deque(bundle for bundle in worker.assigned if bundle.entries)
            self._note_start(worker)
            if keys:
                events.append(Event("returned", keys=tuple(message.keys)))
        elif isinstance(message, PoolRequest):
            self._pool_message(worker, message, events)

    def _record(self, worker: WorkerHandle, key: str, result: Any, attempt: int, start: float, end: float,
                group_size: int) -> Record:
        return Record(key=key, result=result, seconds=end - start, rank=self.rank, host=self.host,
                      device=str(worker.device), worker=worker.name, start=start, end=end, attempt=attempt,
                      group_size=group_size)

    # ----- resource pools -----
    def _requester(self, worker: WorkerHandle, request: int) -> tuple:
        return (self.rank, worker.name, worker.process.pid, request)

    def _pool_message(self, worker: WorkerHandle, message: PoolRequest, events: List[Event]) -> None:
        requester = self._requester(worker, message.request)
        if message.pool in self.global_pools:
            events.append(Event("pool", message=(message.verb, requester, message.pool, message.count)))
            return
        for who, reply in self.node_resources.handle(message.verb, message.pool, requester, message.count):
            self.deliver(who, reply)

    def deliver(self, requester: tuple, message: PoolAnswer) -> None:
        """Send a pool answer to the worker that asked, if it is still the same process."""
        worker = self.workers.get(requester[1])
        if worker is not None and worker.process.pid == requester[2]:
            try:
                worker.conn.send(message)
            except (OSError, ValueError):
                pass

    # ----- failures -----
    def _setup_failed(self, worker: WorkerHandle, error: str) -> None:
        count = self.setup_failures.get(worker.name, 0) + 1
        self.setup_failures[worker.name] = count
        if count >= MAX_SETUP_FAILURES:
            self.given_up[worker.name] = error
            log.error("%s: giving up on %s after %d failed starts: %s", worker.name, worker.device, count, error)
        else:
            log.warning("%s: worker could not start (%s); starting it again", worker.name, error)

    def _on_exit(self, worker: WorkerHandle, events: List[Event]) -> None:
        worker.process.join(1)
        del self.workers[worker.name]
        for handle in (worker.conn, worker.process.sentinel):
            try:
                self.selector.unregister(handle)
            except (KeyError, ValueError):
                pass
        worker.conn.close()
        owner = (self.rank, worker.name, worker.process.pid)
        for who, reply in self.node_resources.handle("gone", "", owner):
            self.deliver(who, reply)
        if self.global_pools:
            events.append(Event("pool", message=("gone", owner, "", 0)))
        why = worker.killed_because or _describe_exit(worker.process.exitcode)
        if worker.assigned:
            # An item that answered just before its worker was killed for it: what came next had
            # barely started, and goes back uncounted
            overtaken = worker.killed_because and worker.running is not worker.killed_running
            running = worker.assigned.popleft()
            # Items it finished whose answers died with it (a chunk's answers travel together): they
            # go back uncounted, and the next one is the item it was running.
            ahead = min(self._unanswered(worker), len(running.entries))
            # A group failed as one; in a chunk only the item after those finished was running; a
            # worker that could not even be sent its items ran none of them.
            failed = ([] if worker.unreachable or overtaken or (running.together and ahead)
                      else running.entries if running.together else running.entries[ahead:ahead + 1])
            if failed and not running.together:
                running.entries = running.entries[:ahead] + running.entries[ahead + 1:]
            if failed and not worker.killed_because:  # the watch said why when it killed it
                log.warning("%s: %s while running %s", worker.name, why, ", ".join(e[0].key for e in failed))
            for item, attempt, handed in failed:
                record = self._record(worker, item.key, None, attempt, max(handed, worker.running_wall), time.time(),
                                      len(failed))
                events.append(Event("failed", record, error=why))
            unstarted = ([] if running.together and failed else running.entries) + [e for b in worker.assigned for e in b.entries]
            if unstarted:
                events.append(Event("returned", keys=tuple(e[0].key for e in unstarted)))
        elif not worker.ready and not worker.retiring and not worker.setup_reported:
            if self.stop_asked():  # not a failure of its device: the run is ending
                log.info("%s: ended while starting (%s); the run is stopping", worker.name, why)
            else:
                self._setup_failed(worker, why)
        if self.closing or worker.name in self.given_up or self.stop_asked():
            return
        self._spawn(worker.device)
