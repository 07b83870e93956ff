"""common.ranks.liveness and common.workers.watchdog on their own, on a simulated clock given to them (no real
waiting): heartbeats and silence between ranks over common.testing.inprocess's message world, and the
watchdog's time limit on a worker (a real process to kill)."""
from __future__ import annotations

import signal
import subprocess
from typing import Any, List

from common.devices import Device
from common.items import Item
from common.messages import Bye, Heartbeat, Result, Stop
from common.ranks.liveness import FollowerWatch, PeerWatch
from common.testing.inprocess import FakeClock, InProcessWorld, fake_time
from common.workers.pool import Assigned, Bundle, WorkerHandle
from common.workers.watchdog import Watchdog


def received(world: InProcessWorld, rank: int) -> List[Any]:
    comm, messages = world.comm(rank), []
    while (incoming := comm.poll()) is not None:
        messages.append(incoming)
    return messages


def test_heartbeats_go_only_where_nothing_else_went_and_silence_is_noticed_after_the_timeout():
    clock = FakeClock()
    world = InProcessWorld(3)
    watch = FollowerWatch(world.comm(0), 4.0, {1: "node1", 2: "node2"}, clock=fake_time(clock))
    clock.advance(0.5)
    watch.send(Stop(), 2)  # a message counts as a sign of life: rank 2 needs no heartbeat yet
    clock.advance(0.6)  # 1.1 s: past the interval (timeout / 4) for rank 1 only
    assert watch.watch() == []
    assert received(world, 1) == [(0, Heartbeat())] and received(world, 2) == [(0, Stop())]
    watch.heard_from(1)
    clock.advance(3.5)  # 4.6 s: rank 2 said nothing since the start, rank 1 spoke 3.5 s ago
    assert watch.watch() == [(2, "no message for 5 s")]
    assert watch.live == [1, 2]  # the caller decides: until it is noted, a silent rank is still live
    watch.forget(2)
    assert watch.note_lost(2, "no message for 5 s", 3) == "node2"
    assert watch.live == [1]
    assert watch.lost[2] == {"rank": 2, "host": "node2", "why": "no message for 5 s", "items_reassigned": 3,
                             "time": clock.time()}
    clock.advance(10.0)
    assert watch.watch() == [(1, "no message for 14 s")]  # a forgotten rank is watched no more


def test_a_follower_gives_rank_0_up_after_the_timeout():
    clock = FakeClock()
    world = InProcessWorld(2)
    watch = PeerWatch(world.comm(1), [0], 2.0, clock=fake_time(clock))
    clock.advance(1.0)
    assert watch.silent() == [] and watch.due() == [0]
    watch.send(Heartbeat(), 0)
    assert watch.due() == []
    clock.advance(1.5)
    assert watch.silent() == [(0, 2.5)]


def test_the_byes_are_awaited_until_their_deadline_keeping_late_results():
    clock = FakeClock()
    world = InProcessWorld(3)
    watch = FollowerWatch(world.comm(0), 4.0, clock=fake_time(clock))
    world.comm(1).send(Result("late"), 0)
    world.comm(1).send(Bye({"rank": 1}), 0)
    late: List[Any] = []
    started = clock.now
    reports, silent = watch.await_byes(2.0, late.append)
    assert reports == {1: {"rank": 1}} and silent == {2} and late == [Result("late")]
    assert 2.0 <= clock.now - started < 2.01  # it slept on the clock it was given, until the deadline


class _NoMessages:
    def poll(self) -> bool:
        return False


def test_the_watchdog_kills_an_item_past_its_time_on_the_clock_it_is_given(tmp_path):
    clock = FakeClock()
    watchdog = Watchdog(None, 2.0, tmp_path, clock=fake_time(clock))
    assert watchdog.heartbeat is None and watchdog.active
    process = subprocess.Popen(["sleep", "60"])
    try:
        worker = WorkerHandle("rank0-cpu0", Device("cpu", 0), process, _NoMessages(), ready=True)
        worker.assigned.append(Bundle([Assigned(Item("a"), 1, clock.time()), Assigned(Item("b"), 1, clock.time())], False, 2))
        watchdog.note_start(worker)
        assert worker.watch.running is worker.assigned[0].entries[0] and worker.watch.since == clock.now
        clock.advance(1.9)
        watchdog.check([worker])
        assert worker.watch.killed is None and process.poll() is None
        clock.advance(0.2)
        watchdog.check([worker])
        assert worker.watch.killed.why == "timed out after 2 s (--item-timeout)"
        assert process.wait(10) == -signal.SIGKILL
        assert "a timed out after 2 s (--item-timeout): killed by its rank" in (tmp_path / "rank0-cpu0.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
