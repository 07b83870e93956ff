"""status.json: what a running job is doing, for ``python -m common.status`` on a login node, which
sees the results folder (a shared filesystem) but cannot reach the compute nodes.

Every rank but 0 sends rank 0 a small snapshot of its workers and GPUs every ``STATUS_SECONDS``
(one MPI message); rank 0 adds its own and the run's counts and rewrites the file atomically at the
same pace, from its distribution loop (so a file that stops changing means rank 0 stopped).
"""
from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from common import settings
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import EXIT_NO_PROGRESS, EXIT_OK, EXIT_STOPPED, error_line
from common.results.failures import WriteFailures
from common.results.layout import ResultsLayout
from common.results.outputs import atomic_write_json

FORMAT_VERSION = 1
#: how often the file is rewritten (and followers report); MULTINODE_GPU_STATUS_SECONDS overrides it
STATUS_SECONDS = settings.DEFAULTS.status_seconds
#: the rate (and so the ETA) is measured over this much recent time
RATE_WINDOW_SECONDS = 300.0
#: failures listed in the file (the count is always complete)
MAX_FAILURES_LISTED = 20
#: the first rewrites come sooner (after 0.5, 1, 2, 4 s, up to every STATUS_SECONDS): seconds into a
#: run, the status command showed the start's snapshot (workers "starting", nothing running) beside
#: the journal's results
FIRST_REFRESH_SECONDS = 0.5


def rank_snapshot(pool: Any, monitor: Any, clock: Clock = SYSTEM_CLOCK) -> Dict[str, Any]:
    """This rank's workers (the item each runs and since when) and its GPUs' recent use."""
    workers = []
    for name, worker in sorted(pool.workers.items()):
        running = worker.assigned[0] if worker.assigned else None
        entry = running.entries[0] if running and running.entries else None
        state = "running" if entry else "idle" if worker.ready else "starting"
        view = {"worker": name, "device": str(worker.device), "pid": worker.process.pid, "state": state}
        if entry is not None:
            # the pool dates what a worker runs from the previous answer (a queued item starts then)
            view.update(key=entry.item.key, attempt=entry.attempt, since=max(entry.handed, worker.watch.since_wall),
                        together=len(running.entries) if running.together else 1)
        workers.append(view)
    return {"rank": pool.rank, "host": pool.host, "time": clock.time(), "workers": workers,
            "given_up": dict(pool.given_up), "gpus": monitor.recent()}


class Cadence:
    """When the next snapshot or rewrite is due: at once, then after 0.5, 1, 2 and 4 s, then every
    ``every`` s. Rank 0's file and the followers' snapshots keep the same one: with followers on a
    plain ``every``, the file said their workers were "starting" for the first seconds of a run
    while they ran items."""

    def __init__(self, every: float, clock: Clock = SYSTEM_CLOCK):
        self.every, self.clock = every, clock
        self._next = 0.0
        self._gap = FIRST_REFRESH_SECONDS  # doubled after each, up to every

    def due(self) -> bool:
        now = self.clock.monotonic()
        if now < self._next:
            return False
        self._next = now + min(self._gap, self.every)
        self._gap *= 2
        return True


class RankReporter:
    """A follower's side: its loop asks ``due()`` and, when it is, sends ``snapshot()`` to rank 0."""

    def __init__(self, pool: Any, monitor: Any, every: float = STATUS_SECONDS, clock: Clock = SYSTEM_CLOCK):
        self.pool, self.monitor, self.clock = pool, monitor, clock
        self.every = every
        self._cadence = Cadence(self.every, clock)
        self._ready: Tuple[str, ...] = ()  # the workers ready at the last look

    def due(self) -> bool:
        """On the cadence, and as soon as a worker has become ready (or left): between two
        snapshots seconds apart, rank 0's file said a follower's workers were "starting" while
        they ran items."""
        ready = tuple(sorted(name for name, worker in getattr(self.pool, "workers", {}).items() if worker.ready))
        changed, self._ready = ready != self._ready, ready
        return self._cadence.due() or changed

    def snapshot(self) -> Dict[str, Any]:
        return rank_snapshot(self.pool, self.monitor, self.clock)


def _inode(folder: Path) -> Optional[int]:
    try:
        return os.stat(folder).st_ino
    except OSError:
        return None


