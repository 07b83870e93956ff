"""The worker process: one per GPU (or per CPU slot), spawned by its rank, never touching MPI.

It loads the app's data once (``App.setup_worker``), then runs what its rank pushes to it over a
pipe (an item, a group run together, or a chunk of short items) and answers with each result or
traceback. Code running inside an item may call
:func:`acquire` to hold a slot of a named resource pool: it finds the worker's inbox in a context
variable that ``worker_main`` sets (the ambient context of the items it runs, like decimal's).

Liveness: from its first moment a thread beside the item sends a heartbeat whenever nothing else
went to the rank for ``heartbeat`` seconds (a few bytes; none while results flow), so the rank can
tell a hung worker (SIGSTOPped, or stuck in native code that holds the GIL: the thread cannot run
then) from a busy one, and kill it (``--worker-timeout``).
"""
from __future__ import annotations

import contextlib
import contextvars
import faulthandler
import logging
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from common.errors import ItemFailed, capped, counted, described
from common.items import ItemSeeds
from common.linux import die_with_parent
from common.messages import (
    Alive,
    Answers,
    Assign,
    ItemDone,
    ItemError,
    PoolAnswer,
    PoolRequest,
    Quit,
    Ready,
    Revoke,
    Revoked,
    SetupFailed,
)
from common.observe.logs import FileLog, worker_file_log
from common.results.journal import as_journaled
from common.signals import (
    DUMP_SIGNAL,
    WORKER_IGNORED_SIGNALS,
    WORKER_TERMINATE_SIGNAL,
    WORKER_TERMINATED_EXIT,
    early_stops,
    ignore_stop_signals,
    leave_stop_signals_to_rank,
    signals_blocked,
)
from common.startup import guard_standard_streams
from common.workers.leftovers import THREAD_GRACE_SECONDS, end_worker, threads_left

log = logging.getLogger("multinode_gpu.worker")


class PoolTimeout(Exception):
    """Waited longer than the timeout for a resource pool."""


class _Pipe:
    """The worker's end of the pipe, shared by the main thread (results, pool calls) and the
    heartbeat thread: one lock around every send, so messages never interleave."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()
        self.last_sent = time.monotonic()
        # one poll object for the process's life: Connection.poll makes and registers a new selector
        # on every call (twice per item), a fifth of a short item's cost in the worker
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def send(self, message: Any) -> None:
        with self.lock:
            self.conn.send(message)
            self.last_sent = time.monotonic()

    def send_bytes(self, data: bytes) -> None:
        """A message pickled by the caller (``ForkingPickler.dumps``, as ``send`` does)."""
        with self.lock:
            self.conn.send_bytes(data)
            self.last_sent = time.monotonic()

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether a message (or the end of the pipe: recv then raises EOFError) is there, waiting up
        to ``timeout`` s (None: forever), as ``Connection.poll``."""
        return bool(self._poller.poll(None if timeout is None else min(max(0.0, timeout) * 1000, 1e9)))

    def recv(self) -> Any:
        return self.conn.recv()


def _start_heartbeat(pipe: _Pipe, interval: float) -> threading.Event:
    """A daemon thread that sends :class:`Alive` whenever nothing was sent for ``interval`` s (and
    once at its start); set the returned event to end it. It starts with every signal blocked, so
    signals keep reaching the main thread (where they interrupt a sleeping item)."""
    done = threading.Event()

    def beat() -> None:
        wait = 0.0
        while not done.wait(wait):
            idle = time.monotonic() - pipe.last_sent
            if idle >= interval or wait == 0.0:
                try:
                    pipe.send(Alive())
                except (OSError, ValueError):  # the rank is gone: the main thread notices too
                    return
                idle = 0.0
            wait = max(0.01, interval - idle)

    with signals_blocked(signal.valid_signals()):  # the thread inherits the mask: every signal to the main thread
        threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    return done


class _Terminated(BaseException):
    """Raised inside the worker on WORKER_TERMINATE_SIGNAL so that ``finally`` blocks (child processes) run."""


