"""A step's processes (read with psutil): who belongs to it, how much memory they hold, ending them.

A step starts in its own session, so its processes are those of that session plus any
descendant of its first process that started a session of its own. A process that detaches
completely (``setsid`` and a double fork) loses its parent; the process that starts steps is a
child subreaper (:func:`become_subreaper`), so such orphans become its children, and those
started after the step's first process (``adopted_since``) belong to the step too. The worker
runs one step at a time, so no other step's processes are mistaken for them.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, List, NamedTuple, Optional, Set

import psutil

from common.linux import PR_SET_CHILD_SUBREAPER, prctl

#: After SIGKILL, how long to wait for the processes to be gone (a few scheduler ticks).
KILL_SETTLE_SECONDS = 1.0
#: psutil's start times come from clock ticks since boot: allow that much rounding
START_SLACK_SECONDS = 0.05


class ProcessInfo(NamedTuple):
    pid: int
    ppid: int
    session: Optional[int]
    zombie: bool
    started: float  # seconds since the epoch (psutil's create_time)


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux 3.4+); whether it worked."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def start_time(pid: int) -> Optional[float]:
    """When ``pid`` started (seconds since the epoch), or None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def snapshot() -> Dict[int, ProcessInfo]:
    """Every process we can see, by pid (processes that vanish while reading are left out)."""
    processes = {}
    for process in psutil.process_iter(["ppid", "status", "create_time"]):
        info = process.info
        if info["ppid"] is None or info["create_time"] is None:
            continue
        try:
            session: Optional[int] = os.getsid(process.pid)
        except OSError:  # gone meanwhile, or not ours to ask
            session = None
        processes[process.pid] = ProcessInfo(process.pid, info["ppid"], session,
                                             info["status"] == psutil.STATUS_ZOMBIE, info["create_time"])
    return processes


def _adopted(root: int, processes: Dict[int, ProcessInfo], since: Optional[float]) -> Set[int]:
    """Our children other than ``root`` that started after it: orphans of the step we adopted."""
    if since is None:
        return set()
    me = os.getpid()
    return {pid for pid, info in processes.items()
            if info.ppid == me and pid != root and info.started >= since - START_SLACK_SECONDS}


def members(root: int, processes: Optional[Dict[int, ProcessInfo]] = None,
            adopted_since: Optional[float] = None) -> List[ProcessInfo]:
    """The live processes of the step started as ``root`` (session leader), itself included."""
    processes = snapshot() if processes is None else processes
    children: Dict[int, List[int]] = {}
    for info in processes.values():
        children.setdefault(info.ppid, []).append(info.pid)
    in_session = [pid for pid, info in processes.items() if info.session == root]
    found: Set[int] = set()
    stack = [root, *in_session, *_adopted(root, processes, adopted_since)]
    while stack:  # each of them and all their descendants (a child may have left the session)
        pid = stack.pop()
        if pid in found or pid not in processes:
            continue
        found.add(pid)
        stack.extend(children.get(pid, []))
    return [processes[pid] for pid in sorted(found) if not processes[pid].zombie]


def resident_bytes(root: int, adopted_since: Optional[float] = None, count_root: bool = True) -> int:
    """Resident memory of all the step's processes together (``root`` left out where it is the
    step's guard rather than its program)."""
    total = 0
    for info in members(root, adopted_since=adopted_since):
        if info.pid == root and not count_root:
            continue
        try:
            total += psutil.Process(info.pid).memory_info().rss
        except psutil.Error:  # ended meanwhile
            continue
    return total


def _signal_all(root: int, signum: int, adopted_since: Optional[float]) -> int:
    """Send ``signum`` to the step's process group and every other member; how many were alive."""
    alive = members(root, adopted_since=adopted_since)
    try:
        os.killpg(root, signum)
    except (ProcessLookupError, PermissionError):
        pass
    for info in alive:
        try:
            os.kill(info.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
    return len(alive)


def _wait_gone(root: int, seconds: float, adopted_since: Optional[float]) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if not members(root, adopted_since=adopted_since):  # an exited, unreaped process is a zombie: not counted
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def end_tree(root: int, grace: float, adopted_since: Optional[float] = None) -> None:
    """SIGTERM every process of the step, then SIGKILL what is still alive after ``grace`` seconds.

    The caller reaps ``root`` itself (it is its child); adopted orphans are reaped here.
    """
    if _signal_all(root, signal.SIGTERM, adopted_since) and not _wait_gone(root, grace, adopted_since):
        _signal_all(root, signal.SIGKILL, adopted_since)
        _wait_gone(root, KILL_SETTLE_SECONDS, adopted_since)
    reap_adopted(root, adopted_since)


def reap_adopted(root: int, adopted_since: Optional[float]) -> None:
    """Collect the exit status of adopted orphans that ended, so no zombie is left behind."""
    if adopted_since is None:
        return
    processes = snapshot()
    for pid in _adopted(root, processes, adopted_since):
        if processes[pid].zombie:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
