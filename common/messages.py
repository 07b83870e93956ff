"""The messages between ranks, one typed record each (pickled over MPI, one tag).

Follower -> leader: :class:`Request`, :class:`Result`, :class:`Results`, :class:`Failed`, :class:`PoolCall`,
:class:`Dropped`, :class:`StopRequest`, :class:`Broken`, :class:`Status`, :class:`Bye`.
Leader -> follower: :class:`Items`, :class:`PoolReply`, :class:`Stop`, :class:`End`, :class:`Release`.
Both ways: :class:`Heartbeat`, sent only when nothing else went to that rank for a while.

Between a rank and each of its workers (over a pipe): :class:`Assign`, :class:`Revoke`, :class:`Quit`,
:class:`PoolAnswer` one way; :class:`Ready`, :class:`SetupFailed`, :class:`ItemDone`, :class:`ItemError`, :class:`Answers`,
:class:`Revoked`, :class:`Alive`, :class:`PoolRequest` the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .app import Record
from .errors import FAILED
from .items import Item, item_row


class Handout(NamedTuple):
    """One item handed out: what the scheduler takes, rank 0 sends in :class:`Items` and a rank
    sends its worker in :class:`Assign`. A NamedTuple: millions travel, so they stay tuples."""

    item: Item
    attempt: int
    avoid: Tuple[str, ...] = ()  # workers that already failed it (none once it reaches a worker)


#: ``handout((item, attempt, avoid))``: a :class:`Handout` made without the Python-level
#: ``__new__`` of a NamedTuple (rank 0 makes one per item)
handout: Callable[[tuple], Handout] = partial(tuple.__new__, Handout)


def _plain(bundles: List[List[Handout]]) -> List[List[tuple]]:
    """Bundles as plain tuples for pickling: pickle writes an exact tuple in C, but each tuple
    subclass through Python code (several times slower per item, on rank 0's hot path)."""
    return [list(map(tuple, bundle)) for bundle in bundles]


def _typed(bundles: List[List[tuple]]) -> List[List[Handout]]:
    return [list(map(handout, bundle)) for bundle in bundles]


class Requester(NamedTuple):
    """Who asked for a resource pool's slot: one request of one worker process. Its first three
    fields name the worker process (a "gone" worker frees whatever they prefix)."""

    rank: int
    worker: str
    pid: int
    request: int = -1  # -1: the whole worker (a "gone")

    def process(self) -> Tuple[int, str, int]:
        """The worker process that asked: a "gone" frees whatever its requests hold or await."""
        return (self.rank, self.worker, self.pid)


# ----- follower -> leader -----
@dataclass
class Request:
    """``need``: idle workers with nothing queued; ``prefetch``: more it would queue if there is plenty."""

    need: int
    prefetch: int


@dataclass
class Result:
    record: Record


@dataclass
class Results:
    """The items a follower finished in the last few milliseconds, in one message (one send, one
    receive and one unpickling at rank 0 for many short items). ``lines``: each record's journal
    line, made by the follower (``common.results.journal.result_line``; None where rank 0 must make
    it): rank 0 only appends them, instead of encoding every result of the run itself."""

    records: List[Record]
    lines: Optional[List[Optional[bytes]]] = None


@dataclass
class Failed:
    """One attempt failed; ``record`` says where and when it ran (its result is None). ``kind``:
    ``FAILED``, ``TIMED_OUT`` or ``SILENT`` (:mod:`common.errors`); ``errno`` and
    ``path``: the OSError the item raised, if it did (a full disk stops the run instead); ``retry``:
    False where no further attempt is to be made (:class:`ItemError`)."""

    record: Record
    error: str
    traceback: str = ""
    kind: str = FAILED
    errno: Optional[int] = None
    path: str = ""
    retry: bool = True


@dataclass
class PoolCall:
    """A worker's acquire/cancel/release of a global resource pool, or "gone" when it died."""

    verb: str
    requester: Requester
    pool: str
    count: int


@dataclass
class Dropped:
    """Items handed to this rank that it never started (a stop, or its workers are gone)."""

    keys: List[str]


@dataclass
class StopRequest:
    """A signal reached this rank: the leader stops the whole run."""

    why: str


@dataclass
class Broken:
    """No worker of this rank can start: hand it nothing more."""

    why: str


@dataclass
class Bye:
    """After :class:`End`: the rank's workers are stopped; ``report`` is its end-of-run report."""

    report: Dict[str, Any] = field(default_factory=dict)


# ----- leader -> follower -----
@dataclass
class Items:
    """Bundles to run, each the :class:`Handout` of one group or a chunk; ``plenty``: prefetching
    is welcome."""

    bundles: List[List[Handout]]
    plenty: bool

    def __reduce__(self) -> tuple:
        """Each handout as one flat row (the item's fields, the attempt, the workers to avoid):
        rank 0 pickles every item of the run in one of these, and a row of plain values pickles
        in C, without a call of ``Item.__reduce__`` per item (half the time per item)."""
        return _items, ([[item_row(entry[0]) + entry[1:] for entry in bundle] for bundle in self.bundles],
                        self.plenty)


def _items(rows: List[List[tuple]], plenty: bool) -> Items:
    return Items([[handout((Item(*row[:-2]), row[-2], row[-1])) for row in bundle] for bundle in rows], plenty)


@dataclass
class PoolReply:
    requester: Requester
    message: Any  # a PoolAnswer


@dataclass
class Stop:
    """Start no more items; running ones may finish."""


@dataclass
class End:
    """The distribution is over ("done": every item resolved; "halt": stopped). ``code`` is the
    run's exit code, which every rank returns."""

    outcome: str
    code: int


@dataclass
class Status:
    """Every few seconds: this rank's workers and GPUs, for rank 0's status file (common.results.status_file)."""

    snapshot: Dict[str, Any]


@dataclass
class Release:
    """After rank 0 has written its outputs: exit with ``code``. ``finalize`` is False when a rank
    was lost: MPI_Finalize would wait for it forever, so every rank leaves without it."""

    code: int
    finalize: bool


# ----- both ways -----
@dataclass
class Heartbeat:
    """Proof of life when no other message went out for a while."""


# ----- a rank -> its workers (over each worker's pipe) -----
@dataclass
class Assign:
    """Items to run: one item, a group to run together (``together``), or a chunk run one by one."""

    bundle: List[Handout]
    together: bool

    def __reduce__(self) -> tuple:
        return _assign, (_plain([self.bundle])[0], self.together)


def _assign(bundle: List[tuple], together: bool) -> Assign:
    return Assign(_typed([bundle])[0], together)


@dataclass
class Revoke:
    """The rank is stopping: give back the items not yet started."""


@dataclass
class Quit:
    """No more items for this worker: exit once the running one is done."""


@dataclass
class PoolAnswer:
    """The answer to a :class:`PoolRequest`: "granted", "refused" (``why``) or "cancelled"."""

    verb: str
    request: int
    why: str = ""


# ----- a worker -> its rank -----
@dataclass
class Ready:
    """Set up (data loaded, device ready): hand me items."""


@dataclass
class SetupFailed:
    error: str
    traceback: str = ""


@dataclass
class ItemDone:
    key: str
    result: Any
    started: float
    ended: float


@dataclass
class ItemError:
    """``errno`` and ``path``: the OSError the item raised, if it did; ``retry``: False where the
    item's code said another attempt would fail the same way (``ItemFailed(retry=False)``)."""

    key: str
    error: str
    traceback: str
    started: float
    ended: float
    errno: Optional[int] = None
    path: str = ""
    retry: bool = True


@dataclass
class Answers:
    """Several :class:`ItemDone` / :class:`ItemError` of a chunk of short items, in one message."""

    answers: List[Any]


@dataclass
class Revoked:
    """The answer to :class:`Revoke`: the keys given back."""

    keys: List[str]


@dataclass
class Alive:
    """A worker's heartbeat, sent when nothing else went to the rank for a while."""


@dataclass
class PoolRequest:
    """``acquire`` (``count`` slots), ``cancel`` or ``release`` a slot of resource pool ``pool``."""

    verb: str
    pool: str
    request: int
    count: int = 0
