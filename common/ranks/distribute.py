"""Handing items out across ranks: rank 0 leads (and works), every other rank follows.

The messages are the typed records of :mod:`common.messages`. A follower sends a ``Request`` whenever
one of its workers is idle with nothing queued, so fast nodes simply get more items; the leader
defers a request it cannot serve until something is ready. Results stream back as they finish.

Liveness (:mod:`common.ranks.liveness`): the leader declares a follower silent for ``heartbeat_timeout``
seconds lost: its items go back to the others and the run ends without it. A follower that hears
nothing from the leader that long stops by itself. Neither waits forever.
"""
from __future__ import annotations

import gc
import itertools
import logging
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from common.app import Record
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import EXIT_FAILED_ITEMS, EXIT_OK, EXIT_STOPPED, counted, described, error_line
from common.messages import (
    Broken,
    Dropped,
    End,
    Failed,
    Handout,
    Heartbeat,
    Items,
    PoolAnswer,
    PoolCall,
    PoolReply,
    Release,
    Request,
    Requester,
    Result,
    Results,
    Status,
    Stop,
    StopRequest,
)
from common.observe.logs import log_to_files, rank_tag
from common.observe.progress import Progress
from common.ranks.liveness import FollowerWatch, PeerWatch
from common.ranks.scheduler import Scheduler
from common.results.failures import WriteFailures
from common.results.journal import Journal, Kind, result_line
from common.workers.pool import Event, WorkerPool
from common.workers.resources import ResourceBroker

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
#: rank 0 counts as idle once nothing happened for this long (Leader.on_idle)
IDLE_SECONDS = 0.1
#: a follower sends its finished items together, at the latest this many seconds after the first
#: of them finished, or once it holds this many
RESULTS_SECONDS = 0.002
RESULTS_BATCH = 256


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


def _avoided(bundle: List[Handout]) -> Tuple[str, ...]:
    """Workers that already failed some item of the bundle."""
    return tuple(worker for handout in bundle for worker in handout.avoid)