class _Inbox:
    """Messages from the rank. Items may arrive while another runs (the rank queues one ahead),
    so every read goes through here: items are queued, a revoke answers at once, and pool replies
    are handed to whoever waits for them."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.items: Deque[tuple] = deque()
        self.replies: Dict[int, PoolAnswer] = {}
        self.stopped = False
        self.stopping = False  # the rank is stopping (a walltime signal): start nothing new
        self.requests = 0  # pool requests made so far: each has its number

    def new_request(self) -> int:
        """The number of a new pool request, which its answer carries."""
        self.requests += 1
        return self.requests

    def _take(self, message: Any) -> None:
        if isinstance(message, Assign):
            self.items.append((message.bundle, message.together))
        elif isinstance(message, Revoke):  # the rank is stopping: give back what has not started
            self.stopping = True
            keys = [handout.item.key for bundle, _ in self.items for handout in bundle]
            self.items.clear()
            self.conn.send(Revoked(keys))
        elif isinstance(message, Quit):
            self.stopped = True
        elif isinstance(message, PoolAnswer):
            self.replies[message.request] = message

    def pump(self, timeout: Optional[float] = 0.0) -> None:
        """Read what has arrived; wait up to ``timeout`` s (None: forever) for the first message."""
        if self.conn.poll(timeout):
            self._take(self.conn.recv())
            while self.conn.poll():
                self._take(self.conn.recv())

    def next_bundle(self, before_waiting: Callable[[], None] = lambda: None) -> Optional[tuple]:
        """The next bundle ([Handout, ...], together) to run, waiting for one (``before_waiting()``
        first); None once told to stop."""
        self.pump()
        if not self.items and not self.stopped:
            before_waiting()
        while not self.items and not self.stopped:
            self.pump(None)
        return None if self.stopped and not self.items else self.items.popleft()

    def reply(self, request: int, timeout: Optional[float]) -> Optional[PoolAnswer]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while request not in self.replies:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self.pump(left)
        return self.replies.pop(request)


#: the inbox of this worker process, set by ``worker_main`` for the items it runs (they run in its
#: main thread; a thread an item starts sees None, as the inbox must not be read by two threads)
_current_inbox: contextvars.ContextVar[Optional[_Inbox]] = contextvars.ContextVar("worker_inbox", default=None)


@contextlib.contextmanager
def acquire(pool: str, count: int = 1, timeout: Optional[float] = None) -> Iterator[None]:
    """Hold ``count`` slots of ``pool`` for the duration of the ``with`` block.

    Blocks until the rank (node pools) or rank 0 (global pools) grants them; raises
    :class:`PoolTimeout` after ``timeout`` seconds of waiting.
    """
    inbox = _current_inbox.get()
    if inbox is None:
        raise RuntimeError("acquire() works only inside an item run by the engine")
    request = inbox.new_request()
    inbox.conn.send(PoolRequest("acquire", pool, request, count))
    reply = inbox.reply(request, timeout)
    if reply is None:
        inbox.conn.send(PoolRequest("cancel", pool, request))
        reply = inbox.reply(request, None)  # "cancelled", or a "granted" that crossed our cancel
        if reply.verb == "granted":
            inbox.conn.send(PoolRequest("release", pool, request))
        raise PoolTimeout(f"waited more than {timeout:g} s for pool {pool!r}")
    if reply.verb == "refused":
        raise ValueError(reply.why)
    try:
        yield
    finally:
        inbox.conn.send(PoolRequest("release", pool, request))


def stop_requested() -> bool:
    """Whether the rank is stopping (walltime, Ctrl-C): an item that runs many steps or retries
    starts no new one. False outside the engine."""
    inbox = _current_inbox.get()
    if inbox is None:
        return False
    inbox.pump()
    return inbox.stopping


class _Termination:
    """The handler of WORKER_TERMINATE_SIGNAL: it raises :class:`_Terminated`, and notes that it
    came. The note is what counts: the exception is raised wherever the main thread is, and code
    there may swallow it (a bare ``except:``, an ``except BaseException`` that goes on). Seen in
    mnist_nn's set-up, in its imports of scikit-learn and SciPy, in about one start in three that a
    resume ended at once: the worker went on to say it was ready, and waited for items until its
    rank killed it 10 s later."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.asked = True
        raise _Terminated()

    def check(self) -> None:
        """Raise :class:`_Terminated` if the signal came, whatever became of its first one."""
        if self.asked:
            raise _Terminated()


def _set_threads(threads: int) -> None:
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


#: a chunk of short items is answered in one message once it is done, or sooner when its first
#: unsent answer is this many seconds old
ANSWER_SECONDS = 0.002


def _os_error(error: BaseException) -> Tuple[Optional[int], str]:
    """The errno and file of an OSError (a full disk stops the run at rank 0), else (None, "")."""
    if not isinstance(error, OSError) or error.errno is None:
        return None, ""
    filename = error.filename
    return error.errno, os.fsdecode(filename) if isinstance(filename, (str, bytes, os.PathLike)) else ""


def _back_to(folder: str, names: str) -> None:
    """Undo an item's os.chdir: the next item on this worker would otherwise start in its folder, and
    a relative path read or written there would depend on which worker ran what before."""
    try:
        if os.getcwd() == folder:
            return
    except OSError:  # its working folder was removed
        pass
    log.info("%s changed the working folder; back to %s for the next item", names, folder)
    os.chdir(folder)


