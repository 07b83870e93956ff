"""Whether the other ranks are still there: heartbeats out, silence noticed, lost ranks noted.

Every rank hears from its peers at least every ``timeout / 4`` seconds (a ``Heartbeat`` goes out
only when nothing else did). Rank 0 (:class:`FollowerWatch`) declares a follower silent for
``timeout`` seconds lost, and its :class:`common.ranks.distribute.Leader` gives what that rank held to the
others; a follower (its :class:`PeerWatch` on rank 0) that hears nothing from rank 0 that long stops by
itself. Neither waits forever.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

from common.clock import SYSTEM_CLOCK, Clock
from common.messages import Bye, Heartbeat, Result, Results

#: rank 0 looks for followers due a heartbeat or silent too long at most this often (heartbeat
#: intervals are seconds; one look walks every rank)
WATCH_SECONDS = 0.05
#: while rank 0 writes its outputs, its heartbeat thread drives MPI's progress this often
PROGRESS_SECONDS = 0.05


class Liveness:
    """When each peer was last heard from and last sent to: who needs a heartbeat, who is silent."""

    def __init__(self, peers: List[int], timeout: float, now: float):
        self.timeout = timeout
        self.interval = timeout / 4
        self.heard = {peer: now for peer in peers}
        self.sent = {peer: now for peer in peers}

    def heard_from(self, peer: int, now: float) -> None:
        if peer in self.heard:
            self.heard[peer] = now

    def sent_to(self, peer: int, now: float) -> None:
        if peer in self.sent:
            self.sent[peer] = now

    def forget(self, peer: int) -> None:
        self.heard.pop(peer, None)
        self.sent.pop(peer, None)

    def due(self, now: float) -> List[int]:
        """Peers nothing was sent to for ``interval`` seconds."""
        return [peer for peer, at in self.sent.items() if now - at >= self.interval]

    def silent(self, now: float) -> List[int]:
        """Peers not heard from for ``timeout`` seconds."""
        return [peer for peer, at in self.heard.items() if now - at > self.timeout]


class Silence(NamedTuple):
    """A peer not heard from: its rank, and the seconds since it last was."""

    rank: int
    seconds: float


class PeerWatch:
    """One rank's links to its peers: every send through it counts as a sign of life, heartbeats go
    to the peers nothing went to for a while, and it tells which peers fell silent."""

    def __init__(self, comm: Any, peers: List[int], timeout: float, clock: Clock = SYSTEM_CLOCK):
        self.comm, self.clock = comm, clock
        self.table = Liveness(peers, timeout, clock.monotonic())

    @property
    def timeout(self) -> float:
        return self.table.timeout

    @property
    def interval(self) -> float:
        return self.table.interval

    def send(self, message: Any, rank: int) -> None:
        self.comm.send(message, rank)
        self.table.sent_to(rank, self.clock.monotonic())

    def heard_from(self, rank: int, now: Optional[float] = None) -> None:
        self.table.heard_from(rank, self.clock.monotonic() if now is None else now)

    def due(self) -> List[int]:
        """Peers nothing was sent to for ``interval`` seconds: they need a heartbeat."""
        return self.table.due(self.clock.monotonic())

    def send_heartbeats(self) -> None:
        """A heartbeat to each peer nothing was sent to for ``interval`` seconds."""
        for rank in self.due():
            self.send(Heartbeat(), rank)

    def silent(self) -> List[Silence]:
        """Each peer silent for ``timeout`` seconds, and for how long."""
        now = self.clock.monotonic()
        return [Silence(rank, now - self.table.heard[rank]) for rank in self.table.silent(now)]


class FollowerWatch(PeerWatch):
    """Rank 0's watch over every other rank (its followers), and the record of those it lost."""

    def __init__(self, comm: Any, timeout: float, hosts: Optional[Dict[int, str]] = None,
                 clock: Clock = SYSTEM_CLOCK):
        """``hosts``: rank -> host name, for what is said about a lost rank."""
        self.followers = list(range(1, comm.size))
        super().__init__(comm, self.followers, timeout, clock)
        self.hosts = hosts or {}
        self.lost: Dict[int, Dict[str, Any]] = {}  # rank -> what happened, for the summary
        self._told_to_end: Set[int] = set()  # lost ranks that spoke again and were told to end
        self._watched = -math.inf  # when watch() last looked at every rank

    @property
    def live(self) -> List[int]:
        return [rank for rank in self.followers if rank not in self.lost]

    def broadcast(self, message: Any) -> None:
        for rank in self.live:
            self.send(message, rank)

    def watch(self) -> List[Tuple[int, str]]:
        """Heartbeats where due; (rank, why) of each follower silent for ``timeout`` seconds. Looks
        at most every WATCH_SECONDS: one look walks every rank, and rank 0's loop turns far more
        often than heartbeat intervals (seconds) need."""
        now = self.clock.monotonic()
        if now - self._watched < WATCH_SECONDS:
            return []
        self._watched = now
        self.send_heartbeats()
        return [(rank, f"no message for {silence:.0f} s") for rank, silence in self.silent()]

    def forget(self, rank: int) -> None:
        """No more heartbeats to ``rank``, nor a watch on its silence."""
        self.table.forget(rank)

    def tell_to_end_once(self, rank: int) -> bool:
        """Whether ``rank``, lost and speaking again (its network came back), is yet to be told to
        end: True the first time only."""
        if rank in self._told_to_end:
            return False
        self._told_to_end.add(rank)
        return True

    def note_lost(self, rank: int, why: str, items_reassigned: int) -> str:
        """Record ``rank`` as lost (after :meth:`forget`); its host's name."""
        host = self.hosts.get(rank, "?")
        self.lost[rank] = {"rank": rank, "host": host, "why": why, "items_reassigned": items_reassigned,
                           "time": self.clock.time()}
        return host

    def await_byes(self, wait: float, on_results: Callable[[Any], None]) -> Tuple[Dict[int, Dict[str, Any]], Set[int]]:
        """After :class:`End`: each live follower's report (:class:`Bye`), giving ``on_results`` the
        results that were finished before the news reached it; and the ranks silent for ``wait``
        seconds (the caller declares them lost)."""
        reports: Dict[int, Dict[str, Any]] = {}
        waiting = set(self.live)
        deadline = self.clock.monotonic() + wait
        while waiting and self.clock.monotonic() < deadline:
            incoming = self.comm.poll()
            if incoming is None:
                self.clock.sleep(0.001)
                continue
            source, message = incoming
            if isinstance(message, Bye):
                waiting.discard(source)
                reports[source] = message.report
            elif isinstance(message, (Result, Results)):
                on_results(message)
        return reports, waiting

    @contextmanager
    def keeping_alive(self) -> Iterator[None]:
        """Heartbeats from a thread while rank 0 is busy after the run (waiting for the followers'
        reports, writing its outputs): the followers wait for its ``Release`` meanwhile and must
        not take its silence for a loss. The first goes out at once; between them the thread
        keeps calling into MPI, without which a message may never leave (``comm.progress``)."""
        done = threading.Event()

        def beat() -> None:
            next_beat = 0.0
            while True:
                now = self.clock.monotonic()
                if now >= next_beat:
                    next_beat = now + self.interval
                    for rank in self.live:
                        self.comm.send(Heartbeat(), rank)
                self.comm.progress()
                if done.wait(PROGRESS_SECONDS):
                    return

        thread = threading.Thread(target=beat, name="heartbeats", daemon=True)
        if self.live:
            thread.start()
        try:
            yield
        finally:
            done.set()
            if thread.is_alive():
                thread.join()
