"""Which worker of a rank gets the next bundle: the one policy of the real pool
(common.workers.pool.WorkerPool) and of its in-process stand-in (common.testing.inprocess.SimulatedPool),
so that a simulated run places items as a real one does."""
from __future__ import annotations

from typing import Iterable, Optional, Tuple, TypeVar

Worker = TypeVar("Worker")


def room(worker: Worker, batch: Optional[int]) -> Optional[int]:
    """How many more items ``worker`` may be handed under ``--batch`` (None: no limit). A chunk of
    short items is cut to it, so that no worker runs more than ``batch`` items (a group run
    together is never cut: it goes whole to a worker that has room left)."""
    return None if not batch else max(0, batch - worker.handed_total)  # type: ignore[attr-defined]


def pick_worker(workers: Iterable[Worker], avoid: Tuple[str, ...] = (), depth: int = 1,
                batch: Optional[int] = None) -> Optional[Worker]:
    """An idle worker first, else one with fewer than ``depth`` bundles (one queued behind the
    running one hides the round trip), preferring one that has not already failed this item
    (``avoid``: worker names). A worker already handed ``batch`` items (``--batch``) gets no more:
    it is replaced once it has answered them. Each worker has ``name``, ``ready``, ``retiring``,
    ``assigned`` (its bundles) and ``handed_total``."""
    best, best_rank = None, None
    for worker in workers:
        if not worker.ready or worker.retiring or len(worker.assigned) >= depth:  # type: ignore[attr-defined]
            continue
        if room(worker, batch) == 0:
            continue
        rank = (len(worker.assigned), worker.name in avoid)  # type: ignore[attr-defined]
        if best_rank is None or rank < best_rank:
            best, best_rank = worker, rank
    return best
