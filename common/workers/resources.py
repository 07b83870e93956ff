"""Named resource pools (counting semaphores) that workers acquire through their rank.

A pool of scope "node" is held by each rank for its own workers (a GPU belongs to a node);
a "global" pool is held by rank 0 for the whole job. Waiters are served first come, first served.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Hashable, List, NamedTuple, Tuple

from common.messages import PoolAnswer, Requester


class Waiting(NamedTuple):
    """A request queued for a pool's slots."""

    requester: Hashable
    count: int


@dataclass
class Pool:
    capacity: int
    held: Dict[Hashable, int] = field(default_factory=dict)
    waiting: Deque[Waiting] = field(default_factory=deque)

    @property
    def free(self) -> int:
        return self.capacity - sum(self.held.values())


class ResourceBroker:
    """Grants pool slots to requesters; a requester is any hashable id (rank, worker, request)."""

    def __init__(self, capacities: Dict[str, int]):
        self.pools = {name: Pool(int(capacity)) for name, capacity in capacities.items()}

    def request(self, name: str, requester: Hashable, count: int) -> List[Hashable]:
        """Queue a request; returns the requesters granted now (possibly this one)."""
        pool = self.pools[name]
        if not 1 <= count <= pool.capacity:
            raise ValueError(f"pool {name!r} has capacity {pool.capacity}; {count} slot(s) cannot be granted")
        pool.waiting.append(Waiting(requester, count))
        return self._grant(name)

    def cancel(self, name: str, requester: Hashable) -> Tuple[bool, List[Hashable]]:
        """Withdraw a waiting request: (True, requesters granted now that it no longer blocks the
        queue), or (False, []) if it was already granted (the requester then releases it)."""
        pool = self.pools[name]
        for entry in list(pool.waiting):
            if entry.requester == requester:
                pool.waiting.remove(entry)
                return True, self._grant(name)
        return False, []

    def release(self, name: str, requester: Hashable) -> List[Hashable]:
        pool = self.pools[name]
        pool.held.pop(requester, None)
        return self._grant(name)

    def release_all(self, whose: Callable[[Hashable], bool]) -> List[Tuple[str, Hashable]]:
        """Free everything held or awaited by the requesters ``whose`` picks (those of a worker that
        died, of a rank that was lost); returns the (pool, requester) pairs granted as a result."""
        granted = []
        for name, pool in self.pools.items():
            pool.waiting = deque(entry for entry in pool.waiting if not whose(entry.requester))
            for requester in [r for r in pool.held if whose(r)]:
                del pool.held[requester]
            granted += [(name, r) for r in self._grant(name)]
        return granted

    def handle(self, verb: str, name: str, requester: Requester, count: int = 0) -> List[Tuple[Requester, PoolAnswer]]:
        """One worker message (acquire/cancel/release) or "gone" -> the (requester, reply) pairs to deliver."""
        if verb == "gone":  # whatever the worker process asked for, whichever request
            gone = requester.process()
            return [(who, PoolAnswer("granted", who.request))
                    for _, who in self.release_all(lambda asked: asked.process() == gone)]
        if name not in self.pools:
            return [(requester, PoolAnswer("refused", requester.request, f"unknown resource pool {name!r}"))]
        replies = []
        if verb == "acquire":
            try:
                granted = self.request(name, requester, count)
            except ValueError as error:
                return [(requester, PoolAnswer("refused", requester.request, str(error)))]
        elif verb == "cancel":
            cancelled, granted = self.cancel(name, requester)
            # not cancelled: the grant crossed the cancel; the worker releases it at once
            replies.append((requester, PoolAnswer("cancelled" if cancelled else "granted", requester.request)))
        else:
            granted = self.release(name, requester)
        return replies + [(who, PoolAnswer("granted", who.request)) for who in granted]

    def _grant(self, name: str) -> List[Hashable]:
        pool, granted = self.pools[name], []
        while pool.waiting and pool.waiting[0].count <= pool.free:
            requester, count = pool.waiting.popleft()
            pool.held[requester] = count
            granted.append(requester)
        return granted
