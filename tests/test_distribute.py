"""The leader's logic (common.ranks.distribute) without processes: the real Leader and Followers, one
thread per rank taking turns, over common.testing.inprocess's world and simulated workers, on a fake clock
(heartbeat timeouts and item durations are simulated seconds). Each test takes well under a second. The
same behaviours with real processes: tests/test_engine.py, test_lost_rank.py, test_vcluster_faults.py."""
from __future__ import annotations

import errno
import json
import types
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from common.devices import Device
from common.errors import EXIT_FAILED_ITEMS, EXIT_OK, EXIT_STOPPED, ItemFailed
from common.items import Item
from common.messages import Answers, End, ItemDone, Results, Stop
from common.observe.progress import Progress
from common.ranks.distribute import Follower, Leader
from common.ranks.liveness import FollowerWatch, PeerWatch
from common.ranks.scheduler import Scheduler
from common.results.failures import WriteFailures
from common.results.journal import _ENCODER, _RECORD_FIELDS, Journal
from common.results.outputs import to_jsonable
from common.testing.inprocess import FakeClock, InProcessWorld, SimulatedPool, Turns, fake_time, instant
from common.workers.pool import Assigned, Bundle, PoolSettings, WorkerHandle, WorkerPool
from common.workers.watchdog import Kill


def sleeper(seconds: float) -> Callable:
    """Items that take ``seconds`` (simulated) and return their key."""
    return lambda item, attempt, worker: ("done", item.key, seconds)


def no_dependencies(item: Item, results: Dict[str, Any]) -> Item:
    return item


@dataclass
class Sim:
    """One simulated run: ranks x workers, the real Leader at rank 0 and a real Follower elsewhere."""

    tmp_path: Path
    items: List[Item]
    ranks: int = 3
    workers: int = 2
    behave: Dict[int, Callable] = field(default_factory=dict)  # rank -> behave (default: instant)
    retries: int = 1
    heartbeat_timeout: float = 1.0
    follower_timeouts: Dict[int, float] = field(default_factory=dict)  # rank -> its own timeout
    grace: float = 5.0
    complete: Callable = no_dependencies
    at: List[Tuple[float, Callable[["Sim"], None]]] = field(default_factory=list)  # (time, action)
    stop_at: Optional[float] = None
    tick: float = 0.001
    batch: Optional[int] = None  # --batch
    write_failures: WriteFailures = field(default_factory=WriteFailures)  # rank 0's stop flag reads it
    stop_after_failures: Optional[int] = None  # --stop-after-failures
    first_result: Optional[Callable] = None  # the app's first_result_warning

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.turns = Turns(self.clock, self.tick, limit=120.0)
        self.time = fake_time(self.clock, self.turns)  # the clock every rank's loop reads and sleeps on
        self.world = InProcessWorld(self.ranks)
        self.world.comm(0).keep_sent = True
        self.pools = [SimulatedPool(rank, self.workers, self.clock, self.behave.get(rank, instant), self.turns,
                                    batch=self.batch)
                      for rank in range(self.ranks)]
        self.pools[0].on_poll = self._actions
        self.scheduler = Scheduler(self.items, {}, self.retries, self.complete)
        self.journal = Journal(self.tmp_path / "journal.jsonl", {"fingerprint": {}})
        progress = Progress(len(self.items), 0, "sim", enabled=False)
        started = self.clock.now

        def stop_signal() -> Optional[str]:
            if self.stop_at is not None and self.clock.now - started >= self.stop_at:
                return "SIGTERM"
            failure = self.write_failures.first
            return failure.describe() if failure is not None else None

        self.started = started
        liveness = FollowerWatch(self.world.comm(0), self.heartbeat_timeout,
                                 {rank: f"node{rank}" for rank in range(self.ranks)}, clock=self.time)
        self.leader = Leader(self.world.comm(0), self.pools[0], self.scheduler, self.journal, progress=progress,
                             liveness=liveness, stop_signal=stop_signal, grace=self.grace,
                             total_capacity=self.ranks * self.workers, clock=self.time,
                             write_failures=self.write_failures, stop_after_failures=self.stop_after_failures,
                             first_result=self.first_result)
        self.followers = [Follower(self.world.comm(rank), self.pools[rank], lambda: None,
                                   PeerWatch(self.world.comm(rank), [0], self.follower_timeouts.get(rank, self.heartbeat_timeout),
                                             clock=self.time), clock=self.time)
                          for rank in range(1, self.ranks)]
        self.ended_at: Dict[int, float] = {}

    def _actions(self) -> None:
        while self.at and self.clock.now - self.started >= self.at[0][0]:
            self.at.pop(0)[1](self)

    def _timed(self, rank: int, run: Callable[[], str]) -> Callable[[], str]:
        def wrapped() -> str:
            try:
                return run()
            finally:
                self.ended_at[rank] = self.clock.now - self.started
        return wrapped

    def run(self) -> List[str]:
        """Every rank's outcome, rank 0's first."""
        self.at.sort(key=lambda entry: entry[0])
        outcomes = self.turns.run([self._timed(0, self.leader.run)] +
                                  [self._timed(f.comm.rank, f.run) for f in self.followers])
        self.journal.close()
        return outcomes

    def results(self) -> List[dict]:
        return [entry for entry in self.journal_entries() if entry["type"] == "result"]

    def journal_entries(self) -> List[dict]:
        return [json.loads(line) for line in (self.tmp_path / "journal.jsonl").read_text().splitlines()]

    def ran(self) -> List[Tuple[str, int, str]]:
        """(key, attempt, worker) of every attempt that finished, on every rank."""
        return [entry for pool in self.pools for entry in pool.ran]

    def sent_by_leader(self, kind: type, rank: int) -> list:
        return [m for dest, m in self.world.comm(0).sent if dest == rank and isinstance(m, kind)]


