"""One run per results folder at a time: rank 0 holds the folder with a file, ``hold.json``.

flock is not reliable on every NFS or Lustre mount, so the hold is a plain file naming its holder
(host, pid, Slurm job, since when). It is created with ``link()`` (atomic on NFS too: only one of
two runs starting at once gets it) and rewritten atomically every ``refresh`` seconds by a thread
of rank 0 (``MULTINODE_GPU_HOLD_SECONDS``, default 20) while the run lives; the run removes it
when it ends.

A hold is stale, and taken over with a one-line notice, when
- its holder ran on this host (same boot, same pid namespace) and that process is gone
  (a SIGKILLed run, an out-of-memory kill), or the host has rebooted since;
- it comes from an earlier incarnation of this very Slurm job (the job was requeued);
- or it was not refreshed for ``STALE_PERIODS`` (3) of its holder's refresh periods: 60 s by
  default (a node that died, a run killed on another host). This compares the holder's clock
  with ours: the nodes' clocks are assumed to agree to well under a minute.
Readers (``python -m common.status``, ``--dry-run``) never take it.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

from common import settings
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import UsageError, quoted
from common.results.layout import HOLD_NAME, ResultsLayout
from common.results.outputs import atomic_write_json
from common.results.regular_file import NotRegularFile, read_regular

log = logging.getLogger("multinode_gpu")

REFRESH_SECONDS = settings.DEFAULTS.hold_seconds
#: a hold not refreshed for this many of its holder's refresh periods is stale
STALE_PERIODS = 3


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _process_started(pid: int) -> Optional[float]:
    """When process ``pid`` started (to tell it from a later process given the same pid); None if gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped (an orphan waits for init)
            return None
        return process.create_time()
    except psutil.ZombieProcess:
        return None
    except psutil.NoSuchProcess:
        # Not in /proc. Where /proc hides processes (mounted hidepid=2, as on many shared clusters)
        # a live run is not there either when it is another user's, or ours started under another
        # group (sg, newgrp) or not dumpable: the kernel still answers for the pid, and only "no
        # such process" is gone. A pid taken meanwhile by a new process is then taken as alive too:
        # its hold goes stale after STALE_PERIODS refreshes instead of at once.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:  # not ours to signal (EPERM): it exists all the same
            pass
        return -1.0
    except psutil.Error:  # exists, but cannot be looked at (another user's): take it as alive
        return -1.0


def _me(refresh: float, now: Optional[float] = None) -> Dict[str, Any]:
    """This process's hold record, stamped ``now`` (the clock's time; the system's where not given)."""
    now = time.time() if now is None else now
    job, restarts = settings.slurm_job()
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_started": _process_started(os.getpid()),
            "boot_id": _boot_id(), "pid_namespace": _pid_namespace(),
            "slurm_job_id": job, "slurm_restart_count": restarts,
            "since": now, "refreshed": now, "refresh_seconds": refresh, "token": uuid.uuid4().hex}


def _stamp(when: Any) -> str:
    try:
        return datetime.datetime.fromtimestamp(float(when), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


def describe(holder: Dict[str, Any]) -> str:
    """'host n1, pid 4242, Slurm job 1234, since 2026-11-24 06:30:12 UTC'."""
    job = holder.get("slurm_job_id")
    return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
            + (f", Slurm job {job}" if job else ", no Slurm job") + f", since {_stamp(holder.get('since'))}")


def read_hold(folder: Path) -> Optional[Dict[str, Any]]:
    """The holder of ``folder`` as its file says (None when there is no hold)."""
    return _read(ResultsLayout(Path(folder)).hold)


def _read(path: Path) -> Optional[Dict[str, Any]]:
    """A hold file with its mtime; a damaged one (which the atomic writes make unlikely) reads
    as ``{"damaged": True}``: stale once it has not changed for the default stale time."""
    try:
        mtime = path.stat().st_mtime
        data = json.loads(read_regular(path, "the results folder's hold"))  # a FIFO: refused, never waited on
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
        mtime = _mtime(path)
    if not isinstance(data, dict):
        data = {"damaged": True}
    data["mtime"] = mtime
    return data


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def process_gone(holder: Dict[str, Any]) -> Optional[str]:
    """Why the process ``holder`` names is known to be gone, from the machine it ran on (same host,
    same pid namespace): the host has rebooted since, or no process of that pid and start time
    exists. None where it exists or cannot be looked at from here (another host)."""
    me = _me(0.0)
    same_machine = (holder.get("host") == me["host"] and holder.get("pid_namespace") == me["pid_namespace"])
    if not same_machine:
        return None
    if holder.get("boot_id") and holder.get("boot_id") != me["boot_id"]:
        return "its host has rebooted since"
    pid = holder.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2 ** 31:  # a real pid
        started = _process_started(pid)
        recorded = holder.get("process_started")
        if started is None or (started > 0 and isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0):
            return "its process is gone"
    return None


def last_refreshed(holder: Dict[str, Any]) -> float:
    """When ``holder`` last refreshed its hold (epoch seconds; 0 where it cannot be told)."""
    try:
        return max(float(holder.get("refreshed") or 0.0), float(holder.get("mtime") or 0.0))
    except (TypeError, ValueError):
        return float(holder.get("mtime") or 0.0)


