"""The rank's view of MPI. mpi4py itself is imported only on the rank's main path (``world()``);
what a worker or a pipeline step must not inherit from the launcher is ``settings.without_launcher``.

Without mpi4py, with ``MULTINODE_GPU_NO_MPI=1``, or started without an MPI launcher, the job is a
single rank and needs no launcher.
"""
from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from typing import Any, List, Mapping, Optional, Tuple

from common import settings

log = logging.getLogger("multinode_gpu")

class SingleRank:
    """A world of one: what a run without a launcher (or without mpi4py) sees."""

    rank, size = 0, 1
    finalize = True

    def allgather(self, value: Any) -> List[Any]:
        return [value]

    def bcast(self, value: Any) -> Any:
        return value

    def send(self, value: Any, dest: int) -> None:
        raise RuntimeError("a single rank has no one to send to")

    def poll(self) -> Optional[Tuple[int, Any]]:
        return None

    def flush(self, timeout: float = 0.0) -> bool:
        return True

    def progress(self) -> None:
        pass

    def abort(self, code: int) -> None:
        os._exit(code)


class MpiWorld:
    """COMM_WORLD with non-blocking, pickled point-to-point messages (one tag)."""

    TAG = 17
    PROGRESS_TAG = 18  # never sent: probed only to drive MPI's progress

    def __init__(self, mpi: Any):
        self.MPI = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._sends: List[Any] = []
        # sends come from rank 0's main thread and from its heartbeat thread while it writes outputs
        self._sends_lock = threading.Lock()
        self._status = mpi.Status()
        self._poll_failed = False
        self._send_failed: set = set()  # the ranks a send to has failed (said once each)
        self.finalize = True  # False: a peer is gone; leave without MPI_Finalize

    def allgather(self, value: Any) -> List[Any]:
        return self.comm.allgather(value)

    def bcast(self, value: Any) -> Any:
        return self.comm.bcast(value, root=0)

    def send(self, value: Any, dest: int) -> None:
        """Non-blocking: two ranks sending to each other at once can never deadlock. A send to a
        rank that is gone may fail (mpi4py raises MPI errors): liveness decides about that rank."""
        try:
            with self._sends_lock:
                self._sends.append(self.comm.isend(value, dest=dest, tag=self.TAG))
                if len(self._sends) > 64:
                    self._sends = [r for r in self._sends if not r.Test()]
        except self.MPI.Exception as error:  # its rank is gone or cut off: liveness finds out which
            if dest not in self._send_failed:  # one line per peer, not an error stack per message
                self._send_failed.add(dest)
                log.warning("sending to rank %d failed: %s", dest, _last_line(error))

    def poll(self) -> Optional[Tuple[int, Any]]:
        """The next message for this rank as (source, message), or None."""
        try:
            if not self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.TAG, status=self._status):
                return None
            source = self._status.Get_source()
            return source, self.comm.recv(source=source, tag=self.TAG)
        except self.MPI.Exception as error:  # a peer's connection broke: liveness finds out which
            if not self._poll_failed:
                self._poll_failed = True
                log.warning("receiving failed: %s", _last_line(error))
            return None

    def flush(self, timeout: float = math.inf) -> bool:
        """Wait up to ``timeout`` s until every message sent has left; False if some never did
        (its receiver is gone)."""
        deadline = time.monotonic() + timeout
        while self._sends and time.monotonic() < deadline:
            try:
                self.progress()
            except self.MPI.Exception:
                return False
            time.sleep(0.001)
        return not self._sends

    def progress(self) -> None:
        """Move the messages sent so far along. Over libfabric's tcp provider (MPICH's OFI netmod,
        what the engine picks under srun's pmi2) a small message is complete for its sender as soon
        as it is queued, and leaves only while the sender calls MPI's progress engine; MPI_Test of
        a complete request does not, a probe does. A rank busy with anything else (rank 0 writing
        its outputs) must call this, or its heartbeats never reach the followers."""
        with self._sends_lock:
            self._sends = [r for r in self._sends if not r.Test()]
        self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.PROGRESS_TAG)  # a tag never sent: takes nothing

    def abort(self, code: int) -> None:
        self.comm.Abort(code)


def _last_line(error: Exception) -> str:
    """An MPI error in one line: MPICH's error stack ends with its cause (the rest is call sites)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else repr(error)


def world(no_mpi: Optional[bool] = None) -> Any:
    """This process's MPI world; a single rank when there is no MPI to join, or ``no_mpi`` (the run's
    MULTINODE_GPU_NO_MPI; read here where not given)."""
    if no_mpi is None:
        no_mpi = bool(settings.value(settings.NO_MPI))
    if no_mpi or not launched_by_mpi(os.environ):
        return SingleRank()
    try:
        import mpi4py
    except ImportError:
        return SingleRank()
    if multiprocessing.current_process().name != "MainProcess":
        # A spawned child must never join its parent's MPI job (see README, "workers and MPI").
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        return SingleRank()
    mpi4py.rc.initialize = False  # initialised below, once the netmod is decided
    mpi4py.rc.finalize = True
    from mpi4py import MPI

    if not MPI.Is_initialized():
        netmod = srun_pmi_netmod(os.environ, MPI.Get_library_version())
        if netmod:
            os.environ["MPIR_CVAR_CH4_NETMOD"] = netmod
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MpiWorld(MPI)


def launched_by_mpi(env: Mapping[str, str]) -> bool:
    """Whether an MPI launcher (mpiexec, srun --mpi, an Open MPI or Intel MPI launcher) started this
    process: it left variables through which the rank finds its job. Without them MPI_Init could
    only make a world of one, and MPICH's singleton start (it starts a process manager, then
    finalises it at exit) costs about 0.15 s of wall time for nothing: such a run is a
    :class:`SingleRank`, which behaves the same for one rank.

    Where in doubt, MPI is started as before: a job step of Slurm (an MPI built on Slurm's own PMI
    finds its job through SLURM_* variables alone, under ``srun`` without ``--mpi``), MVAPICH, PBS's
    PALS, Cray's ALPS and LSF's jsrun count as launchers too. Taking a real launch for a single
    rank would run the whole job in every rank."""
    return any(name.startswith(settings.LAUNCHER_PREFIXES + _OTHER_LAUNCHERS) for name in env)


#: variables other launchers leave (not removed from a worker's environment: no MPI reads them there)
_OTHER_LAUNCHERS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_PROCID", "MV2_", "PALS_", "ALPS_APP", "JSM_NAMESPACE")


def srun_pmi_netmod(env: Mapping[str, str], library: str) -> Optional[str]:
    """The MPICH netmod a rank started by ``srun --mpi=pmi2`` must use, or None for MPI's default.

    Slurm's pmi2 plugin reads each PMI-1 request with a single ``read()`` of at most 1024 bytes
    (its source says "TODO: read until newline"). MPICH's UCX netmod publishes a 4 KB address
    in nine segments whose lines can exceed that, depending on what the uninitialised part of
    the buffer holds: MPI_Init then fails at random ("mpi/pmi2: value not properly terminated",
    then a UCX assertion). OFI's address is one short line. Only an MPICH built with both
    netmods (the ``mpich`` wheel), and only where the user has not chosen one."""
    if env.get("SLURM_MPI_TYPE") != "pmi2" or "PMI_FD" not in env or "MPIR_CVAR_CH4_NETMOD" in env:
        return None
    device = next((line for line in library.splitlines() if line.startswith("MPICH Device:")), "")
    netmods = device.split(":", 1)[-1].replace("ch4:", " ").split()
    return "ofi" if "ucx" in netmods and "ofi" in netmods else None