def items(count: int, prefix: str = "i") -> List[Item]:
    return [Item(f"{prefix}{n:03d}") for n in range(count)]


def test_every_item_is_handed_out_once_and_faster_ranks_get_more(tmp_path):
    sim = Sim(tmp_path, items(300), ranks=3, workers=2,
              behave={0: sleeper(0.02), 1: sleeper(0.02), 2: sleeper(0.005)})
    assert sim.run() == ["complete", "done", "done"]
    keys = [key for key, _, _ in sim.ran()]
    assert sorted(keys) == sorted(item.key for item in sim.items)  # each ran exactly once
    assert sorted(r["key"] for r in sim.results()) == sorted(keys)  # and was journaled once
    per_rank = {rank: len(pool.ran) for rank, pool in enumerate(sim.pools)}
    assert per_rank[2] > 2 * max(per_rank[0], per_rank[1]), per_rank
    assert min(per_rank.values()) > 0, per_rank
    assert sim.leader.code == EXIT_OK and not sim.leader.lost
    assert all(sim.sent_by_leader(End, rank) == [End("done", EXIT_OK)] for rank in (1, 2))


def test_the_first_result_kept_is_checked_once_and_a_check_that_raises_stops_nothing(tmp_path, capsys):
    """App.first_result_warning sees the first result rank 0 keeps, from any rank, once; what it
    says is printed with rank 0's tag; an app whose check raises loses its warning, not the run."""
    seen = []

    def check(result):
        seen.append(result)
        return "the first result looks wrong"

    sim = Sim(tmp_path, items(40), ranks=3, workers=2, first_result=check)
    assert sim.run() == ["complete", "done", "done"]
    assert len(seen) == 1 and seen[0] in [entry["result"] for entry in sim.results()]
    said = [line for line in capsys.readouterr().err.splitlines() if "the first result looks wrong" in line]
    assert len(said) == 1 and said[0].startswith("[rank 0 "), said

    def broken(result):
        raise KeyError("a bug in the app's check")

    (tmp_path / "broken").mkdir()
    failing = Sim(tmp_path / "broken", items(40), ranks=2, workers=2, first_result=broken)
    assert failing.run() == ["complete", "done"]
    assert len(failing.results()) == 40 and failing.leader.code == EXIT_OK
    said = [line for line in capsys.readouterr().err.splitlines() if "check of the first result" in line]
    assert len(said) == 1 and "failed (KeyError: \"a bug in the app's check\"; the traceback is in the rank's log): " \
        "the run goes on" in said[0], said


def test_short_items_travel_in_chunks_and_each_runs_once(tmp_path):
    sim = Sim(tmp_path, items(2000), ranks=3, workers=2)  # instant items
    assert sim.run() == ["complete", "done", "done"]
    assert sorted(key for key, _, _ in sim.ran()) == sorted(item.key for item in sim.items)
    assert len(sim.results()) == 2000


