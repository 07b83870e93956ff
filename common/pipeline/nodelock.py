"""Node-wide GPU slots: separate runs on one node that hold ``gpu`` share its capacity.

The engine's pools count within one run. Two runs started side by side on a node (two Slurm
jobs sharing it, two terminals) know nothing of each other, so a GPU step also takes an
exclusive ``flock`` on one slot file of its node: one per GPU (``gpu<ID>-<k>``), or on a node
without GPU, one per slot of an explicitly sized ``gpu`` pool (``cpu-<k>``). The kernel lets
go of a lock when its holder dies, so a killed run never leaves a slot taken.

The files live in ``$PIPELINE_LOCK_DIR``, else ``/dev/shm/multinode-gpu-pipeline-<uid>``
(memory, local to the node), else the same name in the temporary folder; only this user's.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from .. import settings

POLL_SECONDS = 0.1


class SlotTimeout(Exception):
    """Waited longer than allowed for a node-wide slot."""


class SlotWaitStopped(Exception):
    """Gave up waiting for a node-wide slot: the run is stopping."""


def lock_dir(chosen: Optional[str]) -> Path:
    """The folder of this node's slot files (made private to this user): ``chosen`` (the run's
    ``PIPELINE_LOCK_DIR``), else one of this user's in /dev/shm (or the temporary folder)."""
    if chosen:
        folder = Path(chosen)
    else:
        base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
        folder = base / f"multinode-gpu-pipeline-{os.getuid()}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():  # another user's folder: they could hold our slots for ever
        raise OSError(f"{folder} belongs to another user; set {settings.LOCK_DIR.name} to a folder of yours")
    return folder


def slot_names(gpu: Optional[str], gpus_here: int, capacity: int) -> list:
    """The slot files a GPU step may take: ``capacity`` slots spread over this rank's GPUs
    (at least one per GPU), or ``capacity`` CPU slots on a node without GPU."""
    if gpu is None:
        return [f"cpu-{k}" for k in range(capacity)]
    per_gpu = max(1, -(-capacity // max(1, gpus_here)))
    tag = re.sub(r"[^A-Za-z0-9_-]", "_", gpu)
    return [f"gpu{tag}-{k}" for k in range(per_gpu)]


@contextlib.contextmanager
def hold_slot(names: Sequence[str], timeout: Optional[float] = None,
              stop: Callable[[], bool] = lambda: False, chosen_dir: Optional[str] = None) -> Iterator[str]:
    """Hold the first free one of ``names`` (exclusive, node-wide) for the ``with`` block; waits
    for one, up to ``timeout`` seconds (None: as long as it takes), or until ``stop()`` says so.
    ``chosen_dir``: the run's ``PIPELINE_LOCK_DIR`` (:func:`lock_dir`)."""
    folder = lock_dir(chosen_dir)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        for name in names:
            fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
                yield name
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        if stop():
            raise SlotWaitStopped("the run is stopping")
        if deadline is not None and time.monotonic() >= deadline:
            raise SlotTimeout(f"every node-wide slot ({', '.join(names)}) stayed taken by other runs")
        time.sleep(POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - time.monotonic())))
