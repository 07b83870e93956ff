"""A step's processes, read from /proc: who belongs to it, how much memory they hold, ending them.

A step starts in its own session, so its processes are those of that session plus any
descendant of its first process that started a session of its own.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, List, NamedTuple, Set

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcessInfo(NamedTuple):
    pid: int
    ppid: int
    session: int
    rss_bytes: int
    zombie: bool


def _read(pid: int) -> ProcessInfo:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        text = handle.read().decode("ascii", "replace")
    # The command name may hold spaces and parentheses: split after its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state) of proc(5): ppid 4, session 6, rss 24 (pages).
    return ProcessInfo(pid, int(fields[1]), int(fields[3]), int(fields[21]) * PAGE_SIZE, fields[0] == "Z")


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


def members(root: int, processes: Dict[int, ProcessInfo] = None) -> List[ProcessInfo]:
    """The live processes of the step started as ``root`` (session leader), itself included."""
    processes = snapshot() if processes is None else processes
    children: Dict[int, List[int]] = {}
    for info in processes.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: Set[int] = {pid for pid, info in processes.items() if info.session == root}
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in processes:
            found.add(pid)
        stack.extend(child for child in children.get(pid, []) if child not in found)
    return [processes[pid] for pid in sorted(found) if pid in processes and not processes[pid].zombie]


def resident_bytes(root: int) -> int:
    """Resident memory of all the step's processes together."""
    return sum(info.rss_bytes for info in members(root))


def _signal_all(root: int, signum: int) -> int:
    """Send ``signum`` to the step's process group and every other member; how many were alive."""
    alive = members(root)
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


def end_tree(root: int, grace: float) -> None:
    """SIGTERM every process of the step, then SIGKILL what is still alive after ``grace`` seconds.

    The caller reaps ``root`` itself (it is its child).
    """
    if _signal_all(root, signal.SIGTERM) == 0:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not members(root):  # an exited, unreaped root is a zombie: not counted
            return
        time.sleep(0.05)
    _signal_all(root, signal.SIGKILL)
