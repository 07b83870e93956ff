"""Stand-ins for MPI and for a rank's worker processes, all in one process: the leader's logic
(common.ranks.distribute) tested in milliseconds and benchmarked at 1,000 ranks without starting any.

- :class:`InProcessWorld`: one communicator per rank (the interface of common.ranks.mpi's ``MpiWorld``:
  ``rank``, ``size``, ``send``, ``poll``, ``flush``, ``abort``, ``finalize``) over shared deques.
  ``cut(rank)`` silences a rank as a dropped network link does: it neither sends nor receives
  until ``restore(rank)``. ``pickled=True`` pickles every message as MPI would (the cost counts).
- :class:`SimulatedPool`: the WorkerPool interface the Leader and Follower use, without
  processes. Each item "runs" for ``behave``'s duration (0: done at the next poll) and then
  succeeds or fails as ``behave`` says.
- :class:`FakeClock` and :class:`Turns`: a clock that moves only when told, and round-robin
  turns for ranks run as threads, each giving the turn on at every poll of its pool. With
  :func:`fake_time` as the clock given to the real Leader, Followers and their liveness watches,
  whole runs are deterministic and take no real time, heartbeat timeouts included.
"""
from __future__ import annotations

import pickle
import threading
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from common.app import Record
from common.errors import ItemFailed, described
from common.items import Item
from common.messages import Handout, PoolAnswer, Requester
from common.results.layout import worker_name, worker_rank_and_device
from common.workers.placement import pick_worker, room
from common.workers.pool import Assigned, Event, WorkerCounts


class InProcessWorld:
    """``size`` ranks in one process; ``comm(rank)`` is each rank's communicator."""

    def __init__(self, size: int, pickled: bool = False):
        self.size = size
        self.pickled = pickled
        self.inboxes: List[Deque[Tuple[int, Any]]] = [deque() for _ in range(size)]
        self.silenced: Set[int] = set()
        self.comms = [InProcessComm(self, rank) for rank in range(size)]

    def comm(self, rank: int) -> "InProcessComm":
        return self.comms[rank]

    def cut(self, rank: int) -> None:
        """From now on ``rank`` neither sends nor receives (what is sent meanwhile is lost)."""
        self.silenced.add(rank)

    def restore(self, rank: int) -> None:
        self.silenced.discard(rank)

    def _deliver(self, source: int, dest: int, message: Any) -> None:
        if source in self.silenced or dest in self.silenced:
            return
        self.inboxes[dest].append((source, pickle.dumps(message, pickle.HIGHEST_PROTOCOL) if self.pickled else message))


class InProcessComm:
    """One rank's view of an :class:`InProcessWorld` (the interface of ``common.ranks.mpi.MpiWorld``)."""

    def __init__(self, world: InProcessWorld, rank: int):
        self.world, self.rank, self.size = world, rank, world.size
        self.finalize = True
        self.aborted: Optional[int] = None
        self.sent: List[Tuple[int, Any]] = []  # (dest, message), for tests that look at the traffic
        self.keep_sent = False

    def send(self, value: Any, dest: int) -> None:
        if not 0 <= dest < self.size:
            raise ValueError(f"no rank {dest} in a world of {self.size}")
        if self.keep_sent:
            self.sent.append((dest, value))
        self.world._deliver(self.rank, dest, value)

    def poll(self) -> Optional[Tuple[int, Any]]:
        inbox = self.world.inboxes[self.rank]
        if not inbox or self.rank in self.world.silenced:
            return None
        source, message = inbox.popleft()
        return source, pickle.loads(message) if self.world.pickled else message

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def progress(self) -> None:
        """Messages are delivered as they are sent: nothing to move along."""

    def abort(self, code: int) -> None:
        self.aborted = code
        raise SystemExit(code)