def _run_group(app: Any, state: Any, bundle: list, seed_of: Callable[[str], Any],
               lines: Optional[FileLog] = None) -> List[Any]:
    """Run one item, or a group of items together (``App.run_group``); the answer for each.
    ``seed_of``: key -> the item's seed, in the app's ``seed_form`` (:class:`ItemSeeds`).
    ``lines``: the worker log, which holds the "done" line (:meth:`FileLog.hold`); None: logged now."""
    items = [handout.item for handout in bundle]
    names = ", ".join(item.key for item in items)
    folder = os.getcwd()  # each item starts where the worker's set-up left it, whatever one before did
    started = time.time()
    try:
        try:
            if len(items) == 1:
                results = [app.run_item(state, items[0], seed_of(items[0].key))]
            else:
                results = list(app.run_group(state, items, [seed_of(item.key) for item in items]))
                if len(results) != len(items):
                    raise RuntimeError(f"run_group returned {len(results)} results for {len(items)} items")
        finally:
            _back_to(folder, names)
    except (Exception, SystemExit, KeyboardInterrupt, GeneratorExit) as error:  # the item's code raised it
        # (SystemExit and the others too: the rank stops a worker with _Terminated, and SIGINT reaches
        # no worker, so these come from the item's code: it fails, and the worker goes on)
        text = f"{described(error)}\n" if isinstance(error, ItemFailed) else capped(traceback.format_exc())
        ended = time.time()
        log.error("%s (attempt %s) failed:\n%s", names, ",".join(str(handout.attempt) for handout in bundle), text)
        errno, path = _os_error(error)
        retry = not isinstance(error, ItemFailed) or error.retry
        return [ItemError(item.key, described(error), text, started, ended, errno, path, retry) for item in items]
    ended = time.time()
    answers = [_kept(item.key, result, started, ended) for item, result in zip(items, results)]
    if lines is None:
        log.info("%s done in %.3f s", names, ended - started)
    else:
        lines.hold(ended, f"{names} done in {ended - started:.3f} s")
    return answers


def _kept(key: str, result: Any, started: float, ended: float) -> Any:
    """The item's answer: its result as the journal keeps it (:func:`as_journaled`), or, where the
    journal cannot keep it, the item's failure for good saying what it returned (rank 0 would
    otherwise fail writing its journal line, and the run with it; another attempt returns the same)."""
    try:
        return ItemDone(key, as_journaled(result), started, ended)
    except (TypeError, ValueError, RecursionError) as error:
        why = described(TypeError(f"item {key} returned a value the journal cannot keep as JSON: {error}"))
        log.error("%s failed: %s", key, why)
        return ItemError(key, why, f"{why}\n", started, ended, retry=False)


def _run_bundle(app: Any, state: Any, entries: list, together: bool, seed_of: Callable[[str], Any], conn: Any,
                finished: Any, lines: Optional[FileLog] = None) -> None:
    """A group (run together) or a chunk of short items (one after the other); the answers go in
    as few messages as ANSWER_SECONDS allows. ``finished`` (shared with the rank) counts the items
    this process has finished, sent or not: if it dies, its rank knows which item it was running."""
    if together:
        answers = _run_group(app, state, entries, seed_of, lines)
        if finished is not None:
            finished.value += len(entries)
        _answer(conn, answers)
        return
    pending: List[Any] = []
    since = 0.0
    for handout in entries:
        pending += _run_group(app, state, [handout], seed_of, lines)
        if finished is not None:
            finished.value += 1
        now = time.monotonic()
        if len(pending) == 1:
            since = now
        if now - since >= ANSWER_SECONDS:
            _answer(conn, pending)
            pending = []
    if pending:
        _answer(conn, pending)


def _answer(conn: Any, answers: List[Any]) -> None:
    """Pickled first, then sent: only the write's errors mean the rank is gone. Every result is JSON
    by now (:func:`_kept`), so every answer pickles."""
    conn.send_bytes(ForkingPickler.dumps(answers[0] if len(answers) == 1 else Answers(answers)))


def worker_main(conn: Connection, app: Any, device: Any, name: str, log_path: str, seed: int, threads: int,
                heartbeat: Optional[float] = None, finished: Any = None) -> None:
    """Entry point of the spawned process. ``heartbeat``: seconds between heartbeats (None: none);
    ``finished``: a shared counter of the items it has finished (a ``multiprocessing.RawValue``).
    Once its work is over it ends, whatever threads the app's code left running (see
    :mod:`common.workers.leftovers`)."""
    # what the app's code prints goes where the rank's own output goes: a reader that left (| head, a tee
    # ended by Ctrl-C) or a full disk must fail no item (BrokenPipeError in a print), as it fails no run
    guard_standard_streams()
    try:
        code = _serve(conn, app, device, name, log_path, seed, threads, heartbeat, finished)
    except _Terminated:  # ended by its rank while still starting (a run that ended first): nothing to say
        code = WORKER_TERMINATED_EXIT
    ignore_stop_signals()  # a second USR2 (the pool's shutdown) must not raise inside the exit (early returns too)
    end_worker(log.warning, code)


