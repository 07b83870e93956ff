"""The workers of one rank: spawned processes, one per device, watched and replaced.

The pool starts each worker with 'spawn' and an environment made for it: pinned to exactly its
GPU by ``CUDA_VISIBLE_DEVICES``, thread counts set, and every MPI/PMI variable removed so the child
can never re-initialise MPI. It notices a dead worker within one poll (its process sentinel),
reports the item it was running as failed (or, where a SIGUSR2 it did not send ended the worker, as
cut off: handed out again, uncounted) and starts a fresh one.

A worker that lives but says nothing for ``worker_timeout`` seconds, or whose item ran past
``item_timeout``, is killed by the pool's :class:`common.workers.watchdog.Watchdog` and handled as a dead one.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import signal
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from common.app import Record
from common.clock import SYSTEM_CLOCK, Clock
from common.devices import Device
from common.errors import FAILED, TIMED_OUT
from common.items import Item
from common.messages import (
    Answers,
    Assign,
    Dropped,
    Failed,
    Handout,
    ItemDone,
    ItemError,
    PoolAnswer,
    PoolCall,
    PoolRequest,
    Quit,
    Ready,
    Requester,
    Result,
    Revoke,
    Revoked,
    SetupFailed,
)
from common.results.layout import worker_log, worker_name
from common.settings import without_launcher
from common.signals import (
    WORKER_IGNORED_SIGNALS,
    WORKER_TERMINATE_SIGNAL,
    WORKER_TERMINATED_EXIT,
    signals_blocked,
    start_resource_tracker,
)
from common.workers.placement import pick_worker, room
from common.workers.resources import ResourceBroker
from common.workers.watchdog import Watchdog, WorkerWatch, unanswered
from common.workers.worker import worker_main

log = logging.getLogger("multinode_gpu")

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
MAX_SETUP_FAILURES = 3
#: times an item may be cut off by a SIGUSR2 the pool did not send before the next counts as its failure
#: (a worker that keeps ending so, an item's own os._exit(140), would hand it out for ever)
MAX_CUT_OFFS = 3


@contextmanager
def _child_environment(device: Device, threads: int) -> Iterator[None]:
    """os.environ as the child must see it, for the instant its process is started."""
    saved = dict(os.environ)
    try:
        child = without_launcher(os.environ)
        os.environ.clear()
        os.environ.update(child)
        os.environ["CUDA_VISIBLE_DEVICES"] = device.physical if device.is_gpu else ""
        # GPU numbers in PCI order, as NVML and nvidia-smi count the GPUs this job may open (a device
        # cgroup's are numbered from 0), whatever order the user's environment asks CUDA for: the
        # monitor finds them in NVML so (common.devices.nvml_usable_handles), the summary names them so
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
    if code == WORKER_TERMINATED_EXIT:
        return f"worker ended by {WORKER_TERMINATE_SIGNAL.name}"
    return f"worker exited with code {code}"


@dataclass(slots=True, eq=False)
class Assigned:
    """An item a worker holds, until it answers for it."""

    item: Item
    attempt: int
    handed: float = 0.0  # epoch seconds


@dataclass
class Bundle:
    """Items handed to a worker in one message: a group run together, or a chunk of short items
    run one after the other."""

    entries: List[Assigned]
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
    spawned: float = 0.0  # monotonic, when it was started (its setup's time limit counts from then)
    watch: WorkerWatch = field(default_factory=WorkerWatch)  # what runs since when, why it was killed
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
    failure: str = "failed"  # failed: Failed.kind
    errno: Optional[int] = None  # failed: the OSError the item raised
    path: str = ""  # failed: its file
    retry: bool = True  # failed: False where the item said another attempt would fail the same way
    keys: Tuple[str, ...] = ()  # returned
    message: Optional[PoolCall] = None  # pool

    @property
    def key(self) -> str:
        return self.record.key if self.record else ""

    def as_message(self) -> Any:
        """The event as rank 0 receives it (a record of :mod:`common.messages`)."""
        if self.kind == "done":
            return Result(self.record)
        if self.kind == "failed":
            return Failed(self.record, self.error, self.traceback, self.failure, self.errno, self.path, self.retry)
        if self.kind == "returned":
            return Dropped(list(self.keys))
        return self.message


class WorkerCounts:
    """What the rank's loop asks of any pool of workers (``self.workers``: name -> handle with
    ``ready``, ``assigned`` and ``retiring``): shared by :class:`WorkerPool` and the in-process
    stand-in of the tests and benchmarks (``common.testing.inprocess``)."""

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


@dataclass(frozen=True)
class PoolSettings:
    """What a rank's workers are started with, and the rules they run under."""

    rank: int
    host: str
    logs_dir: Path  # each worker's log goes there
    seed: int
    threads: int  # CPU threads per worker
    batch: Optional[int] = None  # a worker is replaced after this many items (None: never)
    node_pools: Dict[str, int] = field(default_factory=dict)  # resource pools of this node: name -> size
    global_pools: Tuple[str, ...] = ()  # names of the pools rank 0 hands out


