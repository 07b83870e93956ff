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
import time
from typing import Callable, List

import psutil

#: how long processes the items left get to end after SIGTERM, before SIGKILL
PROCESS_GRACE_SECONDS = 2.0
#: how long threads the items left get to end (an executor's queued work, a last write) at the worker's end
THREAD_GRACE_SECONDS = 3.0
#: how long the exit functions get (multiprocessing's waits for each process an item left running).
#: The worst end, 3 + 2 + 2 (PROCESS_GRACE_SECONDS) + 0.5 s, stays well inside the 10 s after which
#: the rank kills a worker that has not ended, which would leave what the worker was ending running
EXIT_FUNCTIONS_SECONDS = 2.0


def threads_left() -> List[threading.Thread]:
    """The threads, other than the calling one, that Python's exit would wait for."""
    here = threading.current_thread()
    return [thread for thread in threading.enumerate() if thread is not here and not thread.daemon
            and thread.is_alive()]


def end_worker(note: Callable[[str], None], code: int = 0, grace: float = THREAD_GRACE_SECONDS) -> None:
    """End this process as Python's exit would, but bounded: threading's exit hooks (an executor
    runs the work queued in it) and the threads :func:`threads_left` names get ``grace`` seconds
    together, the atexit functions run (the app's too, whenever it registered them) for up to
    EXIT_FUNCTIONS_SECONDS, then the processes it left are ended (:func:`end_processes_left`), and the
    process ends with ``code`` whatever threads still run."""
    deadline = time.monotonic() + grace
    hooks = threading.Thread(target=_threading_exit_hooks, name="exit hooks", daemon=True)
    hooks.start()
    hooks.join(grace)
    for thread in threads_left():
        thread.join(max(0.0, deadline - time.monotonic()))
    # what the interpreter runs after joining its threads, bounded too: multiprocessing's own waits for
    # every process an item started and left running (it would wait for ever for a server)
    exits = threading.Thread(target=atexit._run_exitfuncs, name="atexit functions", daemon=True)
    exits.start()
    exits.join(EXIT_FUNCTIONS_SECONDS)
    end_processes_left(note)
    exits.join(0.5)  # what was waiting for them ends with them
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _threading_exit_hooks() -> None:
    """What threading's shutdown runs before it joins the threads (concurrent.futures' executors
    finish their queued work there); CPython's, where it has them."""
    for hook in reversed(list(getattr(threading, "_threading_atexits", ()))):
        try:
            hook()
        except Exception:  # noqa: BLE001 -- a library's hook: the worker ends all the same
            pass


def end_processes_left(note: Callable[[str], None], grace: float = PROCESS_GRACE_SECONDS) -> int:
    """SIGTERM every process this one started (and theirs) that still runs, SIGKILL those left after
    ``grace`` s; ``note`` is told which, in one line. Returns how many there were."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    left = [child for child in children if _running(child)]
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


def _running(process: psutil.Process) -> bool:
    """Not gone, and not one that ended and that nobody waited for (a zombie holds nothing)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
