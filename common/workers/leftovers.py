"""What an app's code leaves running when its worker ends, dealt with so that the worker ends.

Two things would keep a worker, or part of it, alive past its run:

- a thread an item or ``setup_worker`` started and never ended (not a daemon): Python's exit
  waits for every such thread, so the worker would sit until its rank kills it (seconds at the
  end of every run, for a worker that has nothing left to do);
- a process an item started and left running (``subprocess.Popen`` never waited for, a server):
  it would outlive the run, adopted by init, and keep the run's stdout and stderr open, so that a
  caller reading them (a pipe, ``$(...)``, a test) waits for it.

A batch system ends both with the job; on a workstation nothing else would.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Callable, List

import psutil

#: how long processes the items left get to end after SIGTERM, before SIGKILL
PROCESS_GRACE_SECONDS = 2.0


def threads_left() -> List[threading.Thread]:
    """The threads, other than the calling one, that Python's exit would wait for."""
    here = threading.current_thread()
    return [thread for thread in threading.enumerate() if thread is not here and not thread.daemon
            and thread.is_alive()]


def exit_without_waiting(code: int = 0) -> None:
    """End this process as Python's exit would (its atexit functions, flushed streams) but without
    waiting for :func:`threads_left`."""
    atexit._run_exitfuncs()  # what the interpreter runs after joining its threads, run now
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def end_processes_left(note: Callable[[str], None], grace: float = PROCESS_GRACE_SECONDS) -> int:
    """SIGTERM every process this one started (and theirs) that still runs, SIGKILL those left after
    ``grace`` s; ``note`` is told which, in one line. Returns how many there were."""
    try:
        left = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    if not left:
        return 0
    names = []
    for process in left:
        try:
            names.append(f"{process.name()} (pid {process.pid})")
            process.terminate()
        except psutil.Error:
            pass
    note(f"{len(left)} process(es) started by the app's code still ran at the end, and are ended: "
         f"{', '.join(names[:5])}{', ...' if len(names) > 5 else ''}")
    _, alive = psutil.wait_procs(left, timeout=grace)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    return len(left)