def test_a_failing_attempt_is_retried_on_another_worker_then_failed_for_good(tmp_path):
    def behave(item: Item, attempt: int, worker: str):
        if item.key == "flaky" and attempt == 1:
            return "failed", "RuntimeError: first time", 0.01
        if item.key == "broken":
            return "failed", f"RuntimeError: always ({worker})", 0.01
        if item.key == "refused":  # its code says a retry would fail the same way
            return "failed", ItemFailed("item refused returned a float", retry=False, shown_as="TypeError"), 0.01
        return "done", item.key, 0.01

    work = items(20) + [Item("flaky"), Item("broken"), Item("refused")]
    sim = Sim(tmp_path, work, retries=2, behave={rank: behave for rank in range(3)})
    assert sim.run() == ["complete", "done", "done"]
    attempts = {key: [(attempt, worker) for k, attempt, worker in sim.ran() if k == key]
                for key in ("flaky", "broken", "refused")}
    assert [a for a, _ in attempts["flaky"]] == [1, 2]
    assert attempts["flaky"][0][1] != attempts["flaky"][1][1]  # retried elsewhere
    assert [a for a, _ in attempts["broken"]] == [1, 2, 3]  # --retries 2: three attempts, then failed
    assert attempts["broken"][1][1] != attempts["broken"][0][1]  # avoiding the worker it failed on (a preference)
    assert [a for a, _ in attempts["refused"]] == [1]  # failed for good at once, --retries 2 or not
    assert "flaky" in sim.scheduler.results and sorted(sim.scheduler.failed) == ["broken", "refused"]
    entries = sim.journal_entries()
    assert sorted(e["key"] for e in entries if e["type"] == "failed") == ["broken", "refused"]
    assert sum(e["type"] == "attempt_failed" for e in entries) == 5
    assert sim.leader.code == EXIT_FAILED_ITEMS
    assert all(sim.sent_by_leader(End, rank) == [End("done", EXIT_FAILED_ITEMS)] for rank in (1, 2))


def test_an_item_failed_of_a_users_own_making_keeps_its_defaults():
    """A subclass whose __init__ skips ItemFailed's (as one written before retry= would) is retried
    and named by its class; ItemFailed takes any arguments, as an Exception does."""
    from common.errors import described

    class Diverged(ItemFailed):
        def __init__(self, where: str):
            Exception.__init__(self, f"loss diverged at {where}")

    mine = Diverged("epoch 3")
    assert mine.retry is True and described(mine) == "Diverged: loss diverged at epoch 3"
    assert ItemFailed("a", "b").args == ("a", "b") and ItemFailed().retry is True
    refused = ItemFailed("item x=1 returned a float", retry=False, shown_as="TypeError")
    assert not refused.retry and described(refused) == "TypeError: item x=1 returned a float"


def _broken(item: Item, attempt: int, worker: str):
    """Every item fails (a bug in the function), after a simulated second."""
    return "failed", f"RuntimeError: a bug ({item.key})", 1.0


def test_stop_after_failures_stops_handing_out_items_once_that_many_failed_for_good(tmp_path):
    """A bug that fails every item: the run stops after 3 failures (each after its retry), not after
    all 300 items (the allocation spent); a failure during the grace is dropped (run on --resume),
    not counted. It ends "stopped" with the failed items' exit code: Slurm does not requeue it."""
    sim = Sim(tmp_path, items(300), retries=1, stop_after_failures=3, behave={rank: _broken for rank in range(3)})
    assert sim.run() == ["stopped", "halt", "halt"]
    assert sim.leader.gave_up and sim.leader.stopping == "3 items failed for good (--stop-after-failures 3)"
    assert len(sim.scheduler.failed) == 3
    assert len(sim.ran()) < 3 * 2 + 6 * 2  # the 3 failures' attempts, and at most two rounds of the 6 workers besides
    entries = sim.journal_entries()
    assert [e["why"] for e in entries if e["type"] == "stop"] == [sim.leader.stopping]
    # the timeline draws the attempts the stop ended (dropped, run on --resume) as stopped, not failed:
    # red bars beside "0 failed" read as failures (a pipeline stopped by Ctrl-C)
    bars = [bar for bar in sim.leader.timeline_bars() if not bar["ok"]]
    failed_attempts = [e for e in entries if e["type"] == "attempt_failed"]
    assert sum(bar["why"] == "failed" for bar in bars) == len(failed_attempts)
    assert sum(bar["why"] == "stopped" for bar in bars) == len(bars) - len(failed_attempts) > 0


