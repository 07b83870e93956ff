"""Handing items out across ranks: rank 0 leads (and works), every other rank follows.

Protocol (pickled tuples over MPI, one tag):
  follower -> leader  ("request", need, prefetch)   need: idle workers without a queued item
                      ("result", Record) / ("failed", Record without result, error, traceback)
                      ("pool", verb, requester, pool, count)   global resource pools
                      ("dropped", [keys])   handed out but not started when a stop came
                      ("stop_request", why) / ("broken", why)
                      ("bye",)  after "done"/"halt", once its workers are stopped
  leader -> follower  ("items", [bundle, ...], plenty)   a bundle: [(item, attempt, avoid), ...] of one
                      group (usually one item); plenty: prefetch is welcome
                      ("pool_reply", requester, message)
                      ("stop",) stop starting items;  ("halt",) stop now;  ("done",) all work is done
A follower asks again whenever one of its workers is idle with nothing queued, so fast nodes
simply get more items; the leader defers a request it cannot serve until something is ready.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .app import Record
from .journal import Journal
from .progress import Progress
from .resources import ResourceBroker
from .scheduler import Scheduler
from .worker_pool import Event, WorkerPool

log = logging.getLogger("multinode_gpu")


class _Backoff:
    """How long a rank's loop sleeps in the worker poll. Worker events wake it at once, MPI
    messages do not: so it stays short while a message may come (another rank's request, an
    answer to ours) and grows only when the rank has nothing to wait for."""

    def __init__(self, low: float, high: float):
        self.low, self.high, self.value = low, high, low

    def next(self, active: bool, cap: float) -> float:
        self.value = self.low if active else min(self.high, cap, self.value * 2)
        return self.value


SHORT_ITEM_SECONDS = 0.5


class _ItemPace:
    """How long items take here (a running average), which decides how far ahead to queue.

    Short items: queue one behind the running one in each worker (and, on followers, enough to
    cover a round trip to rank 0), so no worker waits for a message. Long items: queue nothing
    ahead, so no item ever waits behind another while some worker is idle."""

    def __init__(self) -> None:
        self.seconds = float("inf")  # unknown: assume long

    def observe(self, seconds: float) -> None:
        self.seconds = seconds if self.seconds == float("inf") else 0.8 * self.seconds + 0.2 * seconds

    @property
    def short(self) -> bool:
        return self.seconds < SHORT_ITEM_SECONDS


def _avoided(bundle: List[tuple]) -> Tuple[str, ...]:
    """Workers that already failed some item of the bundle."""
    return tuple(worker for _, _, avoid in bundle for worker in avoid)


class Leader:
    """Rank 0: the scheduler, the journal, the global pools, and its own workers."""

    def __init__(self, comm: Any, pool: WorkerPool, scheduler: Scheduler, journal: Journal, progress: Progress,
                 global_pools: Dict[str, int], total_capacity: int, grace: float, stop_signal: Callable[[], Optional[str]]):
        self.comm, self.pool, self.scheduler, self.journal = comm, pool, scheduler, journal
        self.progress, self.grace, self.stop_signal = progress, grace, stop_signal
        self.global_resources = ResourceBroker(global_pools)
        self.total_capacity = total_capacity
        self.requests: Dict[int, Tuple[int, int]] = {}  # follower rank -> (need, prefetch)
        self.broken: Dict[int, str] = {}
        self.records: Dict[str, Record] = {}
        self.bars: List[dict] = []  # for the timeline
        self.stopping: Optional[str] = None
        self.deadline = 0.0
        self.pace = _ItemPace()

    def run(self) -> str:
        """Until every item is resolved ("complete") or a stop is finished ("stopped")."""
        backoff = _Backoff(0.0002 if self.comm.size > 1 else 0.05, 0.05)
        cap = 0.002 if self.comm.size > 1 else 0.05  # followers' requests must be answered fast
        timeout = backoff.low
        self.report_failures()
        while True:
            active = self._drain_messages()
            for event in self.pool.poll(timeout):
                active = True
                self._local_event(event)
            why = self.stop_signal()
            if why and not self.stopping:
                self._begin_stop(why)
            if self.stopping and getattr(self.stop_signal, "urgent", False):
                self.deadline = 0.0  # a second signal: do not wait for running items
            if not self.stopping:
                active |= self._dispatch()
                self._check_workers_left()
            self.journal.maybe_sync()
            if not self.stopping and self.scheduler.all_resolved():
                self._broadcast(("done",))
                return "complete"
            if self.stopping and (not self.scheduler.in_flight or time.monotonic() > self.deadline):
                self._broadcast(("halt",))
                return "stopped"
            timeout = backoff.next(active, cap)

    def await_byes(self) -> None:
        """After "done"/"halt": read until every follower has said "bye", keeping results that
        were finished before the news reached it (MPI sends then complete on both sides)."""
        waiting = set(range(1, self.comm.size))
        while waiting:
            incoming = self.comm.poll()
            if incoming is None:
                time.sleep(0.001)
                continue
            source, message = incoming
            if message[0] == "bye":
                waiting.discard(source)
            elif message[0] == "result":
                self._finished(message[1])
        self.journal.maybe_sync()

    # ----- stopping -----
    def _begin_stop(self, why: str) -> None:
        self.stopping = why
        self.deadline = time.monotonic() + self.grace
        running = len(self.scheduler.in_flight)
        self.progress.write(f"[rank 0] {why}: handing out no more items; waiting up to {self.grace:g} s "
                            f"for {running} running item(s)")
        self.journal.add_event("stop", why=why, time=time.time())
        self.pool.revoke_queued()
        self._broadcast(("stop",))

    def _broadcast(self, message: tuple) -> None:
        for rank in range(1, self.comm.size):
            self.comm.send(message, rank)

    # ----- results -----
    def _finished(self, record: Record) -> None:
        if record.rank == 0:
            self.pace.observe(record.seconds)
        self.bars.append({"worker": record.worker, "start": record.start, "end": record.end, "ok": True})
        item = self.scheduler.items.get(record.key)
        if item is not None and item.after:
            record.params = item.params  # what it was built from: --resume checks it still holds
        if self.scheduler.done(record.key, record.result):
            self.records[record.key] = record
            self.journal.add_result(record)
            self.progress.advance()
            self.report_failures()  # a dependent that could not be built from this result

    def _attempt_failed(self, record: Record, error: str, text: str) -> None:
        """``record`` says where and when the attempt ran (its result is None)."""
        key, worker = record.key, record.worker
        self.bars.append({"worker": worker, "start": record.start, "end": record.end, "ok": False})
        if self.stopping:  # killed by the stop itself: it will simply run again on --resume
            self.scheduler.dropped(key)
            return
        self.journal.add_event("attempt_failed", key=key, error=error, traceback=text, worker=worker,
                               attempt=record.attempt, start=record.start, end=record.end)
        retried = self.scheduler.attempt_failed(key, error, worker)
        if retried:
            last_line = error.splitlines()[-1] if error else "failed"
            self.progress.write(f"[rank 0] item {key} failed on {worker} (attempt {record.attempt}): {last_line}; retrying")
        self.report_failures()

    def report_failures(self) -> None:
        """Journal and show each item that failed for good, once."""
        for key in self.scheduler.pop_new_failures():
            error = self.scheduler.failed[key]
            self.journal.add_event("failed", key=key, error=error)
            self.progress.write(f"[rank 0] item {key} failed for good: {error.splitlines()[-1] if error else ''}")
            self.progress.advance(failed=True)

    def _local_event(self, event: Event) -> None:
        self._on_message(0, event.as_message())

    def _drain_messages(self) -> bool:
        active = False
        while True:
            incoming = self.comm.poll()
            if incoming is None:
                return active
            active = True
            self._on_message(*incoming)

    def _on_message(self, source: int, message: tuple) -> None:
        """One message of the protocol from rank ``source`` (0: an event of this rank's own workers)."""
        verb = message[0]
        if verb == "request":
            self.requests[source] = (message[1], message[2])
        elif verb == "result":
            self._finished(message[1])
        elif verb == "failed":
            self._attempt_failed(*message[1:])
        elif verb == "pool":
            self._pool(*message[1:])
        elif verb == "dropped":
            for key in message[1]:
                self.scheduler.give_back(key)
        elif verb == "stop_request" and not self.stopping:
            self._begin_stop(message[1])
        elif verb == "broken":
            self.broken[source] = message[1]
            self.requests.pop(source, None)

    # ----- handing out -----
    def _dispatch(self) -> bool:
        handed = False
        while self.scheduler.ready_count:
            # Queue one item behind the running one only while there is plenty left for everybody.
            depth = 2 if self.pace.short and self.scheduler.ready_count > self.total_capacity else 1
            worker = self.pool.pick_worker(depth=depth)
            if worker is None:
                break
            bundle = self.scheduler.take(self._chunk())
            avoid = _avoided(bundle)
            if avoid and worker.name in avoid:
                worker = self.pool.pick_worker(avoid, depth) or worker
            for item, _, _ in bundle:
                self.scheduler.handed(item.key)
            self.pool.assign(worker, [(item, attempt) for item, attempt, _ in bundle], bool(bundle[0][0].group))
            handed = True
        for rank, (need, prefetch) in list(self.requests.items()):
            plenty = self.scheduler.ready_count > need + prefetch + self.total_capacity
            count = need + (prefetch if plenty else 0)
            batch = []  # bundles
            while len(batch) < count and self.scheduler.ready_count:
                bundle = self.scheduler.take(self._chunk())
                for item, _, _ in bundle:
                    self.scheduler.handed(item.key)
                batch.append(bundle)
            if batch or need == 0:
                self.comm.send(("items", batch, plenty), rank)
                del self.requests[rank]
                handed = True
        return handed

    def _chunk(self) -> int:
        """Items per message: 1, or for items far below a millisecond, about 2 ms worth of them
        (one message and one wake-up for many items), while there is plenty for everybody."""
        if not self.pace.short or self.scheduler.ready_count < 4 * self.total_capacity:
            return 1
        return max(1, min(64, int(0.002 / max(self.pace.seconds, 1e-6)), self.scheduler.ready_count // (4 * self.total_capacity)))

    def _check_workers_left(self) -> None:
        """If no rank can run anything any more, fail what is left instead of waiting forever."""
        local_dead = self.pool.capacity == 0 and bool(self.pool.given_up)
        if local_dead and len(self.broken) == self.comm.size - 1 and not self.scheduler.all_resolved():
            reasons = "; ".join(sorted(set(self.pool.given_up.values()) | set(self.broken.values())))
            self.scheduler.fail_remaining(f"no worker could start: {reasons}")
            self.report_failures()

    # ----- global resource pools -----
    def _pool(self, verb: str, requester: tuple, name: str, count: int) -> None:
        for who, reply in self.global_resources.handle(verb, name, requester, count):
            self._pool_reply(who, reply)

    def _pool_reply(self, requester: tuple, message: tuple) -> None:
        if requester[0] == 0:
            self.pool.deliver(requester, message)
        else:
            self.comm.send(("pool_reply", requester, message), requester[0])


class Follower:
    """Every rank but 0: runs what the leader hands it and streams results back."""

    def __init__(self, comm: Any, pool: WorkerPool, stop_signal: Callable[[], Optional[str]]):
        self.comm, self.pool, self.stop_signal = comm, pool, stop_signal
        self.buffer: Deque[List[Tuple[Any, int, tuple]]] = deque()  # bundles
        self.asked = False
        self.plenty = True
        self.stopping = False
        self.told_stop = False
        self.told_broken = False
        self.handed: Dict[str, Tuple[Any, int, tuple]] = {}  # key -> entry, while a worker holds it
        # Running averages that size the prefetch: enough items to cover one round trip to rank 0.
        self.pace = _ItemPace()
        self.round_trip = 0.001
        self.asked_at = 0.0

    def run(self) -> str:
        backoff = _Backoff(0.0002, 0.05)
        timeout = backoff.low
        while True:
            active, ending = self._drain_messages()
            if ending:
                return ending
            for event in self.pool.poll(timeout):
                active = True
                self._send_event(event)
            why = self.stop_signal()
            if why and not self.told_stop:
                self.told_stop = True
                self.comm.send(("stop_request", why), 0)
            if not self.stopping:
                active |= self._start_buffered()
                self._ask()
            if self.pool.capacity == 0 and self.pool.given_up and not self.told_broken:
                self.told_broken = True
                self.comm.send(("broken", "; ".join(sorted(set(self.pool.given_up.values())))), 0)
                self._drop_buffer()
            timeout = backoff.next(active, 0.001 if self.asked else 0.02)

    def _drain_messages(self) -> Tuple[bool, Optional[str]]:
        active = False
        while True:
            incoming = self.comm.poll()
            if incoming is None:
                return active, None
            active = True
            message = incoming[1]
            verb = message[0]
            if verb == "items" and self.told_broken:  # crossed our "broken": give them back
                self.comm.send(("dropped", [entry[0].key for bundle in message[1] for entry in bundle]), 0)
                self.asked = False
            elif verb == "items":
                self.buffer.extend(message[1])
                self.plenty = message[2]
                self.asked = False
                self.round_trip = 0.8 * self.round_trip + 0.2 * (time.monotonic() - self.asked_at)
            elif verb == "pool_reply":
                self.pool.deliver(message[1], message[2])
            elif verb == "stop":
                self.stopping = True
                self.pool.revoke_queued()
                self._drop_buffer()
            elif verb in ("halt", "done"):
                return True, verb

    def _drop_buffer(self) -> None:
        if self.buffer:
            self.comm.send(("dropped", [entry[0].key for bundle in self.buffer for entry in bundle]), 0)
            self.buffer.clear()

    def _send_event(self, event: Event) -> None:
        if event.kind == "returned":  # handed to a worker that died or was told to stop: run elsewhere
            entries = [self.handed.pop(key) for key in event.keys]
            if not self.stopping:
                self.buffer.extendleft([entry] for entry in reversed(entries))
                return
        self.handed.pop(event.key, None)
        if event.kind == "done":
            self.pace.observe(event.record.seconds)
        self.comm.send(event.as_message(), 0)

    def _start_buffered(self) -> bool:
        started = False
        depth = 2 if self.plenty and self.pace.short else 1
        while self.buffer:
            bundle = self.buffer[0]
            worker = self.pool.pick_worker(_avoided(bundle), depth)
            if worker is None:
                break
            self.buffer.popleft()
            for entry in bundle:
                self.handed[entry[0].key] = entry
            self.pool.assign(worker, [(item, attempt) for item, attempt, _ in bundle], bool(bundle[0][0].group))
            started = True
        return started

    def _ask(self) -> None:
        if self.asked or self.pool.capacity == 0:
            return
        need = max(0, len(self.pool.idle) - len(self.buffer))
        ahead = 1 + min(64, int(self.round_trip / max(self.pace.seconds, 1e-5)) + 1) if self.pace.short else 0
        prefetch = max(0, self.pool.capacity * (1 + ahead) - self.pool.queued - len(self.buffer) - need)
        if need > 0 or (self.plenty and prefetch > 0):
            self.comm.send(("request", need, prefetch), 0)
            self.asked = True
            self.asked_at = time.monotonic()