class StatusWriter:
    """Rank 0's side: gathers the snapshots and keeps ``status.json`` current."""

    def __init__(self, results: Path, *, app: str, command: str, layout: List[dict], items_total: int,
                 items_resumed: int, started_at: float, pool: Any, monitor: Any, every: float = STATUS_SECONDS,
                 write_failures: Optional[WriteFailures] = None, resume_command: str = "", clock: Clock = SYSTEM_CLOCK):
        """``write_failures``: the run's (no status file once the results folder was moved away);
        ``resume_command``: what finishes the run, for a stopped or gone one whose summary was not
        written (a stop while the outputs were written); ``clock``: when it is due and what it says."""
        self.clock = clock
        self.path = ResultsLayout(Path(results)).status
        self.write_failures = write_failures or WriteFailures()
        self.every = every
        self.header = {"format": FORMAT_VERSION, "app": app, "command": command, "host": layout[0]["host"],
                       "pid": os.getpid(), "started": started_at, "every": self.every,
                       "items_total": items_total, "items_resumed": items_resumed, "resume_command": resume_command,
                       # where the folder was, and which it was (a bind mount shows it elsewhere): the status
                       # command of a moved or copied one says so beside the commands
                       "results_dir": str(Path(results).resolve()), "results_inode": _inode(Path(results)),
                       # where the commands were given (relative paths in them, a module found there)
                       "launch_dir": _launch_dir()}
        self.layout = layout
        self.pool, self.monitor = pool, monitor
        self.snapshots: Dict[int, Dict[str, Any]] = {}  # rank -> its last snapshot
        self.heard: Dict[int, float] = {entry["rank"]: started_at for entry in layout}
        # (time, items done this run) over the rate window
        self.done: Deque[Tuple[float, int]] = deque([(started_at, 0)])
        self.items_began: Optional[float] = None  # when the first item of this run that finished started
        self._cadence = Cadence(self.every, clock)

    def absorb(self, rank: int, snapshot: Dict[str, Any]) -> None:
        """A follower's snapshot (its "status" message)."""
        self.snapshots[rank] = snapshot
        self.heard[rank] = self.clock.time()

    def tick(self, leader: Any) -> None:
        """From rank 0's loop: rewrite the file when it is due."""
        if self._cadence.due():
            self.write(leader, "stopping" if leader.stopping else "running")

    def write(self, leader: Any, state: str, *, final: bool = False) -> None:
        """``final``: the run has ended: no worker of any rank runs anything any more (a follower's
        last snapshot, up to ``every`` s old, still said what its workers were running)."""
        failure = self.write_failures.first
        if failure is not None and failure.moved_away:  # never a status file in a folder made again by someone
            return
        now = self.clock.time()
        self.snapshots[0] = rank_snapshot(self.pool, self.monitor, self.clock)
        self.heard[0] = now
        scheduler = leader.scheduler
        this_run = len(leader.records)
        self.done.append((now, this_run))
        while len(self.done) > 2 and self.done[1][0] <= now - RATE_WINDOW_SECONDS:
            self.done.popleft()
        if self.items_began is None and this_run:  # the first results: when their items started
            self.items_began = min(record.start for record in leader.records.values())
        # no result can come before the first item started: the workers' start-up (torch's import, 3 s
        # and more) counted in the span made a short run's rate half what it was, and its ETA twice
        (window_start, first_done) = self.done[0]
        # a start told by a node whose clock runs ahead of this one's may lie in this one's future: not taken
        began = self.items_began if self.items_began is not None and self.items_began < now else window_start
        span = now - max(window_start, began)
        rate = (this_run - first_done) / span if span > 0 else 0.0
        remaining = scheduler.unresolved
        failed = list(scheduler.failed.items())
        status = {
            **self.header, "updated": now, "state": state, "stopping": leader.stopping,
            "items_done": len(scheduler.results), "items_this_run": this_run, "items_failed": len(failed),
            "items_running": len(scheduler.in_flight), "items_remaining": remaining,
            "rate_per_second": rate, "eta_seconds": remaining / rate if rate > 0 and remaining else None,
            "failures": [{"key": key, "error": error_line(error)}
                         for key, error in failed[-MAX_FAILURES_LISTED:]],
            "ranks": [{"rank": entry["rank"], "host": entry["host"], "heard": self.heard.get(entry["rank"]),
                       "broken": leader.broken.get(entry["rank"]),
                       "lost": _lost(leader, entry["rank"])} for entry in self.layout],
            "workers": [w for rank in sorted(self.snapshots) for w in self._workers(rank, final)],
            "gpus": [{"rank": rank, "host": snap["host"], **gpu}
                     for rank, snap in sorted(self.snapshots.items()) for gpu in snap["gpus"]],
        }
        try:
            atomic_write_json(self.path, status, parents=False)
        except OSError:  # a full disk, or a folder moved away: both show through the journal, which stops
            pass  # the run; the status file simply goes stale

    def running_attempts(self, leaving_out: Set[int] = frozenset()) -> List[Dict[str, Any]]:
        """What each rank's workers run, as each rank last said (rank 0's own: now), but the ranks
        ``leaving_out`` (lost: their last word is stale, their items went to others): the worker,
        the item's key and since when (epoch seconds)."""
        self.snapshots[0] = rank_snapshot(self.pool, self.monitor, self.clock)
        return [{"worker": w["worker"], "key": w["key"], "since": w["since"]}
                for rank, snapshot in sorted(self.snapshots.items()) if rank not in leaving_out
                for w in snapshot["workers"] if w.get("state") == "running" and "key" in w and "since" in w]

    def finished(self, leader: Any, code: int, error: str = "") -> None:
        """The last write, with the run's outcome from its exit code; ``error``: why rank 0 itself
        failed (a bug of the engine or the app, whose traceback is in its log)."""
        if error:
            self.header["error"] = error
        if code == EXIT_NO_PROGRESS:  # stopped, and a requeue with the same --time would only repeat it
            self.header["no_progress"] = True
        self.write(leader, {EXIT_OK: "complete", EXIT_STOPPED: "stopped", EXIT_NO_PROGRESS: "stopped"}.get(code, "failed"),
                   final=True)

    def _workers(self, rank: int, final: bool) -> List[Dict[str, Any]]:
        snapshot = self.snapshots[rank]
        given_up = [{"worker": name, "state": "given up", "error": error}
                    for name, error in snapshot.get("given_up", {}).items()]
        workers = snapshot["workers"]
        if final:
            workers = [{"worker": w["worker"], "device": w["device"], "pid": w["pid"], "state": "ended"} for w in workers]
        return [{"rank": rank, "host": snapshot["host"], **w} for w in workers + given_up]



def _launch_dir() -> Optional[str]:
    try:
        return os.getcwd()
    except OSError:
        return None


def _lost(leader: Any, rank: int) -> Optional[str]:
    """Why rank 0 carried on without ``rank`` (no message for --heartbeat-timeout s), else None."""
    lost = leader.lost.get(rank)
    return lost.get("why", "lost") if lost else None