def test_a_signal_ends_the_wait_of_a_stop_after_failures_at_once(tmp_path):
    """The stop line says "a stop signal ends the wait": the first one does (it was taken as the
    first of two and ignored: the run waited out the items' 100 s)."""
    def one_fails(item: Item, attempt: int, worker: str):
        return _broken(item, attempt, worker) if item.key == "i000" else ("done", item.key, 100.0)

    sim = Sim(tmp_path, items(30), ranks=1, workers=2, retries=0, stop_after_failures=1, grace=60.0, stop_at=5.0,
              behave={0: one_fails})
    assert sim.run() == ["stopped"]
    assert sim.leader.gave_up and sim.ended_at[0] < 6.0 and sim.leader.cut_off == 1


def test_stop_after_failures_with_nothing_left_to_hand_out_lets_the_run_end_as_it_would(tmp_path):
    """The limit reached while the last items run: stopping would only leave the run without its
    outputs (a stopped run writes none), so it ends failed, its outputs written."""
    def first_fails(item: Item, attempt: int, worker: str):
        return _broken(item, attempt, worker) if item.key == "i000" else ("done", item.key, 5.0)

    sim = Sim(tmp_path, items(2), ranks=1, workers=2, retries=0, stop_after_failures=1, behave={0: first_fails})
    assert sim.run() == ["complete"]
    assert not sim.leader.gave_up and sim.leader.code == EXIT_FAILED_ITEMS and len(sim.results()) == 1


def test_stop_after_failures_reached_by_the_last_item_ends_the_run_as_failed_not_stopped(tmp_path):
    def last_fails(item: Item, attempt: int, worker: str):
        return _broken(item, attempt, worker) if item.key == "i009" else ("done", item.key, 0.01)

    sim = Sim(tmp_path, items(10), ranks=1, workers=1, retries=0, stop_after_failures=1,
              behave={0: last_fails})
    assert sim.run() == ["complete"]
    assert not sim.leader.gave_up and sim.leader.code == EXIT_FAILED_ITEMS and len(sim.results()) == 9


def test_a_later_wave_runs_after_what_it_waits_for_and_is_built_from_its_results(tmp_path):
    first = [Item(f"a{n}", {"value": n}) for n in range(6)]
    second = [Item(f"b{n}", after=(f"a{n}", f"a{(n + 1) % 6}")) for n in range(6)]
    final = [Item("c", after=tuple(item.key for item in second))]

    def complete(item: Item, results: Dict[str, Any]) -> Item:
        return Item(item.key, {"value": sum(results.values())}, after=item.after)

    def behave(item: Item, attempt: int, worker: str):
        return "done", item.params["value"], 0.01 * (1 + len(item.key))

    sim = Sim(tmp_path, final + second + first, complete=complete,
              behave={rank: behave for rank in range(3)})
    assert sim.run() == ["complete", "done", "done"]
    results = sim.scheduler.results
    assert [results[f"b{n}"] for n in range(6)] == [n + (n + 1) % 6 for n in range(6)]
    assert results["c"] == 2 * sum(range(6))
    records = sim.leader.records
    for item in second + final:
        assert all(records[item.key].start >= records[dep].end for dep in item.after), item.key
    assert {r["key"]: r["params"] for r in sim.results()}["c"] == {"value": 30}  # what --resume checks