def _never_stopped() -> Optional[str]:
    return None


class WorkerPool(WorkerCounts):
    """Spawned workers of one rank. Single-threaded: the rank's loop calls ``poll``."""

    def __init__(self, app: Any, devices: List[Device], settings: PoolSettings, watchdog: Optional[Watchdog] = None,
                 *, stop_asked: Callable[[], Optional[str]] = _never_stopped, clock: Clock = SYSTEM_CLOCK):
        """``watchdog``: kills silent and overrunning workers (None: no time limits). ``stop_asked``:
        the rank's stop flag (why, or None): a worker that ends once a stop was asked is not replaced."""
        self.app, self.devices, self.settings, self.clock = app, devices, settings, clock
        self.rank, self.host = settings.rank, settings.host
        self.logs_dir, self.seed, self.threads, self.batch = Path(settings.logs_dir), settings.seed, settings.threads, settings.batch
        self.watchdog = watchdog or Watchdog(None, None, self.logs_dir, clock)
        self.node_resources = ResourceBroker(settings.node_pools)
        self.global_pools = set(settings.global_pools)
        self.context = multiprocessing.get_context("spawn")
        self.workers: Dict[str, WorkerHandle] = {}
        self.setup_failures: Dict[str, int] = {}
        self.cut_offs: Counter = Counter()  # item key -> times a SIGUSR2 the pool did not send cut it off
        self.given_up: Dict[str, str] = {}  # worker name -> why its device was given up
        self.closing = False
        self.stop_asked = stop_asked
        self._kill_at = 0.0  # set by shutdown: when join kills the workers still alive
        self.selector = selectors.DefaultSelector()

    # ----- life cycle -----
    def start(self) -> None:
        for device in self.devices:
            self._spawn(device)

    def _spawn(self, device: Device) -> None:
        name = worker_name(self.rank, device)
        parent_end, child_end = self.context.Pipe()
        log_path = worker_log(self.logs_dir, name)
        finished = self.context.RawValue("q", 0)
        process = self.context.Process(
            target=worker_main, name=name, daemon=True,
            args=(child_end, self.app, device, name, str(log_path), self.seed, self.threads),
            kwargs={"heartbeat": self.watchdog.heartbeat, "finished": finished})
        # multiprocessing starts its resource tracker with the first spawned process, and then
        # unblocks SIGINT and SIGTERM (it does not restore the mask): start it first, outside the block
        start_resource_tracker()
        with _child_environment(device, self.threads), signals_blocked(WORKER_IGNORED_SIGNALS):
            process.start()
        child_end.close()
        worker = WorkerHandle(name, device, process, parent_end, finished=finished, spawned=self.clock.monotonic())
        self.workers[name] = worker
        self.selector.register(parent_end, selectors.EVENT_READ, (worker, "conn"))
        self.selector.register(process.sentinel, selectors.EVENT_READ, (worker, "sentinel"))

    def assign(self, worker: WorkerHandle, bundle: List[Handout], together: bool = False) -> None:
        """Hand over one item, a group to run together, or a chunk."""
        now = self.clock.time()
        worker.assigned.append(Bundle([Assigned(item, attempt, now) for item, attempt, _ in bundle], together,
                                      len(bundle)))
        worker.handed_total += len(bundle)
        self.watchdog.note_start(worker)
        self._send(worker, Assign(list(bundle), together))

    def _send(self, worker: WorkerHandle, message: tuple) -> None:
        """Send, tolerating a worker that died since the last poll (its sentinel reports it)."""
        try:
            worker.conn.send(message)
        except (OSError, ValueError):
            worker.unreachable = True

    def pick_worker(self, avoid: Tuple[str, ...] = (), depth: int = 1) -> Optional[WorkerHandle]:
        """The worker to hand the next item to (:func:`common.workers.placement.pick_worker`); none the
        watch has killed, whose exit is yet to be read (an item sent to it would be lost with it)."""
        return pick_worker((worker for worker in self.workers.values() if worker.watch.killed is None), avoid, depth,
                           self.batch)

    def room(self, worker: WorkerHandle) -> Optional[int]:
        """Items ``worker`` may still be handed (:func:`common.workers.placement.room`)."""
        return room(worker, self.batch)

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
        self._kill_at = self.clock.monotonic() + kill_after
        if wait or busy:
            self.join()

    def join(self) -> None:
        """After ``shutdown``: wait for the workers it stopped, killing those still alive at its deadline."""
        if not self.workers:  # joined already
            return
        for worker in self.workers.values():
            worker.process.join(max(0.0, self._kill_at - self.clock.monotonic()))
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
            self.clock.sleep(timeout)
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
        if self.watchdog.active:
            self.watchdog.check(self.workers.values())
        return events

    def _drain(self, worker: WorkerHandle, events: List[Event]) -> None:
        """Read one message (the selector reports the pipe again while more are waiting)."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._on_exit(worker, events)
            return
        worker.heard = self.clock.monotonic()  # any message says it is alive
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
            entry = next((e for e in running.entries if e.item.key == key), None)
            if entry is None and worker.watch.killed is not None and any(
                    e.item.key == key for bundle in worker.assigned for e in bundle.entries):
                # killed by the watch, it went on to what was queued after the item (or group) it was
                # killed for, whose answers are still unkept: its exit fails that one and gives this back
                log.info("%s: %s answered while the worker was being killed: not kept (it runs again)",
                         worker.name, key)
                worker.items_done += 1
                return
            if entry is None:  # cannot happen unless the pipe reorders; fail loudly
                raise RuntimeError(f"{worker.name} answered {key}, which it was not running")
            killed = worker.watch.killed
            if killed is not None and killed.kind == TIMED_OUT and key in killed.keys:
                # it answered during the stack dump, past its --item-timeout: the item timed out all
                # the same (as the run said when it killed the worker), and fails or is retried
                log.info("%s: %s answered after its --item-timeout, while being killed: not kept", worker.name, key)
                worker.items_done += 1  # answered (not on its way any more): its exit fails it, counted
                return
            running.entries.remove(entry)
            if not running.entries:
                worker.assigned.popleft()
            self.watchdog.note_start(worker)
            attempt, group_size = entry.attempt, running.size if running.together else 1
            worker.items_done += 1
            done = isinstance(message, ItemDone)
            record = self._record(worker, key, message.result if done else None, attempt, message.started,
                                  message.ended, group_size)
            if done:
                events.append(Event("done", record))
            else:
                events.append(Event("failed", record, error=message.error, traceback=message.traceback,
                                    errno=message.errno, path=message.path, retry=message.retry))
            if self.batch and worker.items_done >= self.batch and not self.closing:
                worker.retiring = True  # a fresh process gives back memory the old one never did
                self._send(worker, Quit())
        elif isinstance(message, Revoked):
            keys = set(message.keys)
            for bundle in worker.assigned:
                bundle.entries = [e for e in bundle.entries if e.item.key not in keys]
            worker.assigned = deque(bundle for bundle in worker.assigned if bundle.entries)
            self.watchdog.note_start(worker)
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
    def _requester(self, worker: WorkerHandle, request: int) -> Requester:
        return Requester(self.rank, worker.name, worker.process.pid, request)

    def _pool_message(self, worker: WorkerHandle, message: PoolRequest, events: List[Event]) -> None:
        requester = self._requester(worker, message.request)
        if message.pool in self.global_pools:
            events.append(Event("pool", message=PoolCall(message.verb, requester, message.pool, message.count)))
            return
        for who, reply in self.node_resources.handle(message.verb, message.pool, requester, message.count):
            self.deliver(who, reply)

    def deliver(self, requester: Requester, message: PoolAnswer) -> None:
        """Send a pool answer to the worker that asked, if it is still the same process."""
        worker = self.workers.get(requester.worker)
        if worker is not None and worker.process.pid == requester.pid:
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
        owner = Requester(self.rank, worker.name, worker.process.pid)
        for who, reply in self.node_resources.handle("gone", "", owner):
            self.deliver(who, reply)
        if self.global_pools:
            events.append(Event("pool", message=PoolCall("gone", owner, "", 0)))
        killed = worker.watch.killed
        why = killed.why if killed is not None else _describe_exit(worker.process.exitcode)
        killed_keys = killed.keys if killed is not None else ()
        # ended by WORKER_TERMINATE_SIGNAL that this pool did not send (a kill of the whole process group,
        # which may reach the worker before its rank): what it held was cut off, not failed, and goes back
        # (-SIGUSR2: before the app's __main__ let the worker's handlers take it)
        cut_off = (worker.process.exitcode in (WORKER_TERMINATED_EXIT, -WORKER_TERMINATE_SIGNAL)
                   and killed is None)
        held = [e.item.key for b in worker.assigned for e in b.entries]
        if held and cut_off:
            self.cut_offs.update(held)
            cut_off = all(self.cut_offs[key] <= MAX_CUT_OFFS for key in held)  # past it: a failure, counted
        if worker.assigned and cut_off:
            log.info("%s: ended by %s while running %s: back to be run again", worker.name,
                     WORKER_TERMINATE_SIGNAL.name, ", ".join(held))
            events.append(Event("returned", keys=tuple(held)))
        elif worker.assigned:
            # An item that answered just before its worker was killed for it: what came next had
            # barely started, and goes back uncounted
            running = worker.assigned.popleft()
            overtaken = bool(killed_keys) and not any(e.item.key in killed_keys for e in running.entries)
            # Items it finished whose answers died with it (a chunk's answers travel together): they
            # go back uncounted, and the next one is the item it was running. Killed by the watch,
            # the item the run said it killed is that one, also if it finished during the stack dump
            # and its answer died with it (counted then among the finished).
            ahead = min(unanswered(worker), len(running.entries))
            killed_at = [i for i, e in enumerate(running.entries) if e.item.key in killed_keys]
            if killed_at:
                ahead = killed_at[0]
            # A group failed as one; in a chunk only the item after those finished was running; a
            # worker that could not even be sent its items ran none of them (but the one the watch
            # killed it for, which it was running: a send to it after the kill failed, and that item
            # went back uncounted and ran again)
            failed = ([] if (worker.unreachable and not killed_at) or overtaken or (running.together and ahead)
                      else running.entries if running.together else running.entries[ahead:ahead + 1])
            if failed and not running.together:
                running.entries = running.entries[:ahead] + running.entries[ahead + 1:]
            if failed and killed is None:  # the watch said why when it killed it
                log.warning("%s: %s while running %s", worker.name, why, ", ".join(e.item.key for e in failed))
            ended = self.clock.time()  # one end for a group's entries: the summary counts its one attempt once
            for entry in failed:
                record = self._record(worker, entry.item.key, None, entry.attempt, max(entry.handed, worker.watch.since_wall),
                                      ended, len(failed))
                events.append(Event("failed", record, error=why, failure=killed.kind if killed is not None else FAILED))
            unstarted = ([] if running.together and failed else running.entries) + [e for b in worker.assigned for e in b.entries]
            if unstarted:
                events.append(Event("returned", keys=tuple(e.item.key for e in unstarted)))
        elif not worker.ready and not worker.retiring and not worker.setup_reported:
            if self.stop_asked() or cut_off:  # not a failure of its device
                log.info("%s: ended while starting (%s)%s", worker.name, why,
                         "; the run is stopping" if self.stop_asked() else "")
            else:
                self._setup_failed(worker, why)
        if self.closing or worker.name in self.given_up or self.stop_asked():
            return
        self._spawn(worker.device)
