"""A step's processes, read from /proc: who belongs to it, how much memory they hold, ending them.

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

from ..linux import PR_SET_CHILD_SUBREAPER, prctl

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
#: After SIGKILL, how long to wait for the processes to be gone (a few scheduler ticks).
KILL_SETTLE_SECONDS = 1.0


class ProcessInfo(NamedTuple):
    pid: int
    ppid: int
    session: int
    rss_bytes: int
    zombie: bool
    started: int  # clock ticks after boot


def _read(pid: int) -> ProcessInfo:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read().decode("ascii", "replace")
    # The command name may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5): ppid 4, session 6, starttime 22, rss 24 (pages).
    return ProcessInfo(pid, int(fields[1]), int(fields[3]), int(fields[21]) * PAGE_SIZE, fields[0] == "Z",
                       int(fields[19]))


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux 3.4+); whether it worked."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks after boot), or None if it is gone."""
    try:
        return _read(pid).started
    except (OSError, ValueError, IndexError):
        return None


def now_ticks() -> int:
    """Clock ticks since boot, the unit of a process's start time."""
    with open("/proc/uptime") as handle:
        return int(float(handle.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def snapshot() -> Dict[int, ProcessInfo]:
    """Every process we can see, by pid (processes that vanish while reading are left out)."""
    processes = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                processes[int(name)] = _read(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return processes


def _adopted(root: int, processes: Dict[int, ProcessInfo], since: Optional[int]) -> Set[int]:
    """Our children other than ``root`` that started after it: orphans of the step we adopted."""
    if since is None:
        return set()
    me = os.getpid()
    return {pid for pid, info in processes.items() if info.ppid == me and pid != root and info.started >= since}


def members(root: int, processes: Dict[int, ProcessInfo] = None,
            adopted_since: Optional[int] = None) -> List[ProcessInfo]:
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
    return [processes[pid] for pid in sorted(found) if pid in processes and not processes[pid].zombie]


def resident_bytes(root: int, adopted_since: Optional[int] = None) -> int:
    """Resident memory of all the step's processes together."""
    return sum(info.rss_bytes for info in members(root, adopted_since=adopted_since))


def _signal_all(root: int, signum: int, adopted_since: Optional[int]) -> int:
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


def _wait_gone(root: int, seconds: float, adopted_since: Optional[int]) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if not members(root, adopted_since=adopted_since):  # an exited, unreaped process is a zombie: not counted
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def end_tree(root: int, grace: float, adopted_since: Optional[int] = None) -> None:
    """SIGTERM every process of the step, then SIGKILL what is still alive after ``grace`` seconds.

    The caller reaps ``root`` itself (it is its child); adopted orphans are reaped here.
    """
    if _signal_all(root, signal.SIGTERM, adopted_since) and not _wait_gone(root, grace, adopted_since):
        _signal_all(root, signal.SIGKILL, adopted_since)
        _wait_gone(root, KILL_SETTLE_SECONDS, adopted_since)
    reap_adopted(root, adopted_since)


def reap_adopted(root: int, adopted_since: Optional[int]) -> None:
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