class Leader:
    """Rank 0: the scheduler, the journal, the global pools, its own workers, the others' liveness."""

    def __init__(self, comm: Any, pool: WorkerPool, scheduler: Scheduler, journal: Journal, *, progress: Progress,
                 liveness: FollowerWatch, stop_signal: Callable[[], Optional[str]], grace: float, total_capacity: int,
                 global_pools: Optional[Dict[str, int]] = None, status: Optional[Any] = None,
                 on_idle: Optional[Callable[[], None]] = None, stop_after_failures: Optional[int] = None,
                 clock: Clock = SYSTEM_CLOCK, write_failures: Optional[WriteFailures] = None,
                 first_result: Optional[Callable[[Any], Optional[str]]] = None):
        """``liveness``: the watch over the other ranks; ``status``: status.json's writer
        (``common.results.status_file.StatusWriter``), or None; ``on_idle``: called once, the first time
        rank 0 has had nothing to do for IDLE_SECONDS after a result came (the runner warms the
        end-of-run figures up then, without slowing a busy rank 0); ``write_failures``: the run's,
        where an item's output that found no space is noted; ``stop_after_failures``: the run stops
        once this many items have failed for good (None: never); ``first_result``: called with the
        first result kept, and what it returns (a warning) is printed with this rank's tag."""
        self.comm, self.pool, self.scheduler, self.journal = comm, pool, scheduler, journal
        self.clock = clock
        self.write_failures = write_failures or WriteFailures()
        self.progress, self.grace, self.stop_signal = progress, grace, stop_signal
        self.global_resources = ResourceBroker(global_pools or {})
        self.total_capacity = total_capacity
        self.requests: Dict[int, Request] = {}  # follower rank -> what it asked for last
        self.broken: Dict[int, str] = {}
        self.records: Dict[str, Record] = {}
        # for the timeline: failed attempts and results that came twice (the kept results' bars are
        # made from self.records at the end: no dict per item meanwhile)
        self.bars: List[dict] = []
        # key -> the bar of its attempt the stop's wait cut off (_draw_cut_off); apart from the bars, which
        # say an attempt was started again in the run (a requeue with the same --time would not only repeat it)
        self.cut_bars: Dict[str, dict] = {}
        self._names: Dict[str, str] = {}  # one copy of each host, device and worker name
        self.stopping: Optional[str] = None
        self.stop_after_failures = stop_after_failures
        self.gave_up = False  # the stop is --stop-after-failures's: the run failed, it is not to be requeued
        self.cut_off = 0  # items a stop's wait ended before they finished (they run again on --resume)
        self.wait_cut_short = False  # a second stop signal ended that wait before its deadline
        self.deadline = 0.0
        self.pace = _ItemPace()
        self.liveness = liveness
        self.holding: Dict[int, Set[str]] = {rank: set() for rank in liveness.followers}  # keys a follower holds
        self.code = EXIT_OK
        self.status = status
        self.on_idle = on_idle
        self.first_result = first_result
        self.tag = rank_tag(0)  # its messages begin as its log lines do

    @property
    def lost(self) -> Dict[int, Dict[str, Any]]:
        """rank -> what happened, for the summary."""
        return self.liveness.lost

    @property
    def live(self) -> List[int]:
        return self.liveness.live

    def run(self) -> str:
        """Until every item is resolved ("complete") or a stop is finished ("stopped"); then every
        live follower is told to end, with the run's exit code.

        What exists when the run starts (the items, the scheduler's tables: a million items make
        millions of objects) lives until its end: it is frozen out of the garbage collector's passes
        meanwhile (``gc.freeze``); its full passes would otherwise walk all of it again each time
        the records kept grow by a quarter (half the collector's time at rank 0 in bench_scale, and
        the collector took 15% of rank 0's time there). It is unfrozen when the run ends; what of it
        becomes garbage meanwhile is still freed at once by reference counting, and a cycle of it
        by the first collection after the run."""
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> str:
        backoff = _Backoff(0.0002 if self.comm.size > 1 else 0.05, 0.05)
        cap = 0.002 if self.comm.size > 1 else 0.05  # followers' requests must be answered fast
        timeout = backoff.low
        self.report_failures()
        idle_since: Optional[float] = None
        while True:
            active = self._drain_messages()
            events = self.pool.poll(timeout)
            if events:
                active = True
                self._local_events(events)
            self._watch_followers()
            why = self.stop_signal()
            if why and not self.stopping:
                self._begin_stop(why)
            elif why and self.gave_up and self.deadline:  # a signal during --stop-after-failures's wait ends it
                self.deadline = 0.0
                self.progress.write(f"{self.tag} {why}: not waiting for the items handed out (they run again on "
                                    f"--resume)")
            if self.stopping and getattr(self.stop_signal, "urgent", False):
                if self.scheduler.in_flight and self.clock.monotonic() <= self.deadline:
                    self.wait_cut_short = True
                self.deadline = 0.0  # a second signal: do not wait for running items
            if not self.stopping:
                active |= self._dispatch()
                self._check_workers_left()
            self.journal.maybe_sync()
            if self.status is not None:
                self.status.tick(self)
            if self.scheduler.all_resolved() and (not self.stopping or self._nothing_to_resume()):
                return self._end("complete", EXIT_FAILED_ITEMS if self.scheduler.failed else EXIT_OK)
            if self.stopping and (not self.scheduler.in_flight or self.clock.monotonic() > self.deadline):
                self.cut_off = len(self.scheduler.in_flight)
                self._draw_cut_off()
                return self._end("stopped", EXIT_STOPPED)
            if self.on_idle is not None and self.records:
                now = self.clock.monotonic()
                idle_since = None if active else idle_since or now
                if idle_since is not None and now - idle_since >= IDLE_SECONDS:
                    self.on_idle()
                    self.on_idle = None
            timeout = backoff.next(active, cap)

    def _draw_cut_off(self) -> None:
        """The attempts the stop's wait ended before they finished, as bars ended by the stop (the
        timeline draws them grey; the summary counts their time among the attempts that gave no
        result): from where each rank last said its workers were (rank 0's own: now), so an item
        whose start no rank has told yet is counted in ``cut_off`` only."""
        if not self.scheduler.in_flight or self.status is None:
            return
        now = self.clock.time()
        last_end: Dict[str, float] = {}  # worker -> the end of its latest attempt known here
        for worker, end in itertools.chain(((bar["worker"], bar["end"]) for bar in self.bars),
                                           ((record.worker, record.end) for record in self.records.values())):
            last_end[worker] = max(end, last_end.get(worker, end))
        for attempt in self.status.running_attempts(leaving_out=set(self.lost)):
            key, since = attempt["key"], attempt["since"]
            if since < last_end.get(attempt["worker"], since):  # a word older than that worker's last end
                continue
            if key in self.scheduler.in_flight and since < now and since > self.cut_bars.get(key, {}).get("start", -1.0):
                # an item seen on two workers (a rank's word older than a retry elsewhere): its latest attempt
                self.cut_bars[key] = {"worker": attempt["worker"], "start": since, "end": now, "ok": False,
                                      "why": "stopped"}

    def _end(self, outcome: str, code: int) -> str:
        self.code = code
        self._broadcast(End("done" if outcome == "complete" else "halt", code))
        return outcome

    def await_byes(self, wait: float) -> Dict[int, Dict[str, Any]]:
        """After :class:`End`: each live follower's report, keeping results that were finished
        before the news reached it. A follower silent for ``wait`` seconds is declared lost."""
        reports, waiting = self.liveness.await_byes(wait, self._results)
        for rank in sorted(waiting):
            self._lose(rank, f"no answer {wait:.0f} s after the end of the run")
        self.journal.maybe_sync()
        return reports

    def release(self, code: int) -> bool:
        """Let every live follower exit with ``code``; False when a rank was lost (then no rank
        may call MPI_Finalize)."""
        finalize = not self.lost
        self._broadcast(Release(code, finalize))
        return finalize

    # ----- liveness -----
    def _send(self, message: Any, rank: int) -> None:
        self.liveness.send(message, rank)

    def _broadcast(self, message: Any) -> None:
        self.liveness.broadcast(message)

    def _watch_followers(self) -> None:
        for rank, why in self.liveness.watch():
            self._lose(rank, why)

    def _lose(self, rank: int, why: str) -> None:
        """Carry on without ``rank``: what it held goes back to the others (attempts not counted)."""
        keys = sorted(self.holding.pop(rank, set()))
        for key in keys:
            if key in self.scheduler.in_flight:
                self.scheduler.give_back(key)
        self.liveness.forget(rank)
        self.requests.pop(rank, None)
        self.broken.pop(rank, None)
        for _, who in self.global_resources.release_all(lambda requester: requester.rank == rank):
            self._pool_reply(who, PoolAnswer("granted", who.request))
        host = self.liveness.note_lost(rank, why, len(keys))
        self.journal.add_event(Kind.RANK_LOST, rank=rank, host=host, why=why, items=keys, time=self.clock.time())
        said = (f"lost rank {rank} on {host} ({why}); the {counted(len(keys), 'item')} it held "
                f"{'goes' if len(keys) == 1 else 'go'} to the other ranks")
        self.progress.write(f"{self.tag} {said}")  # stderr: once, as the bar's line
        log_to_files(said)  # and the rank's log

    # ----- stopping -----
    def _nothing_to_resume(self) -> bool:
        """A stop whose grace let every item finish, each with its result: the run ends complete,
        its outputs written, instead of asking for a --resume that would only write them. Not where
        an item failed (a stop may have caused it; a resume runs it again) or a write failed."""
        return not self.scheduler.failed and self.write_failures.first is None

    def _begin_stop(self, why: str) -> None:
        self.stopping = why
        self.deadline = self.clock.monotonic() + self.grace
        # in flight: running, or queued in a worker's inbox or a follower's (those are taken back at once)
        handed = len(self.scheduler.in_flight)
        # stopped by a signal, a second one ends the wait; stopped by itself (a failed write, --stop-after-failures), one
        again = ("a stop signal" if self.gave_up or self.write_failures.first is not None
                 else "the same signal again, 2 s or more later,")
        waiting = (f"waiting up to {self.grace:g} s for the {counted(handed, 'item')} handed out to finish or come back "
                   f"({again} ends the wait: they run again on --resume)"
                   if handed else "none is running")
        said = f"{why}: handing out no more items; {waiting}"
        self.progress.write(f"{self.tag} {said}")
        log_to_files(said, logging.WARNING)  # and the rank's log, which tells the run's story afterwards
        self.journal.add_event(Kind.STOP, why=why, time=self.clock.time())
        self.pool.revoke_queued()
        self._broadcast(Stop())

    # ----- results -----
    def _results(self, message: Any) -> None:
        """A :class:`Result` or :class:`Results` message."""
        if isinstance(message, Results):
            self._finished(message.records, message.lines)
        else:
            self._finished([message.record])

    def _finished(self, records: List[Record], lines: Optional[List[Optional[bytes]]] = None) -> None:
        """Finished items (a :class:`Results` message's, or one), handled as one batch: per record
        only its own bookkeeping, each O(1) (rank 0 does this for every result of the run); the
        progress count and the journal's look at its batch's age once for all. Each result's line
        joins the journal's batch in order, as before, so the window of a SIGKILL is the same.
        ``lines``: the records' journal lines as their follower made them (None: made here)."""
        scheduler, journal, kept = self.scheduler, self.journal, self.records
        items, done, add, append_line = scheduler.items, scheduler.done, journal.append_result, journal.append_line
        holding, names = self.holding, self._names  # names: each unpickled record brings its own copies
        count = 0
        for index, record in enumerate(records):
            rank, key = record.rank, record.key
            if rank == 0:
                self.pace.observe(record.seconds)
            held = holding.get(rank)
            if held:
                held.discard(key)
            record.host = names.setdefault(record.host, record.host)
            record.device = names.setdefault(record.device, record.device)
            record.worker = names.setdefault(record.worker, record.worker)
            item = items.get(key)
            if item is not None:
                record.key = key = item.key  # one copy of the key string, not one more per result
                if item.after:
                    record.params = item.params  # what it was built from: --resume checks it still holds
            if done(key, record.result):
                kept[key] = record
                line = lines[index] if lines is not None else None
                if line is None:
                    add(record)
                else:
                    append_line(line)
                count += 1
                if scheduler.has_new_failures:  # a dependent that could not be built from this result
                    self.progress.advance(count)
                    count = 0
                    self.report_failures()
            else:
                self.bars.append({"worker": record.worker, "start": record.start, "end": record.end, "ok": True})
        if count:
            self.progress.advance(count)
        if self.first_result is not None:
            self._first_kept(records)
        journal.maybe_sync()

    def _first_kept(self, records: List[Record]) -> None:
        """The first result kept (not one that came twice) goes to ``first_result``, once."""
        first = next((record for record in records if self.records.get(record.key) is record), None)
        if first is not None:
            check, self.first_result = self.first_result, None
            try:
                warning = check(first.result)
            except Exception as error:  # the app's own code: the run goes on without its warning
                self.progress.write(f"{self.tag} the app's check of the first result failed ({error_line(described(error))}; the "
                                    f"traceback is in the rank's log): the run goes on")
                log_to_files(f"the app's check of the first result failed:\n{traceback.format_exc().rstrip()}",
                             logging.WARNING)
                return
            if warning:
                self.progress.write(f"{self.tag} {warning}")
                log_to_files(warning, logging.WARNING)  # the rank's log tells the run's story afterwards

    def timeline_bars(self) -> List[dict]:
        """Every attempt of this run, for the timeline: the kept results' and then the others."""
        return [{"worker": r.worker, "start": r.start, "end": r.end, "ok": True} for r in self.records.values()] \
            + self.other_bars()

    def other_bars(self) -> List[dict]:
        """The attempts of this run but those of the kept results: failed, timed out, ended by the
        stop, a result not kept, and those the stop's wait cut off (but for a result that still came
        before the run ended)."""
        return self.bars + self.cut_attempts()

    def cut_attempts(self) -> List[dict]:
        """The bars of the attempts the stop's wait cut off, but those whose result still came."""
        return [bar for key, bar in self.cut_bars.items() if key not in self.records]

    def _attempt_failed(self, failed: Failed) -> None:
        """``failed.record`` says where and when the attempt ran (its result is None)."""
        record, error, text = failed.record, failed.error, failed.traceback
        key, worker = record.key, record.worker
        self.holding.get(record.rank, set()).discard(key)
        # killed by the stop itself, or its output found no space (the run stops on it): it runs again on
        # --resume, and is not a failure (summary.md counts none; the timeline draws it as stopped, not failed)
        stopped = bool(self.stopping) or self.write_failures.item_error(failed.errno, failed.path, key, worker)
        self.bars.append({"worker": worker, "start": record.start, "end": record.end, "ok": False,
                          "why": "stopped" if stopped else failed.kind})
        if stopped:
            self.scheduler.dropped(key)
            return
        self.journal.add_event(Kind.ATTEMPT_FAILED, key=key, error=error, traceback=text, worker=worker,
                               attempt=record.attempt, start=record.start, end=record.end)
        retried = self.scheduler.attempt_failed(key, error, worker, retry=failed.retry)
        if retried:
            self.progress.write(f"{self.tag} item {key} failed on {worker} (attempt {record.attempt}): "
                                f"{error_line(error) or 'failed'}; retrying")
        self.report_failures()

    def report_failures(self) -> None:
        """Journal and show each item that failed for good, once; begin the stop of
        ``stop_after_failures`` when they are that many."""
        for key in self.scheduler.pop_new_failures():
            error = self.scheduler.failed[key]
            self.journal.add_event(Kind.FAILED, key=key, error=error)
            self.progress.write(f"{self.tag} item {key} failed for good: {error_line(error)}")
            self.progress.advance(failed=True)
        limit, failed = self.stop_after_failures, len(self.scheduler.failed)
        left = self.scheduler.unresolved - len(self.scheduler.in_flight)  # not handed out yet
        if limit is not None and failed >= limit and not self.stopping and left > 0:
            # (with none left, the run ends as it would have, its outputs written)
            self.gave_up = True
            self._begin_stop(f"{counted(failed, 'item')} failed for good (--stop-after-failures {limit})")

    def _local_events(self, events: List[Event]) -> None:
        """What one poll of rank 0's own workers saw, in order; items finished one after the other
        are handled as one batch, as a follower's :class:`Results` are."""
        finished: List[Record] = []
        for event in events:
            if event.kind == "done":
                finished.append(event.record)  # type: ignore[arg-type]
                continue
            if finished:
                self._finished(finished)
                finished = []
            self._on_message(0, event.as_message())
        if finished:
            self._finished(finished)

    def _drain_messages(self) -> bool:
        active = False
        now = self.clock.monotonic()
        while True:
            incoming = self.comm.poll()
            if incoming is None:
                return active
            active = True
            source, message = incoming
            if source in self.lost:
                self._from_lost(source, message)
                continue
            self.liveness.heard_from(source, now)
            self._on_message(source, message)

    def _from_lost(self, source: int, message: Any) -> None:
        """A rank declared lost speaks again (its network came back): keep its finished work, and
        tell it once to end, since its items went to others."""
        if isinstance(message, (Result, Results)):
            self._results(message)
        if self.liveness.tell_to_end_once(source):
            self.comm.send(End("halt", EXIT_STOPPED), source)

    def _on_message(self, source: int, message: Any) -> None:
        """One message from rank ``source`` (0: an event of this rank's own workers)."""
        if isinstance(message, Request):
            self.requests[source] = message
        elif isinstance(message, (Results, Result)):
            self._results(message)
        elif isinstance(message, Failed):
            self._attempt_failed(message)
        elif isinstance(message, PoolCall):
            for who, reply in self.global_resources.handle(message.verb, message.pool, message.requester, message.count):
                self._pool_reply(who, reply)
        elif isinstance(message, Dropped):
            for key in message.keys:
                self.holding.get(source, set()).discard(key)
                self.scheduler.give_back(key)
        elif isinstance(message, StopRequest) and not self.stopping:
            self._begin_stop(message.why)
        elif isinstance(message, Broken):
            self.broken[source] = message.why
            self.requests.pop(source, None)
        elif isinstance(message, Status) and self.status is not None:
            self.status.absorb(source, message.snapshot)

    # ----- handing out -----
    def _dispatch(self) -> bool:
        handed = False
        while self.scheduler.ready_count:
            # Queue one item behind the running one only while there is plenty left for everybody.
            depth = 2 if self.pace.short and self.scheduler.ready_count > self.total_capacity else 1
            worker = self.pool.pick_worker(depth=depth)
            if worker is None:
                break
            chunk, room = self._chunk(), self.pool.room(worker)  # --batch: a chunk never takes a worker past it
            bundle = self.scheduler.take(chunk if room is None else min(chunk, room))
            avoid = _avoided(bundle)
            if avoid and worker.name in avoid:
                other = self.pool.pick_worker(avoid, depth)
                other_room = None if other is None else self.pool.room(other)
                if other is not None and (other_room is None or other_room >= len(bundle)):
                    worker = other
            self.scheduler.handed_all([handout.item.key for handout in bundle])
            self.pool.assign(worker, bundle, bool(bundle[0].item.group))
            handed = True
        # nothing ready: only the requests that ask for nothing are answered (an empty Items)
        requests = list(self.requests.items()) if self.scheduler.ready_count else \
            [(rank, wanted) for rank, wanted in self.requests.items() if not wanted.need]
        for rank, wanted in requests:
            need, prefetch = wanted.need, wanted.prefetch
            plenty = self.scheduler.ready_count > need + prefetch + self.total_capacity
            count = need + (prefetch if plenty else 0)
            batch, keys = self.scheduler.take_handed(count, self._chunk)  # bundles
            self.holding[rank].update(keys)
            if batch or need == 0:
                self._send(Items(batch, plenty), rank)
                del self.requests[rank]
                handed = True
        return handed

    def _chunk(self) -> int:
        """Items per message: 1, or for items far below a millisecond, about 2 ms worth of them
        (one message and one wake-up for many items), while there is plenty for everybody."""
        ready, share = self.scheduler.ready_count, 4 * self.total_capacity
        seconds = self.pace.seconds
        if ready < share or not seconds < SHORT_ITEM_SECONDS:
            return 1
        return max(1, min(64, int(0.002 / max(seconds, 1e-6)), ready // share))

    def _check_workers_left(self) -> None:
        """If no rank can run anything any more, fail what is left instead of waiting forever."""
        local_dead = self.pool.capacity == 0 and bool(self.pool.given_up)
        if not local_dead:  # the usual case, known without a walk over every rank
            return
        live = self.live
        if all(rank in self.broken for rank in live) and not self.scheduler.all_resolved():
            reasons = set(self.pool.given_up.values()) | {self.broken[rank] for rank in live}
            if self.lost:
                reasons.add(f"{'rank' if len(self.lost) == 1 else 'ranks'} {', '.join(str(r) for r in self.lost)} lost")
            self.scheduler.fail_remaining(f"no worker could start: {'; '.join(sorted(reasons))}")
            self.report_failures()

    def _pool_reply(self, requester: Requester, message: PoolAnswer) -> None:
        if requester.rank == 0:
            self.pool.deliver(requester, message)
        elif requester.rank not in self.lost:
            self._send(PoolReply(requester, message), requester.rank)


class Follower:
    """Every rank but 0: runs what the leader hands it and streams results back."""

    def __init__(self, comm: Any, pool: WorkerPool, stop_signal: Callable[[], Optional[str]], liveness: PeerWatch,
                 *, status: Optional[Any] = None, clock: Clock = SYSTEM_CLOCK):
        """``liveness``: the watch on rank 0 (its only peer); ``status``: what this rank tells
        status.json (``common.results.status_file.RankReporter``), or None."""
        self.comm, self.pool, self.stop_signal, self.clock = comm, pool, stop_signal, clock
        self.buffer: Deque[List[Handout]] = deque()  # bundles
        self.asked = False
        self.plenty = True
        self.stopping = False
        self.told_stop = False
        self.told_broken = False
        self.handed: Dict[str, Handout] = {}  # key -> its handout, while a worker holds it
        # Running averages that size the prefetch: enough items to cover one round trip to rank 0.
        self.pace = _ItemPace()
        self.round_trip = 0.001
        self.asked_at = 0.0
        self.liveness = liveness
        self.end: Optional[End] = None
        self.silence = 0.0  # how long rank 0 had been silent when it was given up
        # Finished items not yet sent: sent together (Results) every RESULTS_SECONDS, RESULTS_BATCH
        # items, whenever the loop has nothing else to do, and before any other message; with each
        # its journal line (rank 0 only appends it)
        self.results: List[Record] = []
        self.lines: List[Optional[bytes]] = []
        self.results_since = 0.0
        self.status = status

    def run(self) -> str:
        """Until the leader's :class:`End` ("done" or "halt"), or "lost" when rank 0 fell silent."""
        backoff = _Backoff(0.0002, 0.05)
        timeout = backoff.low
        while True:
            active, ending = self._drain_messages()
            if ending:
                self.flush()  # finished before the news of the end reached this rank: rank 0 keeps them
                return ending
            silent = self.liveness.silent()
            if silent:
                self.silence = silent[0].seconds
                return "lost"
            if self.liveness.due():
                self._send(Heartbeat())
            for event in self.pool.poll(timeout):
                active = True
                self._send_event(event)
            if self.status is not None and self.status.due():
                self._send(Status(self.status.snapshot()))
            why = self.stop_signal()
            if why and not self.told_stop:
                self.told_stop = True
                self._send(StopRequest(why))
            if not self.stopping:
                active |= self._start_buffered()
                self._ask()
            if self.pool.capacity == 0 and self.pool.given_up and not self.told_broken:
                self.told_broken = True
                self._send(Broken("; ".join(sorted(set(self.pool.given_up.values())))))
                self._drop_buffer()
            if self.results and (not active or len(self.results) >= RESULTS_BATCH
                                 or self.clock.monotonic() - self.results_since >= RESULTS_SECONDS):
                self._send_results()
            timeout = backoff.next(active, 0.001 if self.asked else 0.02)

    def await_release(self) -> Optional[Release]:
        """After its :class:`Bye`: rank 0's :class:`Release`, or None when rank 0 fell silent."""
        while True:
            incoming = self.comm.poll()
            if incoming is None:
                silent = self.liveness.silent()
                if silent:
                    self.silence = silent[0].seconds
                    return None
                self.clock.sleep(0.005)
                continue
            self.liveness.heard_from(0)
            if isinstance(incoming[1], Release):
                return incoming[1]

    def _send(self, message: Any) -> None:
        if self.results:  # in order: what finished goes before what follows it (a request, a bye)
            self._send_results()
        self.liveness.send(message, 0)

    def _send_results(self) -> None:
        batch, lines, self.results, self.lines = self.results, self.lines, [], []
        self.liveness.send(Results(batch, lines) if len(batch) > 1 else Result(batch[0]), 0)

    def flush(self) -> None:
        """Send the finished items not sent yet (at the end of the run, before the :class:`Bye`)."""
        if self.results:
            self._send_results()

    def _drain_messages(self) -> Tuple[bool, Optional[str]]:
        active = False
        while True:
            incoming = self.comm.poll()
            if incoming is None:
                return active, None
            active = True
            self.liveness.heard_from(0)
            message = incoming[1]
            if isinstance(message, Items) and self.told_broken:  # crossed our "broken": give them back
                self._send(Dropped([handout.item.key for bundle in message.bundles for handout in bundle]))
                self.asked = False
            elif isinstance(message, Items):
                self.buffer.extend(message.bundles)
                self.plenty = message.plenty
                self.asked = False
                self.round_trip = 0.8 * self.round_trip + 0.2 * (self.clock.monotonic() - self.asked_at)
            elif isinstance(message, PoolReply):
                self.pool.deliver(message.requester, message.message)
            elif isinstance(message, Stop):
                self.stopping = True
                self.pool.revoke_queued()
                self._drop_buffer()
                if self.status is not None:  # what runs now: rank 0 draws what the stop's wait cuts off from it
                    self._send(Status(self.status.snapshot()))
            elif isinstance(message, End):
                self.end = message
                return True, message.outcome

    def _drop_buffer(self) -> None:
        if self.buffer:
            self._send(Dropped([handout.item.key for bundle in self.buffer for handout in bundle]))
            self.buffer.clear()

    def _send_event(self, event: Event) -> None:
        if event.kind == "returned":  # handed to a worker that died or was told to stop: run elsewhere
            handouts = [self.handed.pop(key) for key in event.keys]
            if not self.stopping:
                self.buffer.extendleft([handout] for handout in reversed(handouts))
                return
        handed = self.handed.pop(event.key, None)
        if event.kind == "done":
            record = event.record
            self.pace.observe(record.seconds)
            if not self.results:
                self.results_since = self.clock.monotonic()
            line = None  # not known here (no handout): rank 0 makes it
            if handed is not None:
                if handed.item.after:
                    record.params = handed.item.params  # as rank 0 journals it (see Leader._finished)
                line = result_line(record)
            self.results.append(record)
            self.lines.append(line)
            return
        self._send(event.as_message())

    def _start_buffered(self) -> bool:
        started = False
        depth = 2 if self.plenty and self.pace.short else 1
        while self.buffer:
            bundle = self.buffer[0]
            worker = self.pool.pick_worker(_avoided(bundle), depth)
            if worker is None:
                break
            self.buffer.popleft()
            room = self.pool.room(worker)  # --batch: a chunk from rank 0 is cut to what the worker may still run
            if room is not None and len(bundle) > room and not bundle[0].item.group:
                self.buffer.appendleft(bundle[room:])
                bundle = bundle[:room]
            for handout in bundle:
                self.handed[handout.item.key] = handout
            self.pool.assign(worker, bundle, bool(bundle[0].item.group))
            started = True
        return started

    def _ask(self) -> None:
        if self.asked or self.pool.capacity == 0:
            return
        need = max(0, len(self.pool.idle) - len(self.buffer))
        ahead = 1 + min(64, int(self.round_trip / max(self.pace.seconds, 1e-5)) + 1) if self.pace.short else 0
        prefetch = max(0, self.pool.capacity * (1 + ahead) - self.pool.queued - len(self.buffer) - need)
        if need > 0 or (self.plenty and prefetch > 0):
            self._send(Request(need, prefetch))
            self.asked = True
            self.asked_at = self.clock.monotonic()