def silent_for(holder: Dict[str, Any], now: float) -> Optional[float]:
    """Seconds ``holder`` has not refreshed its hold for, where that is past its stale time; None
    while the hold is fresh."""
    try:
        period = max(float(holder.get("refresh_seconds") or REFRESH_SECONDS), 0.1)
    except (TypeError, ValueError):
        period = REFRESH_SECONDS
    silent = now - last_refreshed(holder)
    return silent if silent > STALE_PERIODS * period else None


def stale_because(holder: Dict[str, Any], now: Optional[float] = None) -> Optional[str]:
    """Why ``holder`` no longer holds its folder, or None while it may still be running."""
    now = time.time() if now is None else now
    gone = process_gone(holder)
    if gone is not None:
        return gone
    job, restarts = settings.slurm_job()  # as _me records them, without looking at this process again
    if job and holder.get("slurm_job_id") == job and holder.get("slurm_restart_count") != restarts:
        return "it was an earlier run of this Slurm job, which was requeued"
    silent = silent_for(holder, now)
    return None if silent is None else f"not refreshed for {silent:.0f} s"


def refusal(folder: Path, holder: Dict[str, Any]) -> UsageError:
    if holder.get("damaged"):
        return UsageError(f"--results {quoted(folder)}: in use by another run (its {HOLD_NAME} is being written or damaged; "
                          f"it counts as stale {STALE_PERIODS * REFRESH_SECONDS:.0f} s after it last changed)")
    return UsageError(f"--results {quoted(folder)}: in use by another run ({describe(holder)}); wait for it to end "
                      f"or choose another --results")


def check_free(folder: Path) -> Optional[str]:
    """Read-only: raise :class:`UsageError` if a live run holds ``folder``; else the reason a
    stale hold will be taken over (None when there is none)."""
    holder = read_hold(folder)
    if holder is None:
        return None
    why = stale_because(holder)
    if why is None:
        raise refusal(folder, holder)
    return why


class Hold:
    """This run's hold on its results folder; :meth:`acquire`, then :meth:`release` at the end."""

    def __init__(self, folder: Path, refresh: float = REFRESH_SECONDS, clock: Clock = SYSTEM_CLOCK):
        """``refresh``: seconds between rewrites (the run's MULTINODE_GPU_HOLD_SECONDS); ``clock``:
        what the hold's times are stamped with."""
        self.clock = clock
        self.folder = Path(folder)
        self.path = ResultsLayout(self.folder).hold
        self.refresh = refresh
        self.me = _me(self.refresh, clock.time())
        self.lost: Optional[str] = None  # set when another run took the folder over from this one
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def acquire(self) -> None:
        """Take the hold (a stale one with a notice) or raise :class:`UsageError` naming the holder."""
        for _ in range(5):
            if self._create():
                try:
                    self._start_refreshing()
                except RuntimeError as error:  # "can't start new thread": the limit on processes (ulimit -u)
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                    raise UsageError(f"--results {quoted(self.folder)}: cannot start the thread that keeps its "
                                     f"{HOLD_NAME} fresh ({error}); raise the limit on processes (ulimit -u)") from None
                return
            holder = read_hold(self.folder)
            if holder is None:
                continue  # its run just ended: try again
            why = stale_because(holder)
            if why is None:
                raise refusal(self.folder, holder)
            if self._remove_stale(holder):
                log.warning("taking over --results %s from a run that is gone (%s; %s)",
                            self.folder, describe(holder) if not holder.get("damaged") else f"damaged {HOLD_NAME}", why)
        raise UsageError(f"--results {quoted(self.folder)}: in use by other runs starting at the same time; try again")

    def _create(self) -> bool:
        """Write our hold beside it, then link it into place: fails if a hold exists."""
        temporary = ResultsLayout(self.folder).hold_temporary(self.me["token"])
        try:
            with open(temporary, "x") as handle:
                json.dump(self.me, handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink()

    def _remove_stale(self, holder: Dict[str, Any]) -> bool:
        """Move the stale hold aside and delete it, unless it changed in the meantime (another
        run took it over first): then put it back."""
        aside = ResultsLayout(self.folder).hold_stale(self.me["token"])
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        moved = _read(aside) or {}
        if moved.get("token") == holder.get("token") and bool(moved.get("damaged")) == bool(holder.get("damaged")):
            aside.unlink()
            return True
        try:
            os.link(aside, self.path)  # someone's fresh hold: give it back
        except FileExistsError:
            pass
        aside.unlink()
        return False

    def _start_refreshing(self) -> None:
        self._thread = threading.Thread(target=self._refresh_loop, name="results-hold", daemon=True)
        self._thread.start()

    def _refresh_loop(self) -> None:
        while not self._done.wait(self.refresh):
            self.refresh_now()

    def refresh_now(self) -> None:
        """Say we are alive: rewrite the file (atomically), or, where that fails (a full disk),
        touch it, which needs no space."""
        try:
            current = read_hold(self.folder)
        except NotRegularFile:
            current = None
        if current is None or current.get("token") != self.me["token"]:
            if not self.lost:
                self.lost = describe(current) if current and not current.get("damaged") else "unknown"
                log.error("the hold on %s was taken over by another run (%s): this run no longer holds its "
                          "results folder", self.folder, self.lost)
            return
        self.me["refreshed"] = self.clock.time()
        try:
            atomic_write_json(self.path, self.me, parents=False)
        except OSError:
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        """Stop refreshing and remove the hold if it is still ours."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            current = read_hold(self.folder)
        except NotRegularFile:
            return
        if current is not None and current.get("token") == self.me["token"]:
            try:
                self.path.unlink()
            except OSError:
                pass

