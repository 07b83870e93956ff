"""common.workers.worker.acquire and stop_requested reach the worker's inbox through the context its main
sets, not a module global: here over a real pipe, with a thread playing the rank."""
from __future__ import annotations

import contextvars
import threading
from multiprocessing import Pipe
from typing import Any, Callable, List

import pytest

from common.messages import PoolAnswer, PoolRequest, Revoke
from common.workers import worker

#: a multiprocessing Pipe, but no process: tests/tiers.py would take it for the processes tier
pytestmark = pytest.mark.inprocess


def as_worker(body: Callable[[], Any]) -> tuple:
    """Run ``body`` as an item of a worker whose rank grants every request: (its result, what the
    rank received). The inbox is set in a copy of the context, as worker_main sets it in its own."""
    rank_end, worker_end = Pipe()
    received: List[Any] = []

    def rank() -> None:
        while True:
            try:
                message = rank_end.recv()
            except EOFError:
                return
            received.append(message)
            if message.verb == "acquire":
                rank_end.send(PoolAnswer("granted", message.request))

    thread = threading.Thread(target=rank, daemon=True)
    thread.start()

    def item() -> Any:
        worker._current_inbox.set(worker._Inbox(worker_end))
        return body()

    try:
        result = contextvars.copy_context().run(item)
    finally:
        worker_end.close()
        thread.join(5)
        rank_end.close()
    return result, received


def test_outside_a_worker_acquire_refuses_and_no_stop_is_asked():
    with pytest.raises(RuntimeError, match="only inside an item"):
        with worker.acquire("gpu"):
            pass
    assert worker.stop_requested() is False


def test_each_worker_numbers_its_own_requests_and_releases_what_it_held():
    def body() -> str:
        with worker.acquire("licence", 2):
            with worker.acquire("gpu"):
                return "ran"

    for _ in range(2):  # a second worker starts from request 1 again: no count shared between them
        result, received = as_worker(body)
        assert result == "ran"
        assert received == [PoolRequest("acquire", "licence", 1, 2), PoolRequest("acquire", "gpu", 2, 1),
                            PoolRequest("release", "gpu", 2), PoolRequest("release", "licence", 1)]
    with pytest.raises(RuntimeError):  # and nothing of it outlives the item's context
        with worker.acquire("gpu"):
            pass


def test_a_revoke_from_the_rank_is_seen_by_stop_requested():
    rank_end, worker_end = Pipe()

    def item() -> tuple:
        worker._current_inbox.set(worker._Inbox(worker_end))
        before = worker.stop_requested()
        rank_end.send(Revoke())
        return before, worker.stop_requested()

    assert contextvars.copy_context().run(item) == (False, True)
    assert rank_end.recv().keys == []  # the revoke is answered: nothing was waiting
    worker_end.close()
    rank_end.close()