def test_the_lines_followers_make_are_the_lines_rank_0_would_make(tmp_path):
    """A follower sends each result's journal line with it and rank 0 only appends it: the journal
    holds, for every record rank 0 keeps, the line the general encoder makes of that record (a later
    wave's params, which rank 0 built, included)."""
    first = [Item(f"a{n:02d}", {"value": n}) for n in range(60)]
    second = [Item(f"b{n:02d}", after=(f"a{n:02d}",)) for n in range(60)]

    def complete(item: Item, results: Dict[str, Any]) -> Item:
        return Item(item.key, {"value": sum(results.values()), "mixed": [0.1, "\u00e9\n", None]}, after=item.after)

    def behave(item: Item, attempt: int, worker: str):
        return "done", {"v": item.params["value"], "text": "\u00fc\"x"} if item.after else item.params["value"], 0.0

    sim = Sim(tmp_path, first + second, complete=complete, behave={rank: behave for rank in range(3)})
    for rank in (1, 2):
        sim.world.comm(rank).keep_sent = True
    assert sim.run() == ["complete", "done", "done"]
    made = [line for rank in (1, 2) for _, message in sim.world.comm(rank).sent if isinstance(message, Results)
            for line in message.lines]
    assert made and all(line is not None for line in made)  # the followers made lines, rank 0 took them
    journaled = {json.loads(line)["key"]: line.encode()
                 for line in (tmp_path / "journal.jsonl").read_text().splitlines() if '"type":"result"' in line}
    assert sorted(journaled) == sorted(item.key for item in first + second)
    for key, record in sim.leader.records.items():
        entry = {"type": "result", **{name: getattr(record, name) for name in _RECORD_FIELDS}}
        assert journaled[key] == _ENCODER.encode(to_jsonable(entry)).encode(), key
    assert json.loads(journaled["b07"])["params"] == {"value": 7, "mixed": [0.1, "\u00e9\n", None]}


def test_a_silent_rank_is_lost_and_its_items_finish_elsewhere(tmp_path):
    sim = Sim(tmp_path, items(60), heartbeat_timeout=0.5,
              behave={rank: sleeper(0.1) for rank in range(3)},
              at=[(0.25, lambda s: s.world.cut(2))])
    outcomes = sim.run()
    assert outcomes == ["complete", "done", "lost"]
    assert list(sim.leader.lost) == [2]
    lost = sim.leader.lost[2]
    assert lost["host"] == "node2" and lost["items_reassigned"] >= 1
    assert sim.followers[1].silence > 0.5 and sim.ended_at[2] <= 0.25 + 0.5 + 0.01  # it gave rank 0 up, in time
    assert sorted(r["key"] for r in sim.results()) == sorted(item.key for item in sim.items)  # each once
    event = [e for e in sim.journal_entries() if e["type"] == "rank_lost"]
    assert len(event) == 1 and event[0]["rank"] == 2 and len(event[0]["items"]) == lost["items_reassigned"]
    for key in event[0]["items"]:  # what it held ran on the others
        assert sim.leader.records[key].rank in (0, 1)
    assert sim.sent_by_leader(End, 2) == []  # nothing more goes to a lost rank
    assert sim.leader.code == EXIT_OK


def test_followers_that_hear_nothing_from_rank_0_stop_by_themselves(tmp_path):
    sim = Sim(tmp_path, items(40), heartbeat_timeout=0.5,
              behave={rank: sleeper(0.1) for rank in range(3)},
              at=[(0.2, lambda s: s.world.cut(0))])
    outcomes = sim.run()
    assert outcomes == ["complete", "lost", "lost"]  # rank 0 goes on alone
    for follower in sim.followers:
        assert 0.5 <= follower.silence <= 0.6
        assert sim.ended_at[follower.comm.rank] <= 0.2 + 0.6
    assert sorted(sim.leader.lost) == [1, 2]
    assert sorted(r["key"] for r in sim.results()) == sorted(item.key for item in sim.items)
    assert {sim.leader.records[r["key"]].rank for r in sim.results()[-5:]} == {0}


def test_a_lost_rank_that_comes_back_has_its_late_results_kept_once_and_is_told_to_end(tmp_path):
    # ranks 0 and 1 are slow (0.5 s an item), rank 2 fast (0.3 s): the items rank 2 held when its link
    # dropped finish there (0.3 s) before the survivors, busy until 0.5 s, can run them again
    sim = Sim(tmp_path, items(30), heartbeat_timeout=0.1, follower_timeouts={2: 5.0},
              behave={0: sleeper(0.5), 1: sleeper(0.5), 2: sleeper(0.3)},
              at=[(0.05, lambda s: s.world.cut(2)), (0.2, lambda s: s.world.restore(2))])
    assert sim.run() == ["complete", "done", "halt"]
    assert list(sim.leader.lost) == [2] and "told_to_end" not in sim.leader.lost[2]  # the summary's record only
    assert sim.sent_by_leader(End, 2) == [End("halt", EXIT_STOPPED)]  # once
    late = [key for key, record in sim.leader.records.items() if record.rank == 2]
    assert late and set(late) <= set(next(e for e in sim.journal_entries() if e["type"] == "rank_lost")["items"])
    assert sorted(r["key"] for r in sim.results()) == sorted(item.key for item in sim.items)  # once each
    # they came back before any survivor was free to run them again: taken off the ready list
    assert sorted(key for key, _, _ in sim.ran()) == sorted(item.key for item in sim.items)
    assert sim.leader.code == EXIT_OK