def _serve(conn: Connection, app: Any, device: Any, name: str, log_path: str, seed: int, threads: int,
           heartbeat: Optional[float], finished: Any) -> int:
    """Serve until told to stop; the exit code: WORKER_TERMINATED_EXIT where WORKER_TERMINATE_SIGNAL ended it."""
    conn = _Pipe(conn)  # type: ignore[assignment]
    beating = _start_heartbeat(conn, heartbeat) if heartbeat else threading.Event()
    inbox = _Inbox(conn)
    _current_inbox.set(inbox)
    early = early_stops()  # what came while the app's __main__ imported (read once our handlers are in)
    die_with_parent(WORKER_TERMINATE_SIGNAL)  # no worker outlives its rank
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the rank died while the app imported: Linux
        beating.set()  # sends no signal for a parent already gone, and the setup would only be lost time
        return 0
    # the rank keeps its workers daemonic (none outlives it), but an item may start processes of its own
    # (a DataLoader's num_workers, a multiprocessing Pool, scikit-learn's n_jobs), which Python refuses
    # to a daemonic process ("daemonic processes are not allowed to have children"); end_worker ends
    # whatever they leave
    multiprocessing.current_process().daemon = False
    # The rank decides when work stops: Ctrl-C and Slurm's walltime warning go to it, not us.
    leave_stop_signals_to_rank()
    termination = _Termination()
    signal.signal(WORKER_TERMINATE_SIGNAL, termination)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORED_SIGNALS)  # blocked since the pool started us
    if WORKER_TERMINATE_SIGNAL in early.numbers:  # the rank ended us while the app's __main__ imported
        beating.set()
        return WORKER_TERMINATED_EXIT
    handler = worker_file_log(log_path, name)  # falls back to stderr when the disk is full
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # the worker log's lines name no thread, process or source line: not gathering them for each
    # record (logging's documented optimisation) makes an item's line about a third cheaper
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # type: ignore[attr-defined]
    log.info("started: pid %d, device %s, CUDA_VISIBLE_DEVICES=%s, threads %d",
             os.getpid(), device, os.environ.get("CUDA_VISIBLE_DEVICES", ""), threads)
    try:  # where a hung item is, in this log, before the rank kills it
        dump_file = open(log_path, "a")
        faulthandler.register(DUMP_SIGNAL, file=dump_file, all_threads=True)
    except (OSError, ValueError, RuntimeError):
        pass
    try:
        try:
            # numpy.random, which every item's seed (item_seed) needs: imported now, not inside the first item,
            # whose time (its record, the timeline, the item timeout) would otherwise include it
            import numpy.random  # noqa: F401

            seed_of = ItemSeeds(seed).maker(getattr(app, "seed_form", "sequence"))
            # ended by its rank while it got this far: the exception may have been swallowed on the way (numpy.random's
            # import runs Cython code that calls Python inside a bare except), and the set-up would wait out its rank's kill
            termination.check()
            state = app.setup_worker(device)
            _set_threads(threads)
            termination.check()  # ended by its rank while the set-up ran: not ready, gone
        except (Exception, SystemExit) as error:  # sys.exit() in the app's setup too: said as an item's would be
            trace = capped(traceback.format_exc())
            log.error("setup failed:\n%s", trace)
            conn.send(SetupFailed(described(error), trace))
            return 0
        conn.send(Ready())
        while True:
            termination.check()  # the signal came while an item ran, and its code swallowed it
            bundle = inbox.next_bundle(handler.write_held)  # no line waits while the worker does
            if bundle is None:
                break
            entries, together = bundle
            _run_bundle(app, state, entries, together, seed_of, conn, finished, handler)
    except _Terminated:
        log.info("stopping: ended by SIGUSR2")
        return WORKER_TERMINATED_EXIT
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        log.info("stopping")
    finally:
        beating.set()
        left = threads_left()
        if left:
            one = len(left) == 1
            log.warning("%s started by the app's code still %s (%s): the worker ends without waiting "
                        "for %s past %g s", counted(len(left), "thread"), "runs" if one else "run",
                        ", ".join(thread.name for thread in left[:5]), "it" if one else "them", THREAD_GRACE_SECONDS)
        logging.shutdown()
        ignore_stop_signals()  # none kills this process while it shuts down (Python's defaults)
    return 0