class FakeClock:
    """Seconds that pass only through ``advance``."""

    def __init__(self, start: float = 1000.0, epoch: float = 1.7e9):
        self.now = start
        self.epoch = epoch

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.epoch + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Turns:
    """Ranks run as threads, one at a time in a fixed order: each gives the turn to the next at
    every poll of its pool (or sleep), and the clock moves ``tick`` seconds each round. So the
    real loops of Leader and Follower interleave deterministically, without real waiting."""

    def __init__(self, clock: FakeClock, tick: float = 0.001, limit: float = 600.0):
        self.clock, self.tick, self.limit = clock, tick, limit
        self.cond = threading.Condition()
        self.order: List[int] = []  # participants still running, by index
        self.current: Optional[int] = None
        self.local = threading.local()
        self.start = clock.now  # of the current run

    def pause(self) -> None:
        """Give the turn to the next participant and wait for it to come back."""
        me = getattr(self.local, "index", None)
        if me is None:  # not a participant (the test's own thread): nothing to interleave with
            self.clock.advance(self.tick)
            return
        with self.cond:
            self._pass_on(me)
            self.cond.wait_for(lambda: self.current == me)
        if self.clock.now - self.start > self.limit:
            raise RuntimeError(f"the simulated run went on for more than {self.limit:g} simulated seconds")

    def _pass_on(self, me: int) -> None:
        later = [index for index in self.order if index > me]
        if later:
            self.current = later[0]
        else:
            self.current = self.order[0] if self.order else None
            self.clock.advance(self.tick)
        self.cond.notify_all()

    def run(self, functions: List[Callable[[], Any]]) -> List[Any]:
        """Run each function in its own thread, in turns; their return values (an exception in
        one is raised here once all have ended)."""
        self.start = self.clock.now
        results: List[Any] = [None] * len(functions)
        errors: List[BaseException] = []
        self.order = list(range(len(functions)))
        self.current = 0

        def participant(index: int, function: Callable[[], Any]) -> None:
            self.local.index = index
            with self.cond:
                self.cond.wait_for(lambda: self.current == index)
            try:
                results[index] = function()
            except BaseException as error:  # noqa: B902 - handed to the caller
                errors.append(error)
            finally:
                with self.cond:
                    self._pass_on(index)
                    self.order.remove(index)
                    if not self.order:
                        self.current = None
                    self.cond.notify_all()

        threads = [threading.Thread(target=participant, args=(i, f), daemon=True) for i, f in enumerate(functions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def fake_time(clock: FakeClock, turns: Optional[Turns] = None) -> SimpleNamespace:
    """A :class:`common.clock.Clock` on ``clock``: give it to the Leader, the Followers and their
    liveness watches (``clock=fake_time(clock, turns)``); a sleep gives the turn on."""

    def sleep(seconds: float) -> None:
        if turns is not None:
            turns.pause()
        else:
            clock.advance(seconds)

    return SimpleNamespace(monotonic=clock.monotonic, time=clock.time, sleep=sleep)


# ----- workers -----
#: what ``behave(item, attempt, worker)`` returns: ("done", result, seconds) or ("failed", error, seconds);
#: an error that is an OSError travels with its errno and file, as a real worker sends them
Outcome = Tuple[str, Any, float]


def instant(item: Item, attempt: int, worker: str) -> Outcome:
    """Every item succeeds at once; its result is its key."""
    return "done", item.key, 0.0


@dataclass(slots=True, eq=False)
class SimulatedItem(Assigned):
    """An item a simulated worker holds, with what ``behave`` said of it (asked once, when it starts)."""

    outcome: Optional[Outcome] = None


@dataclass
class SimulatedWorker:
    name: str
    ready: bool = True
    retiring: bool = False
    assigned: Deque[List[SimulatedItem]] = field(default_factory=deque)  # bundles
    handed_total: int = 0
    items_done: int = 0
    started: float = 0.0  # when the head bundle's first item started


class SimulatedPool(WorkerCounts):
    """A rank's workers without processes (the interface of ``common.workers.pool.WorkerPool``).

    ``poll`` finishes the items whose simulated time is up, in order within each worker, and
    gives the turn on when there are :class:`Turns`. ``clock`` is any object with ``monotonic()``
    and ``time()`` (a :class:`FakeClock`, or the ``time`` module)."""

    def __init__(self, rank: int, workers: int, clock: Any, behave: Callable[[Item, int, str], Outcome] = instant,
                 turns: Optional[Turns] = None, host: str = "", on_poll: Optional[Callable[[], None]] = None,
                 keep_ran: bool = True, batch: Optional[int] = None):
        """``batch``: as ``--batch``, a worker is replaced by a fresh one after that many items."""
        self.rank, self.clock, self.behave, self.turns, self.batch = rank, clock, behave, turns, batch
        self.host = host or f"node{rank}"
        self.workers: Dict[str, SimulatedWorker] = {
            name: SimulatedWorker(name) for name in (worker_name(rank, f"cpu{i}") for i in range(workers))}
        self.given_up: Dict[str, str] = {}
        self.on_poll = on_poll  # called at each poll (a benchmark steps its simulated ranks there)
        self.keep_ran = keep_ran  # False: a benchmark that must not count this list as rank 0's memory
        self.ran: List[Tuple[str, int, str]] = []  # (key, attempt, worker) of every attempt finished
        self.revoked = 0
        self.retired = 0  # workers replaced after ``batch`` items

    def pick_worker(self, avoid: Tuple[str, ...] = (), depth: int = 1) -> Optional[SimulatedWorker]:
        """The real pool's policy (:func:`common.workers.placement.pick_worker`)."""
        return pick_worker(self.workers.values(), avoid, depth, self.batch)

    def room(self, worker: SimulatedWorker) -> Optional[int]:
        """The real pool's rule (:func:`common.workers.placement.room`)."""
        return room(worker, self.batch)

    def assign(self, worker: SimulatedWorker, bundle: List[Handout], together: bool = False) -> None:
        if not worker.assigned:
            worker.started = self.clock.monotonic()
        worker.assigned.append([SimulatedItem(item, attempt) for item, attempt, _ in bundle])
        worker.handed_total += len(bundle)

    def revoke_queued(self) -> None:
        """Items waiting behind the running one come back as a "returned" event at the next poll."""
        self._returned = [entry.item.key for w in self.workers.values() for bundle in list(w.assigned)[1:]
                          for entry in bundle]
        for worker in self.workers.values():
            while len(worker.assigned) > 1:
                worker.assigned.pop()
        self.revoked += len(self._returned)

    def deliver(self, requester: Requester, message: PoolAnswer) -> None:
        pass

    def poll(self, timeout: float) -> List[Event]:
        if self.turns is not None:
            self.turns.pause()
        if self.on_poll is not None:
            self.on_poll()
        events: List[Event] = []
        returned = getattr(self, "_returned", None)
        if returned:
            events.append(Event("returned", keys=tuple(returned)))
            self._returned = []
        now = self.clock.monotonic()
        for worker in self.workers.values():
            while worker.assigned:
                bundle = worker.assigned[0]
                entry = bundle[0]
                item, attempt = entry.item, entry.attempt
                if entry.outcome is None:  # asked once, when it starts
                    entry.outcome = self.behave(item, attempt, worker.name)
                kind, value, seconds = entry.outcome
                if now < worker.started + seconds:
                    break
                bundle.pop(0)
                if not bundle:
                    worker.assigned.popleft()
                if self.keep_ran:
                    self.ran.append((item.key, attempt, worker.name))
                end = worker.started + seconds
                worker.started = end
                wall = self.clock.time() - (now - end)
                record = Record(key=item.key, result=value if kind == "done" else None, seconds=seconds,
                                rank=self.rank, host=self.host, device=worker_rank_and_device(worker.name)[1],
                                worker=worker.name, start=wall - seconds, end=wall, attempt=attempt)
                if kind == "done":
                    events.append(Event("done", record))
                else:
                    errno, path = (value.errno, value.filename or "") if isinstance(value, OSError) else (None, "")
                    error = (f"{type(value).__name__}: {value}" if isinstance(value, OSError) else
                             described(value) if isinstance(value, ItemFailed) else str(value))  # as a worker's
                    events.append(Event("failed", record, error=error, errno=errno, path=path,
                                        retry=not isinstance(value, ItemFailed) or value.retry))
                worker.items_done += 1
                if self.batch and worker.items_done >= self.batch:
                    worker.retiring = True  # as WorkerPool: it ends once its items are answered
        for name, worker in list(self.workers.items()):
            if worker.retiring and not worker.assigned:  # its fresh process starts at once here
                self.workers[name] = SimulatedWorker(name)
                self.retired += 1
        return events