def test_a_stop_lets_running_items_finish_and_gives_back_what_never_started(tmp_path):
    sim = Sim(tmp_path, items(2000), behave={rank: sleeper(0.002) for rank in range(3)},
              stop_at=0.1)
    assert sim.run() == ["stopped", "halt", "halt"]
    assert sim.leader.code == EXIT_STOPPED
    assert all(sim.sent_by_leader(Stop, rank) and sim.sent_by_leader(End, rank)[-1] == End("halt", EXIT_STOPPED)
               for rank in (1, 2))
    assert sim.ended_at[0] < 0.1 + 0.05  # the running items took 2 ms, not the 5 s grace
    done = {r["key"] for r in sim.results()}
    assert 0 < len(done) < 2000 and done == set(sim.scheduler.results)
    assert not sim.scheduler.in_flight and not sim.scheduler.failed
    assert len(done) + sim.scheduler.ready_count == 2000  # the rest is ready again for --resume
    assert sum(pool.revoked for pool in sim.pools) > 0  # queued items were taken back from workers
    assert any(e["type"] == "stop" for e in sim.journal_entries())


def test_a_stop_waits_for_running_items_no_longer_than_the_grace(tmp_path):
    sim = Sim(tmp_path, items(12), behave={rank: sleeper(10.0) for rank in range(3)},
              stop_at=0.5, grace=2.0)
    assert sim.run() == ["stopped", "halt", "halt"]
    assert 2.5 <= sim.ended_at[0] <= 2.6
    assert not sim.scheduler.results and not sim.scheduler.failed  # they run again on --resume


def test_the_simulator_places_items_by_the_real_pools_policy_batch_included(tmp_path):
    """SimulatedPool and WorkerPool pick the same worker in the same state, --batch's rule
    included (a worker handed its batch gets nothing more, even when it is the idle one)."""
    real = WorkerPool(None, [], PoolSettings(rank=0, host="node0", logs_dir=tmp_path, seed=0, threads=1, batch=2))
    simulated = SimulatedPool(0, 3, FakeClock(), batch=2)
    names = list(simulated.workers)
    real.workers = {name: WorkerHandle(name, Device("cpu", 0), None, None, ready=True) for name in names}
    # (handed so far, bundles queued) per worker, workers to avoid, depth -> the expected choice
    cases = [([(0, 0), (0, 0), (0, 0)], (), 1, names[0]),
             ([(0, 0), (0, 0), (0, 0)], (names[0],), 1, names[1]),
             ([(1, 1), (2, 0), (0, 1)], (), 2, names[0]),  # the idle one has had its batch
             ([(2, 1), (2, 0), (1, 1)], (names[2],), 2, names[2]),  # avoided, but the only one left
             ([(2, 0), (2, 1), (2, 0)], (), 2, None)]
    for state, avoid, depth, expected in cases:
        for pool in (real, simulated):
            for name, (handed, queued) in zip(names, state):
                pool.workers[name].handed_total = handed
                pool.workers[name].assigned = deque([["bundle"]] * queued)
        chosen = [pool.pick_worker(avoid, depth) for pool in (real, simulated)]
        assert [worker.name if worker else None for worker in chosen] == [expected, expected], (state, avoid)
    real.selector.close()

    sim = Sim(tmp_path, items(40), ranks=1, workers=2, behave={0: sleeper(0.01)}, batch=4)
    assert sim.run() == ["complete"]
    assert sorted(key for key, _, _ in sim.ran()) == sorted(item.key for item in sim.items)
    assert sim.pools[0].retired == 10  # 40 items, 4 per worker process


