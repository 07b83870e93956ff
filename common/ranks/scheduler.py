"""Rank 0's bookkeeping of every item: what is ready, running, done, retried or failed.

Ready items leave most expensive first, each with the ready items of its group (items an app can
run together, such as the folds of one model). An item that names others in ``after`` waits until each
of them is done or has failed for good; then ``App.complete`` fills it in from their results.
"""
from __future__ import annotations

import graphlib
import heapq
import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from common.items import Item
from common.messages import Handout, handout
from common.results.outputs import to_jsonable


def _plain(value: Any) -> Any:
    """``value`` as it reads back from the journal's JSON."""
    return json.loads(json.dumps(to_jsonable(value)))


class Scheduler:
    def __init__(self, items: List[Item], finished: Mapping[str, Any], retries: int,
                 complete: Callable[[Item, Dict[str, Any]], Item], finished_params: Optional[Mapping[str, Any]] = None):
        """``finished``: results from the journal (a resumed run); ``finished_params``: the params
        its later-wave items ran with, to tell whether those results still hold."""
        self.items = {item.key: item for item in items}
        self.order = {item.key: index for index, item in enumerate(items)}
        self.retries = retries
        self.complete = complete
        self.results: Dict[str, Any] = dict(finished)  # key -> result
        self.failed: Dict[str, str] = {}  # key -> last error
        self.attempts: Dict[str, int] = {}
        self.avoid: Dict[str, Tuple[str, ...]] = {}
        self.in_flight: Set[str] = set()  # keys handed out and not yet resolved
        self._new_failures: List[str] = []
        self.stale: List[str] = []  # journaled later-wave items that must run again
        # The ready items, in the order they leave (most expensive first, then in item order), in two
        # parts: _first, those ready from the start, sorted once and taken from its end (a list's pop is
        # O(1) and gives the room back; a heap's pop of a million entries is about 20 comparisons of
        # tuples, the largest part of handing an item out); _ready, a heap of those ready later
        # (dependents, retries, items given back). An entry whose key left _ready_keys is stale.
        self._first: List[Tuple[float, int, str]] = []
        self._ready: List[Tuple[float, int, str]] = []
        self._ready_keys: Set[str] = set()
        self._ready_groups: Dict[str, Set[str]] = {}
        waiting: Dict[str, Set[str]] = {}  # item -> the unresolved items it waits for
        built_now: List[str] = []  # later-wave items whose dependencies are all journaled
        for item in items:
            if item.key in self.results and item.after:
                if self._still_holds(item, complete, finished_params or {}):
                    continue
                del self.results[item.key]  # built from other results than there are now: run again
                self.stale.append(item.key)
            if item.key in self.results:
                continue
            missing = {dep for dep in item.after if dep not in self.results}
            unknown = {dep for dep in missing if dep not in self.items}
            if unknown:
                raise ValueError(f"item {item.key} waits for unknown items {sorted(unknown)}")
            if missing:
                waiting[item.key] = missing
            elif item.after:
                built_now.append(item.key)
            else:
                self._ready_keys.add(item.key)
                if item.group:
                    self._ready_groups.setdefault(item.group, set()).add(item.key)
                self._first.append((-float(item.cost), self.order[item.key], item.key))
        self._first.sort(reverse=True)
        # the items that wait and those they wait for: graphlib releases each waiting item once all of
        # its dependencies are resolved (done, or failed for good: its complete() decides what then)
        self._dependencies: Optional[graphlib.TopologicalSorter] = None
        self._in_dependencies: Set[str] = set()
        if waiting:
            self._dependencies = _dependency_sorter(waiting)
            self._in_dependencies = set(waiting).union(*waiting.values())
        # built once the sorter knows who waits for them: one that cannot be built fails for good,
        # and releases what waits for it, as one that failed while the run went on does
        for key in built_now:
            self._make_ready(key)

    def _still_holds(self, item: Item, complete: Callable, finished_params: Mapping[str, Any]) -> bool:
        """A journaled later-wave result holds if everything it waits for is finished and
        ``complete`` builds it as it ran (then the rebuilt item replaces the placeholder)."""
        if any(dep not in self.results for dep in item.after):
            return False  # some dependency failed back then: it will be retried, so this must follow
        try:
            rebuilt = complete(item, {dep: self.results[dep] for dep in item.after})
        except Exception:
            return False
        if item.key in finished_params and _plain(rebuilt.params) != finished_params[item.key]:
            return False
        self.items[item.key] = rebuilt
        return True

    # ----- state -----
    @property
    def ready_count(self) -> int:
        return len(self._ready_keys)

    @property
    def unresolved(self) -> int:
        """Items neither done nor failed for good."""
        return len(self.items) - len(self.results) - len(self.failed)

    def all_resolved(self) -> bool:
        return self.unresolved == 0

    # ----- transitions -----
    def _make_ready(self, key: str) -> None:
        item = self.items[key]
        if item.after:
            try:
                item = self.complete(item, {d: self.results[d] for d in item.after if d in self.results})
            except Exception as error:
                self._fail(key, f"could not build the item from its dependencies: {type(error).__name__}: {error}")
                return
            self.items[key] = item
        self._push(key)

    def _push(self, key: str) -> None:
        item = self.items[key]
        self._ready_keys.add(key)
        if item.group:
            self._ready_groups.setdefault(item.group, set()).add(key)
        heapq.heappush(self._ready, (-float(item.cost), self.order[key], key))

    def _pop(self, key: str) -> Handout:
        ready_keys = self._ready_keys
        ready_keys.discard(key)
        if not ready_keys:  # a set keeps the room it once needed (all the items): give it back
            self._ready_keys = set()
        item = self.items[key]
        if item.group:
            self._ready_groups[item.group].discard(key)
        attempt = self.attempts.get(key, 0) + 1
        self.attempts[key] = attempt
        return handout((item, attempt, self.avoid.get(key, ()) if self.avoid else ()))

    def _next_key(self) -> Optional[str]:
        """The most expensive ready key (stale entries dropped), removed from _first or _ready."""
        ready_keys, first, heap = self._ready_keys, self._first, self._ready
        while first and first[-1][2] not in ready_keys:
            first.pop()
        while heap and heap[0][2] not in ready_keys:
            heapq.heappop(heap)
        if heap and (not first or heap[0] < first[-1]):
            return heapq.heappop(heap)[2]
        return first.pop()[2] if first else None

    def _peek_ungrouped(self) -> bool:
        """Whether the next ready item is one without a group (stale entries dropped)."""
        ready_keys, first, heap = self._ready_keys, self._first, self._ready
        while first and first[-1][2] not in ready_keys:
            first.pop()
        while heap and heap[0][2] not in ready_keys:
            heapq.heappop(heap)
        head = heap[0] if heap and (not first or heap[0] < first[-1]) else first[-1] if first else None
        return head is not None and not self.items[head[2]].group

    def take(self, chunk: int = 1) -> Optional[List[Handout]]:
        """The next bundle to run (item, attempt number, workers to avoid each); None when
        nothing is ready. A bundle is the most expensive ready item with the ready items of its
        group, or up to ``chunk`` ungrouped items in a row (very short items travel in chunks)."""
        key = self._next_key()
        if key is None:
            return None
        first = self._pop(key)
        if first.item.group:
            mates = sorted(self._ready_groups.get(first.item.group, ()), key=self.order.__getitem__)
            return [first] + [self._pop(mate) for mate in mates]
        bundle = [first]
        while len(bundle) < chunk and self._peek_ungrouped():
            bundle.append(self._pop(self._next_key()))  # type: ignore[arg-type]
        return bundle

    def take_handed(self, count: int, chunk: Callable[[], int]) -> Tuple[List[List[Handout]], List[str]]:
        """Up to ``count`` bundles, each as :meth:`take` gives it (of up to ``chunk()`` items, asked
        before each bundle), every item already :meth:`handed`; and their keys. One call per
        follower's request (every item a follower runs is handed out through here), not one per item."""
        bundles: List[List[Handout]] = []
        keys: List[str] = []
        take, add = self.take, keys.append
        while len(bundles) < count and self._ready_keys:
            bundle = take(chunk())
            if bundle is None:
                break
            bundles.append(bundle)
            for entry in bundle:
                add(entry.item.key)
        self.in_flight.update(keys)
        return bundles, keys

    def handed(self, key: str) -> None:
        self.in_flight.add(key)

    def handed_all(self, keys: Iterable[str]) -> None:
        """:meth:`handed` for each key (the items of a bundle :meth:`take` gave), in one call."""
        self.in_flight.update(keys)

    def dropped(self, key: str) -> None:
        """An attempt ended by a stop: neither done nor failed; it runs again on --resume."""
        self.in_flight.discard(key)

    def give_back(self, key: str) -> None:
        """An item handed out but never started (a stop): ready again, the attempt not counted."""
        self.in_flight.discard(key)
        self.attempts[key] -= 1
        self._push(key)

    def done(self, key: str, result: Any) -> bool:
        """Record a result; False if the item was already resolved (a duplicate). O(1), and
        nothing allocated but the result's entry: rank 0 calls it for every result."""
        self.in_flight.discard(key)
        results = self.results
        if key in results or key in self.failed:
            return False
        self._ready_keys.discard(key)  # given back by a rank that was lost, yet its result came
        group = self.items[key].group
        if group:
            self._ready_groups.get(group, set()).discard(key)
        results[key] = result
        if key in self._in_dependencies:
            self._release_dependents(key)
        return True

    def attempt_failed(self, key: str, error: str, worker: str, retry: bool = True) -> bool:
        """One attempt failed; True if the item will be tried again, False if it failed for good
        (its retries used, or ``retry`` False: the item said another attempt would fail the same way)."""
        self.in_flight.discard(key)
        if key in self.results or key in self.failed:
            return False
        if retry and self.attempts.get(key, 0) <= self.retries:
            self.avoid[key] = self.avoid.get(key, ()) + (worker,)
            self._push(key)
            return True
        self._fail(key, error)
        return False

    def fail_remaining(self, error: str) -> None:
        """Give up on everything not yet resolved (no worker anywhere can run items)."""
        keys = [key for key in self.items if key not in self.results and key not in self.failed]
        for key in keys:  # all at once, later waves too: none is built from its dependencies first
            self.failed[key] = error
            self._new_failures.append(key)
        self._dependencies, self._in_dependencies = None, set()
        self._ready.clear()
        self._first.clear()
        self._ready_keys.clear()
        self._ready_groups.clear()

    @property
    def has_new_failures(self) -> bool:
        """Whether :meth:`pop_new_failures` has keys to give (rank 0 asks after every result)."""
        return bool(self._new_failures)

    def pop_new_failures(self) -> List[str]:
        """Keys that failed for good since the last call (to journal and report them once)."""
        if not self._new_failures:
            return []
        keys, self._new_failures = self._new_failures, []
        return keys

    def _fail(self, key: str, error: str) -> None:
        self.failed[key] = error
        self._new_failures.append(key)
        if key in self._in_dependencies:
            self._release_dependents(key)

    def _release_dependents(self, key: str) -> None:
        """``key`` is resolved: the items whose last unresolved dependency it was are built and ready."""
        assert self._dependencies is not None
        self._dependencies.done(key)
        for dependent in self._dependencies.get_ready():
            self._make_ready(dependent)


def _dependency_sorter(waiting: Dict[str, Set[str]]) -> graphlib.TopologicalSorter:
    """A sorter of the items that wait (``waiting``: item -> the items it waits for), its first ready
    set taken: those are the dependencies that wait for nothing, already ready or running.

    Items that wait for each other would never run: an app bug, reported at once."""
    sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter(waiting)
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        stuck = sorted(set(error.args[1]))
        raise ValueError(f"items wait for each other in a cycle: {', '.join(stuck[:5])}") from None
    sorter.get_ready()
    return sorter