def test_an_item_whose_output_finds_no_space_stops_the_run_by_its_errno_not_its_text(tmp_path, monkeypatch, capsys):
    """An item raises ENOSPC: rank 0 notes it in the run's WriteFailures (no other run's),
    stops, and neither retries nor fails the item; an error that only quotes "[Errno 28]" is an
    ordinary failure."""
    def behave(item: Item, attempt: int, worker: str):
        if item.key == "i050":
            return "failed", OSError(errno.ENOSPC, "No space left on device", "/out/model.pt"), 0.01
        if item.key == "i010":
            return "failed", "RuntimeError: OSError: [Errno 28] No space left on device: '/x'", 0.01
        return "done", item.key, 0.01

    elsewhere = WriteFailures()
    sim = Sim(tmp_path, items(200), behave={rank: behave for rank in range(3)}, retries=5)
    assert sim.run() == ["stopped", "halt", "halt"]
    failure = sim.write_failures.first
    assert failure is not None and failure.no_space and elsewhere.first is None
    assert failure.describe().startswith("cannot write an output of item i050 on rank")
    assert failure.describe().endswith("'/out/model.pt' (No space left on device)")
    assert "i050" not in sim.scheduler.failed and "i050" not in sim.scheduler.results
    attempts = [e for e in sim.journal_entries() if e["type"] == "attempt_failed"]
    assert all(e["key"] == "i010" for e in attempts) and attempts  # retried as an ordinary failure
    # no signal stopped it: its first ends the wait (common.signals.StopFlag.urgent), not "the same signal again"
    stop_line = [line for line in capsys.readouterr().err.splitlines() if "handing out no more items" in line]
    assert len(stop_line) == 1 and "(a stop signal ends the wait" in stop_line[0], stop_line


def test_a_stop_says_how_many_items_it_waits_for_and_none_when_none_runs(tmp_path, capsys):
    waiting = Sim(tmp_path / "a", items(12), behave={rank: sleeper(10.0) for rank in range(3)}, stop_at=0.5, grace=2.0)
    waiting.run()
    assert ("SIGTERM: handing out no more items; waiting up to 2 s for the 6 items handed out to finish or come back "
            "(the same signal again, 2 s or more later, ends the wait: they run again on --resume)\n") in capsys.readouterr().err
    at_once = Sim(tmp_path / "b", items(12), stop_at=0.0)  # before anything was handed out
    assert at_once.run()[0] == "stopped"
    assert "SIGTERM: handing out no more items; none is running\n" in capsys.readouterr().err


def test_no_worker_anywhere_fails_every_item_once_later_waves_too_and_leaves_none_ready():
    """fail_remaining: each unresolved item fails once with the reason given, a later wave's too
    (it used to be made ready, or built from no results, when its last dependency failed, and so
    failed, or was reported, twice), and nothing is left to hand out."""
    def build(item: Item, results: Dict[str, Any]) -> Item:
        if not results:
            raise ValueError("nothing to build it from")
        return item

    waves = [Item("a", {}), Item("b", {}), Item("c", {}, after=("a", "b"))]
    scheduler = Scheduler(waves, {}, 1, build)
    scheduler.fail_remaining("no worker could start: no driver")
    assert scheduler.pop_new_failures() == ["a", "b", "c"]
    assert set(scheduler.failed.values()) == {"no worker could start: no driver"}
    assert scheduler.ready_count == 0 and scheduler.take() is None and scheduler.all_resolved()


class _DeadProcess:
    """What the pool's exit handling reads of a worker process it killed."""

    pid, exitcode, sentinel = 12345, -9, object()

    def join(self, timeout: float) -> None:
        pass


class _ClosedPipe:
    def close(self) -> None:
        pass


def _killed_chunk_worker(tmp_path: Path, kind: str, finished: int):
    """A pool whose one worker runs the chunk A, B, C and was killed (``kind``) for B, A finished
    before it with its answer held back (a chunk's answers travel together)."""
    pool = WorkerPool(None, [], PoolSettings(rank=0, host="node0", logs_dir=tmp_path, seed=0, threads=1))
    pool.closing = True  # no new worker is started in its place
    entries = [Assigned(Item(key, {}), 1) for key in "ABC"]
    worker = WorkerHandle("rank0-cpu0", Device("cpu", 0), _DeadProcess(), _ClosedPipe(), ready=True)
    worker.assigned.append(Bundle(entries, together=False, size=3))
    worker.watch.running, worker.finished = entries[0], types.SimpleNamespace(value=finished)
    why = "timed out after 0.3 s (--item-timeout)" if kind == "timeout" else "worker silent for 9 s"
    worker.watch.killed = Kill(why, kind, ("B",))
    pool.workers[worker.name] = worker
    return pool, worker


def test_a_chunks_answers_during_a_timeout_kill_keep_the_item_before_and_fail_the_one_killed(tmp_path):
    """B ran past --item-timeout; A's held-back answer and B's, sent together during the stack
    dump, arrive: A is kept, B fails (the item the run said it killed, counted), C goes back."""
    pool, worker = _killed_chunk_worker(tmp_path, "timeout", finished=2)
    events: list = []
    pool._handle(worker, Answers([ItemDone("A", {"v": 1}, 1.0, 1.1), ItemDone("B", {"v": 2}, 1.1, 1.6)]), events)
    pool._on_exit(worker, events)
    assert [(e.kind, e.key or e.keys) for e in events] == [("done", "A"), ("failed", "B"), ("returned", ("C",))]
    assert events[1].error.startswith("timed out after 0.3 s") and events[1].failure == "timeout"


def test_what_a_worker_ran_after_the_group_it_was_killed_for_goes_back(tmp_path):
    """mnist_svm's folds run as a group: the group A+B ran past --item-timeout, answered late during
    the stack dump (not kept), and the worker went on to the next group C+D, queued behind it. C's
    answer raised "answered C, which it was not running": a traceback, and a run left "running".
    Now it is not kept either; the worker's exit fails A and B (timed out) and gives C and D back."""
    pool = WorkerPool(None, [], PoolSettings(rank=0, host="node0", logs_dir=tmp_path, seed=0, threads=1))
    pool.closing = True
    first, second = ([Assigned(Item(key, {}), 1) for key in keys] for keys in ("AB", "CD"))
    worker = WorkerHandle("rank0-cpu0", Device("cpu", 0), _DeadProcess(), _ClosedPipe(), ready=True)
    worker.assigned.extend([Bundle(first, together=True, size=2), Bundle(second, together=True, size=2)])
    worker.watch.running, worker.finished = first[0], types.SimpleNamespace(value=3)
    worker.watch.killed = Kill("timed out after 0.15 s (--item-timeout)", "timeout", ("A", "B"))
    pool.workers[worker.name] = worker
    events: list = []
    pool._handle(worker, Answers([ItemDone("A", {}, 1.0, 1.2), ItemDone("B", {}, 1.0, 1.2)]), events)
    pool._handle(worker, Answers([ItemDone("C", {}, 1.2, 1.3)]), events)
    assert events == []
    pool._on_exit(worker, events)
    assert [(e.kind, e.key or e.keys) for e in events] == [("failed", "A"), ("failed", "B"), ("returned", ("C", "D"))]
    assert {e.failure for e in events[:2]} == {"timeout"}
    # an answer for an item it was never given is still a bug, said loudly
    worker.assigned.append(Bundle([Assigned(Item("E", {}), 1)], together=False, size=1))
    with pytest.raises(RuntimeError, match="answered Z, which it was not running"):
        pool._handle(worker, ItemDone("Z", {}, 1.0, 1.1), [])


def test_an_item_killed_for_its_timeout_fails_when_it_finished_but_its_answer_died_with_it(tmp_path):
    """B ran past --item-timeout and finished during the stack dump (the shared counter says A and B
    finished), but the SIGKILL came before their answers left: B fails, as the run said when it
    killed it; A (finished, unanswered) and C go back uncounted. (Seen in CI under load: B went back
    uncounted, ran again, and was kept.)"""
    pool, worker = _killed_chunk_worker(tmp_path, "timeout", finished=2)
    events: list = []
    pool._on_exit(worker, events)
    assert [(e.kind, e.key or e.keys) for e in events] == [("failed", "B"), ("returned", ("A", "C"))]
    assert events[0].failure == "timeout"


def test_a_worker_killed_silent_in_a_chunk_fails_the_item_it_ran_and_gives_back_the_rest(tmp_path):
    """Killed for silence while running B, A finished (its answer died with the worker): B fails,
    A and C go back uncounted, as before the answers of a timeout kill were judged."""
    pool, worker = _killed_chunk_worker(tmp_path, "silent", finished=1)
    events: list = []
    pool._on_exit(worker, events)
    assert [(e.kind, e.key or e.keys) for e in events] == [("failed", "B"), ("returned", ("A", "C"))]
